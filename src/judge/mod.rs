//! The judge: recompute a micro-batch's loss from its own dumped inputs with the
//! reference kernels ([`crate::kernels`]) under given or inferred conventions, and say
//! whether the dump is self-consistent. Below the tools: losscheck reports it for one
//! tree, dumpdiff adjudicates a loss disagreement between two sides with it, postmortem
//! runs it on a run's dumps — none of them calls another tool for it.
//!
//! Entry points:
//! - [`self_consistency_any`]: one rank/micro of a dump tree of either layout → one
//!   [`Verdict`]; the side whose verdict is [`Status::Consistent`] is the one whose loss
//!   follows from its own inputs.
//! - [`self_consistency`] (weaver) and [`self_consistency_self_hosted`] (self-hosted): the
//!   same for a known layout; the self-hosted one takes a [`SelfHostedStep`] loaded once
//!   per step.
//! - [`check_tree`]: every rank/micro of a step under the configuration given.
//! - [`check_tree_inferred`]: every rank/micro of a step under the step's own
//!   conventions — aggregation, KL estimator, entropy/KL coefficients, advantage epsilon —
//!   settled first from flags, the dump's `extra_info`, or a joint fit over every cell
//!   ([`infer`]); [`StepCheck::conventions`] + [`StepCheck::check_under`] do the same one
//!   cell at a time. Tolerances carry the stored dtypes' rounding ([`terms`]); the
//!   diagnosis names the term that differs ([`Verdict::differs`]).
//! - [`inputs_from_value`]: free-standing tensors (`losscheck --inputs FILE`) → [`LossInputs`].
//!
//! Supported layouts ([`Layout`]):
//! - weaver: `is_loss_debug/` (log_probs, old_log_probs, advantages, prob_ratio,
//!   elementwise_loss, effective_valid, loss), cross-checked with its `loss/` file (loss,
//!   pg_loss, entropy_loss, metrics) when present, entropy from `forward_data/`;
//! - self-hosted: `forward_data/` + whole-batch (or per-micro) `old_log_probs/` +
//!   `trajectory/` (rows matched by token content, or by their log-probs without
//!   `input_ids` ([`locate`]); advantages recomputed from rewards and group ids; see
//!   [`self_hosted`]), checked against `loss/` (loss, pg_loss, entropy_loss, metrics).

pub mod cell;
pub mod infer;
pub mod locate;
pub mod overrides;
pub mod picture;
pub mod self_hosted;
mod shifted;
pub mod terms;
mod under;
mod verdict_line;

use std::path::{Path, PathBuf};

use candle_core::Device;

use crate::error::{Error, Position, Result};
use crate::kernels::loss::{LossConfig, LossInputs};
use crate::kernels::{to_f64_vec, KernelError};
use crate::model::step::{LogProbSource, TokenTensor};
use crate::producers::layout::{DumpTree, Kind};
use crate::producers::loose_tensors;
use crate::value::Value;

use cell::{gather_self_hosted, gather_weaver, judge, Cell, Uncertainty};
use infer::Convention;
use overrides::Overrides;
use under::judge_under;

pub use self_hosted::{Dealer, SelfHostedStep};

/// Tolerance of "dumped equals recomputed": the shared type, symmetric
/// ([`Tolerance::self_consistency`]; `Default`: rtol 1e-4, atol 1e-6, dumps are f32 and
/// the reference is f64).
pub use crate::compare::tolerance::Tolerance;

/// The outcome of one self-consistency check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// The dumped loss and intermediates follow from the dumped inputs.
    Consistent,
    /// Something dumped does not follow from the dumped inputs.
    Inconsistent,
    /// Only the total is dumped, its intermediates follow, and it holds terms whose
    /// coefficients nothing states: whether it follows cannot be told (a warning).
    Undetermined,
    /// The cell does not follow, but neither do most cells of its side under the
    /// conventions found: the tool's picture of the step is in doubt, not this cell
    /// (issue 28: check before judging; a warning, never a failure).
    CannotJudge,
}

/// Which dump layout a verdict was computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// Weaver: per-micro `is_loss_debug/` with every intermediate.
    Weaver,
    /// NexRL self-hosted: `forward_data/` + whole-batch `old_log_probs/` + `trajectory/`.
    SelfHosted,
}

/// The first intermediate (in computation order) whose dumped value differs.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Divergence {
    /// Intermediate name (`prob_ratio`, `elementwise_loss`, ...).
    pub name: String,
    /// Row within the micro-batch.
    pub row: usize,
    /// Response position within the row.
    pub pos: usize,
    /// Dumped value.
    pub dumped: f64,
    /// Recomputed value.
    pub recomputed: f64,
    /// How many valid positions differ.
    pub count: usize,
}

/// One dumped scalar of the `loss/` file (`loss`, `pg_loss`, `entropy_loss`,
/// `metrics.approx_kl`, ...) next to its recomputed value.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ScalarCheck {
    /// Key path in the `loss/` file (`metrics.avg_ratio`).
    pub name: String,
    /// Dumped value.
    pub dumped: f64,
    /// Recomputed value.
    pub recomputed: f64,
    /// Within tolerance.
    pub ok: bool,
}

/// The verdict on one rank/micro.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Verdict {
    /// The file holding the dumped loss (`is_loss_debug/` for weaver, `loss/` for
    /// self-hosted).
    pub file: PathBuf,
    /// Layout the inputs were read from.
    pub layout: Layout,
    /// Step.
    pub step: i64,
    /// Rank.
    pub rank: u32,
    /// Micro-batch.
    pub micro: u32,
    /// Consistent or not.
    pub status: Status,
    /// Dumped loss.
    pub dumped_loss: f64,
    /// Recomputed loss.
    pub recomputed_loss: f64,
    /// First divergent intermediate, if any (weaver only: self-hosted dumps no
    /// per-token intermediates).
    pub first_divergence: Option<Divergence>,
    /// Every dumped scalar of the `loss/` file compared with its recomputed value.
    pub checks: Vec<ScalarCheck>,
    /// Valid tokens in the micro.
    pub tokens: usize,
    /// Other findings in words (e.g. "the dumped loss ... a sum, not a mean").
    pub notes: Vec<String>,
    /// The terms that differ, in the diagnosis's words (`ratio`, `pg`, `aggregation`,
    /// `entropy`, `kl`, `mask`, `composition`, `loss`); empty when consistent. In JSON
    /// under the tree report's `diagnoses` (the verdict's own layout is kept as it was).
    #[serde(skip)]
    pub differs: Vec<String>,
    /// The dumped loss is what its recomputed terms give (within tolerance, or alike at
    /// the dumped precision): an inconsistent cell then does not call its loss different.
    #[serde(skip)]
    pub loss_ok: bool,
    /// The dumped pg term is the plain sum of the cell's own dumped per-token loss, which
    /// no mean of it gives: a fault whatever weights that per-token loss holds.
    #[serde(skip)]
    pub own_sum: bool,
    /// The dumped `prob_ratio` follows the cell's own log-probs with `old_log_probs`
    /// shifted by one token ([`shifted::own_shift`]): a fault whatever the step's picture.
    #[serde(skip)]
    pub own_shift: bool,
}

pub(crate) fn kerr(path: &Path, e: KernelError) -> Error {
    Error::format(path, Position::File, e.to_string())
}

/// A model tensor as an f64 candle tensor; a failure names its file and key.
pub(crate) fn candle_of(t: &TokenTensor) -> Result<candle_core::Tensor> {
    t.tensor
        .to_candle(&Device::Cpu)
        .and_then(|t| t.to_dtype(candle_core::DType::F64))
        .map_err(|e| {
            Error::format(
                &t.source.file,
                Position::Key(t.source.key.clone()),
                e.to_string(),
            )
        })
}

/// A tensor the check cannot do without.
pub(crate) fn required(
    t: Option<&TokenTensor>,
    path: &Path,
    key: &str,
) -> Result<candle_core::Tensor> {
    match t {
        Some(t) => candle_of(t),
        None => Err(Error::format(
            path,
            Position::Key(key.into()),
            "missing or not a tensor",
        )),
    }
}

/// Recompute one rank/micro of a weaver `tree` at `step` from its own dumped inputs
/// (`is_loss_debug/`: log_probs, old_log_probs, advantages, effective_valid `[B, T]`)
/// under `cfg`, and compare with what was dumped: `prob_ratio`, `elementwise_loss`, `loss`,
/// and the `loss/` file's scalars when present.
///
/// Errors (exit 2 in the CLI): the file is absent, unreadable, or lacks an input; tensor
/// shapes disagree (both sizes named).
pub fn self_consistency(
    tree: &DumpTree,
    step: i64,
    rank: u32,
    micro: u32,
    cfg: &LossConfig,
    tol: &Tolerance,
) -> Result<Verdict> {
    judge(
        &gather_weaver(tree, step, rank, micro)?,
        cfg,
        tol,
        Uncertainty::default(),
    )
}

/// Recompute one rank/micro of a self-hosted `tree` (see [`self_hosted`]) under `cfg`:
/// its `forward_data/` log-probs and mask, the matching rows of the whole-batch old
/// log-probs and advantages in `batch` (from [`SelfHostedStep::load`] with the same
/// step), and compare with its `loss/` file (loss, pg_loss, entropy_loss, metrics).
///
/// Errors (exit 2 in the CLI): forward_data or loss file absent or unreadable, a key
/// missing, shapes that disagree, a row whose tokens match no trajectory.
pub fn self_consistency_self_hosted(
    tree: &DumpTree,
    batch: &SelfHostedStep,
    step: i64,
    rank: u32,
    micro: u32,
    cfg: &LossConfig,
    tol: &Tolerance,
) -> Result<Verdict> {
    judge(
        &gather_self_hosted(tree, batch, step, rank, micro)?,
        cfg,
        tol,
        Uncertainty::default(),
    )
}

/// The verdict of a cell set aside as [`Error::CannotJudge`] (a self-hosted micro whose
/// rows neither ids, log-probs nor order place): [`Status::CannotJudge`] with `reason` as
/// its note, its dumped loss when its `loss/` file reads (else NaN), nothing recomputed
/// (NaN): a warning, never a failure nor an unreadable file (issue 28).
pub fn cannot_judge_verdict(
    tree: &DumpTree,
    step: i64,
    (rank, micro): (u32, u32),
    reason: &str,
) -> Verdict {
    let lf = tree.get(Kind::Loss, step, Some(rank), Some(micro));
    let dumped = lf.and_then(|f| {
        cell::loss_file(&f.path, crate::producers::nexrl_self_hosted::loss_record)
            .ok()?
            .0
            .loss
    });
    Verdict {
        file: lf.map_or_else(|| tree.root.clone(), |f| f.path.clone()),
        layout: layout_of(tree, step).unwrap_or(Layout::SelfHosted),
        step,
        rank,
        micro,
        status: Status::CannotJudge,
        dumped_loss: dumped.unwrap_or(f64::NAN),
        recomputed_loss: f64::NAN,
        first_divergence: None,
        checks: Vec::new(),
        tokens: 0,
        notes: vec![reason.to_string()],
        differs: Vec::new(),
        loss_ok: false,
        own_sum: false,
        own_shift: false,
    }
}

/// The layout `tree` holds at `step`: weaver when it has `is_loss_debug/` files there,
/// self-hosted when it has `forward_data/`, `old_log_probs/` and `trajectory/`; `None`
/// otherwise (e.g. remote-API trees, which dump no per-micro inputs).
pub fn layout_of(tree: &DumpTree, step: i64) -> Option<Layout> {
    let has = |k: Kind| tree.files_of(k, step).next().is_some();
    if has(Kind::IsLossDebug) {
        Some(Layout::Weaver)
    } else if has(Kind::ForwardData) && has(Kind::Trajectory) {
        Some(Layout::SelfHosted)
    } else {
        None
    }
}

fn no_layout(tree: &DumpTree, step: i64) -> Error {
    Error::input(
        &tree.root,
        format!(
            "step {step} has neither is_loss_debug/ files (weaver layout) nor forward_data/ + \
         old_log_probs/ + trajectory/ files (self-hosted layout); losscheck needs one of them"
        ),
    )
}

/// A cell: `(rank, micro)`.
pub type CellId = (u32, u32);

/// A dump tree's step made ready for self-consistency checks: its layout and, for the
/// self-hosted layout, the whole-batch inputs (trajectories, old log-probs, advantages)
/// read once for every rank/micro checked.
pub struct StepCheck<'a> {
    tree: &'a DumpTree,
    step: i64,
    layout: Layout,
    batch: Option<SelfHostedStep>,
    /// How the whole-batch `old_log_probs` rows were found ordered, when not in the
    /// trajectory file's order ([`SelfHostedStep::settle_old_order`]).
    pub old_order: Option<Convention>,
}

impl<'a> StepCheck<'a> {
    /// Find the layout of `tree` at `step` and, when self-hosted, read its whole-batch
    /// files with `cfg`'s advantage convention.
    ///
    /// Errors: neither layout at `step`; the whole-batch files unreadable.
    pub fn new(tree: &'a DumpTree, step: i64, cfg: &LossConfig) -> Result<Self> {
        let layout = layout_of(tree, step).ok_or_else(|| no_layout(tree, step))?;
        let batch = match layout {
            Layout::SelfHosted => Some(SelfHostedStep::load(tree, step, &cfg.advantage)?),
            Layout::Weaver => None,
        };
        let (batch, old_order) = picture::settled(tree, step, batch);
        Ok(StepCheck {
            tree,
            step,
            layout,
            batch,
            old_order,
        })
    }

    /// [`StepCheck::new`] with the self-hosted whole-batch records taken from `whole` (the
    /// trajectory/ or old_log_probs/ file of `step`, when the caller has read it) and the
    /// trajectories from `traj` when given; a file `whole` lacks is read from disk.
    pub fn with_values(
        tree: &'a DumpTree,
        step: i64,
        cfg: &LossConfig,
        whole: &dyn Fn(Kind) -> Option<&'a crate::model::record::Record>,
        traj: Option<&self_hosted::TrajectorySummary>,
    ) -> Result<Self> {
        let whole = |k: Kind| whole(k).map(crate::model::record::Record::raw);
        let layout = layout_of(tree, step).ok_or_else(|| no_layout(tree, step))?;
        let file = |k: Kind| tree.get(k, step, None, None).map(|f| f.path.clone());
        let adv = &cfg.advantage;
        let batch = match layout {
            Layout::SelfHosted => Some(
                match (
                    traj,
                    file(Kind::Trajectory).zip(whole(Kind::Trajectory)),
                    file(Kind::OldLogProbs).zip(whole(Kind::OldLogProbs)),
                ) {
                    (Some(ts), _, Some((of, ov))) => SelfHostedStep::from_summary(ts, of, ov, adv)?,
                    (None, Some((tf, tv)), Some((of, ov))) => {
                        SelfHostedStep::from_values(tf, tv, of, ov, adv)?
                    }
                    _ => SelfHostedStep::load(tree, step, adv)?,
                },
            ),
            Layout::Weaver => None,
        };
        let (batch, old_order) = picture::settled(tree, step, batch);
        Ok(StepCheck {
            tree,
            step,
            layout,
            batch,
            old_order,
        })
    }

    /// The layout found.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Read one rank/micro's inputs and dumped values ([`cell::gather_weaver`] or
    /// [`cell::gather_self_hosted`]).
    pub fn gather(&self, rank: u32, micro: u32) -> Result<Cell> {
        match &self.batch {
            Some(b) => gather_self_hosted(self.tree, b, self.step, rank, micro),
            None => gather_weaver(self.tree, self.step, rank, micro),
        }
    }

    /// The step's conventions settled from every cell ([`infer::resolve`]; flags in
    /// `given`), for [`StepCheck::check_under`]: what [`check_tree_inferred`] does, for a
    /// caller (dumpdiff's adjudication) that judges cells one at a time. No advantage
    /// epsilon search (that needs the step re-read with each candidate).
    ///
    /// Errors: a cell unreadable.
    pub fn conventions(
        &self,
        cfg: &LossConfig,
        given: &Overrides,
        tol: &Tolerance,
    ) -> Result<infer::Resolved> {
        let all = self.cells().0;
        let preps: Vec<infer::Prep> = all
            .iter()
            .map(|(r, m)| infer::prep(&self.gather(*r, *m)?, cfg, tol))
            .collect::<Result<_>>()?;
        let resolved = infer::resolve(&preps, cfg, given, tol)?;
        // the policy loss searched as losscheck does, so both tools judge alike
        let fit = infer::pg_fit(&preps, &resolved.cfg, tol);
        let found = picture::search_policy(self, &all, &resolved, fit, given, tol, &[])?;
        Ok(found.map_or(resolved, |(mut r, _)| {
            infer::mark_preset(&mut r.conventions, &r.cfg, cfg, true);
            r
        }))
    }

    /// [`StepCheck::check`] under settled conventions (`resolved.cfg`, with the
    /// uncertainty of inferred coefficients).
    pub fn check_under(
        &self,
        rank: u32,
        micro: u32,
        resolved: &infer::Resolved,
        tol: &Tolerance,
    ) -> Result<Verdict> {
        judge_under(&self.gather(rank, micro)?, resolved, tol)
    }

    /// The rank/micro cells of the step with something dumped to check (self-hosted:
    /// forward_data and loss files both; weaver: is_loss_debug), sorted, and the
    /// forward_data cells skipped for lack of a loss file.
    pub fn cells(&self) -> (Vec<CellId>, Vec<CellId>) {
        let kind = match self.layout {
            Layout::Weaver => Kind::IsLossDebug,
            Layout::SelfHosted => Kind::ForwardData,
        };
        let mut cells: Vec<(u32, u32)> = self
            .tree
            .files_of(kind, self.step)
            .filter_map(|f| Some((f.rank?, f.micro?)))
            .collect();
        cells.sort_unstable();
        cells.dedup();
        if self.layout == Layout::Weaver {
            return (cells, Vec::new());
        }
        cells.into_iter().partition(|(r, m)| {
            self.tree
                .get(Kind::Loss, self.step, Some(*r), Some(*m))
                .is_some()
        })
    }

    /// The verdict of one rank/micro: [`self_consistency`] for weaver,
    /// [`self_consistency_self_hosted`] for self-hosted. `cfg` must be the one given to
    /// [`StepCheck::new`] (its advantage convention built the batch).
    pub fn check(
        &self,
        rank: u32,
        micro: u32,
        cfg: &LossConfig,
        tol: &Tolerance,
    ) -> Result<Verdict> {
        match &self.batch {
            Some(b) => self_consistency_self_hosted(self.tree, b, self.step, rank, micro, cfg, tol),
            None => self_consistency(self.tree, self.step, rank, micro, cfg, tol),
        }
    }
}

/// The self-consistency verdict of one rank/micro of `tree` at `step`, whatever its
/// layout ([`layout_of`]): [`self_consistency`] for weaver, [`self_consistency_self_hosted`]
/// for self-hosted. `cfg` from [`crate::kernels::presets::preset`] (e.g. `nexrl-is`),
/// possibly overridden.
///
/// For one cell only: a self-hosted call re-reads the step's trajectory and old_log_probs
/// files; to check several micros of one step, make a [`StepCheck`] once.
///
/// Errors: neither layout at `step`; the cell's files absent or unreadable; see the
/// layout-specific functions.
pub fn self_consistency_any(
    tree: &DumpTree,
    step: i64,
    rank: u32,
    micro: u32,
    cfg: &LossConfig,
    tol: &Tolerance,
) -> Result<Verdict> {
    StepCheck::new(tree, step, cfg)?.check(rank, micro, cfg, tol)
}

/// The self-consistency verdict of every rank/micro at `step` (restricted to `rank` /
/// `micro` when given), in rank then micro order, for either layout: the cells with an
/// `is_loss_debug/` file (weaver) or a `forward_data/` file (self-hosted; the whole-batch
/// files are read once), each under `cfg` as given. A self-hosted cell without a `loss/`
/// file has nothing dumped to check and is left out, unless every selected cell lacks one.
pub fn check_tree(
    tree: &DumpTree,
    step: i64,
    rank: Option<u32>,
    micro: Option<u32>,
    cfg: &LossConfig,
    tol: &Tolerance,
) -> Result<Vec<Verdict>> {
    let check = StepCheck::new(tree, step, cfg)?;
    let (cells, without) = selected(&check, tree, step, rank, micro)?;
    if let (true, Some((r, m))) = (cells.is_empty(), without.first()) {
        // every selected cell lacks its loss file: say so for the first
        check.gather(*r, *m)?;
    }
    cells
        .into_iter()
        .map(|(r, m)| check.check(r, m, cfg, tol))
        .collect()
}

/// The cells of `check` selected by `rank`/`micro`, and the skipped ones (no loss file).
///
/// Errors: no cell selected (with or without a loss file).
fn selected(
    check: &StepCheck,
    tree: &DumpTree,
    step: i64,
    rank: Option<u32>,
    micro: Option<u32>,
) -> Result<(Vec<CellId>, Vec<CellId>)> {
    let pick = |v: Vec<(u32, u32)>| -> Vec<(u32, u32)> {
        v.into_iter()
            .filter(|(r, m)| rank.is_none_or(|x| x == *r) && micro.is_none_or(|x| x == *m))
            .collect()
    };
    let (with, without) = check.cells();
    let (with, without) = (pick(with), pick(without));
    if with.is_empty() && without.is_empty() {
        let kind = match check.layout() {
            Layout::Weaver => Kind::IsLossDebug,
            Layout::SelfHosted => Kind::ForwardData,
        };
        return Err(Error::input(
            &tree.root,
            format!(
                "no {kind} files for step {step}{}{}",
                rank.map(|r| format!(" rank {r}")).unwrap_or_default(),
                micro.map(|m| format!(" micro {m}")).unwrap_or_default(),
            ),
        ));
    }
    Ok((with, without))
}

/// A tree's step checked under its own conventions ([`check_tree_inferred`]).
#[derive(Debug, Clone)]
pub struct TreeCheck {
    /// The configuration every cell was judged with (the preset with the conventions).
    pub cfg: LossConfig,
    /// Each convention and where it came from.
    pub conventions: Vec<Convention>,
    /// One verdict per selected cell, rank then micro order.
    pub verdicts: Vec<Verdict>,
    /// Cells with forward_data but no loss file (nothing dumped to check), `rank R micro M`.
    pub skipped: Vec<String>,
}

/// [`check_tree`] with the step's conventions (aggregation, KL estimator, entropy and KL
/// coefficients) settled first from every cell of the step ([`infer::resolve`]: a flag
/// in `given`, else the dump's `extra_info`, else inferred jointly, else `cfg`'s), then
/// each selected cell judged under them.
///
/// Errors: as [`check_tree`]; a cell unreadable.
pub fn check_tree_inferred(
    tree: &DumpTree,
    step: i64,
    rank: Option<u32>,
    micro: Option<u32>,
    cfg: &LossConfig,
    given: &Overrides,
    tol: &Tolerance,
) -> Result<TreeCheck> {
    let mut check = StepCheck::new(tree, step, cfg)?;
    let (chosen, without) = selected(&check, tree, step, rank, micro)?;
    let (all, _) = check.cells();
    let self_hosted = check.layout() == Layout::SelfHosted;
    // self-hosted trees dump rewards, not advantages: the epsilon of (r − mean)/(std + ε)
    // is a convention too (TRL 1e-4, verl 1e-6), tried besides the preset's; each
    // candidate's advantages are computed once from the step's rewards and put into the
    // cells gathered for the preset's (nothing is read again)
    let search = self_hosted && given.adv_eps.is_none() && !given.preset_fixes_composition;
    // (no candidate fails where the preset's succeeded: errors come from shapes, not ε)
    let candidates: Vec<(LossConfig, self_hosted::Advantages)> = match &check.batch {
        Some(batch) if search => crate::conventions::advantage::CANDIDATES
            .into_iter()
            .filter(|eps| *eps != cfg.advantage.eps)
            .map(|eps| {
                let mut c = cfg.clone();
                c.advantage.eps = eps;
                let adv = batch.advantages_under(&c.advantage)?;
                Ok((c, adv))
            })
            .collect::<Result<_>>()?,
        _ => Vec::new(),
    };
    // pass 1: what inference needs of every cell (one cell's tensors in memory at a time)
    // under the preset's epsilon and each candidate's, from one gather of the cell
    let per_cell: Vec<Vec<infer::Prep>> = all
        .iter()
        .map(|(r, m)| {
            let cell = check.gather(*r, *m)?;
            let swapped: Vec<Option<LossInputs>> = candidates
                .iter()
                .map(|(_, a)| infer::inputs_with_advantages(&cell, a))
                .collect::<Result<_>>()?;
            let variants: Vec<(&LossConfig, Option<&LossInputs>)> = std::iter::once((cfg, None))
                .chain(
                    candidates
                        .iter()
                        .zip(&swapped)
                        .map(|((c, _), s)| (c, s.as_ref())),
                )
                .collect();
            infer::prep_each(&cell, &variants, tol)
        })
        .collect::<Result<_>>()?;
    let mut preps: Vec<Vec<infer::Prep>> = (0..=candidates.len())
        .map(|_| Vec::with_capacity(all.len()))
        .collect();
    for cell_preps in per_cell {
        for (list, p) in preps.iter_mut().zip(cell_preps) {
            list.push(p);
        }
    }
    // the conventions, and how well the pg terms then fit
    let settle =
        |preps: &[infer::Prep], c: &LossConfig| -> Result<(infer::Resolved, (usize, f64))> {
            let resolved = infer::resolve(preps, c, given, tol)?;
            let fit = infer::pg_fit(preps, &resolved.cfg, tol);
            Ok((resolved, fit))
        };
    let mut preps = preps.into_iter();
    let (mut resolved, mut best) = settle(&preps.next().unwrap_or_default(), cfg)?;
    let mut best_adv = None;
    let mut adv = None;
    if search {
        // the epsilon under which most cells' pg terms follow, at equal counts the one
        // whose pg terms sit closest to the dumped
        for ((c, a), p) in candidates.into_iter().zip(preps) {
            let (r, fit) = settle(&p, &c)?;
            if fit.0 > best.0 || (fit.0 == best.0 && fit.1 < best.1) {
                (resolved, best, best_adv) = (r, fit, Some(a));
            }
        }
        let eps = resolved.cfg.advantage.eps;
        let same = eps == cfg.advantage.eps;
        let mut conv = infer::Convention::new(
            "adv_eps",
            crate::fmt::num(eps),
            Some(eps),
            if same {
                infer::Source::Preset
            } else {
                infer::Source::Inferred
            },
        );
        conv.matches_preset = same;
        adv = Some(conv);
    }
    // pass 2: each selected cell read again (one cell's tensors at a time) and judged
    // under the step's conventions, its advantages the chosen epsilon's
    if let Some(a) = best_adv {
        check.batch = check.batch.take().map(|b| b.with_advantages(a));
    }
    // the policy loss: when the settled one reproduces fewer than half of the pg terms,
    // real producers' are tried (clip bounds, dual clip, GSPO's ratio), under every ε
    let eps = picture::eps_candidates(check.batch.as_ref().filter(|_| search), &resolved.cfg)?;
    if let Some((mut r, _)) =
        picture::search_policy(&check, &all, &resolved, best, given, tol, &eps)?
    {
        adv = picture::adopt_eps(&mut check, &eps, &r.cfg, &resolved.cfg, cfg).or(adv);
        // (settled again from the settled conventions: marked against the preset, so that
        // a coefficient fitted to one cell's total is no preset value: seed 8751)
        infer::mark_preset(&mut r.conventions, &r.cfg, cfg, true);
        resolved = r;
    }
    let mut verdicts: Vec<Verdict> = chosen
        .iter()
        .map(|(r, m)| judge_under(&check.gather(*r, *m)?, &resolved, tol))
        .collect::<Result<_>>()?;
    let mut conventions = resolved.conventions;
    if let Some(c) = adv {
        conventions.insert(0, c);
    }
    if let Some(c) = check.old_order.take() {
        conventions.insert(0, c);
    }
    // before any cell is called wrong, the conventions must reproduce most of them
    let tried: Vec<String> = conventions.iter().map(Convention::line).collect();
    picture::before_judging(&mut verdicts, &conventions, &tried.join(", "));
    Ok(TreeCheck {
        cfg: resolved.cfg,
        conventions,
        verdicts,
        skipped: without
            .iter()
            .map(|(r, m)| format!("rank {r} micro {m}"))
            .collect(),
    })
}

/// Free-standing inputs from a dict of tensors (`.safetensors`, `.pt`, ...) mapped by
/// [`loose_tensors::inputs`]: `log_probs`, optional `old_log_probs`, `ref_log_probs`,
/// `entropy`, a mask (`mask`, `response_mask`, `loss_mask` or `effective_valid`; all ones
/// when absent), and `advantages` `[B]`/`[B, T]` or `rewards` `[B]` + `group_ids` `[B]`
/// turned into advantages with `cfg.advantage`. Keys may carry an `in.` prefix.
pub fn inputs_from_value(v: &Value, path: &Path, cfg: &LossConfig) -> Result<LossInputs> {
    let li = loose_tensors::inputs(path, v)?;
    let b = &li.batch;
    let log_probs = required(
        b.log_probs(LogProbSource::Current),
        path,
        loose_tensors::LOG_PROBS,
    )?;
    let opt = |t: Option<&TokenTensor>| t.map(candle_of).transpose();
    let mask = match &b.loss_mask {
        Some(m) => candle_of(m)?,
        None => log_probs
            .ones_like()
            .map_err(|e| Error::format(path, Position::File, e.to_string()))?,
    };
    let advantages = match opt(b.advantages.as_ref())? {
        Some(a) => a,
        None => {
            let rewards = required(li.rewards.as_ref(), path, loose_tensors::REWARDS)?;
            let rewards = to_f64_vec(&rewards).map_err(|e| kerr(path, e))?;
            let groups = required(li.group_ids.as_ref(), path, loose_tensors::GROUP_IDS)?;
            let groups: Vec<i64> = to_f64_vec(&groups)
                .map_err(|e| kerr(path, e))?
                .iter()
                .map(|g| *g as i64)
                .collect();
            let adv =
                crate::kernels::advantage::group_advantages(&rewards, &groups, &cfg.advantage)
                    .map_err(|e| kerr(path, e))?;
            candle_core::Tensor::from_vec(adv, rewards.len(), &Device::Cpu)
                .map_err(|e| Error::format(path, Position::File, e.to_string()))?
        }
    };
    Ok(LossInputs {
        log_probs,
        old_log_probs: opt(b.log_probs(LogProbSource::Old))?,
        ref_log_probs: opt(b.log_probs(LogProbSource::Reference))?,
        advantages,
        mask,
        entropy: opt(b.entropy.as_ref())?,
        rollout_log_probs: None,
    })
}

//! losscheck: recompute a micro-batch's loss from its own dumped inputs with the reference
//! kernels ([`crate::kernels`]) and say whether the dump is self-consistent.
//!
//! Entry points:
//! - [`self_consistency_any`]: one rank/micro of a dump tree of either layout → one
//!   [`Verdict`]. Meant for dumpdiff: when two sides disagree on a loss, run it on each
//!   side; the side whose verdict is [`Status::Consistent`] is the one whose loss follows
//!   from its own inputs.
//! - [`self_consistency`] (weaver) and [`self_consistency_self_hosted`] (self-hosted): the
//!   same for a known layout; the self-hosted one takes a [`SelfHostedStep`] loaded once
//!   per step.
//! - [`check_tree`]: every rank/micro of a step.
//! - [`inputs_from_value`]: free-standing tensors (`--inputs FILE`) → [`LossInputs`].
//!
//! Supported layouts ([`Layout`]):
//! - weaver: `is_loss_debug/` (log_probs, old_log_probs, advantages, prob_ratio,
//!   elementwise_loss, effective_valid, loss), cross-checked with its `loss/` file (loss,
//!   pg_loss, entropy_loss, metrics) when present, entropy from `forward_data/`;
//! - self-hosted: `forward_data/` + whole-batch `old_log_probs/` + `trajectory/` (rows
//!   matched by token content, advantages recomputed from rewards and group ids; see
//!   [`self_hosted`]), checked against `loss/` (loss, pg_loss, entropy_loss, metrics).

pub mod overrides;
pub mod report;
pub mod self_hosted;

use std::path::{Path, PathBuf};

use candle_core::Device;

use crate::error::{Error, Position, Result};
use crate::kernels::loss::{compute, LossConfig, LossInputs, LossOutput};
use crate::kernels::{to_f64, to_f64_vec, KernelError};
use crate::model::step::{LogProbSource, LossRecord, TokenTensor};
use crate::readers::layout::{DumpTree, Kind};
use crate::readers::producers::nexrl_self_hosted as keys;
use crate::readers::producers::{loose_tensors, weaver};
use crate::readers::read_any;
use crate::value::Value;

pub use self_hosted::SelfHostedStep;

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
}

impl Verdict {
    /// One line: `rank R micro M FILE: consistent (loss X)` or `... dumped loss X ≠
    /// recomputed Y — first divergent intermediate: NAME at row R pos P`, followed by the
    /// notes (the diagnosis) and the `loss/` scalars that disagree. Each pair is printed
    /// with the digits that show its difference.
    pub fn line(&self) -> String {
        let head = format!(
            "rank {} micro {} {}",
            self.rank,
            self.micro,
            self.file.display()
        );
        let mut s = match self.status {
            Status::Consistent => format!(
                "{head}: consistent (loss {})",
                crate::fmt::num(self.recomputed_loss)
            ),
            Status::Inconsistent => {
                let (d, r) = crate::fmt::pair(self.dumped_loss, self.recomputed_loss);
                let mut s = format!("{head}: dumped loss {d} ≠ recomputed {r}");
                match (&self.first_divergence, self.layout) {
                    (Some(d), _) => {
                        let (a, b) = crate::fmt::pair(d.dumped, d.recomputed);
                        s.push_str(&format!(
                            " — first divergent intermediate: {} at row {} pos {} (dumped {a}, recomputed {b}; {} positions differ)",
                            d.name, d.row, d.pos, d.count
                        ))
                    }
                    (None, Layout::Weaver) => {
                        s.push_str(" — every intermediate matches: the aggregation differs")
                    }
                    (None, Layout::SelfHosted) => {}
                }
                s
            }
        };
        // The diagnosis first (e.g. "a sum, not a mean"), then the scalars that disagree.
        for n in &self.notes {
            s.push_str("; ");
            s.push_str(n);
        }
        // The loss itself is in the head already; the other scalars that disagree follow.
        let loss_in_head = self.status == Status::Inconsistent;
        for c in self
            .checks
            .iter()
            .filter(|c| !(c.ok || loss_in_head && c.name == "loss"))
        {
            let (d, r) = crate::fmt::pair(c.dumped, c.recomputed);
            s.push_str(&format!("; {} {d} ≠ recomputed {r}", c.name));
        }
        s
    }
}

fn kerr(path: &Path, e: KernelError) -> Error {
    Error::format(path, Position::File, e.to_string())
}

fn scalar(v: &Value, path: &Path, key: &str) -> Result<f64> {
    v.get(key)
        .and_then(|x| {
            x.as_f64()
                .or_else(|| x.to_tensor().and_then(|t| t.scalar_f64()))
        })
        .ok_or_else(|| Error::format(path, Position::Key(key.into()), "missing or not a number"))
}

/// First position where `dumped` and `recomputed` (`[B, T]` row-major, `T` columns)
/// differ at a valid position.
fn first_diff(
    name: &str,
    dumped: &[f64],
    recomputed: &[f64],
    mask: &[f64],
    t: usize,
    tol: &Tolerance,
) -> Option<Divergence> {
    let mut first = None;
    let mut count = 0;
    for (i, ((d, r), m)) in dumped.iter().zip(recomputed).zip(mask).enumerate() {
        if *m != 0.0 && !tol.allows(*d, *r) {
            count += 1;
            if first.is_none() {
                first = Some((i, *d, *r));
            }
        }
    }
    first.map(|(i, d, r)| Divergence {
        name: name.to_string(),
        row: i / t.max(1),
        pos: i % t.max(1),
        dumped: d,
        recomputed: r,
        count,
    })
}

/// Compare every scalar a `loss/` file holds (`loss`, `pg_loss`, `entropy_loss`,
/// `metrics.{pg_loss, approx_kl, avg_ratio, clip_frac, entropy, num_tokens}`) with the
/// recomputed ones; keys absent from the file (or not recomputable, e.g. entropy without
/// an entropy tensor) are skipped. `num_tokens` must match exactly.
/// The scalars of a `loss/` record ([`LossRecord`]) against the recomputation: each one
/// the record holds is checked, the others are skipped.
fn loss_file_checks(
    rec: &LossRecord,
    out: &LossOutput,
    tokens: usize,
    tol: &Tolerance,
) -> Vec<ScalarCheck> {
    let f = |t: &candle_core::Tensor| to_f64(t).unwrap_or(f64::NAN);
    let loss = f(&out.loss);
    let pg = f(&out.pg_loss);
    let m = &out.metrics;
    let metric = |k: &str| rec.metrics.get(k).copied();
    let wanted: [(String, Option<f64>, Option<f64>); 9] = [
        (keys::LOSS.into(), Some(loss), rec.loss),
        (keys::PG_LOSS.into(), Some(pg), rec.pg_loss),
        (
            keys::ENTROPY_LOSS.into(),
            out.entropy_loss.as_ref().map(f),
            rec.entropy_loss,
        ),
        (
            format!("{}.pg_loss", keys::METRICS),
            Some(pg),
            metric("pg_loss"),
        ),
        (
            format!("{}.approx_kl", keys::METRICS),
            Some(m.approx_kl),
            metric("approx_kl"),
        ),
        (
            format!("{}.avg_ratio", keys::METRICS),
            Some(m.avg_ratio),
            metric("avg_ratio"),
        ),
        (
            format!("{}.clip_frac", keys::METRICS),
            Some(m.clip_frac),
            metric("clip_frac"),
        ),
        (
            format!("{}.entropy", keys::METRICS),
            m.entropy,
            metric("entropy"),
        ),
        (
            format!("{}.num_tokens", keys::METRICS),
            Some(tokens as f64),
            metric("num_tokens"),
        ),
    ];
    let mut checks = Vec::new();
    for (name, ours, dumped) in wanted {
        let (Some(ours), Some(dumped)) = (ours, dumped) else {
            continue;
        };
        let ok = if name.ends_with(".num_tokens") {
            dumped == ours
        } else {
            tol.allows(dumped, ours)
        };
        checks.push(ScalarCheck {
            name,
            dumped,
            recomputed: ours,
            ok,
        });
    }
    checks
}

/// A note when the dumped loss is the recomputed token-mean times the token count.
fn sum_not_mean(dumped: f64, recomputed: f64, tokens: usize, tol: &Tolerance) -> Option<String> {
    if tokens > 0
        && !tol.allows(dumped, recomputed)
        && tol.allows(dumped, recomputed * tokens as f64)
    {
        return Some(format!(
            "the dumped loss equals the recomputed token-mean × {tokens} valid tokens: a sum, not a mean"
        ));
    }
    None
}

/// The per-token entropy of weaver's `forward_data/` file when it has `shape` (weaver's
/// `is_loss_debug/` holds none); `None` when the file or its `entropy` is absent or shaped
/// otherwise.
///
/// Errors: the file unreadable, its `entropy` not a tensor.
fn weaver_entropy(
    tree: &DumpTree,
    step: i64,
    rank: u32,
    micro: u32,
    shape: &[usize],
) -> Result<Option<candle_core::Tensor>> {
    let Some(f) = tree.get(Kind::ForwardData, step, Some(rank), Some(micro)) else {
        return Ok(None);
    };
    let fb = weaver::forward_data(&f.path, &read_any(&f.path)?)?;
    let Some(e) = &fb.entropy else {
        return Ok(None);
    };
    let e = candle_of(e)?;
    Ok((e.dims() == shape).then_some(e))
}

/// A model tensor as an f64 candle tensor; a failure names its file and key.
fn candle_of(t: &TokenTensor) -> Result<candle_core::Tensor> {
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
fn required(t: Option<&TokenTensor>, path: &Path, key: &str) -> Result<candle_core::Tensor> {
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
    let file = tree
        .get(Kind::IsLossDebug, step, Some(rank), Some(micro))
        .ok_or_else(|| {
            Error::input(
                &tree.root,
                format!("no is_loss_debug file for step {step} rank {rank} micro {micro}"),
            )
        })?;
    let path = file.path.as_path();
    let v = read_any(path)?;
    let tb = weaver::is_loss_debug(path, &v)?;
    let mask = required(tb.loss_mask.as_ref(), path, weaver::EFFECTIVE_VALID)?;
    let log_probs = tb.log_probs(LogProbSource::Current);
    let old = tb.log_probs(LogProbSource::Old);
    let inputs = LossInputs {
        log_probs: required(log_probs, path, weaver::LOG_PROBS)?,
        old_log_probs: Some(required(old, path, weaver::OLD_LOG_PROBS)?),
        ref_log_probs: None,
        advantages: required(tb.advantages.as_ref(), path, weaver::ADVANTAGES)?,
        mask: mask.clone(),
        entropy: weaver_entropy(tree, step, rank, micro, mask.dims())?,
    };
    let out = compute(&inputs, cfg).map_err(|e| kerr(path, e))?;
    let t = mask.dims().get(1).copied().unwrap_or(1);
    let m = to_f64_vec(&mask).map_err(|e| kerr(path, e))?;
    let mut first_divergence = None;
    if let Some(dumped) = &tb.ratio {
        let ours = to_f64_vec(&out.ratio).map_err(|e| kerr(path, e))?;
        let d = to_f64_vec(&candle_of(dumped)?).map_err(|e| kerr(path, e))?;
        first_divergence = first_diff(weaver::PROB_RATIO, &d, &ours, &m, t, tol);
    }
    if first_divergence.is_none() {
        if let Some(dumped) = &tb.per_token_loss {
            let ours = to_f64_vec(&out.per_token_loss).map_err(|e| kerr(path, e))?;
            let d = to_f64_vec(&candle_of(dumped)?).map_err(|e| kerr(path, e))?;
            first_divergence = first_diff(weaver::ELEMENTWISE_LOSS, &d, &ours, &m, t, tol);
        }
    }
    let dumped_loss = scalar(&v, path, weaver::LOSS)?;
    let recomputed_loss = to_f64(&out.loss).map_err(|e| kerr(path, e))?;
    let tokens = m.iter().filter(|x| **x != 0.0).count();
    let mut notes = Vec::new();
    if first_divergence.is_none() {
        notes.extend(sum_not_mean(dumped_loss, recomputed_loss, tokens, tol));
    }
    let checks = match tree.get(Kind::Loss, step, Some(rank), Some(micro)) {
        Some(lf) => {
            let rec = weaver::loss_record(&lf.path, &read_any(&lf.path)?)?;
            loss_file_checks(&rec, &out, tokens, tol)
        }
        None => Vec::new(),
    };
    let ok = tol.allows(dumped_loss, recomputed_loss)
        && first_divergence.is_none()
        && checks.iter().all(|c| c.ok);
    Ok(Verdict {
        file: file.path.clone(),
        layout: Layout::Weaver,
        step,
        rank,
        micro,
        status: if ok {
            Status::Consistent
        } else {
            Status::Inconsistent
        },
        dumped_loss,
        recomputed_loss,
        first_divergence,
        checks,
        tokens,
        notes,
    })
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
    let lf = tree
        .get(Kind::Loss, step, Some(rank), Some(micro))
        .ok_or_else(|| {
            Error::input(
                &tree.root,
                format!("no loss file for step {step} rank {rank} micro {micro} (nothing dumped to check)"),
            )
        })?;
    let mi = batch.micro_inputs(tree, step, rank, micro)?;
    let ff = mi.forward_file.as_path();
    let out = compute(&mi.inputs, cfg).map_err(|e| kerr(ff, e))?;
    let m = to_f64_vec(&mi.inputs.mask).map_err(|e| kerr(ff, e))?;
    let tokens = m.iter().filter(|x| **x != 0.0).count();
    let rec = keys::loss_record(&lf.path, &read_any(&lf.path)?)?;
    let dumped_loss = rec.loss.ok_or_else(|| {
        Error::format(
            &lf.path,
            Position::Key(keys::LOSS.into()),
            "missing or not a number",
        )
    })?;
    let recomputed_loss = to_f64(&out.loss).map_err(|e| kerr(ff, e))?;
    let checks = loss_file_checks(&rec, &out, tokens, tol);
    let mut notes = mi.notes;
    notes.extend(sum_not_mean(dumped_loss, recomputed_loss, tokens, tol));
    if let Some(&c) = rec.coefficients.get(keys::ENTROPY_COEFF) {
        if c != cfg.entropy_coeff {
            notes.push(format!(
                "{} says entropy_coeff {c} but the check used {} (--entropy-coeff)",
                lf.path.display(),
                cfg.entropy_coeff
            ));
        }
    }
    let ok = checks.iter().all(|c| c.ok) && tol.allows(dumped_loss, recomputed_loss);
    Ok(Verdict {
        file: lf.path.clone(),
        layout: Layout::SelfHosted,
        step,
        rank,
        micro,
        status: if ok {
            Status::Consistent
        } else {
            Status::Inconsistent
        },
        dumped_loss,
        recomputed_loss,
        first_divergence: None,
        checks,
        tokens,
        notes,
    })
}

/// The layout `tree` holds at `step`: weaver when it has `is_loss_debug/` files there,
/// self-hosted when it has `forward_data/`, `old_log_probs/` and `trajectory/`; `None`
/// otherwise (e.g. remote-API trees, which dump no per-micro inputs).
pub fn layout_of(tree: &DumpTree, step: i64) -> Option<Layout> {
    let has = |k: Kind| tree.files_of(k, step).next().is_some();
    if has(Kind::IsLossDebug) {
        Some(Layout::Weaver)
    } else if has(Kind::ForwardData) && has(Kind::OldLogProbs) && has(Kind::Trajectory) {
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

/// A dump tree's step made ready for self-consistency checks: its layout and, for the
/// self-hosted layout, the whole-batch inputs (trajectories, old log-probs, advantages)
/// read once for every rank/micro checked.
pub struct StepCheck<'a> {
    tree: &'a DumpTree,
    step: i64,
    layout: Layout,
    batch: Option<SelfHostedStep>,
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
        Ok(StepCheck {
            tree,
            step,
            layout,
            batch,
        })
    }

    /// [`StepCheck::new`] with the self-hosted whole-batch files taken from `whole`
    /// (the value of the trajectory/ or old_log_probs/ file of `step`, when the caller has
    /// read it already) and the trajectories from `traj` when given, instead of read
    /// again; a file `whole` lacks is read from disk.
    pub fn with_values(
        tree: &'a DumpTree,
        step: i64,
        cfg: &LossConfig,
        whole: &dyn Fn(Kind) -> Option<&'a Value>,
        traj: Option<&self_hosted::TrajectorySummary>,
    ) -> Result<Self> {
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
        Ok(StepCheck {
            tree,
            step,
            layout,
            batch,
        })
    }

    /// The layout found.
    pub fn layout(&self) -> Layout {
        self.layout
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
/// files are read once).
pub fn check_tree(
    tree: &DumpTree,
    step: i64,
    rank: Option<u32>,
    micro: Option<u32>,
    cfg: &LossConfig,
    tol: &Tolerance,
) -> Result<Vec<Verdict>> {
    let layout = layout_of(tree, step).ok_or_else(|| no_layout(tree, step))?;
    let kind = match layout {
        Layout::Weaver => Kind::IsLossDebug,
        Layout::SelfHosted => Kind::ForwardData,
    };
    let mut cells: Vec<(u32, u32)> = tree
        .files_of(kind, step)
        .filter_map(|f| Some((f.rank?, f.micro?)))
        .filter(|(r, m)| rank.is_none_or(|x| x == *r) && micro.is_none_or(|x| x == *m))
        .collect();
    cells.sort_unstable();
    cells.dedup();
    if cells.is_empty() {
        return Err(Error::input(
            &tree.root,
            format!(
                "no {kind} files for step {step}{}{}",
                rank.map(|r| format!(" rank {r}")).unwrap_or_default(),
                micro.map(|m| format!(" micro {m}")).unwrap_or_default(),
            ),
        ));
    }
    let check = StepCheck::new(tree, step, cfg)?;
    cells
        .into_iter()
        .map(|(r, m)| check.check(r, m, cfg, tol))
        .collect()
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
    })
}

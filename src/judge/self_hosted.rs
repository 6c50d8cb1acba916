//! Self-hosted dump trees (NexRL self-hosted trainer, SPEC §2): the inputs of one micro's
//! loss are spread over three kinds of file, so they are put back together here.
//!
//! - `forward_data/step_N_rankR_microM`: `log_probs` `[mb, T]`, `response_mask` `[mb, T]`,
//!   `entropy` `[mb, T]`, `input_ids` `[mb, S]` (prompt left-padded to `S − T`, then the
//!   response right-padded to `T`).
//! - `old_log_probs/step_N`: the whole batch `[N, T']`, rows in `trajectory/step_N` order.
//! - `trajectory/step_N`: `trajectories[i]` with `tokens`, `loss_mask`, `reward`,
//!   `extra_fields.group_id` (or `uid`).
//!
//! Each micro row is matched to its trajectory by content ([`tokens_hash`] of the prompt
//! without its left padding followed by the response; the response alone when that is
//! ambiguous or absent), never by position. Advantages are recomputed from the step's
//! rewards and group ids with the preset's [`AdvantageConfig`] and rounded to f32 unless
//! the dumped log-probs are f64 (a torch trainer holds advantages in float32).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

use crate::error::{Error, Position, Result};
use crate::formats::read_any;
use crate::kernels::advantage::{group_advantages_runs, AdvantageConfig};
use crate::kernels::loss::LossInputs;
use crate::model::step::{LogProbSource, TokenTensor};
use crate::model::tokens::tokens_hash;
use crate::model::trajectory::nexrl_batch_order;
pub use crate::model::trajectory::{TrajectoryRow, TrajectorySummary};
use crate::producers::layout::{DumpTree, Kind};
use crate::producers::nexrl_self_hosted;
pub use crate::producers::nexrl_self_hosted::group_of;
use crate::tensor::DType;
use crate::value::Value;

mod advantages;
mod by_order;
use crate::compare::metrics::effective_dtype;
use advantages::advantages_of;
pub use advantages::Advantages;
pub use by_order::Dealer;

/// The whole-batch half of a self-hosted step: every trajectory's advantage and old
/// log-probs, and indexes from token content to trajectory. Load once per step, then
/// [`SelfHostedStep::micro_inputs`] for each rank/micro.
#[derive(Debug, Clone)]
pub struct SelfHostedStep {
    /// `trajectory/step_N` file.
    pub trajectory_file: PathBuf,
    /// `old_log_probs/step_N` file (the folder, when the tree dumps one file per micro).
    pub old_file: PathBuf,
    /// The whole-batch old log-probs `[n, cols]`, read a row at a time, or
    /// [`OldRows::PerMicro`]: each micro's own `old_log_probs/step_N_rankR_microM` file, rows
    /// in its forward_data order.
    pub(super) old: OldRows,
    /// Columns of the whole-batch old log-probs.
    pub(super) cols: usize,
    /// Per-trajectory reward, group and advantage (f64 of the f32 value, see module doc).
    pub(super) rewards: Vec<f64>,
    groups: Vec<String>,
    /// Each trajectory's run id (NexRL's two-stage advantage mean when runs repeat).
    runs: Vec<Option<String>>,
    advantages_f64: Vec<f64>,
    advantages_f32: Vec<f64>,
    /// `tokens_hash(prompt ++ response)` → trajectory indices.
    by_tokens: HashMap<u64, Vec<usize>>,
    /// `tokens_hash(response)` (tokens under `loss_mask == 1`) → trajectory indices.
    by_response: HashMap<u64, Vec<usize>>,
    /// Each trajectory's response length (valid tokens), to place rows without ids.
    pub(super) response_lens: Vec<Option<usize>>,
    /// NexRL's batch order of the trajectories (batch position → trajectory index,
    /// [`nexrl_batch_order`]) when their ids give one other than the file's.
    pub(super) batch_order: Option<Vec<usize>>,
    /// Trajectory index → row of the whole-batch `old_log_probs`, once
    /// [`SelfHostedStep::settle_old_order`] found the rows in NexRL's batch order;
    /// `None`: in trajectory-file order.
    pub(super) old_of_traj: Option<Vec<usize>>,
    /// Every forward_data cell's rows' valid counts, read once when rows are placed by
    /// where NexRL deals them ([`by_order`]).
    pub(super) dealt_cells: std::sync::OnceLock<Vec<by_order::CellRows>>,
}

/// The whole-batch old log-probs: the dumped tensor itself (its storage shared with the
/// file's map, each needed row widened to f64 when a micro reads it, so no f64 copy of
/// the batch is held), or an f64 copy when it is not a contiguous real tensor (a list).
#[derive(Debug, Clone)]
pub(super) enum OldRows {
    Tensor(crate::tensor::Tensor),
    Dense(Vec<f64>),
    PerMicro,
    /// None dumped: NexRL's `old_log_prob = log_prob.detach()` (core_algos.py:307, 6860191).
    Current,
}

impl OldRows {
    fn of(t: Option<&TokenTensor>, path: &Path) -> Result<(Vec<usize>, OldRows)> {
        match t.map(|t| &t.tensor) {
            Some(x) if x.is_contiguous() && !x.dtype().is_complex() && x.ndim() == 2 => {
                Ok((x.shape().to_vec(), OldRows::Tensor(x.clone())))
            }
            _ => {
                let (shape, old, _) = dense(t, path, nexrl_self_hosted::OLD_LOG_PROBS)?;
                Ok((shape, OldRows::Dense(old)))
            }
        }
    }

    /// Row `i` (of `cols` values; `i` is below the row count, checked at load) as f64.
    pub(super) fn row(&self, i: usize, cols: usize) -> std::borrow::Cow<'_, [f64]> {
        match self {
            OldRows::Dense(v) => std::borrow::Cow::Borrowed(&v[i * cols..(i + 1) * cols]),
            OldRows::PerMicro | OldRows::Current => std::borrow::Cow::Owned(Vec::new()),
            OldRows::Tensor(t) => {
                let s = t.dtype().size();
                let start = (t.offset() + i * cols) * s;
                let bytes = t.storage_bytes()[start..start + cols * s].to_vec();
                let row = crate::tensor::Tensor::from_le_bytes(t.dtype(), vec![cols], bytes)
                    .map(|r| r.to_f64_vec())
                    .unwrap_or_default();
                std::borrow::Cow::Owned(row)
            }
        }
    }
}

/// One micro's inputs in the self-hosted layout, with where each row came from.
#[derive(Debug, Clone)]
pub struct MicroInputs {
    /// Inputs for [`crate::kernels::loss::compute`] (f64; log-probs under a zero mask
    /// replaced by 0 so that padding NaN cannot leak into masked sums).
    pub inputs: LossInputs,
    /// The trajectory index (row of `old_log_probs`) of each micro row.
    pub trajectory_rows: Vec<usize>,
    /// The advantage used for each micro row.
    pub advantages: Vec<f64>,
    /// The forward_data file.
    pub forward_file: PathBuf,
    /// Findings worth a note (e.g. two trajectories with the same tokens).
    pub notes: Vec<String>,
    /// The dtype the entropy was stored in (its rounding bounds the entropy term).
    pub entropy_dtype: Option<DType>,
    /// The dtype the log-probs were stored in.
    pub logprob_dtype: Option<DType>,
    /// The log-probs are not f64: the trainer held advantages in f32.
    pub f32_trainer: bool,
}

pub(super) fn key_err(path: &Path, key: &str, msg: &str) -> Error {
    Error::format(path, Position::Key(key.to_string()), msg.to_string())
}

/// `(shape, row-major f64 values, stored dtype)` of a tensor the producer mapping read
/// (`None`: the file lacks `key`).
pub(super) fn dense(
    t: Option<&TokenTensor>,
    path: &Path,
    key: &str,
) -> Result<(Vec<usize>, Vec<f64>, Option<DType>)> {
    let t = t.ok_or_else(|| key_err(path, key, "missing (self-hosted layout needs it)"))?;
    Ok((t.tensor.shape().to_vec(), t.tensor.to_f64_vec(), t.dtype))
}

/// The rounding `values` carry: their stored dtype, else — a list of numbers (NexRL's
/// `dump_format: jsonl`) has none — the grid the values themselves lie on (bf16 log-probs
/// written as JSON numbers). Asked only of the tensors whose rounding is used.
/// The stored dtype, or the coarsest one every value under the mask fits (a jsonl dump
/// states none); values outside the mask are nobody's numbers and never make it finer.
fn stored_or_detected(dtype: Option<DType>, values: &[f64], mask: &[f64]) -> Option<DType> {
    dtype.or_else(|| {
        let inside: Vec<f64> = values
            .iter()
            .zip(mask)
            .filter(|(_, m)| **m != 0.0)
            .map(|(v, _)| *v)
            .collect();
        Some(effective_dtype(DType::F64, &inside))
    })
}

fn dims2(path: &Path, key: &str, shape: &[usize]) -> Result<(usize, usize)> {
    match shape {
        [b, t] => Ok((*b, *t)),
        d => Err(key_err(
            path,
            key,
            &format!("must be 2-d [B, T], got shape {d:?}"),
        )),
    }
}

fn round_f32(x: f64) -> f64 {
    x as f32 as f64
}

impl SelfHostedStep {
    /// Read `trajectory/step_N` and `old_log_probs/step_N` of `tree` and compute every
    /// trajectory's advantage under `adv`.
    ///
    /// Errors: either file absent or unreadable; a trajectory without `tokens`, `reward`
    /// or a group id (named by index); `old_log_probs` not `[n, T]` with `n` the number of
    /// trajectories (both sizes named).
    pub fn load(tree: &DumpTree, step: i64, adv: &AdvantageConfig) -> Result<SelfHostedStep> {
        let need = |kind: Kind| {
            tree.get(kind, step, None, None).ok_or_else(|| {
                Error::input(
                    &tree.root,
                    format!(
                        "no {kind}/ file for step {step} (the self-hosted layout needs \
                     trajectory/, old_log_probs/, forward_data/ and loss/)"
                    ),
                )
            })
        };
        let tf = need(Kind::Trajectory)?.path.clone();
        let tv = read_any(&tf)?;
        if tree.get(Kind::OldLogProbs, step, None, None).is_none() {
            let summary = || -> Result<TrajectorySummary> {
                Ok(TrajectorySummary::of(&nexrl_self_hosted::trajectories(
                    &tf, &tv,
                )?))
            };
            if let Some(f) = tree.files_of(Kind::OldLogProbs, step).next() {
                // per-micro old_log_probs: each micro reads its own file
                let dir = f.path.parent().unwrap_or(&tree.root).to_path_buf();
                return Self::from_summary_per_micro(&summary()?, dir, adv);
            }
            // none at all: NexRL's old_log_prob = log_prob.detach() (ratio 1)
            let mut s = Self::from_parts(&summary()?, adv)?;
            s.old = OldRows::Current;
            return Ok(s);
        }
        let of = need(Kind::OldLogProbs)?.path.clone();
        let ov = read_any(&of)?;
        Self::from_values(tf, &tv, of, &ov, adv)
    }

    /// [`SelfHostedStep::from_summary`] for a tree that dumps `old_log_probs` per micro
    /// (`old_log_probs/step_N_rankR_microM`, rows in the micro's forward_data order) in the
    /// folder `dir`: each micro reads its own file in [`SelfHostedStep::micro_inputs`].
    pub fn from_summary_per_micro(
        ts: &TrajectorySummary,
        dir: PathBuf,
        adv: &AdvantageConfig,
    ) -> Result<SelfHostedStep> {
        let mut s = Self::from_parts(ts, adv)?;
        s.old_file = dir;
        Ok(s)
    }

    /// [`SelfHostedStep::load`] from the two whole-batch files already read (`tv` from
    /// trajectory file `tf`, `ov` from old_log_probs file `of`, named in errors), so that a
    /// caller that holds them (dumpdiff) does not read them again.
    pub fn from_values(
        tf: PathBuf,
        tv: &Value,
        of: PathBuf,
        ov: &Value,
        adv: &AdvantageConfig,
    ) -> Result<SelfHostedStep> {
        let summary = TrajectorySummary::of(&nexrl_self_hosted::trajectories(&tf, tv)?);
        Self::from_summary(&summary, of, ov, adv)
    }

    /// [`SelfHostedStep::from_summary`] of the old log-probs' record as a tool holds it.
    pub fn from_summary_record(
        ts: &TrajectorySummary,
        of: PathBuf,
        ov: &crate::model::record::Record,
        adv: &AdvantageConfig,
    ) -> Result<SelfHostedStep> {
        Self::from_summary(ts, of, ov.raw(), adv)
    }

    /// [`SelfHostedStep::from_values`] from the trajectories' summary (what a caller
    /// keeps of the trajectory file once its token lists are no longer needed).
    pub fn from_summary(
        ts: &TrajectorySummary,
        of: PathBuf,
        ov: &Value,
        adv: &AdvantageConfig,
    ) -> Result<SelfHostedStep> {
        let mut s = Self::from_parts(ts, adv)?;
        let ob = nexrl_self_hosted::old_log_probs(&of, ov)?;
        let (shape, old) = OldRows::of(ob.log_probs(LogProbSource::Old), &of)?;
        let (n, cols) = dims2(&of, nexrl_self_hosted::OLD_LOG_PROBS, &shape)?;
        if n != s.rewards.len() {
            return Err(key_err(
                &of,
                nexrl_self_hosted::OLD_LOG_PROBS,
                &format!(
                    "has {n} rows but {} holds {} trajectories (rows must follow the \
                     trajectory order)",
                    s.trajectory_file.display(),
                    s.rewards.len()
                ),
            ));
        }
        s.old_file = of;
        s.old = old;
        s.cols = cols;
        Ok(s)
    }

    /// The trajectories' half: rewards, groups, advantages and the token indexes (old
    /// log-probs still [`OldRows::PerMicro`]).
    fn from_parts(ts: &TrajectorySummary, adv: &AdvantageConfig) -> Result<SelfHostedStep> {
        let tf = ts.file.clone();
        let mut rewards = Vec::with_capacity(ts.rows.len());
        let mut groups = Vec::with_capacity(ts.rows.len());
        let mut by_tokens: HashMap<u64, Vec<usize>> = HashMap::new();
        let mut by_response: HashMap<u64, Vec<usize>> = HashMap::new();
        let mut response_lens = Vec::with_capacity(ts.rows.len());
        for (i, t) in ts.rows.iter().enumerate() {
            let at = |k: &str| format!("trajectories[{i}].{k}");
            let tokens = t
                .tokens
                .ok_or_else(|| key_err(&tf, &at("tokens"), "missing or not a list of ints"))?;
            let reward = t
                .reward
                .ok_or_else(|| key_err(&tf, &at("reward"), "missing or not a number"))?;
            let group = t.group.clone().ok_or_else(|| {
                key_err(
                    &tf,
                    &at("extra_fields.group_id"),
                    "missing (needed to group rewards into advantages)",
                )
            })?;
            by_tokens.entry(tokens).or_default().push(i);
            if let Some(r) = t.response {
                by_response.entry(r).or_default().push(i);
            }
            rewards.push(reward);
            groups.push(group);
            response_lens.push(t.response_len);
        }
        let runs: Vec<Option<String>> = ts.rows.iter().map(|t| t.ids.run_id.clone()).collect();
        let (advantages_f64, advantages_f32) = advantages_of(&tf, &rewards, (&groups, &runs), adv)?;
        Ok(SelfHostedStep {
            old_file: tf.clone(),
            trajectory_file: tf,
            old: OldRows::PerMicro,
            cols: 0,
            rewards,
            groups,
            runs,
            advantages_f64,
            advantages_f32,
            by_tokens,
            by_response,
            response_lens,
            batch_order: nexrl_batch_order(
                &ts.rows.iter().map(|r| r.ids.clone()).collect::<Vec<_>>(),
            ),
            old_of_traj: None,
            dealt_cells: std::sync::OnceLock::new(),
        })
    }

    /// Trajectory index → row of the whole-batch `old_log_probs`, when
    /// [`SelfHostedStep::settle_old_order`] found them in NexRL's batch order.
    pub fn old_order(&self) -> Option<&[usize]> {
        self.old_of_traj.as_deref()
    }

    /// The row of the whole-batch `old_log_probs` that holds trajectory `i`.
    fn old_row(&self, i: usize) -> usize {
        self.old_of_traj.as_ref().map_or(i, |o| o[i])
    }

    /// Settle which order the whole-batch `old_log_probs` rows follow, from the data: the
    /// trajectory file's own, or NexRL's batch order ([`nexrl_batch_order`]: NexRL dumps
    /// `trajectory/` as the rollouts arrived, then sorts the batch and computes
    /// `old_log_probs` on the sorted batch). Both are tried on up to three cells of the
    /// step: the order under which each row's old log-probs sit closer to its current
    /// ones (mean `|log_probs − old_log_probs|` over the response; a first PPO epoch
    /// gives ~0, another row's tokens O(1)) is kept, NexRL's when its gap is at most half
    /// the file order's. Returns whether NexRL's order was
    /// kept, with the evidence in a sentence, when the trajectories give a batch order
    /// other than the file's; `None` otherwise (per-micro `old_log_probs`, no ids, or ids
    /// already in order).
    pub fn settle_old_order(&mut self, tree: &DumpTree, step: i64) -> Option<(bool, String)> {
        if matches!(self.old, OldRows::PerMicro | OldRows::Current) {
            return None;
        }
        let perm = self.batch_order.clone()?;
        let mut sorted = vec![0; perm.len()];
        for (j, i) in perm.iter().enumerate() {
            sorted[*i] = j;
        }
        let cells: Vec<(u32, u32)> = tree
            .files_of(Kind::ForwardData, step)
            .filter_map(|f| Some((f.rank?, f.micro?)))
            .take(3)
            .collect();
        if let Some(settled) = self.settle_by_lengths(tree, step, &cells, &perm, &sorted) {
            return Some(settled);
        }
        // mean |current − old| over every valid token of the cells, under each order: each
        // cell read once (its rows' trajectories do not depend on the order), the old row
        // of each trajectory then looked up under the file's order and under NexRL's
        self.old_of_traj = None;
        let mut sums = [(0.0, 0usize); 2];
        let mut read_all = true;
        for (r, m) in &cells {
            let Ok(mi) = self.micro_inputs(tree, step, *r, *m) else {
                read_all = false;
                break;
            };
            let (Ok(lp), Ok(mask)) = (
                crate::kernels::to_f64_vec(&mi.inputs.log_probs),
                crate::kernels::to_f64_vec(&mi.inputs.mask),
            ) else {
                read_all = false;
                break;
            };
            let t = lp.len() / mi.trajectory_rows.len().max(1);
            for (row, i) in mi.trajectory_rows.iter().enumerate() {
                for (k, old_row) in [*i, sorted[*i]].into_iter().enumerate() {
                    let old = self.old.row(old_row, self.cols);
                    for c in 0..t.min(old.len()) {
                        let (a, w) = (lp[row * t + c], mask[row * t + c]);
                        if w != 0.0 && a.is_finite() && old[c].is_finite() {
                            sums[k].0 += (a - old[c]).abs();
                            sums[k].1 += 1;
                        }
                    }
                }
            }
        }
        let gap = |(sum, n): (f64, usize)| (read_all && n > 0).then(|| sum / n as f64);
        let (file_gap, batch_gap) = (gap(sums[0]), gap(sums[1]));
        // NexRL's order only when it clearly fits better: half the file order's gap or less
        // (rows in an order neither explains leave both gaps alike and large)
        let batch_wins = match (file_gap, batch_gap) {
            (Some(f), Some(b)) => b <= 0.5 * f,
            (None, Some(_)) => true,
            _ => false,
        };
        self.old_of_traj = batch_wins.then_some(sorted);
        let num = |x: Option<f64>| x.map_or("not computable".into(), crate::fmt::num);
        let evidence = format!(
            "mean |log_probs − old_log_probs| {} vs {} in {} order, {} cells",
            num(if batch_wins { batch_gap } else { file_gap }),
            num(if batch_wins { file_gap } else { batch_gap }),
            if batch_wins {
                "trajectory-file"
            } else {
                "NexRL's batch"
            },
            cells.len(),
        );
        Some((batch_wins, evidence))
    }

    /// Every trajectory's advantage under `adv` instead (f64 and f32-rounded, by
    /// trajectory index): what [`SelfHostedStep::load`] with `adv` would compute, without
    /// reading the files again.
    ///
    /// Errors: as [`SelfHostedStep::load`]'s advantage computation.
    pub fn advantages_under(&self, adv: &AdvantageConfig) -> Result<Advantages> {
        let (f64s, f32s) = advantages_of(
            &self.trajectory_file,
            &self.rewards,
            (&self.groups, &self.runs),
            adv,
        )?;
        Ok(Advantages { f64s, f32s })
    }

    /// This step with `adv`'s advantages ([`SelfHostedStep::advantages_under`]).
    pub fn with_advantages(mut self, adv: Advantages) -> SelfHostedStep {
        self.advantages_f64 = adv.f64s;
        self.advantages_f32 = adv.f32s;
        self
    }

    /// Number of trajectories in the step.
    pub fn len(&self) -> usize {
        self.rewards.len()
    }

    /// True when the step holds no trajectory.
    pub fn is_empty(&self) -> bool {
        self.rewards.is_empty()
    }

    /// Group id of trajectory `i`.
    pub fn group(&self, i: usize) -> Option<&str> {
        self.groups.get(i).map(String::as_str)
    }

    /// Advantage of trajectory `i`: f64 as computed, or rounded to f32 (`f32 = true`).
    pub fn advantage(&self, i: usize, f32: bool) -> Option<f64> {
        let v = if f32 {
            &self.advantages_f32
        } else {
            &self.advantages_f64
        };
        v.get(i).copied()
    }

    /// The trajectory of one micro row by its token ids (`row_ids`: prompt left-padded,
    /// then the response under `m`, `t` wide), as the module doc says.
    fn row_by_tokens(
        &self,
        ff: &Path,
        row_ids: &[f64],
        m: &[f64],
        t: usize,
        (rank, micro, r): (u32, u32, usize),
        notes: &mut Vec<String>,
    ) -> Result<usize> {
        let s = row_ids.len();
        let prompt: Vec<i64> = row_ids[..s - t]
            .iter()
            .map(|x| *x as i64)
            .skip_while(|x| *x == 0)
            .collect();
        let response: Vec<i64> = row_ids[s - t..]
            .iter()
            .zip(m)
            .filter(|(_, m)| **m != 0.0)
            .map(|(x, _)| *x as i64)
            .collect();
        let full: Vec<i64> = prompt.iter().chain(&response).copied().collect();
        // a prompt left-padded with another pad id (Qwen's 151643): its leading run
        let first = row_ids.first().map(|x| *x as i64);
        let repadded = || -> Option<&Vec<usize>> {
            let p = first.filter(|p| *p != 0 && row_ids.get(1) == row_ids.first())?;
            let prompt = row_ids[..s - t]
                .iter()
                .map(|x| *x as i64)
                .skip_while(|x| *x == p);
            let full: Vec<i64> = prompt.chain(response.iter().copied()).collect();
            self.by_tokens.get(&tokens_hash(&full))
        };
        let candidates = self
            .by_tokens
            .get(&tokens_hash(&full))
            .or_else(repadded)
            .or_else(|| self.by_response.get(&tokens_hash(&response)))
            .ok_or_else(|| {
                key_err(
                    ff,
                    &format!("input_ids[{r}]"),
                    &format!(
                        "rank {rank} micro {micro} row {r}: its tokens match no trajectory \
                         of {}",
                        self.trajectory_file.display()
                    ),
                )
            })?;
        let i = candidates[0];
        if candidates.len() > 1 {
            notes.push(format!(
                "row {r} matches trajectories {candidates:?} (same tokens); took {i}"
            ));
        }
        Ok(i)
    }

    /// The loss inputs of `rank`/`micro`: its forward_data log-probs, mask and entropy,
    /// the matching rows of the whole-batch old log-probs (trimmed or zero-padded to the
    /// micro's width `T`), and each row's advantage broadcast over its valid tokens
    /// (`[mb]`, f64).
    ///
    /// Errors: no forward_data file; a missing key; shapes that disagree (both named); a
    /// row whose tokens match no trajectory (file and row named); a valid position beyond
    /// the whole-batch width.
    pub fn micro_inputs(
        &self,
        tree: &DumpTree,
        step: i64,
        rank: u32,
        micro: u32,
    ) -> Result<MicroInputs> {
        let ff = tree
            .get(Kind::ForwardData, step, Some(rank), Some(micro))
            .ok_or_else(|| {
                Error::input(
                    &tree.root,
                    format!("no forward_data file for step {step} rank {rank} micro {micro}"),
                )
            })?
            .path
            .clone();
        let fv = read_any(&ff)?;
        let fb = nexrl_self_hosted::forward_data(&ff, &fv)?;
        let lp_t = fb.log_probs(LogProbSource::Current);
        let (lshape, lp, ldtype) = dense(lp_t, &ff, nexrl_self_hosted::LOG_PROBS)?;
        let (b, t) = dims2(&ff, nexrl_self_hosted::LOG_PROBS, &lshape)?;
        let (mshape, mask, _) = dense(
            fb.response_mask.as_ref(),
            &ff,
            nexrl_self_hosted::RESPONSE_MASK,
        )?;
        if mshape != lshape {
            return Err(key_err(
                &ff,
                nexrl_self_hosted::RESPONSE_MASK,
                &format!("is {mshape:?} but log_probs is {lshape:?}"),
            ));
        }
        let ldtype = stored_or_detected(ldtype, &lp, &mask);
        // without token ids, the rows are placed among the old rows by their values
        let (ids, s, placed) = match fb.input_ids.as_ref() {
            Some(_) => {
                let (ishape, ids, _) =
                    dense(fb.input_ids.as_ref(), &ff, nexrl_self_hosted::INPUT_IDS)?;
                let (ib, s) = dims2(&ff, nexrl_self_hosted::INPUT_IDS, &ishape)?;
                if ib != b || s < t {
                    return Err(key_err(
                        &ff,
                        nexrl_self_hosted::INPUT_IDS,
                        &format!(
                            "is {ishape:?} but log_probs is {lshape:?} (expected [{b}, S ≥ \
                             {t}]: prompt then response)"
                        ),
                    ));
                }
                (ids, s, None)
            }
            None if matches!(self.old, OldRows::PerMicro | OldRows::Current) => (
                Vec::new(),
                0,
                Some(self.place_by_order(tree, step, (rank, micro), &ff)?),
            ),
            None => (Vec::new(), 0, Some(self.place_rows(&ff, &lp, &mask, t)?)),
        };
        let mut entropy_dtype = None;
        let mut entropy = match &fb.entropy {
            Some(et) => {
                let (eshape, e, edt) = dense(Some(et), &ff, nexrl_self_hosted::ENTROPY)?;
                entropy_dtype = stored_or_detected(edt, &e, &mask);
                if eshape != lshape {
                    return Err(key_err(
                        &ff,
                        nexrl_self_hosted::ENTROPY,
                        &format!("is {eshape:?} but log_probs is {lshape:?}"),
                    ));
                }
                Some(e)
            }
            None => None,
        };
        let reference = match fb.log_probs(LogProbSource::Reference) {
            Some(t) => {
                let (rshape, r, _) = dense(Some(t), &ff, nexrl_self_hosted::REF_LOG_PROBS)?;
                if rshape != lshape {
                    return Err(key_err(
                        &ff,
                        nexrl_self_hosted::REF_LOG_PROBS,
                        &format!("is {rshape:?} but log_probs is {lshape:?}"),
                    ));
                }
                Some(r)
            }
            None => None,
        };
        // per-micro old_log_probs: the micro's own file, rows in forward_data order
        let micro_old = match self.old {
            OldRows::PerMicro => {
                let of = tree
                    .get(Kind::OldLogProbs, step, Some(rank), Some(micro))
                    .ok_or_else(|| {
                        Error::input(
                            &tree.root,
                            format!(
                                "no old_log_probs file for step {step} rank {rank} micro \
                                 {micro} (this tree dumps old_log_probs per micro)"
                            ),
                        )
                    })?
                    .path
                    .clone();
                let ob = nexrl_self_hosted::old_log_probs(&of, &read_any(&of)?)?;
                let (oshape, o, _) = dense(
                    ob.log_probs(LogProbSource::Old),
                    &of,
                    nexrl_self_hosted::OLD_LOG_PROBS,
                )?;
                let (ob_rows, ocols) = dims2(&of, nexrl_self_hosted::OLD_LOG_PROBS, &oshape)?;
                if ob_rows != b {
                    return Err(key_err(
                        &of,
                        nexrl_self_hosted::OLD_LOG_PROBS,
                        &format!("is {oshape:?} but log_probs is {lshape:?} (rows must match)"),
                    ));
                }
                Some((of, o, ocols))
            }
            _ => None,
        };
        let f32_trainer = ldtype != Some(DType::F64);
        let mut notes = Vec::new();
        let mut rows = Vec::with_capacity(b);
        let mut adv = Vec::with_capacity(b);
        let mut old = vec![0.0; b * t];
        let mut logp = lp;
        if let Some((_, note)) = &placed {
            notes.push(note.clone());
        }
        for r in 0..b {
            let m = &mask[r * t..(r + 1) * t];
            let i = match &placed {
                Some((rows, _)) => rows[r],
                None => self.row_by_tokens(
                    &ff,
                    &ids[r * s..(r + 1) * s],
                    m,
                    t,
                    (rank, micro, r),
                    &mut notes,
                )?,
            };
            let a = self.advantage(i, f32_trainer).unwrap_or(f64::NAN);
            let (old_row, cols, old_file) = match &micro_old {
                Some((of, o, oc)) => (
                    std::borrow::Cow::Borrowed(&o[r * oc..(r + 1) * oc]),
                    *oc,
                    of,
                ),
                None => (
                    self.old.row(self.old_row(i), self.cols),
                    self.cols,
                    &self.old_file,
                ),
            };
            for c in 0..t {
                if m[c] == 0.0 {
                    // padding: NaN/junk here must not reach a masked sum (0 · NaN = NaN)
                    logp[r * t + c] = 0.0;
                    if let Some(e) = entropy.as_mut() {
                        e[r * t + c] = 0.0;
                    }
                    continue;
                }
                if matches!(self.old, OldRows::Current) && micro_old.is_none() {
                    old[r * t + c] = logp[r * t + c];
                    continue;
                }
                if c >= cols {
                    return Err(key_err(
                        old_file,
                        nexrl_self_hosted::OLD_LOG_PROBS,
                        &format!(
                            "is {cols} columns wide but rank {rank} micro {micro} row {r} has a \
                             valid token at position {c}"
                        ),
                    ));
                }
                old[r * t + c] = old_row[c];
            }
            rows.push(i);
            adv.push(a);
        }
        if matches!(self.old, OldRows::Current) {
            notes.push("no old_log_probs dumped: judged with old = log_prob (NexRL's do_old_log_prob_compute false: old_log_prob = log_prob.detach(), ratio 1)".into());
        }
        let dev = &Device::Cpu;
        let mk = |v: Vec<f64>| {
            Tensor::from_vec(v, (b, t), dev)
                .map_err(|e| Error::format(&ff, Position::File, e.to_string()))
        };
        let inputs = LossInputs {
            log_probs: mk(logp)?,
            old_log_probs: Some(mk(old)?),
            ref_log_probs: reference
                .map(|mut v| {
                    for (x, m) in v.iter_mut().zip(&mask) {
                        if *m == 0.0 {
                            *x = 0.0;
                        }
                    }
                    mk(v)
                })
                .transpose()?,
            advantages: Tensor::from_vec(adv.clone(), b, dev)
                .map_err(|e| Error::format(&ff, Position::File, e.to_string()))?,
            mask: mk(mask)?,
            entropy: entropy.map(mk).transpose()?,
            rollout_log_probs: None,
        };
        Ok(MicroInputs {
            inputs,
            trajectory_rows: rows,
            advantages: adv,
            forward_file: ff,
            notes,
            entropy_dtype,
            logprob_dtype: ldtype,
            f32_trainer,
        })
    }
}

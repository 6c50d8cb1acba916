//! Rows of a forward_data without `input_ids` placed when no whole-batch `old_log_probs`
//! can place them by their values (NexRL's `do_old_log_prob_compute: false` dumps none; a
//! tree may dump old log-probs per micro): by where NexRL deals them. Its trainer sorts
//! the batch (`_reorder_batch_by_group_and_run_id`, nexrl/trainer/self_hosted_grpo_trainer.py)
//! and hands contiguous rows to ranks, each rank's rows to its micros
//! (nexrl/train_service_backend/fsdp_worker/fsdp_actor.py `update_policy`, nex-agi/NexRL@6860191);
//! with `use_dynamic_bsz` verl's `rearrange_micro_batches` regroups a rank's rows.
//!
//! That is a picture of the producer, so it is checked against the data before it is used:
//! every row's valid count must equal its trajectory's response length, in every cell of
//! the step. Rows of one length inside one micro may be any of those trajectories — the
//! loss is a sum over the micro's rows — and are placed only when that choice cannot move
//! the cell's terms (old = current log-probs, ratio 1; or their trajectories' advantages
//! equal).

use std::path::Path;
use std::sync::OnceLock;

use super::{dense, key_err, OldRows, SelfHostedStep};
use crate::error::Result;
use crate::formats::read_any;
use crate::kernels::advantage::AdvantageConfig;
use crate::model::trajectory::TrajectorySummary;
use crate::producers::layout::{DumpTree, Kind};
use crate::producers::nexrl_self_hosted;

/// One forward_data cell: `(rank, micro)` and each row's valid count.
pub(super) type CellRows = ((u32, u32), Vec<usize>);

/// Where NexRL deals each forward_data row of a step that dumps neither token ids nor
/// old log-probs (`do_old_log_prob_compute: false`), asked cell by cell: dumpdiff places
/// such rows as losscheck does ([this module](self)). Building one reads nothing; the
/// step's forward_data files are read once, by the first cell that asks.
pub struct Dealer {
    step: SelfHostedStep,
    tree: DumpTree,
    at: i64,
    used: OnceLock<String>,
}

impl Dealer {
    /// A dealer of `tree`'s step `at` over the trajectories `ts` (`None` when a trajectory
    /// lacks what advantages need).
    pub fn new(
        ts: &TrajectorySummary,
        adv: &AdvantageConfig,
        tree: &DumpTree,
        at: i64,
    ) -> Option<Dealer> {
        let mut step = SelfHostedStep::from_parts(ts, adv).ok()?;
        step.old = OldRows::Current;
        Some(Dealer {
            step,
            tree: tree.clone(),
            at,
            used: OnceLock::new(),
        })
    }

    /// Each row's trajectory (by index in the trajectories) of `(rank, micro)` and how
    /// they were placed; `None` when no dealing fits the step's valid counts.
    pub fn rows(&self, rank: u32, micro: u32) -> Option<(Vec<usize>, String)> {
        let f = self
            .tree
            .get(Kind::ForwardData, self.at, Some(rank), Some(micro))?;
        let placed = self
            .step
            .place_by_order(&self.tree, self.at, (rank, micro), &f.path)
            .ok()?;
        self.used.get_or_init(|| placed.1.clone());
        Some(placed)
    }

    /// How the first cell that was placed was placed (`None`: no cell asked, or none fit).
    pub fn how(&self) -> Option<&str> {
        self.used.get().map(String::as_str)
    }
}

/// Each cell's trajectory per row, under one way of dealing the batch.
type Dealt = Vec<((u32, u32), Vec<usize>)>;

impl SelfHostedStep {
    /// The trajectory of each row of `(rank, micro)` and a note saying how they were
    /// placed ([`self`](self) module doc), for a step whose rows neither token ids nor
    /// whole-batch old log-probs place.
    ///
    /// Errors: no dealing fits the step's valid counts (named with what was tried).
    pub(super) fn place_by_order(
        &self,
        tree: &DumpTree,
        step: i64,
        (rank, micro): (u32, u32),
        ff: &Path,
    ) -> Result<(Vec<usize>, String)> {
        let cells = match self.dealt_cells.get() {
            Some(c) => c,
            None => {
                let c = cell_rows(tree, step)?;
                self.dealt_cells.get_or_init(|| c)
            }
        };
        let n = self.rewards.len();
        let total: usize = cells.iter().map(|(_, v)| v.len()).sum();
        let fail = |why: String| {
            key_err(
                ff,
                nexrl_self_hosted::INPUT_IDS,
                &format!("missing, and no old_log_probs place the rows by their values: {why}"),
            )
        };
        // ranks dealt in their numbers' order, as NexRL does; failing that, in the one
        // other order of the ranks that fits (the names a launcher gave its ranks)
        let dealings = rank_orders(cells);
        // fewer rows than trajectories: each rank's micro files hold its last
        // mini-batch (NexRL names them by micro index alone, so an earlier mini-batch's
        // are overwritten); each rank's share of the batch is then its tail
        let ranks = dealings[0].len().max(1);
        let share = match total.cmp(&n) {
            std::cmp::Ordering::Equal => None,
            std::cmp::Ordering::Less if n.is_multiple_of(ranks) => Some(n / ranks),
            _ => {
                return Err(fail(format!(
                    "the step's forward_data files hold {total} rows, its trajectory file {n}"
                )))
            }
        };
        let identity: Vec<usize> = (0..n).collect();
        let orders = self
            .batch_order
            .as_deref()
            .map(|o| ("NexRL's batch order", o))
            .into_iter()
            .chain([("trajectory-file order", identity.as_slice())]);
        let orders: Vec<(&str, &[usize])> = orders.collect();
        let tail = share.map_or(String::new(), |s| {
            format!(
                ", the micro files of each rank holding the last mini-batch of its {s} rows \
                 ({total} of {n} rows dumped: earlier mini-batches' files are overwritten)"
            )
        });
        let mut tried = Vec::new();
        let mut other: Vec<(Vec<u32>, String, Vec<usize>)> = Vec::new();
        for (k, ranks) in dealings.iter().enumerate() {
            let dealt_cells: Vec<CellRows> = ranks
                .iter()
                .flat_map(|r| cells.iter().filter(move |(c, _)| c.0 == *r).cloned())
                .collect();
            for (name, order) in &orders {
                for (how, per_rank) in [("micro by micro", false), ("rank by rank", true)] {
                    let rows_of = |dealt: Dealt| {
                        dealt
                            .into_iter()
                            .find(|(c, _)| *c == (rank, micro))
                            .map(|(_, r)| r)
                            .unwrap_or_default()
                    };
                    match self.deal(&dealt_cells, order, per_rank, share) {
                        Ok(dealt) if k == 0 => {
                            let note = format!(
                                "no input_ids and no whole-batch old_log_probs: rows placed as \
                                 NexRL deals them, {name} over ranks then micros ({how}){tail}; \
                                 every row's valid count equals its trajectory's response \
                                 length ({n} rows)"
                            );
                            return Ok((rows_of(dealt), note));
                        }
                        Ok(dealt) if !other.iter().any(|(r, _, _)| r == ranks) => {
                            let how = format!("{name} over ranks in the order {ranks:?} ({how})");
                            other.push((ranks.clone(), how, rows_of(dealt)));
                        }
                        Err(e) if k == 0 => tried.push(format!("{name} {how}: {e}")),
                        _ => {}
                    }
                }
            }
        }
        if let [(_, how, rows)] = other.as_slice() {
            let note = format!(
                "no input_ids and no whole-batch old_log_probs: rows placed as NexRL deals \
                 them, {how}{tail}: the only order of the ranks under which every row's valid \
                 count equals its trajectory's response length ({n} rows)"
            );
            return Ok((rows.clone(), note));
        }
        if other.len() > 1 {
            tried.push(format!(
                "{} other orders of the ranks fit alike",
                other.len()
            ));
        }
        Err(fail(tried.join("; ")))
    }

    /// Deal `order` (batch position → trajectory) to `cells` in rank then micro order:
    /// each micro takes the next rows (`per_rank`: each rank takes the next rows, its
    /// micros any of them, as `rearrange_micro_batches` regroups them), a row the first
    /// unused trajectory of its length. Errors when a row has none, or when two
    /// trajectories a row could be would give its cell different terms.
    /// With `share`, rank k's rows are the last of positions `k·share .. (k+1)·share`.
    fn deal(
        &self,
        cells: &[CellRows],
        order: &[usize],
        per_rank: bool,
        share: Option<usize>,
    ) -> Result<Dealt, String> {
        let mut out = Vec::with_capacity(cells.len());
        let mut at = 0;
        let mut i = 0;
        let mut rank_at = 0;
        while i < cells.len() {
            // the cells that draw from one pool of rows
            let rank = cells[i].0 .0;
            if let Some(s) = share {
                if i == 0 || cells[i - 1].0 .0 != rank {
                    let rank_rows: usize = cells[i..]
                        .iter()
                        .take_while(|(c, _)| c.0 == rank)
                        .map(|(_, v)| v.len())
                        .sum();
                    if rank_rows > s {
                        return Err(format!(
                            "rank {rank} holds {rank_rows} rows, more than its share {s}"
                        ));
                    }
                    at = rank_at * s + (s - rank_rows);
                    rank_at += 1;
                }
            }
            let j = if per_rank {
                i + cells[i..].iter().take_while(|(c, _)| c.0 == rank).count()
            } else {
                i + 1
            };
            let rows: usize = cells[i..j].iter().map(|(_, v)| v.len()).sum();
            let pool = &order[at..at + rows];
            let mut used = vec![false; pool.len()];
            for (cell, valid) in &cells[i..j] {
                let mut placed = Vec::with_capacity(valid.len());
                for (r, len) in valid.iter().enumerate() {
                    let fits: Vec<usize> = (0..pool.len())
                        .filter(|k| !used[*k] && self.response_lens[pool[*k]] == Some(*len))
                        .collect();
                    let Some(k) = fits.first() else {
                        return Err(format!(
                            "rank {} micro {} row {r} has {len} valid tokens, no trajectory \
                             left among its rows has that response length",
                            cell.0, cell.1
                        ));
                    };
                    // a choice that could move the cell's terms is not made
                    if (per_rank || !matches!(self.old, OldRows::Current))
                        && fits
                            .iter()
                            .any(|k2| !self.same_advantage(pool[*k], pool[*k2]))
                    {
                        return Err(format!(
                            "rank {} micro {} row {r}: trajectories of {len} tokens with \
                             different advantages could be it",
                            cell.0, cell.1
                        ));
                    }
                    used[*k] = true;
                    placed.push(pool[*k]);
                }
                out.push((*cell, placed));
            }
            at += rows;
            i = j;
        }
        Ok(out)
    }

    fn same_advantage(&self, a: usize, b: usize) -> bool {
        self.advantages_f64[a] == self.advantages_f64[b]
    }
}

/// The ranks of `cells` in their numbers' order first, then every other order (none past
/// six ranks: 720 dealings).
fn rank_orders(cells: &[CellRows]) -> Vec<Vec<u32>> {
    let mut ranks: Vec<u32> = cells.iter().map(|(c, _)| c.0).collect();
    ranks.dedup();
    let mut out = vec![ranks.clone()];
    if ranks.len() > 6 {
        return out;
    }
    fn permute(head: &mut Vec<u32>, rest: &[u32], out: &mut Vec<Vec<u32>>) {
        if rest.is_empty() {
            if out[0] != *head {
                out.push(head.clone());
            }
            return;
        }
        for (i, r) in rest.iter().enumerate() {
            head.push(*r);
            let others: Vec<u32> = rest
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, r)| *r)
                .collect();
            permute(head, &others, out);
            head.pop();
        }
    }
    permute(&mut Vec::new(), &ranks, &mut out);
    out
}

/// Every forward_data cell of `step` in rank then micro order, with its rows' valid
/// counts (`response_mask`).
fn cell_rows(tree: &DumpTree, step: i64) -> Result<Vec<CellRows>> {
    let mut files: Vec<(u32, u32, &Path)> = tree
        .files_of(Kind::ForwardData, step)
        .filter_map(|f| Some((f.rank?, f.micro?, f.path.as_path())))
        .collect();
    files.sort_unstable_by_key(|(r, m, _)| (*r, *m));
    files
        .into_iter()
        .map(|(r, m, path)| {
            let fb = nexrl_self_hosted::forward_data(path, &read_any(path)?)?;
            let (shape, mask, _) = dense(
                fb.response_mask.as_ref(),
                path,
                nexrl_self_hosted::RESPONSE_MASK,
            )?;
            let t = shape.last().copied().unwrap_or(0).max(1);
            let valid = mask
                .chunks(t)
                .map(|row| row.iter().filter(|x| **x != 0.0).count())
                .collect();
            Ok(((r, m), valid))
        })
        .collect()
}

//! Cell builders: a cell from its comparisons, the `forward_data` cell, section 6's tensor
//! cells, the batch inputs a micro's rows are located by.

use super::*;

/// Build a cell from its comparisons: the verdict is the worst, the reason the worst one's.
pub fn cell(
    rank: Option<u32>,
    micro: Option<u32>,
    rows: Option<RowSummary>,
    comparisons: Vec<Comparison>,
) -> Cell {
    let worst = comparisons.iter().max_by_key(|c| c.verdict);
    let (verdict, reason) = match worst {
        Some(c) if c.verdict > Verdict::Pass => (c.verdict, format!("{}: {}", c.name, c.reason)),
        Some(_) => (
            Verdict::Pass,
            format!(
                "{} compared, all within tolerance",
                comparisons
                    .iter()
                    .filter(|c| c.verdict == Verdict::Pass)
                    .count()
            ),
        ),
        None => (Verdict::Skipped, "nothing to compare".into()),
    };
    let verdict =
        if comparisons.iter().all(|c| c.verdict == Verdict::Skipped) && !comparisons.is_empty() {
            Verdict::Skipped
        } else {
            verdict
        };
    Cell {
        rank,
        micro,
        verdict,
        reason,
        rows,
        comparisons,
    }
}

/// A cell present on one side only.
pub fn missing_cell(rank: Option<u32>, micro: Option<u32>, present: &str, missing: &str) -> Cell {
    Cell {
        rank,
        micro,
        verdict: Verdict::Missing,
        reason: format!("present on {present} only, missing on {missing}"),
        rows: None,
        comparisons: vec![],
    }
}

/// The coarser precision of two log-prob tensors, when both are there.
pub fn logprob_precision(a: Option<&Mat>, b: Option<&Mat>) -> Option<DType> {
    Some(coarser(a?.precision(), b?.precision()))
}

/// Section 2: `forward_data` — response_mask exactly, log_probs and entropy mask-aware.
/// Rows pair through `a`'s and `b_ids`' token ids (`b_ids`: the weaver file holding
/// them, `b` itself or its `batch_inputs`).
pub fn forward_data_cell(
    policy: &TolerancePolicy,
    rank: u32,
    micro: u32,
    a: &Tensors<'_>,
    b: &Tensors<'_>,
    b_ids: &Tensors<'_>,
) -> Cell {
    let (lp_a, lp_b) = (a.mat(Field::LogProbs), b.mat(Field::LogProbs));
    let (ma, mb) = (a.mat(Field::ResponseMask), b.mat(Field::ResponseMask));
    let na = lp_a.as_ref().map_or(0, |m| m.rows);
    let nb = lp_b.as_ref().map_or(0, |m| m.rows);
    let rows = pair_rows(a, Some(b_ids), na, nb);
    let ctx = PairCtx {
        policy,
        section: "forward_data",
        rows: &rows,
        mask_a: ma.as_deref(),
        mask_b: mb.as_deref(),
        cell_precision: None,
    };
    let mut out = Vec::new();
    match (&ma, &mb) {
        (Some(x), Some(y)) => out.push(ctx.exact_rows(
            "response_mask",
            x,
            y,
            Origin::dumped("forward_data", "response_mask"),
            Origin::dumped("forward_data", "response_mask"),
        )),
        _ => out.push(skipped(
            "forward_data",
            "response_mask",
            "not dumped on both sides",
        )),
    }
    super::unattributed(
        &mut out,
        &["forward_data.response_mask"],
        "the response mask differs: tokens one side counts as response and the other does not",
    );
    match (&lp_a, &lp_b) {
        (Some(x), Some(y)) => out.push(ctx.logprobs_memo(
            x,
            y,
            mb.as_ref(),
            &rows,
            Origin::dumped("forward_data", "log_probs"),
            Origin::dumped("forward_data", "log_probs"),
            &a.logprobs,
        )),
        _ => out.push(skipped(
            "forward_data",
            "log_probs",
            "not dumped on both sides",
        )),
    }
    match (a.mat(Field::Entropy), b.mat(Field::Entropy)) {
        (Some(x), Some(y)) => out.push(ctx.masked(
            "entropy",
            &x,
            &y,
            Origin::dumped("forward_data", "entropy"),
            Origin::dumped("forward_data", "entropy"),
            false,
            false,
        )),
        _ => out.push(skipped(
            "forward_data",
            "entropy",
            "not dumped on both sides",
        )),
    }
    if !rows.only_a.is_empty() || !rows.only_b.is_empty() {
        out.push(row_coverage_fail("forward_data", &rows));
    }
    name_systematic_entropy(&mut out);
    cell(Some(rank), Some(micro), Some(row_summary(&rows)), out)
}

/// A failing `forward_data.entropy` that differs at most tokens yet correlates with the
/// other side's (pearson ≥ 0.9) is a systematic change of the distribution, not a
/// misalignment (a shift or a row swap decorrelates it): its reason says what gives that
/// shape — logits divided by a sampling temperature on one side only (verl and NexRL
/// divide before `log_softmax`), or a distribution truncated on one side (top-k/top-p).
/// The entropy sums over the whole vocabulary, so it shows the change where the sampled
/// tokens' log-probs can stay within their 16-bit tolerance.
fn name_systematic_entropy(out: &mut [Comparison]) {
    for x in out
        .iter_mut()
        .filter(|x| x.name == "forward_data.entropy" && x.verdict == Verdict::Fail)
    {
        let Some(m) = x.metrics.as_ref().filter(|m| m.systematic()) else {
            continue;
        };
        x.reason = format!(
            "{} — {:.0} % of the tokens differ, each still correlated with the other \
             side's (pearson {:.3}): a systematic change of the distribution, such as \
             logits divided by a sampling temperature on one side only, or a top-k/top-p \
             truncation on one side",
            x.reason,
            100.0 * m.beyond_fraction,
            m.pearson.unwrap_or(0.0)
        );
    }
}

/// A failing pseudo-comparison for rows that found no partner by content.
pub(super) fn row_coverage_fail(section: &str, rows: &RowMatch) -> Comparison {
    let mut c = skipped(section, "rows", "");
    c.verdict = Verdict::Fail;
    c.reason = format!(
        "rows without a content match: reference {:?}, other {:?}",
        rows.only_a, rows.only_b
    );
    c
}

/// Whole-batch inputs the self-hosted side needs to mirror weaver's `is_loss_debug`.
pub struct BatchInputs {
    /// `old_log_probs` `[B, R]` from `old_log_probs/step_N`.
    pub old_log_probs: Option<Mat>,
    /// Token hash of each trajectory → its batch index.
    pub traj_index: HashMap<u64, usize>,
    /// The same of each trajectory's `tokens[:-1]` (the datum layout's input tokens).
    pub traj_short: HashMap<u64, usize>,
    /// Per-trajectory advantages by batch index: remote-api `prepared_trajectories`, else
    /// recomputed from the trajectories' rewards and groups with the preset's convention.
    pub advantages: Option<Vec<f64>>,
    /// Where `advantages` came from, for the report's origin labels.
    pub advantages_from: String,
    /// Micros per rank on the self-hosted side (for contiguous slicing without trajectories).
    pub micros_per_rank: usize,
    /// When `advantages` were recomputed: per batch index `(r − mean, std)` of the group
    /// normalisation, from which a dumped advantage implies the epsilon.
    pub adv_parts: Option<Vec<(f64, f64)>>,
    /// The epsilon the recomputed `advantages` used.
    pub adv_eps: Option<f64>,
    /// Trajectory index → row of `old_log_probs`, when its rows follow NexRL's batch
    /// order rather than the trajectory file's ([`crate::judge::SelfHostedStep::settle_old_order`]).
    pub old_of_traj: Option<Vec<usize>>,
    /// Each trajectory's response length (by batch index), to place rows without ids.
    pub response_lens: Vec<Option<usize>>,
    /// Each row's trajectory as NexRL deals a step with neither token ids nor old
    /// log-probs ([`crate::judge::Dealer`]).
    pub dealer: Option<std::sync::Arc<crate::judge::Dealer>>,
}

impl BatchInputs {
    /// The `old_log_probs` row of trajectory (batch index) `i`.
    pub fn old_row(&self, i: usize) -> Option<usize> {
        match &self.old_of_traj {
            Some(o) => o.get(i).copied(),
            None => Some(i),
        }
    }
}

/// Change `c`'s comparisons with `edit`; its verdict and reason then follow them again
/// (as [`cell`] sets them), its coordinates and rows kept.
pub fn rework(c: &mut Cell, edit: impl FnOnce(&mut Vec<Comparison>)) {
    let mut comparisons = std::mem::take(&mut c.comparisons);
    edit(&mut comparisons);
    *c = cell(c.rank, c.micro, c.rows.take(), comparisons);
}

/// The batch indices of a self-hosted micro's rows: by token content through the
/// trajectory file, else contiguous (`(rank·micros + micro)·rows + row`).
pub(super) fn batch_indices(
    inputs: &BatchInputs,
    fwd: &Tensors<'_>,
    rank: u32,
    micro: u32,
    nrows: usize,
) -> (Vec<Option<usize>>, String) {
    // padding stripped as 0, else as the pad id the file shows (any pad id)
    let pads = std::iter::once(Some(0)).chain(std::iter::once(fwd.pad_candidate()));
    for pad in pads.flatten() {
        let Some(tok) = fwd.input_ids_pad(pad) else {
            continue;
        };
        if !inputs.traj_index.is_empty() {
            let idx: Vec<Option<usize>> = (0..tok.len())
                .map(|i| {
                    tok.hash(i, false)
                        .and_then(|h| inputs.traj_index.get(&h).copied())
                })
                .collect();
            if idx.iter().all(Option::is_some) {
                return (idx, "rows located in the batch by token hash".into());
            }
        }
    }
    if let Some(idx) = placed_by_values(inputs, fwd) {
        return (
            idx,
            "rows located in the batch by their log-probs against old_log_probs (no input_ids)"
                .into(),
        );
    }
    // no old log-probs at all: where NexRL deals the rows, checked against every cell's
    // valid counts (losscheck's placement; seed 8461: arrival-order trajectories)
    if inputs.old_log_probs.is_none() {
        if let Some((rows, how)) = inputs.dealer.as_ref().and_then(|d| d.rows(rank, micro)) {
            if rows.len() == nrows {
                return (rows.into_iter().map(Some).collect(), how);
            }
        }
    }
    // contiguous batch positions: rows of old_log_probs, whose trajectories follow from
    // the settled batch order
    let base = (rank as usize * inputs.micros_per_rank + micro as usize) * nrows;
    let traj_of = traj_of_old(inputs, inputs.old_log_probs.as_ref().map_or(0, |m| m.rows));
    let idx: Vec<usize> = (0..nrows)
        .map(|r| traj_of.get(base + r).copied().unwrap_or(base + r))
        .collect();
    // a guess the trajectories contradict (a row's valid tokens against the response
    // length of the trajectory it would be: dynamic micros deal rows by length, seed 7937)
    // places nothing: the rows' old log-probs and advantages are then not compared
    let valid = fwd.mat(Field::ResponseMask).map(|m| {
        (0..m.rows)
            .map(|r| m.nonzero(r).iter().map(|run| run.len()).sum::<usize>())
            .collect::<Vec<_>>()
    });
    let contradicted = valid.as_ref().is_some_and(|valid| {
        idx.iter().zip(valid).any(|(i, n)| {
            inputs
                .response_lens
                .get(*i)
                .copied()
                .flatten()
                .is_some_and(|len| len != *n)
        })
    });
    if contradicted {
        return (
            vec![None; nrows],
            format!(
                "{UNPLACED}: no input_ids, their log-probs place them nowhere clearly, and the \
                 contiguous batch positions hold trajectories of other response lengths"
            ),
        );
    }
    (
        idx.into_iter().map(Some).collect(),
        "rows located in the batch contiguously".into(),
    )
}

/// Why a chain's rows have no old log-probs or advantages: [`batch_indices`]' own words
/// when it placed no row, else `otherwise`.
pub(super) fn unplaced<'a>(ch: &'a Chain, otherwise: &'a str) -> &'a str {
    if ch.how.starts_with(UNPLACED) {
        &ch.how
    } else {
        otherwise
    }
}

/// How [`batch_indices`] says it placed no row.
const UNPLACED: &str = "rows not placed in the batch";

/// A self-hosted forward_data without input_ids whose log-probs pair no rows with the
/// other side's (a sampling temperature on one side moves every log-prob: seed 7006, whose
/// rows were then paired by index): each side's rows placed in the batch — the
/// self-hosted ones by their log-probs against their own whole-batch old_log_probs
/// ([`placed_by_values`]), the other side's by their token ids through the trajectory
/// file — and paired where both name one trajectory, for every comparison of the cell.
/// Nothing when the rows pair by content or by values, or a row is not placed.
pub fn pair_through_batch(inputs: &BatchInputs, a: &Tensors<'_>, b: Option<&Tensors<'_>>) {
    let Some(b) = b else { return };
    if inputs.traj_index.is_empty() || a.input_ids().is_some() || a.content_rows(b).is_some() {
        return;
    }
    let (Some(ia), Some(ib)) = (placed_by_values(inputs, a), other_in_batch(inputs, b)) else {
        return;
    };
    let mut pairs = Vec::with_capacity(ia.len());
    for (ra, t) in ia.iter().enumerate() {
        match ib.iter().position(|u| u == t) {
            Some(rb) if t.is_some() && !pairs.iter().any(|p: &(usize, usize)| p.1 == rb) => {
                pairs.push((ra, rb))
            }
            _ => return,
        }
    }
    let only_b = (0..ib.len())
        .filter(|j| !pairs.iter().any(|p| p.1 == *j))
        .collect();
    let method = crate::compare::align::MatchMethod::Batch;
    let only_a = Vec::new();
    a.seed_pairing(
        b,
        RowMatch {
            pairs,
            only_a,
            only_b,
            method,
        },
    );
}

/// The batch index of each row of the other side's `input_ids` (pad 0 or the one its rows
/// show), through the trajectory file's token hashes — whole trajectories, or without
/// their last token (the datum layout, `tokens[:-1]`); `None` unless every row is placed.
fn other_in_batch(inputs: &BatchInputs, b: &Tensors<'_>) -> Option<Vec<Option<usize>>> {
    let pads = std::iter::once(Some(0)).chain(std::iter::once(b.pad_candidate()));
    for pad in pads.flatten() {
        let Some(tok) = b.input_ids_pad(pad) else {
            continue;
        };
        for index in [&inputs.traj_index, &inputs.traj_short] {
            let idx: Vec<Option<usize>> = (0..tok.len())
                .map(|j| index.get(&tok.hash(j, false)?).copied())
                .collect();
            if !idx.is_empty() && idx.iter().all(Option::is_some) {
                return Some(idx);
            }
        }
    }
    None
}

/// Old row → trajectory (batch index): the inverse of `old_of_traj` (identity without).
fn traj_of_old(inputs: &BatchInputs, n: usize) -> Vec<usize> {
    let mut traj_of_old: Vec<usize> = (0..n).collect();
    if let Some(o) = &inputs.old_of_traj {
        for (i, j) in o.iter().enumerate() {
            if let Some(slot) = traj_of_old.get_mut(*j) {
                *slot = i;
            }
        }
    }
    traj_of_old
}

/// The batch index of each row of a forward_data without token ids, from its log-probs
/// against the whole-batch `old_log_probs` ([`crate::judge::locate`], at the columns the
/// rows held before any realignment); `None` unless every row is placed.
fn placed_by_values(inputs: &BatchInputs, fwd: &Tensors<'_>) -> Option<Vec<Option<usize>>> {
    let old = inputs.old_log_probs.as_ref()?;
    let (lp, mask) = (fwd.mat(Field::LogProbs)?, fwd.mat(Field::ResponseMask)?);
    if lp.rows != mask.rows || lp.width != mask.width {
        return None;
    }
    let n = old.rows;
    let traj_of_old = traj_of_old(inputs, n);
    let (lpv, mv) = (lp.values(), mask.values());
    let (placed, _) = crate::judge::locate::locate_rows(
        (&lpv, &mv, lp.width),
        fwd.shifts().as_deref().map(Vec::as_slice),
        n,
        |j| old.row(j),
        |j| inputs.response_lens.get(traj_of_old[j]).copied().flatten(),
    );
    placed
        .into_iter()
        .map(|p| p.map(|p| Some(traj_of_old[p.old_row])))
        .collect()
}

/// The cells (rank, micro) whose `is_loss` comparison `name` fails.
pub fn failing_in_is_loss(sections: &[crate::dumpdiff::Section], name: &str) -> Vec<(u32, u32)> {
    sections
        .iter()
        .filter(|s| s.name == "is_loss")
        .flat_map(|s| &s.cells)
        .filter(|c| {
            c.comparisons
                .iter()
                .any(|x| x.name == name && x.verdict == Verdict::Fail)
        })
        .filter_map(|c| Some((c.rank?, c.micro?)))
        .collect()
}

/// A loss total that passes only within the error propagated from 16-bit log-probs
/// (its tolerance's `+ …` allowance) is failed when the same cell's advantages differ
/// (`is_loss.advantages` fails): the allowance bounds what rounding of inputs that agree
/// can do, and these inputs do not agree. Returns the cells changed.
pub fn totals_over_differing_inputs(sections: &mut [crate::dumpdiff::Section]) -> Vec<(u32, u32)> {
    // the advantages, the ratio level (a token ratio where the step's cells use GSPO's:
    // seed 7208's total moved within the 16-bit allowance), or the old log-probs (stale
    // ones: seed 8321's totals 19 % apart inside a bf16 allowance of 0.016)
    let differing: Vec<((u32, u32), &str, &str)> = [
        ("is_loss.advantages", "the cell's advantages differ"),
        ("is_loss.ratio_level", "the sides' ratio levels differ"),
        ("is_loss.old_log_probs", "the cell's old log-probs differ"),
    ]
    .into_iter()
    .flat_map(|(name, what)| {
        let cells = failing_in_is_loss(sections, name);
        cells.into_iter().map(move |k| (k, what, name))
    })
    .collect();
    let mut changed = Vec::new();
    for sec in sections
        .iter_mut()
        .filter(|s| s.name == "loss" || s.name == "is_loss")
    {
        for c in sec.cells.iter_mut() {
            let Some((key, what, name)) = c
                .rank
                .zip(c.micro)
                .and_then(|k| differing.iter().find(|d| d.0 == k).copied())
            else {
                continue;
            };
            let mut any = false;
            rework(c, |comparisons| {
                for x in comparisons.iter_mut().filter(|x| {
                    matches!(
                        x.name.as_str(),
                        "loss.loss" | "loss.pg_loss" | "is_loss.loss"
                    ) && x.verdict == Verdict::Pass
                }) {
                    let Some(d) = x.metrics.as_ref().and_then(|m| m.max_abs) else {
                        continue;
                    };
                    let base = x.tolerance.atol + x.tolerance.rtol * d.a.abs().max(d.b.abs());
                    if d.abs_diff > base {
                        x.verdict = Verdict::Fail;
                        x.reason = format!(
                            "|Δ| {} beyond atol {} rtol {}; within the error propagated from \
                             the log-probs, but {what} ({name}), so the difference is not \
                             their rounding",
                            crate::fmt::num(d.abs_diff),
                            crate::fmt::num(x.tolerance.atol),
                            crate::fmt::num(x.tolerance.rtol)
                        );
                        any = true;
                    }
                }
            });
            if any {
                changed.push(key);
            }
        }
        sec.verdict = sec.worst();
    }
    changed.sort_unstable();
    changed.dedup();
    changed
}

/// Section 6: one param or gradient tensor (`field`, compared under the section's name),
/// flat, at its dtype's tolerance.
pub fn tensor_cell(
    policy: &TolerancePolicy,
    section: &str,
    field: Field,
    rank: u32,
    micro: Option<u32>,
    a: &Record,
    b: &Record,
) -> Cell {
    let key = section;
    let rows = RowMatch::by_index(1, 1);
    let ctx = PairCtx {
        policy,
        section,
        rows: &rows,
        mask_a: None,
        mask_b: None,
        cell_precision: None,
    };
    let flat = |r: &Record| {
        let t = r.tensor(field)?;
        let data = t.to_f64_vec();
        Some(Mat::new(t.shape().to_vec(), 1, data.len(), data, t.dtype()))
    };
    let c = match (flat(a), flat(b)) {
        (Some(x), Some(y)) if x.shape == y.shape => ctx.masked(
            key,
            &x,
            &y,
            Origin::dumped(section, key),
            Origin::dumped(section, key),
            false,
            false,
        ),
        (Some(x), Some(y)) => {
            let mut c = skipped(
                section,
                key,
                format!("shape {:?} vs {:?}", x.shape, y.shape),
            );
            c.verdict = Verdict::Fail;
            c
        }
        _ => skipped(section, key, "not dumped on both sides"),
    };
    cell(Some(rank), micro, None, vec![c])
}

//! What the other side's own dumped values say of how it composed its ratio and per-token
//! loss, so that the reference side's are derived the same way before they are compared:
//! PPO's clipped surrogate or the plain importance-sampling loss, GSPO's sequence ratio
//! or the token ratio.

pub(super) use super::elem_loss::{candidates, dual_of, valid_positions, ElemLoss};
use super::*;

/// The per-token loss convention the other side's own dumped `prob_ratio`, `advantages`
/// and `elementwise_loss` follow: the plain `−A·r`, else PPO's clipped surrogate under the
/// clip range the reference loss file echoes or a customary one (0.2/0.2, DAPO's
/// 0.2/0.28; dual clip 3 or none), whichever reproduces the most of its valid elements to
/// f32 — the plain loss unless a clipped one reproduces more.
pub(super) fn elem_convention(b_is: &Tensors<'_>, a_loss: Option<&Record>) -> ElemFit {
    let none = ElemFit {
        conv: ElemLoss::Plain,
        reproduced: 0,
        valid: 0,
        weight_like: false,
    };
    let (Some(r), Some(a), Some(el)) = (
        b_is.mat(Field::ProbRatio),
        b_is.mat(Field::Advantages),
        b_is.mat(Field::ElementwiseLoss),
    ) else {
        return none;
    };
    let mask = b_is.mat(Field::EffectiveMask);
    if (r.rows, r.width) != (el.rows, el.width) || (a.rows, a.width) != (el.rows, el.width) {
        return none;
    }
    // the elements `conv` reproduces, and whether every other one is `conv` times a
    // weight-like factor in [0, 10] (a truncated importance weight, an IcePop zero)
    let fit = |conv: ElemLoss| -> (usize, bool) {
        let (mut n, mut weight_like) = (0, true);
        for row in 0..el.rows {
            let (rr, ar, er) = (r.row(row), a.row(row), el.row(row));
            for p in valid_positions(mask.as_deref(), el.rows, el.width, row) {
                let want = conv.of(rr[p], ar[p]);
                if (er[p] - want).abs() <= 8.0 * 2f64.powi(-24) * want.abs().max(er[p].abs()) {
                    n += 1;
                } else {
                    let w = er[p] / want;
                    // 0: an IcePop band zeroes the token; 10 to f32: a cap of 10 reached
                    weight_like &= want.abs() > 1e-12 && (0.0..=10.0 * (1.0 + 1e-5)).contains(&w);
                }
            }
        }
        (n, weight_like)
    };
    let reproduced = |conv: ElemLoss| fit(conv).0;
    let valid: usize = (0..el.rows)
        .map(|row| valid_positions(mask.as_deref(), el.rows, el.width, row).len())
        .sum();
    let mut best = (ElemLoss::Plain, reproduced(ElemLoss::Plain));
    if best.1 < valid {
        for conv in candidates(a_loss, dual_read(b_is)).into_iter().skip(1) {
            let n = reproduced(conv);
            if n > best.1 {
                best = (conv, n);
            }
        }
    }
    ElemFit {
        conv: best.0,
        reproduced: best.1,
        valid,
        weight_like: best.1 < valid && fit(best.0).1,
    }
}

/// The per-token loss convention [`elem_convention`] found, with how many of the other
/// side's valid elements it reproduces.
pub(super) struct ElemFit {
    /// The convention (the plain loss when nothing does better).
    pub conv: ElemLoss,
    /// Valid elements it reproduces to f32.
    pub reproduced: usize,
    /// Valid elements (0: nothing to fit).
    pub valid: usize,
    /// Every element it does not reproduce is it times a factor in (0, 10]: a per-token
    /// weight (verl's truncated importance weight is in (0, cap]).
    pub weight_like: bool,
}

impl ElemFit {
    /// "cannot judge …" when the other side's own per-token loss is its convention times
    /// a weight-like factor wherever the convention alone does not reproduce it: it then
    /// carries a per-token weight it does not dump (verl's truncated importance sampling
    /// against rollout log-probs not dumped), and this side's per-token loss cannot be
    /// derived, nor the loss scalars' difference attributed.
    pub fn unseen(&self) -> Option<String> {
        (self.valid > 0 && self.reproduced < self.valid && self.weight_like).then(|| {
            format!(
                "cannot judge which side is wrong: weaver's elementwise_loss is neither −A·r \
                 nor PPO's clipped surrogate of its own prob_ratio and advantages on {} of {} \
                 tokens — a per-token weight it does not dump (importance sampling against \
                 rollout log-probs not dumped?)",
                self.valid - self.reproduced,
                self.valid
            )
        })
    }
}

/// The per-token loss convention the reference side itself follows, when its own dumped
/// `pg_loss` tells: `other` (the other side's, [`elem_convention`]) when it reproduces
/// the reference's pg_loss as well as any candidate (within 10×), else the candidate
/// that reproduces it (within a tenth of a typical token's term) — a clip range differing
/// between the sides is then found by the comparison, not adopted. `other` when the
/// reference's loss cannot tell.
#[allow(clippy::too_many_arguments)]
pub(super) fn own_convention(
    other: ElemLoss,
    ratio: &Mat,
    adv: &Mat,
    mask: Option<&Mat>,
    agg: AggMode,
    pg: f64,
    a_loss: Option<&Record>,
) -> ElemLoss {
    let errors: Vec<(ElemLoss, f64)> = candidates(a_loss, dual_of(other))
        .into_iter()
        .chain(std::iter::once(other))
        .filter_map(|c| Some((c, pg_error(c, ratio, adv, mask, agg, pg)?)))
        .collect();
    let Some(&(best, e)) = errors.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
        return other;
    };
    let tied = |c: ElemLoss| {
        errors
            .iter()
            .any(|(x, ex)| *x == c && *ex <= 10.0 * e.max(1e-12))
    };
    if tied(other) || !pg_close(e, ratio, adv, mask) {
        other
    } else {
        best
    }
}

/// [`own_convention`] settled on the other side's own dumped `prob_ratio`, `advantages`
/// and loss mask, when the cell's comparisons (`out`) found them equal to the
/// reference's and every row paired (`paired`): they are then the reference's ratio at
/// f32, where the ratio re-derived from 16-bit log-probs blurs a clip range's few band
/// tokens below its rounding (seed 6023: clip_ratio_high 0.28 reproduces the
/// self-hosted pg_loss to 2e-10 on the weaver's ratio, the weaver's own 0.2 misses it by
/// 4.7e-3). A candidate other than `other` is taken only when it reproduces the
/// reference's pg_loss to 2e-6 of a typical token's term and `other` misses by more than
/// 1e-5 of it and by a hundred times the candidate's own error; else `None`. With the
/// candidate, what it shows in words ([`clip_bound_blurred`]).
pub(super) fn own_convention_dumped(
    other: ElemLoss,
    b_is: &Tensors<'_>,
    (out, paired): (&[Comparison], bool),
    agg: AggMode,
    pg: f64,
    a_loss: Option<&Record>,
) -> Option<(ElemLoss, String)> {
    let (err, scale) = dumped_error(b_is, (out, paired), agg, pg)?;
    let e_other = err(other)?;
    let (best, e) = candidates(a_loss, dual_read(b_is))
        .into_iter()
        .filter(|c| *c != other)
        .filter_map(|c| Some((c, err(c)?)))
        .min_by(|x, y| x.1.total_cmp(&y.1))?;
    // f32 terms reduced in f32 stay within a few 1e-7 of a term; a band token's clip moves
    // the pg term by far more
    (e <= 2e-6 * scale && e_other > 1e-5 * scale && e_other > 100.0 * e).then(|| {
        let (rb, ro) = (range_words(best), range_words(other));
        let why = format!(
            "the clip bound differs: on the weaver's own prob_ratio and advantages (equal to \
             the self-hosted's), the self-hosted pg_loss follows {rb} (to {}) and misses the \
             weaver's {ro} by {}, which the weaver's elementwise_loss follows — tokens between \
             the two bounds (clip_ratio_high / clip_ratio_low) clipped on one side only",
            crate::fmt::sig(e, 2, crate::fmt::Notation::Sci),
            crate::fmt::sig(e_other, 3, crate::fmt::Notation::Sci)
        );
        (best, why)
    })
}

/// On the other side's own dumped f32 `prob_ratio`, `advantages` and loss mask, when the
/// cell's comparisons (`out`) found them equal to the reference's and every row paired:
/// each convention's error against the reference's `pg_loss`, and a typical token's term.
#[allow(clippy::type_complexity)]
fn dumped_error(
    b_is: &Tensors<'_>,
    (out, paired): (&[Comparison], bool),
    agg: AggMode,
    pg: f64,
) -> Option<(Box<dyn Fn(ElemLoss) -> Option<f64>>, f64)> {
    let agree = ["prob_ratio", "advantages", "effective_valid"]
        .iter()
        .all(|n| {
            out.iter()
                .any(|x| x.name == format!("is_loss.{n}") && x.verdict == Verdict::Pass)
        });
    if !paired || !agree {
        return None;
    }
    let (r, a) = (b_is.mat(Field::ProbRatio)?, b_is.mat(Field::Advantages)?);
    let mask = b_is.mat(Field::EffectiveMask);
    let (vals, _) = valid_terms(ElemLoss::Plain, &r, &a, mask.as_deref())?;
    let scale = vals.iter().map(|v| v.abs()).sum::<f64>() / vals.len().max(1) as f64;
    let err = move |c: ElemLoss| pg_error(c, &r, &a, mask.as_deref(), agg, pg);
    Some((Box::new(err), scale))
}

/// `own` ([`own_convention`] on the 16-bit derived ratio) unless the other side's own
/// dumped f32 ratio ([`dumped_error`]) shows `other` reproducing the reference's pg_loss
/// to 2e-6 of a typical term: the clip range the blurred ratio suggested is then the
/// blur's, not the reference's (seed 7627: float16 log-probs on both sides read a
/// clip_ratio_high of 0.2 off a self-hosted pg_loss that follows 0.28 to f32).
pub(super) fn confirmed(
    other: ElemLoss,
    own: ElemLoss,
    b_is: &Tensors<'_>,
    out: (&[Comparison], bool),
    agg: AggMode,
    pg: f64,
) -> ElemLoss {
    match dumped_error(b_is, out, agg, pg) {
        Some((err, scale)) if err(other).is_some_and(|e| e <= 2e-6 * scale) => other,
        _ => own,
    }
}

/// When [`own_convention_dumped`] found the sides' clip ranges apart (`why`) and no
/// per-token comparison of the cell fails (the band tokens move the loss less than the
/// 16-bit log-probs' rounding), the cell gains a failing `is_loss.clip_bound` saying so:
/// both readings are to f32 on the same dumped values, so the difference is the sides'.
pub(super) fn clip_bound_blurred(out: &mut Vec<Comparison>, why: Option<&str>) {
    let Some(why) = why else { return };
    if out.iter().any(|x| x.verdict == Verdict::Fail) {
        return;
    }
    let mut c = skipped("is_loss", "clip_bound", why);
    c.verdict = Verdict::Fail;
    out.push(c);
}

/// The verl mode (`token-mean`, `seq-mean-token-mean`, `seq-mean-token-sum`) in which the
/// reference's own derived per-token loss (`conv` of the chain's ratio and advantages
/// over `mask`) gives its dumped `pg_loss`, when one does: within a tenth of a typical
/// token's term ([`pg_close`]) and every other mode ten times farther. `None` when none
/// or several do (one row of equal counts, zero advantages).
pub(super) fn self_mode(
    ch: &Chain,
    mask: Option<&Mat>,
    conv: ElemLoss,
    a_loss: Option<&Record>,
) -> Option<AggMode> {
    let (r, a) = (ch.ratio.as_ref()?, ch.adv.as_ref()?);
    let pg = a_loss?.number(Field::PgLoss)?.value;
    let (vals, counts) = valid_terms(conv, r, a, mask)?;
    let errs: Vec<(AggMode, f64)> = [
        AggMode::TokenMean,
        AggMode::SeqMeanTokenMean,
        AggMode::SeqMeanTokenSum,
    ]
    .into_iter()
    .map(|m| (m, (m.reduce_rows(&counts, &vals, r.width) - pg).abs()))
    .collect();
    let &(best, e) = errs.iter().min_by(|x, y| x.1.total_cmp(&y.1))?;
    let apart = errs
        .iter()
        .all(|(m, x)| *m == best || (*x > 10.0 * e && !pg_close(*x, r, a, mask)));
    (pg_close(e, r, a, mask) && apart).then_some(best)
}

/// A failing `is_loss.elementwise_loss` derived under the reference's own clip range
/// (`own`, what its `pg_loss` follows) where the other side's own dumped values follow
/// another (`other`, [`elem_convention`]): the reason names the bound that differs.
pub(super) fn name_clip_bound(out: &mut [Comparison], other: ElemLoss, own: ElemLoss) {
    let (
        ElemLoss::Clipped { lo, hi, dual },
        ElemLoss::Clipped {
            lo: olo,
            hi: ohi,
            dual: odual,
        },
    ) = (own, other)
    else {
        return;
    };
    let n = crate::fmt::num;
    let mut differs = Vec::new();
    if hi != ohi {
        differs.push(format!(
            "the upper clip bound (clip_ratio_high): 1+{} vs 1+{}",
            n(hi),
            n(ohi)
        ));
    }
    if lo != olo {
        differs.push(format!(
            "the lower clip bound (clip_ratio_low): 1−{} vs 1−{}",
            n(lo),
            n(olo)
        ));
    }
    if dual != odual {
        let d = |c: Option<f64>| c.map_or("none".to_string(), n);
        differs.push(format!(
            "the dual clip (clip_ratio_c): {} vs {}",
            d(dual),
            d(odual)
        ));
    }
    if differs.is_empty() {
        return;
    }
    for x in out
        .iter_mut()
        .filter(|x| x.name == "is_loss.elementwise_loss" && x.verdict == Verdict::Fail)
    {
        x.reason = format!(
            "{} — a clip bound differs: the self-hosted pg_loss follows its clip range and \
             the weaver's own per-token loss another, {} (self-hosted vs weaver)",
            x.reason,
            differs.join("; ")
        );
    }
}

/// `|pg − recompute|` of the per-token loss `conv` over `ratio` and `adv` at the valid
/// positions of `mask`, reduced under `agg` or whichever of verl's modes comes closest
/// ([`AggMode::reduce_rows`]); `None` when an element is not finite.
fn pg_error(
    conv: ElemLoss,
    ratio: &Mat,
    adv: &Mat,
    mask: Option<&Mat>,
    agg: AggMode,
    pg: f64,
) -> Option<f64> {
    let (vals, counts) = valid_terms(conv, ratio, adv, mask)?;
    let modes = [
        agg,
        AggMode::TokenMean,
        AggMode::SeqMeanTokenMean,
        AggMode::SeqMeanTokenSum,
    ];
    Some(
        modes
            .iter()
            .map(|m| (m.reduce_rows(&counts, &vals, ratio.width) - pg).abs())
            .fold(f64::INFINITY, f64::min),
    )
}

/// Whether a recompute error `e` is within a tenth of a typical token's term `|A·r|`
/// (stored 16-bit log-probs move a row's terms by a few 1e-3).
fn pg_close(e: f64, ratio: &Mat, adv: &Mat, mask: Option<&Mat>) -> bool {
    e <= 0.1 * pg_scale(ratio, adv, mask)
}

/// A typical token's term `|A·r|` (the mean over the valid tokens; 0 when none or one is
/// not finite).
fn pg_scale(ratio: &Mat, adv: &Mat, mask: Option<&Mat>) -> f64 {
    let Some((vals, _)) = valid_terms(ElemLoss::Plain, ratio, adv, mask) else {
        return 0.0;
    };
    vals.iter().map(|v| v.abs()).sum::<f64>() / vals.len().max(1) as f64
}

/// The per-token terms `conv(r, A)` at the valid positions of `mask` (all without one),
/// row after row, with each row's count; `None` when one is not finite.
pub(super) fn valid_terms(
    conv: ElemLoss,
    ratio: &Mat,
    adv: &Mat,
    mask: Option<&Mat>,
) -> Option<(Vec<f64>, Vec<usize>)> {
    valid_map(ratio, adv, mask, |r, a| conv.of(r, a))
}

/// `f(x, A)` of each valid element of `x` (`[rows, width]`) beside its advantage, at the
/// valid positions of `mask` (all without one), row after row, with each row's count;
/// `None` when `adv` is shorter or a value is not finite.
fn valid_map(
    x: &Mat,
    adv: &Mat,
    mask: Option<&Mat>,
    f: impl Fn(f64, f64) -> f64,
) -> Option<(Vec<f64>, Vec<usize>)> {
    let (xv, av) = (x.values(), adv.values());
    let w = x.width;
    if av.len() < xv.len() {
        return None;
    }
    let (mut vals, mut counts) = (Vec::new(), Vec::new());
    for row in 0..x.rows {
        let valid = valid_positions(mask, x.rows, w, row);
        counts.push(valid.len());
        for p in valid {
            vals.push(f(xv[row * w + p], av[row * w + p]));
        }
    }
    vals.iter().all(|v| v.is_finite()).then_some((vals, counts))
}

/// Whether a dumped ratio is GSPO-shaped: the same value (to one f32 ulp) at every valid
/// position of each row of two or more valid tokens (`Some(true)`), varying along one such
/// row (`Some(false)`), or without such a row (`None`). verl's sequence ratio is
/// `exp(log_prob − sg(log_prob) + sg(mean log-ratio))`: its first terms cancel exactly.
pub(super) fn sequence_shaped(r: &Mat, mask: Option<&Mat>) -> Option<bool> {
    let mut seen = false;
    for row in 0..r.rows {
        let values = r.row(row);
        let valid = valid_positions(mask, r.rows, r.width, row)
            .into_iter()
            .filter_map(|p| values.get(p).copied());
        match crate::conventions::ratio_level::row_shape(valid) {
            Some(false) => return Some(false),
            Some(true) => seen = true,
            None => {}
        }
    }
    seen.then_some(true)
}

/// GSPO's sequence ratio of a chain's token ratios `ratio` (verl
/// `compute_policy_loss_gspo`, `core_algos.py`, volcengine/verl@cc62eca: `s =
/// exp(mean over the row's response tokens of (log_prob − old_log_prob))`, the same at
/// every token), with its allowance `s·(e^Ē − 1)`, `Ē` the mean of the tokens' log-ratio
/// allowances (`allowed = r·(e^E − 1)`). Valid positions are the reference mask's
/// non-zero ones; the others keep the token values. Shapes `[rows, width]` as `ratio`.
pub(super) fn sequence_ratio(ratio: &Mat, allowed: &Mat, mask: Option<&Mat>) -> (Mat, Mat) {
    let (mut r, mut e) = (ratio.values().into_owned(), allowed.values().into_owned());
    let w = ratio.width;
    for row in 0..ratio.rows {
        let valid = valid_positions(mask, ratio.rows, w, row);
        if valid.is_empty() {
            continue;
        }
        let n = valid.len() as f64;
        let at = |p: usize| row * w + p;
        let mean_log = valid.iter().map(|&p| r[at(p)].ln()).sum::<f64>() / n;
        let mean_e = valid
            .iter()
            .map(|&p| (e[at(p)] / r[at(p)].abs()).ln_1p())
            .sum::<f64>()
            / n;
        let s = mean_log.exp();
        let es = propagate::ratio_allowed(s, mean_e);
        for &p in &valid {
            r[at(p)] = s;
            e[at(p)] = es;
        }
    }
    (
        ratio.with_data(r, DType::F64),
        allowed.with_data(e, allowed.dtype),
    )
}

/// A cell's `prob_ratio` and `elementwise_loss` derived at GSPO's sequence level, with
/// the shape of the other side's dumped ratio, for the step's choice of ratio level
/// ([`settle_ratio_level`]).
pub struct SequenceAlt {
    /// [`sequence_shaped`] of the other side's dumped ratio.
    pub shaped: Option<bool>,
    /// [`own_level`] of the reference side's dumped `pg_loss` (every shaped cell).
    pub own: Option<bool>,
    /// The sequence-level comparisons (computed only for a sequence-shaped cell), to
    /// replace the token-level ones of the same name.
    pub comparisons: Vec<Comparison>,
}

/// The step's ratio level, from the shapes of the other side's dumped ratios: sequence
/// (GSPO) when more cells show it than show a token ratio, and then each cell is judged
/// under it — a sequence-shaped cell by its sequence-level comparisons, a token-shaped one
/// failed as a ratio level differing from the step's. Cells are `(cell, alt)` pairs; the
/// note to add to the section when the step is sequence-level.
pub fn settle_ratio_level(cells: &mut [(Cell, Option<SequenceAlt>)]) -> Option<String> {
    let count = |want: bool, of: fn(&SequenceAlt) -> Option<bool>| {
        cells
            .iter()
            .filter(|(_, a)| a.as_ref().and_then(of) == Some(want))
            .count()
    };
    let (seq, tok) = (count(true, |a| a.shaped), count(false, |a| a.shaped));
    let (own_seq, own_tok) = (count(true, |a| a.own), count(false, |a| a.own));
    if seq + own_seq <= tok + own_tok {
        if seq > 0 && tok > 0 && seq + own_seq == tok + own_tok {
            // One step computing two levels is a departure somewhere, but a tie leaves
            // which cells depart unknown: said, no cell blamed.
            let ids = |want: bool| {
                cells
                    .iter()
                    .filter(|(_, a)| a.as_ref().and_then(|a| a.shaped) == Some(want))
                    .map(|(c, _)| {
                        format!(
                            "rank {} micro {}",
                            c.rank.unwrap_or(0),
                            c.micro.unwrap_or(0)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let note = format!(
                "ratio level: cannot judge — weaver's prob_ratio is constant along each row \
                 (GSPO's sequence ratio) in {} and varies (a token ratio) in {}, and the \
                 self-hosted pg_loss does not tell the two apart at its precision: one of \
                 the two sets departs from the configured level; each cell is compared at \
                 the level it shows",
                ids(true),
                ids(false)
            );
            for (cell, alt) in cells.iter_mut() {
                let Some(alt) = alt.take().filter(|a| a.shaped.is_some()) else {
                    continue;
                };
                rework(cell, |comparisons| {
                    if alt.shaped == Some(true) {
                        replace_by_name(comparisons, alt.comparisons);
                    }
                    // a cell flagged for another reason says its level is in doubt too
                    // (seed 9038: one GSPO-shaped cell, one token-shaped, no self-hosted
                    // ratio to tell)
                    for c in comparisons
                        .iter_mut()
                        .filter(|c| c.verdict >= Verdict::Warn)
                    {
                        c.reason = format!("{} ({note})", c.reason);
                    }
                });
            }
            return Some(note);
        }
        // A cell where the weaver's ratio varies along its rows while the self-hosted
        // pg_loss follows GSPO's sequence ratio: the sides compute at two levels, and the
        // step does not say which is configured — a warning, not a failure.
        let mut split = 0;
        for (cell, alt) in cells.iter_mut() {
            if alt
                .as_ref()
                .is_some_and(|a| a.shaped == Some(false) && a.own == Some(true))
            {
                split += 1;
                rework(cell, |comparisons| {
                    let mut c = skipped(
                        "is_loss",
                        "ratio_level",
                        "cannot judge which side is wrong: weaver's prob_ratio varies along \
                         its rows (a token ratio) while the self-hosted pg_loss follows GSPO's \
                         sequence ratio, and the step's other cells do not tell which level is \
                         configured",
                    );
                    c.verdict = Verdict::Warn;
                    comparisons.push(c);
                });
            }
        }
        return (split > 0).then(|| {
            format!(
                "ratio level: the sides differ in {split} cell(s) — the weaver's ratio is a \
                 token ratio, the self-hosted loss follows GSPO's sequence ratio; which is \
                 configured cannot be told (compared at the token level)"
            )
        });
    }
    for (cell, alt) in cells.iter_mut() {
        let Some(alt) = alt.take() else { continue };
        rework(cell, |comparisons| match alt.shaped {
            Some(true) => replace_by_name(comparisons, alt.comparisons),
            Some(false) => {
                let mut c = skipped(
                    "is_loss",
                    "ratio_level",
                    format!(
                        "weaver's prob_ratio varies along its rows (a token ratio) where \
                         {seq} of the step's cells use GSPO's sequence ratio"
                    ),
                );
                c.verdict = Verdict::Fail;
                comparisons.push(c);
            }
            None => {}
        });
    }
    let own = if own_seq + own_tok > 0 {
        format!(
            "; the sequence ratio reproduces the self-hosted pg_loss in {own_seq} cells, the \
             token ratio in {own_tok}"
        )
    } else {
        String::new()
    };
    Some(format!(
        "ratio level: sequence (GSPO) — weaver's prob_ratio is constant along each row in \
         {seq} cells, varies in {tok}{own}; the self-hosted ratio and per-token loss are \
         derived per sequence"
    ))
}

/// Put each of `new` in place of the comparison of the same name in `comparisons`
/// (appended when there is none).
fn replace_by_name(comparisons: &mut Vec<Comparison>, new: Vec<Comparison>) {
    for c in new {
        match comparisons.iter_mut().find(|x| x.name == c.name) {
            Some(x) => *x = c,
            None => comparisons.push(c),
        }
    }
}

/// The ratio level the reference side's own dumped `pg_loss` follows: its per-token loss
/// (`conv`) with the token ratio `ratio` and with GSPO's sequence ratio `seq` at the
/// valid positions of `mask`, reduced as its loss is ([`pg_error`]); `Some(true)` when
/// the sequence one is close ([`pg_close`]) and the token one ten times farther and
/// beyond what its inputs' stored precision allows (`allowed`, `seq_allowed`: each
/// ratio's allowance, reduced as `|A|·allowance`) or the sequence one reproduces it to
/// f32, `Some(false)` the other way round, else `None`. On-policy 16-bit log-probs give token ratios off 1 by their rounding
/// while the sequence mean cancels it: closer, yet the token level is not excluded
/// (seed 8025).
#[allow(clippy::too_many_arguments)]
pub(super) fn own_level(
    (ratio, allowed): (&Mat, &Mat),
    (seq, seq_allowed): (&Mat, &Mat),
    adv: &Mat,
    mask: Option<&Mat>,
    agg: AggMode,
    conv: ElemLoss,
    pg: f64,
) -> Option<bool> {
    let et = pg_error(conv, ratio, adv, mask, agg, pg)?;
    let es = pg_error(conv, seq, adv, mask, agg, pg)?;
    let scale = pg_scale(ratio, adv, mask);
    let close = |e: f64| e <= 0.1 * scale;
    let beyond =
        |e: f64, allowed: &Mat| pg_allowance(allowed, adv, mask, agg).is_some_and(|a| e > a);
    // excluded: an error beyond what the inputs' precision allows, or a rival that
    // reproduces the pg term to f32 (its inputs are what was computed from: seed 3009)
    let exact = |e: f64| e <= 1e-6 * scale;
    if et > 10.0 * es && close(es) && (beyond(et, allowed) || exact(es)) {
        Some(true)
    } else if es > 10.0 * et && close(et) && (beyond(es, seq_allowed) || exact(et)) {
        Some(false)
    } else {
        None
    }
}

/// How far a recomputed pg term may sit from the dumped one for its ratio's allowance
/// alone: `|A|·allowed` at the valid positions of `mask`, reduced as the loss is.
fn pg_allowance(allowed: &Mat, adv: &Mat, mask: Option<&Mat>, agg: AggMode) -> Option<f64> {
    let (vals, counts) = valid_map(allowed, adv, mask, |e, a| (e * a).abs())?;
    Some(agg.reduce_rows(&counts, &vals, allowed.width))
}

/// A cell's [`SequenceAlt`]: the shape of the weaver's dumped ratio and, for a
/// sequence-shaped one, the reference's ratio and per-token loss (`conv`) derived per
/// sequence and compared, with what the reference `pg_loss` says of the level. `masks`:
/// (reference, other side). `None` without a dumped weaver ratio.
pub(super) fn sequence_alt(
    ctx: &PairCtx<'_>,
    b_is: &Tensors<'_>,
    ch: &Chain,
    (mask_a, mask_b): (Option<&Mat>, Option<&Mat>),
    a_loss: Option<&Record>,
    conv: ElemLoss,
    tis: Option<&Tis>,
) -> Option<SequenceAlt> {
    let y = b_is.mat(Field::ProbRatio)?;
    let dumped_b = |k: &str| Origin::dumped("is_loss_debug", k);
    let shaped = sequence_shaped(&y, mask_b);
    let mut comparisons = Vec::new();
    let mut own = None;
    // What the reference side's own pg_loss says of the level counts in every cell whose
    // dumped ratio has a shape: a token-shaped cell of a GSPO step is where the other side
    // departs, and the reference's own loss there still shows the step's level.
    if let (Some(_), Some(x), Some(e), Some(a)) = (shaped, &ch.ratio, &ch.ratio_allowed, &ch.adv) {
        if let Some(pg) = a_loss.and_then(|l| l.number(Field::PgLoss)) {
            let (sr, se) = sequence_ratio(x, e, mask_a);
            own = own_level((x, e), (&sr, &se), a, mask_a, ch.agg, conv, pg.value);
        }
    }
    if let (Some(true), Some(x), Some(e)) = (shaped, &ch.ratio, &ch.ratio_allowed) {
        let (sr, se) = sequence_ratio(x, e, mask_a);
        comparisons.push(ctx.propagated(
            "prob_ratio",
            &sr,
            &y,
            Origin::derived(
                "exp(row mean of (forward_data.log_probs − old_log_probs)) (GSPO sequence ratio)",
            ),
            dumped_b("prob_ratio"),
            &se,
        ));
        if let (Some(a), Some(yb)) = (&ch.adv, b_is.mat(Field::ElementwiseLoss)) {
            let av = a.values();
            let el: Vec<f64> = sr
                .values()
                .iter()
                .zip(av.iter())
                .map(|(r, a)| conv.of(*r, *a))
                .collect();
            let ea: Vec<f64> = se
                .values()
                .iter()
                .zip(av.iter())
                .map(|(e, a)| propagate::product_allowed(*e, *a))
                .collect();
            let (mut el, mut ea) = (sr.with_data(el, sr.dtype), se.with_data(ea, se.dtype));
            if let Some(t) = tis {
                (el, ea) = t.apply(ctx.rows, &el, &ea);
            }
            let weights = tis.map_or(String::new(), Tis::words);
            comparisons.push(ctx.propagated(
                "elementwise_loss",
                &el,
                &yb,
                Origin::derived(format!(
                    "{}{weights} with GSPO's sequence ratio",
                    conv.words()
                )),
                dumped_b("elementwise_loss"),
                &ea,
            ));
        }
    }
    Some(SequenceAlt {
        shaped,
        own,
        comparisons,
    })
}

/// Each failing comparison of `out` named in `names` (dumped values on both sides) told
/// that the difference cannot be attributed: its reason ends with `why`. The difference
/// stays (the values do differ); which side is wrong is not said.
pub fn unattributed(out: &mut [Comparison], names: &[&str], why: &str) {
    for c in out.iter_mut() {
        if names.contains(&c.name.as_str()) && c.verdict == Verdict::Fail {
            c.reason = format!("{} — {why}", c.reason);
        }
    }
}

/// Each failing comparison of `out` named in `names` made a "cannot judge" (skipped, with
/// `why`): what the other side computed it from is not dumped, so this side's value
/// cannot be derived to compare.
pub fn cannot_judge(out: &mut [Comparison], names: &[&str], why: &str) {
    for c in out.iter_mut() {
        if names.contains(&c.name.as_str()) && c.verdict == Verdict::Fail {
            let (section, key) = c.name.split_once('.').unwrap_or(("", c.name.as_str()));
            *c = skipped(section, key, why);
        }
    }
}

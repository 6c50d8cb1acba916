//! A cell judged under its step's settled conventions ([`judge_under`]), and the cell that
//! dumps only its total when nothing states the coefficients of terms that total may hold
//! ([`Status::Undetermined`]): a total is one equation, and with an unknown coefficient it
//! can be explained but not checked.

use super::cell::{judge, Cell};
use super::infer::{self, Source};
use super::terms::{f32_compute, reduce, stored_rounding, weights};
use super::{kerr, Status, Tolerance, Verdict};
use crate::error::Result;
use crate::kernels::aggregate::AggMode;
use crate::kernels::kl::KlEstimator;
use crate::kernels::loss::{compute, KlPlacement, KlTerm};
use crate::kernels::{to_f64, to_f64_vec};

/// verl's pg aggregation modes a cell is tried under when no cell settles one.
const AGG_TRIED: [AggMode; 4] = [
    AggMode::TokenMean,
    AggMode::SeqMeanTokenSum,
    AggMode::SeqMeanTokenMean,
    AggMode::SeqMeanTokenSumNorm { horizon: None },
];

/// The largest coefficient an unstated entropy or KL term may take to explain a total.
/// Producers' defaults sit two orders of magnitude and more below it (NexRL
/// `entropy_coeff` 1e-4, verl `entropy_coeff` 0 and `kl_loss_coef` 1e-3, TRL `beta`
/// 0.04); a term weighed above the policy term would be no regulariser.
const MAX_COEF: f64 = 1.0;

/// The KL estimators an unstated KL term is tried with (verl's `kl_loss_type` choices).
const KL_TRIED: [KlEstimator; 3] = [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3Verl];

/// [`judge`] under a step's settled conventions. A cell that dumps only its total (weaver
/// without a `loss/` file) is judged with the fit's full standard errors (it is no
/// equation of the fit), and when it does not follow:
/// - on a step whose aggregation no evidence settled (no flag, no `extra_info`, no cell's
///   terms) it is judged under each of verl's modes in turn: a total that one of them
///   reproduces is consistent (the mode is named in a note), not a fault of a convention
///   nobody stated;
/// - when its intermediates follow, no other reduction explains it, and an entropy or KL
///   term whose coefficient nothing states would explain it with a coefficient in
///   `(0, MAX_COEF]`, it is undetermined (the coefficients that would explain it are named).
///
/// When the cells cannot tell the settled pg aggregation from another
/// ([`infer::Resolved::agg_rival`]), a cell judged consistent under one and inconsistent
/// under the other cannot be judged: which of them is the fault, the cells do not say.
pub(super) fn judge_under(
    cell: &Cell,
    resolved: &infer::Resolved,
    tol: &Tolerance,
) -> Result<Verdict> {
    let v = judge_settled(cell, resolved, tol)?;
    let Some((mut rival, n)) = resolved.agg_rival else {
        return Ok(v);
    };
    let mut other = resolved.clone();
    other.cfg.agg = rival;
    other.agg_rival = None;
    let mut w = judge_settled(cell, &other, tol)?;
    if n == 0 && v.status == Status::Inconsistent && w.status != Status::Consistent {
        // no cell tells the pg aggregation: each of verl's modes, not only the first rival
        for m in AGG_TRIED
            .into_iter()
            .filter(|m| ![resolved.cfg.agg, rival].contains(m))
        {
            other.cfg.agg = m;
            let x = judge_settled(cell, &other, tol)?;
            if x.status == Status::Consistent {
                (w, rival) = (x, m);
                break;
            }
        }
    }
    let decided = |x: &Verdict| matches!(x.status, Status::Consistent | Status::Inconsistent);
    if !(decided(&v) && decided(&w)) || v.status == w.status {
        return Ok(v);
    }
    let (follows, not) = match v.status {
        Status::Consistent => (resolved.cfg.agg, rival),
        _ => (rival, resolved.cfg.agg),
    };
    if n == 0 {
        // no cell tells the two apart: a cell's total that one of them reproduces is
        // consistent under it, as on a step whose aggregation nothing settled
        let mut ok = if v.status == Status::Consistent { v } else { w };
        ok.notes.push(format!(
            "no cell's terms tell {} from {}: this cell's total is {}'s",
            resolved.cfg.agg.name(),
            rival.name(),
            follows.name()
        ));
        return Ok(ok);
    }
    let mut notes = cell.notes.clone();
    notes.push(format!(
        "cannot judge the aggregation: the step's pg terms show {} and {} alike ({} each where they differ), and this cell's pg term follows {}, not {}",
        resolved.cfg.agg.name(),
        rival.name(),
        crate::fmt::plural(n, "cell"),
        follows.name(),
        not.name()
    ));
    Ok(Verdict {
        status: Status::Undetermined,
        notes,
        differs: Vec::new(),
        loss_ok: false,
        ..v
    })
}

/// [`judge_under`] under the settled conventions alone.
fn judge_settled(cell: &Cell, resolved: &infer::Resolved, tol: &Tolerance) -> Result<Verdict> {
    let total_only = cell.record.is_none();
    let unc = if total_only {
        resolved.total_uncertainty
    } else {
        resolved.uncertainty
    };
    let v = judge(cell, &resolved.cfg, tol, unc)?;
    let lone = lone_coefficient(resolved);
    let lone = lone.as_deref();
    if v.status == Status::Inconsistent && !total_only {
        let v = own_policy(cell, resolved, v, tol)?;
        if v.status != Status::Inconsistent {
            return Ok(v);
        }
        if let Some(w) = one_cell_scale(cell, resolved, tol)? {
            return Ok(w);
        }
        // every per-token value follows the step's conventions and only the pg term's
        // reduction differs (a sum where the step settled a mean): no picture of the
        // cell's own may call its weights unseen (seed 7879, one row under TIS)
        if v.first_divergence.is_none()
            && v.differs.iter().any(|d| d == "aggregation")
            && sum_not_settled_mode(cell, resolved)
        {
            return Ok(v);
        }
        // a pg term that is the plain sum of its own dumped per-token loss where the
        // other cells' pg terms show a mean of theirs: a fault whatever weights that
        // per-token loss holds (seed 8534: TIS weights unseen, one row of two valid, where
        // seq-mean-token-sum is the sum too; not the entropy terms' mode: seed 7573)
        if resolved.own_pg_mode.is_some_and(|m| pg_not_mode(cell, m)) {
            let w = own_sum(cell, v.clone());
            if w.own_sum {
                return Ok(w);
            }
        }
        // per-token weights the dump does not hold, under the step's policy loss or
        // under a real producer's clip bound / ratio level of the cell's own
        if let Some(w) = unseen_weights(cell, &resolved.cfg, &v, tol, (lone, unc.entropy_coeff))? {
            return Ok(w);
        }
        let base = &resolved.cfg;
        for cfg in super::picture::policy_candidates(
            base,
            &[],
            super::picture::dual_shown(std::slice::from_ref(cell)),
        ) {
            // under the candidate's weights, else under none the dump states (the
            // step's weights are read under the step's policy loss, not this cell's)
            let mut plain = cfg.clone();
            plain.rollout_is = None;
            let tries = std::iter::once(cfg).chain(
                (plain.rollout_is != base.rollout_is && cell.inputs.rollout_log_probs.is_some())
                    .then_some(plain),
            );
            for cfg in tries {
                let w = judge(cell, &cfg, tol, unc)?;
                if let Some(mut w) = unseen_weights(cell, &cfg, &w, tol, (lone, unc.entropy_coeff))?
                {
                    w.notes.insert(
                        1,
                        format!(
                            "judged under {}, not the step's convention: this cell computes its policy loss otherwise",
                            super::picture::policy_words(&cfg)
                        ),
                    );
                    return Ok(w);
                }
            }
        }
        // weights other than the token-level TIS its dumped rollout log-probs give (another
        // cap, an IcePop band, sequence-level weights): judged against the unweighted loss
        if let Some(is) = base
            .rollout_is
            .filter(|_| cell.inputs.rollout_log_probs.is_some())
        {
            let mut plain = base.clone();
            plain.rollout_is = None;
            let w = judge(cell, &plain, tol, unc)?;
            if let Some(mut w) = unseen_weights(cell, &plain, &w, tol, (lone, unc.entropy_coeff))? {
                w.notes.insert(
                    1,
                    format!(
                        "the step's importance weights of its dumped rollout_log_probs \
                         ({}: {}) do not give them, nor any cap, IcePop band or \
                         sequence-level weight its own values allow",
                        is.words(),
                        is.formula()
                    ),
                );
                return Ok(w);
            }
        }
        return Ok(super::shifted::own_shift(cell, own_sum(cell, v)));
    }
    if v.status == Status::Consistent {
        return Ok(lone_total(resolved, v));
    }
    if v.status != Status::Inconsistent {
        return Ok(v);
    }
    let settled = resolved
        .conventions
        .iter()
        .any(|c| c.name == "agg" && c.source != Source::Preset);
    if !settled {
        for mode in AGG_TRIED.into_iter().filter(|m| *m != resolved.cfg.agg) {
            let mut cfg = resolved.cfg.clone();
            cfg.agg = mode;
            cfg.entropy_agg = mode;
            let mut w = judge(cell, &cfg, tol, unc)?;
            if w.status == Status::Consistent {
                w.notes.push(format!(
                    "only the total is dumped and no cell states or shows the aggregation: the total is {}'s",
                    mode.name()
                ));
                return Ok(w);
            }
        }
    }
    if let Some(w) = unseen_weights(cell, &resolved.cfg, &v, tol, (lone, unc.entropy_coeff))? {
        return Ok(w);
    }
    undetermined(cell, resolved, v, tol)
}

/// A step of one cell fits no loss scale (`infer::scale` needs two): when this cell's
/// only difference, under the step's policy loss or one of real producers'
/// ([`super::picture::policy_candidates`]), is its total, and that total is its
/// recomputed composition times `rows / n` (an integer `n ≥ rows`: verl's
/// `loss_scale_factor` under dynamic batch size, `verl/workers/actor/dp_actor.py`) or
/// `1 / k` (`k` accumulated micros), the total cannot be judged — one cell cannot confirm
/// the factor — and the cell is [`Status::CannotJudge`], naming it. Else `None`.
fn one_cell_scale(
    cell: &Cell,
    resolved: &infer::Resolved,
    tol: &Tolerance,
) -> Result<Option<Verdict>> {
    let base = &resolved.cfg;
    if resolved.cells != 1 || !base.loss_scale.is_one() {
        return Ok(None);
    }
    let rows = cell.dims().0;
    // an integer as `infer`'s scale fit snaps one (within 1 %)
    let snap = |v: f64| Some(infer::snap_int(v)).filter(|r| r.fract() == 0.0);
    let dual = super::picture::dual_shown(std::slice::from_ref(cell));
    let cfgs =
        std::iter::once(base.clone()).chain(super::picture::policy_candidates(base, &[], dual));
    for cfg in cfgs {
        let w = judge(cell, &cfg, tol, resolved.uncertainty)?;
        let only_total = w.first_divergence.is_none()
            && w.checks.iter().all(|c| c.ok || c.name == "loss")
            && w.checks.iter().any(|c| c.name == "loss" && !c.ok);
        let s = w.dumped_loss / w.recomputed_loss;
        if !only_total || !s.is_finite() || s <= 0.0 || s >= 1.0 {
            continue;
        }
        let factor = match (snap(rows as f64 / s), snap(1.0 / s)) {
            (Some(n), _) if n >= rows as f64 => format!(
                "{rows}/{n} (verl's loss_scale_factor: the micro's rows over a mini-batch of {n})"
            ),
            (_, Some(k)) if k >= 2.0 => {
                format!("1/{k} (one over {k} accumulated micro-batches)")
            }
            _ => continue,
        };
        let mut v = w;
        v.status = Status::CannotJudge;
        let policy = if cfg == *base {
            String::new()
        } else {
            format!(" under {}", super::picture::policy_words(&cfg))
        };
        v.notes.insert(
            0,
            format!(
                "cannot judge the total: its intermediates and terms follow{policy}, and the \
                 total is their composition times {} ≈ {factor}; the step has one cell, which \
                 cannot confirm a loss scale",
                crate::fmt::num(s)
            ),
        );
        return Ok(Some(v));
    }
    Ok(None)
}

/// `v` (an inconsistent cell that dumps its terms) as consistent when its own inputs
/// follow under another of the policy losses real producers use (a clip bound or ratio
/// level of its own, [`super::picture::policy_candidates`]): the cell is consistent with
/// its inputs, and the note names what it computes otherwise than the step's other cells
/// (which dumpdiff then shows against the other side). Else `v` unchanged.
fn own_policy(
    cell: &Cell,
    resolved: &infer::Resolved,
    v: Verdict,
    tol: &Tolerance,
) -> Result<Verdict> {
    let base = &resolved.cfg;
    // the importance weights this cell's own values allow (its dumped rollout log-probs)
    let dual = super::picture::dual_shown(std::slice::from_ref(cell));
    let weights: Vec<_> = super::picture::weight_schemes(std::slice::from_ref(cell), base, dual)?
        .into_iter()
        .map(|(w, _)| w)
        .collect();
    // the candidates that change the fewest things first
    let mut candidates = super::picture::policy_candidates(base, &weights, dual);
    candidates.sort_by_key(|c| {
        usize::from(c.ratio_level != base.ratio_level)
            + usize::from(c.policy != base.policy)
            + usize::from(c.rollout_is != base.rollout_is)
    });
    for cfg in candidates {
        let mut w = judge(cell, &cfg, tol, resolved.uncertainty)?;
        if w.status != Status::Consistent {
            continue;
        }
        let mut what = Vec::new();
        if cfg.ratio_level != base.ratio_level {
            what.push(format!(
                "ratio level: {} where the step's other cells use {}",
                super::picture::level_words(cfg.ratio_level),
                super::picture::level_words(base.ratio_level)
            ));
        }
        if cfg.policy != base.policy {
            what.push(format!(
                "clip bound: {} where the step's other cells use {}",
                super::picture::clip_words(&cfg),
                super::picture::clip_words(base)
            ));
        }
        if let Some(is) = cfg.rollout_is.filter(|_| cfg.rollout_is != base.rollout_is) {
            what.push(format!("importance weights of its own: {}", is.words()));
        }
        w.notes.push(format!(
            "consistent with its own inputs under {}, not the step's convention ({}): this cell computes its policy loss otherwise",
            super::picture::policy_words(&cfg),
            what.join("; ")
        ));
        return Ok(w);
    }
    Ok(v)
}

/// `v` (inconsistent, its per-token loss differing from the recomputed) with the
/// aggregation named when its dumped `pg_loss` is the plain sum of its own dumped
/// `elementwise_loss` over the valid tokens (a sum, not a mean): whatever weights the
/// per-token loss carries, that reduction is the cell's own.
fn own_sum(cell: &Cell, mut v: Verdict) -> Verdict {
    let (Some(el), Some(pg)) = (
        cell.per_token.as_ref(),
        cell.record.as_ref().and_then(|r| r.pg_loss),
    ) else {
        return v;
    };
    let Ok(m) = to_f64_vec(&cell.inputs.mask) else {
        return v;
    };
    let n = m.iter().filter(|x| **x != 0.0).count();
    let sum: f64 = el.iter().zip(&m).map(|(e, w)| e * w).sum();
    let open = f32_compute(el, &m, 4.0) + 4.0 * 2f64.powi(-24) * sum.abs();
    let elementwise = v
        .first_divergence
        .as_ref()
        .is_some_and(|d| d.name == crate::producers::weaver::ELEMENTWISE_LOSS);
    if elementwise && n > 1 && (pg - sum).abs() <= open + 1e-9 && (pg - sum / n as f64).abs() > open
    {
        v.notes.push(format!(
            "aggregation: the dumped pg_loss is the sum of its own elementwise_loss over {n} valid tokens, not a mean: a sum, not a mean"
        ));
        if !v.differs.iter().any(|d| d == "aggregation") {
            v.differs.push("aggregation".into());
        }
        v.own_sum = true;
    }
    v
}

/// Whether the step's cells settled its pg aggregation (read or inferred, not the preset's)
/// and this cell's dumped `pg_loss` is not that mode's reduction of its own dumped
/// `elementwise_loss`: then a pg term that is their plain sum ([`own_sum`]) is no mode of
/// the step's, even on one row, where verl's seq-mean-token-sum is the sum too.
fn sum_not_settled_mode(cell: &Cell, resolved: &infer::Resolved) -> bool {
    let settled = resolved
        .conventions
        .iter()
        .any(|c| c.name == "agg" && c.source != Source::Preset);
    settled && pg_not_mode(cell, resolved.cfg.agg)
}

/// Whether this cell's dumped `pg_loss` is not `mode`'s reduction of its own dumped
/// `elementwise_loss` (beyond the f32 rounding of the sum); false when it dumps neither.
fn pg_not_mode(cell: &Cell, mode: AggMode) -> bool {
    let (Some(el), Some(pg)) = (
        cell.per_token.as_ref(),
        cell.record.as_ref().and_then(|r| r.pg_loss),
    ) else {
        return false;
    };
    let Ok(m) = to_f64_vec(&cell.inputs.mask) else {
        return false;
    };
    let (b, t) = cell.dims();
    if m.len() != b * t || el.len() != m.len() {
        return false;
    }
    let w = weights(&m, b, t, mode);
    let own = reduce(el, &w);
    (pg - own).abs() > f32_compute(el, &w, 4.0) + 4.0 * 2f64.powi(-24) * own.abs() + 1e-9
}

/// A consistent cell of a one-cell step whose entropy or KL coefficient was fitted to its
/// own total, at a value that is not the preset's: one equation fits any value (a loss
/// scale or a term no file states goes into it, seed 7466: NexRL's unechoed KL loss), so
/// the total is undetermined — its terms still checked. A fit landing on the preset's
/// value is evidence and stays consistent.
fn lone_total(resolved: &infer::Resolved, v: Verdict) -> Verdict {
    let Some(c) = resolved.conventions.iter().find(|c| {
        matches!(c.name, "entropy_coeff" | "kl_coef")
            && c.source == Source::Inferred
            && c.cells == Some(1)
            && !c.matches_preset
    }) else {
        return v;
    };
    if resolved.cells != 1 {
        return v;
    }
    let mut notes = v.notes.clone();
    notes.push(format!(
        "its terms follow, but its total is the one equation {} was fitted to: any total fits \
         it (a loss scale or a term no file states would go into it); give --entropy-coeff \
         and --kl-coef to check it",
        c.line()
    ));
    Verdict {
        status: Status::Undetermined,
        notes,
        ..v
    }
}

/// An entropy or KL coefficient the step inferred from a single cell's total (one
/// equation, one unknown: it fits that cell whatever its total holds — a loss scale, a
/// term no file states), in words; `None` when none was.
fn lone_coefficient(resolved: &infer::Resolved) -> Option<String> {
    resolved
        .conventions
        .iter()
        .find(|c| {
            matches!(c.name, "entropy_coeff" | "kl_coef")
                && c.source == Source::Inferred
                && c.cells == Some(1)
        })
        .map(|c| c.line())
}

/// The largest factor a per-token weight the dump does not hold may take (verl's
/// truncated importance weight is in `(0, rollout_is_threshold]`, 2 by default; slime's
/// and others' caps sit below 10).
const MAX_WEIGHT: f64 = 10.0;

/// `v` (an inconsistent cell whose ratio follows) as [`Status::CannotJudge`] when its
/// dumped per-token loss is the recomputed one times a per-token factor in
/// `[0, MAX_WEIGHT]`, not one factor for every token, and its pg term follows from its own
/// per-token loss under the step's aggregation. It then applies per-token weights it does
/// not dump (verl's truncated importance sampling against the rollout engine's
/// log-probs, `compute_policy_loss_vanilla(..., rollout_is_weights)`, or an IcePop mask):
/// nothing in the cell can check them. Else `None`. A cell whose ratio differs, or
/// whose pg term does not follow from its own per-token loss, stays inconsistent: the
/// weights enter neither.
///
/// A cell that dumps only its total (its `loss/` file unread) when `lone` names a
/// coefficient the step inferred from one cell's total alone ([`lone_coefficient`]): that
/// total cannot check this one's, so only the per-token factors are asked.
fn unseen_weights(
    cell: &Cell,
    cfg: &crate::kernels::loss::LossConfig,
    v: &Verdict,
    tol: &Tolerance,
    (lone, se): (Option<&str>, f64),
) -> Result<Option<Verdict>> {
    let elementwise = v
        .first_divergence
        .as_ref()
        .is_some_and(|d| d.name == crate::producers::weaver::ELEMENTWISE_LOSS);
    let weighted = cfg.rollout_is.is_some() && cell.inputs.rollout_log_probs.is_some();
    let Some(dumped) = cell.per_token.as_ref() else {
        return Ok(None);
    };
    if v.status != Status::Inconsistent || !elementwise || weighted {
        return Ok(None);
    }
    let path = cell.file.as_path();
    let out = compute(&cell.inputs, cfg).map_err(|e| kerr(path, e))?;
    let ours = to_f64_vec(&out.per_token_loss).map_err(|e| kerr(path, e))?;
    let m = to_f64_vec(&cell.inputs.mask).map_err(|e| kerr(path, e))?;
    if ours.len() != dumped.len() || m.len() != dumped.len() {
        return Ok(None);
    }
    let slack = match cell.logprob_dtype {
        Some(d) if d.size() <= 2 => 1e-2,
        _ => 1e-5,
    };
    let (mut lo, mut hi, mut differ) = (f64::INFINITY, f64::NEG_INFINITY, 0usize);
    for ((d, o), w) in dumped.iter().zip(&ours).zip(&m) {
        if *w == 0.0 {
            continue;
        }
        if o.abs() <= 1e-12 {
            if d.abs() > 1e-9 {
                return Ok(None); // a loss where the recomputation has none: no weight makes it
            }
            continue;
        }
        let f = d / o;
        // 0: an IcePop band zeroes the token; MAX_WEIGHT to f32, or to the rounding of
        // 16-bit log-probs our ratio is recomputed from: a cap of 10 reached (seed 8226)
        if !(0.0..=MAX_WEIGHT * (1.0 + slack)).contains(&f) {
            return Ok(None);
        }
        lo = lo.min(f);
        hi = hi.max(f);
        differ += usize::from(!tol.allows(*d, *o));
    }
    // one factor on every token is a scale or a coefficient, not a per-token weight —
    // unless every valid token is in one row: then it is that row's sequence-level weight
    // as much as a scale (verl's sequence-level IS, one row left by rejection: seed 7420;
    // the other rows' advantages all 0, their terms 0 under any weight: seed 8162)
    let (b, t) = cell.dims();
    let rows_valid = (0..b)
        .filter(|r| (r * t..(r + 1) * t).any(|i| m[i] != 0.0 && ours[i].abs() > 1e-12))
        .count();
    if differ == 0 || (hi - lo <= 1e-6 * hi.abs().max(1.0) && rows_valid != 1) {
        return Ok(None);
    }
    // the pg term from its own per-token loss: under the step's aggregation, else under
    // another of verl's (the weights blur what the step's cells tell of it)
    // (the dumped pg_loss, else the dumped total less the recomputed other terms, scaled
    // as the total is: its `loss/` file unread)
    let pg_dumped = cell.record.as_ref().and_then(|r| r.pg_loss);
    let (loss_out, pg_out) = (
        to_f64(&out.loss).map_err(|e| kerr(path, e))?,
        to_f64(&out.pg_loss).map_err(|e| kerr(path, e))?,
    );
    let scale = cfg.loss_scale.factor(b).unwrap_or(1.0);
    // the entropy term's rounding, and for a total-only cell the coefficient's standard
    // error over it (two of them: seed 8202's entropy_coeff fitted 0 ± 4e-3 beside huge
    // totals, where 1e-4·H was the whole difference)
    let se = if pg_dumped.is_none() { se } else { 0.0 };
    let entropy_open = match (&cell.inputs.entropy, cfg.entropy_coeff) {
        (Some(e), c) if c != 0.0 || se > 0.0 => {
            let ev = to_f64_vec(e).map_err(|e| kerr(path, e))?;
            let we = weights(&m, b, t, cfg.entropy_agg);
            c.abs() * (stored_rounding(&ev, &we, cell.entropy_dtype) + f32_compute(&ev, &we, 1.0))
                + 2.0 * se * reduce(&ev, &we).abs()
        }
        _ => 0.0,
    };
    let follows = |mode: AggMode| {
        let w = weights(&m, b, t, mode);
        let own = reduce(dumped, &w);
        let open = f32_compute(dumped, &w, 4.0);
        match pg_dumped {
            Some(pg) => tol.allows_with(pg, own, open) || crate::fmt::alike(pg, own),
            None => {
                let total = loss_out + scale * (own - pg_out);
                let open = scale.abs() * (open + entropy_open) + 4.0 * 2f64.powi(-24) * total.abs();
                tol.allows_with(cell.dumped_loss, total, open)
                    || crate::fmt::alike(cell.dumped_loss, total)
            }
        }
    };
    let modes = [
        cfg.agg,
        AggMode::TokenMean,
        AggMode::SeqMeanTokenMean,
        AggMode::SeqMeanTokenSum,
    ];
    let pg_words = match modes.into_iter().find(|m| follows(*m)) {
        Some(mode) => format!(
            "its pg term is the {} of that elementwise_loss",
            mode.name()
        ),
        None => match lone.filter(|_| pg_dumped.is_none()) {
            Some(c) => format!(
                "its total, the only term it dumps, cannot be checked: {c} was inferred from \
                 one cell's total alone, which any value fits"
            ),
            None => return Ok(None),
        },
    };
    // the factors' shape: one per row, zeros, a shared largest one
    let shape = super::picture::unseen_shape(dumped, &ours, &m, b, t)
        .map(|s| format!("; the factors' shape: {s}"))
        .unwrap_or_default();
    let mut v = v.clone();
    v.status = Status::CannotJudge;
    v.notes.insert(
        0,
        format!(
            "cannot judge the per-token loss: on {differ} of {} valid tokens the dumped \
             elementwise_loss is the recomputed one times a factor between {} and {}, and \
             {pg_words} — per-token weights the dump does not hold (truncated importance \
             sampling against rollout log-probs not dumped, or an IcePop mask){shape}; tried: \
             the step's conventions and each real producer's clip bound and ratio level",
            m.iter().filter(|x| **x != 0.0).count(),
            crate::fmt::num(lo),
            crate::fmt::num(hi),
        ),
    );
    Ok(Some(v))
}

/// `v` (an inconsistent total-only cell) as [`Status::Undetermined`] when an unstated
/// term explains its total (see [`judge_under`]); else `v` unchanged.
fn undetermined(
    cell: &Cell,
    resolved: &infer::Resolved,
    v: Verdict,
    tol: &Tolerance,
) -> Result<Verdict> {
    let unstated = resolved.unstated;
    if !(unstated.entropy || unstated.kl) || v.first_divergence.is_some() || v.differs != ["loss"] {
        return Ok(v);
    }
    let path = cell.file.as_path();
    // the total without the unstated terms: the pg term and the stated ones
    let mut base_cfg = resolved.cfg.clone();
    if unstated.entropy {
        base_cfg.entropy_coeff = 0.0;
    }
    if unstated.kl {
        base_cfg.kl = None;
    }
    let out = compute(&cell.inputs, &base_cfg).map_err(|e| kerr(path, e))?;
    let base = to_f64(&out.loss).map_err(|e| kerr(path, e))?;
    let r = cell.dumped_loss - base;
    let fits = |c: f64| c > 0.0 && c <= MAX_COEF;
    let mut explained = Vec::new();
    if unstated.entropy {
        if let Some(e) = &out.entropy_loss {
            let h = to_f64(e).map_err(|e| kerr(path, e))?;
            // loss = pg − entropy_coeff · entropy_loss
            if h > 0.0 && fits(-r / h) {
                explained.push(format!("entropy_coeff {}", crate::fmt::num(-r / h)));
            }
        }
    }
    if unstated.kl && cell.inputs.ref_log_probs.is_some() {
        for est in KL_TRIED {
            let mut c = base_cfg.clone();
            c.kl = Some(KlTerm {
                estimator: est,
                coef: 0.0,
                placement: KlPlacement::Separate,
            });
            let o = compute(&cell.inputs, &c).map_err(|e| kerr(path, e))?;
            if let Some(k) = &o.kl_loss {
                // loss = pg + kl_coef · kl_loss
                let k = to_f64(k).map_err(|e| kerr(path, e))?;
                if k != 0.0 && fits(r / k) {
                    explained.push(format!("kl_coef {} ({est:?})", crate::fmt::num(r / k)));
                }
            }
        }
    }
    if explained.is_empty() || tol.allows(cell.dumped_loss, base) {
        return Ok(v);
    }
    let (d, b) = crate::fmt::pair(cell.dumped_loss, base);
    let mut notes = cell.notes.clone();
    notes.push(format!(
        "only the total is dumped and nothing states its {}: the dumped loss {d} − the recomputed {b} = {}, which {} would explain; give --entropy-coeff and --kl-coef to check it",
        match (unstated.entropy, unstated.kl) {
            (true, true) => "entropy and KL coefficients",
            (true, false) => "entropy coefficient",
            _ => "KL coefficient",
        },
        crate::fmt::num(r),
        explained.join(" or ")
    ));
    Ok(Verdict {
        status: Status::Undetermined,
        recomputed_loss: base,
        notes,
        differs: Vec::new(),
        loss_ok: false,
        ..v
    })
}

#[cfg(test)]
mod tests;

//! Is our picture of a step right? Before a side's value is called wrong, the conventions
//! used to judge it must reproduce that side's own dumped values (issue 28): the row order
//! of NexRL's whole-batch `old_log_probs` is settled from the data, and a side whose cells
//! mostly do not follow under the conventions found is "cannot judge", not wrong.

mod rollout_is;

pub(super) use crate::kernels::rollout_is::read::unseen_shape;

use crate::error::Result;
use crate::judge::infer::{
    inputs_with_advantages, pg_fit, prep_each, resolve, Convention, Prep, Resolved, Source, KL_TERM,
};
use crate::judge::overrides::Overrides;
use crate::judge::self_hosted::Advantages;
use crate::judge::self_hosted::SelfHostedStep;
use crate::judge::{CellId, Status, StepCheck, Tolerance, Verdict};
use crate::kernels::config::{LossConfig, PolicyKind, RatioLevel};
use crate::kernels::loss::LossInputs;
use crate::kernels::policy_loss::ClipParams;
use crate::kernels::rollout_is::{IsBound, IsLevel, RolloutIs};
use crate::producers::layout::DumpTree;

/// The self-hosted step with its `old_log_probs` row order settled from the data, and that
/// order as a convention when it is NexRL's batch order rather than the file's.
pub(crate) fn settled(
    tree: &DumpTree,
    step: i64,
    batch: Option<SelfHostedStep>,
) -> (Option<SelfHostedStep>, Option<Convention>) {
    let Some(mut b) = batch else {
        return (None, None);
    };
    let conv = match b.settle_old_order(tree, step) {
        Some((true, evidence)) => Some(Convention::new(
            "old_log_probs_order",
            format!("nexrl-batch-order ({evidence})"),
            None,
            Source::Inferred,
        )),
        _ => None,
    };
    (Some(b), conv)
}

/// Whether convention `c` says the side's loss holds a term no file states (see
/// [`doubtful_coefficients`]): an inferred coefficient that explains fewer than half of
/// at least 2 cells, a negative inferred entropy coefficient, or a `kl_term`.
pub fn misfit(c: &Convention) -> bool {
    let inferred = matches!(c.name, "entropy_coeff" | "kl_coef") && c.source == Source::Inferred;
    let few = matches!((c.explained, c.cells), (Some(e), Some(n)) if n >= 2 && e * 2 < n);
    let negative = c.name == "entropy_coeff"
        && c.number
            .is_some_and(|v| v < 0.0 && -v > 3.0 * c.std_err.unwrap_or(0.0));
    (inferred && (few || negative)) || c.name == KL_TERM
}

/// Whether a verdict's pg term and intermediates follow its inputs, whatever its total
/// does: no divergent intermediate and no failing `pg_loss` check.
pub fn pg_term_follows(v: &Verdict) -> bool {
    v.first_divergence.is_none()
        && v.checks
            .iter()
            .all(|k| k.ok || !(k.name == "pg_loss" || k.name.ends_with(".pg_loss")))
}

/// Both checks of the picture on a side's verdicts, in order: [`doubtful_coefficients`],
/// then [`check_before_judging`] (`tried`: the conventions in words). Returns the cells the
/// second made "cannot judge".
pub fn before_judging(verdicts: &mut [Verdict], conventions: &[Convention], tried: &str) -> usize {
    doubtful_coefficients(verdicts, conventions);
    check_before_judging(verdicts, tried)
}

/// Check before judging (issue 28): when the conventions used reproduce fewer than half
/// of a side's own cells (of at least 3), or none of two (neither naming the term that
/// differs), the picture is wrong, not the
/// data: each inconsistent cell becomes [`Status::CannotJudge`], with what was tried
/// (`tried`, the conventions in words). A single cell is left as it is (one faulty cell
/// cannot be told from a wrong picture, nor the reverse). Returns the number of cells so
/// changed.
pub fn check_before_judging(verdicts: &mut [Verdict], tried: &str) -> usize {
    let n = verdicts.len();
    // a pg term that is the plain sum of its own per-token loss, or a ratio of old
    // log-probs shifted by a token, is a fault whatever the picture (`Verdict::own_sum`,
    // `Verdict::own_shift`): no doubt on the picture, and never doubted itself
    let doubted = |v: &Verdict| v.status == Status::Inconsistent && !(v.own_sum || v.own_shift);
    let bad = verdicts.iter().filter(|v| doubted(v)).count();
    // of two cells, both must disagree with no term named (a sum for a mean, a mask, …):
    // a named difference in each is evidence, a bare "pg term differs" twice is not
    let named = verdicts.iter().any(|v| {
        v.status == Status::Inconsistent && v.differs.iter().any(|d| d != "pg" && d != "loss")
    });
    if n < 2 || (n == 2 && (bad < 2 || named)) || (n > 2 && bad * 2 <= n) {
        return 0;
    }
    for v in verdicts.iter_mut().filter(|v| doubted(v)) {
        v.status = Status::CannotJudge;
        v.notes.insert(
            0,
            format!(
                "cannot judge: the conventions used ({tried}) reproduce this side's own loss on \
                 only {} of {n} cells, so the recomputation is in doubt, not this cell",
                n - bad
            ),
        );
    }
    bad
}

/// A coefficient the step's own totals inferred but that explains fewer than half of its
/// cells (of at least 2), or a negative inferred entropy coefficient (an entropy *penalty*,
/// no producer's bonus: a positive term the fit absorbed), or a KL coefficient the dump
/// echoes for a term it does not dump (`kl_term`), is no convention of the side: its loss
/// holds a term no file states (NexRL's KL loss, added into `loss` with no `kl_loss`
/// dumped). A cell whose pg term and intermediates follow then cannot have its total
/// judged either way — neither failed nor silently passed under the misfit coefficient:
/// [`Status::CannotJudge`], saying so. Not when a flag gives a coefficient (the user's
/// picture is judged as given). Returns the number of cells so changed.
pub fn doubtful_coefficients(verdicts: &mut [Verdict], conventions: &[Convention]) -> usize {
    let misfit = conventions.iter().find(|c| misfit(c));
    // a coefficient given by a flag is the user's picture: judged as given
    let flagged = conventions
        .iter()
        .any(|c| matches!(c.name, "entropy_coeff" | "kl_coef") && c.source == Source::Flag);
    let Some(c) = misfit.filter(|_| !flagged) else {
        return 0;
    };
    let term = "the loss holds a term no file states (a KL loss?)";
    let why = match (c.name, c.explained, c.cells) {
        (KL_TERM, _, _) => format!(
            "{}: the loss holds kl_loss_coef · kl_loss, and no file states kl_loss",
            c.value
        ),
        (_, Some(e), Some(n)) if e * 2 < n => {
            format!(
                "{} explains only {e} of {n} cells' totals — {term}",
                c.line()
            )
        }
        _ => format!("{} is negative, an entropy penalty — {term}", c.line()),
    };
    let mut changed = 0;
    for v in verdicts
        .iter_mut()
        .filter(|v| v.status != Status::CannotJudge)
    {
        if !pg_term_follows(v) {
            continue;
        }
        v.status = Status::CannotJudge;
        v.notes.insert(
            0,
            format!("cannot judge the total: {why}; the pg term follows"),
        );
        changed += 1;
    }
    changed
}

/// The policy losses real producers use, tried when the preset's reproduces fewer than
/// half of the step's dumped pg terms: PPO's clip with verl's default bounds (0.2/0.2) and
/// DAPO's clip-higher (0.2/0.28), each with and without verl's dual clip (`clip_ratio_c`
/// 3.0, NexRL's default: `fsdp_actor.py` reads `clip_ratio_c` with 3.0; also 2.0, a
/// tighter setting seen in configs), at token level and
/// at GSPO's sequence level (verl `compute_policy_loss_gspo`, whose own bounds are 3e-4/4e-4).
/// Each is also tried with every importance-weight scheme of `weights` (the rollout
/// engine's log-probs dumped: the schemes [`rollout_is::propose`] reads off the
/// data, and verl's default token TIS cap 2) when `base` has none. `dual`: a dual clip
/// constant the cells' own values show ([`dual_shown`]), tried beside 3 and 2.
pub(super) fn policy_candidates(
    base: &LossConfig,
    weights: &[RolloutIs],
    dual: Option<f64>,
) -> Vec<LossConfig> {
    let mut out = Vec::new();
    let mut caps: Vec<Option<RolloutIs>> = vec![None];
    if base.rollout_is.is_none() {
        caps.extend(weights.iter().copied().map(Some));
    }
    let bounds = [(0.2, 0.2), (0.2, 0.28), (3e-4, 4e-4)];
    for level in [RatioLevel::Token, RatioLevel::GspoToken] {
        for (lo, hi) in bounds {
            if level == RatioLevel::Token && lo < 0.01 {
                continue;
            }
            let mut duals = vec![None, Some(3.0), Some(2.0)];
            if let Some(c) = dual.filter(|c| !duals.contains(&Some(*c))) {
                duals.push(Some(c));
            }
            for (c, cap) in duals
                .into_iter()
                .flat_map(|c| caps.iter().map(move |cap| (c, *cap)))
            {
                let mut cfg = base.clone();
                cfg.ratio_level = level;
                cfg.policy = PolicyKind::Clip(ClipParams {
                    eps_low: lo,
                    eps_high: hi,
                    delta: None,
                    clip_ratio_c: c,
                });
                cfg.rollout_is = cfg.rollout_is.or(cap);
                if cfg != *base {
                    out.push(cfg);
                }
            }
        }
    }
    // NexRL's `importance_sampling` loss, `−A·exp(logp − old)` unclipped (its actor's
    // `loss_func_type`, nexrl/train_service_backend/fsdp_worker/fsdp_actor.py; the remote
    // trainer's default `loss_fn`, nexrl/trainer/remote_api_trainer.py, nex-agi/NexRL@6860191)
    for cap in &caps {
        let mut cfg = base.clone();
        cfg.ratio_level = RatioLevel::Token;
        cfg.policy = PolicyKind::ImportanceSampling;
        cfg.rollout_is = cfg.rollout_is.or(*cap);
        if cfg != *base {
            out.push(cfg);
        }
    }
    out
}

/// The dual clip constant the cells' own dumped ratio, advantages and per-token loss show
/// (weaver's `is_loss_debug`; [`crate::kernels::policy_loss::dual_clip_shown`] over every
/// valid token of every cell), `None` when no cell dumps them or none is capped.
pub(super) fn dual_shown(cells: &[super::cell::Cell]) -> Option<f64> {
    let mut rows = Vec::new();
    for c in cells {
        let (Some(r), Some(el)) = (&c.ratio, &c.per_token) else {
            continue;
        };
        let (Ok(a), Ok(m)) = (
            crate::kernels::to_f64_vec(&c.inputs.advantages),
            crate::kernels::to_f64_vec(&c.inputs.mask),
        ) else {
            continue;
        };
        let (b, t) = c.dims();
        if r.len() != b * t || el.len() != b * t || m.len() != b * t {
            continue;
        }
        // advantages per token, or per row broadcast over its tokens
        let adv = |i: usize| match a.len() {
            n if n == b * t => Some(a[i]),
            n if n == b && t > 0 => Some(a[i / t]),
            _ => None,
        };
        rows.extend((0..b).map(|row| {
            (row * t..(row + 1) * t)
                .filter(|&i| m[i] != 0.0)
                .filter_map(|i| Some((r[i], adv(i)?, el[i])))
                .collect::<Vec<_>>()
        }));
    }
    crate::kernels::policy_loss::dual_clip_shown(rows)
}

/// The importance-weight schemes to try on `cells` under `base` (verl's token TIS cap 2
/// first: on a tie it is the one named), each with the evidence that proposes it
/// (empty for the default); none when no cell dumps the rollout engine's log-probs.
/// `dual`: the cells' [`dual_shown`], which the caller also gives the policy search.
pub(super) fn weight_schemes(
    cells: &[super::cell::Cell],
    base: &LossConfig,
    dual: Option<f64>,
) -> Result<Vec<(RolloutIs, String)>> {
    if !cells
        .iter()
        .any(|c| c.inputs.rollout_log_probs.is_some() && c.inputs.old_log_probs.is_some())
    {
        return Ok(Vec::new());
    }
    let mut plain = base.clone();
    plain.rollout_is = None;
    let mut policies = vec![plain.clone()];
    policies.extend(
        policy_candidates(&plain, &[], dual)
            .into_iter()
            .filter(|c| c.rollout_is.is_none()),
    );
    let mut out = rollout_is::propose(cells, &policies)?;
    out.truncate(6);
    // verl's default first: on a tie (no token above 2) it is the one named
    let default = RolloutIs::token_cap(2.0);
    out.retain(|(x, _)| *x != default);
    out.insert(0, (default, String::new()));
    Ok(out)
}

/// A ratio level in words.
pub(super) fn level_words(level: RatioLevel) -> &'static str {
    match level {
        RatioLevel::Token => "token ratio",
        RatioLevel::Sequence => "sequence ratio",
        RatioLevel::GspoToken => "GSPO sequence ratio",
    }
}

/// The clip of a policy loss in words (`ppo-clip 0.2/0.28, dual clip 3`).
pub(super) fn clip_words(cfg: &LossConfig) -> String {
    match cfg.policy {
        PolicyKind::ImportanceSampling => "no clip (importance sampling)".into(),
        PolicyKind::Clip(p) => {
            let mut s = format!(
                "ppo-clip {}/{}",
                crate::fmt::num(p.eps_low),
                crate::fmt::num(p.eps_high)
            );
            if let Some(c) = p.clip_ratio_c {
                s.push_str(&format!(", dual clip {}", crate::fmt::num(c)));
            }
            s
        }
    }
}

/// The policy loss in words (`ppo-clip 0.2/0.28, dual clip 3, gspo-token ratio`).
pub(super) fn policy_words(cfg: &LossConfig) -> String {
    let level = level_words(cfg.ratio_level);
    let tis = match cfg.rollout_is {
        Some(is) => format!(
            ", importance weights against rollout_log_probs ({})",
            weight_words(&is)
        ),
        None => String::new(),
    };
    let words = match cfg.policy {
        PolicyKind::ImportanceSampling => format!("importance sampling, {level}"),
        PolicyKind::Clip(_) => format!("{}, {level}", clip_words(cfg)),
    };
    words + &tis
}

/// An importance-weight scheme in words: verl's default kind as before (`TIS, cap 2`),
/// the others by [`RolloutIs::words`].
pub(super) fn weight_words(is: &RolloutIs) -> String {
    match (is.level, is.bound) {
        (IsLevel::Token, IsBound::Cap { cap }) if cap.is_finite() => {
            format!("TIS, cap {}{}", crate::fmt::num(cap), is.norm_words())
        }
        _ => is.words(),
    }
}

/// Check before judging, for the policy loss: when the settled conventions leave some of
/// the cells' dumped pg terms unreproduced (`fit` of `with_pg` cells), each of
/// [`policy_candidates`] is tried on every cell (gathered again, one at a time) and the
/// one reproducing the most pg terms (then the closest) is kept when it reproduces more
/// than `fit`, with a `policy` convention saying what it explains. `None` when the
/// policy is given by a flag or an explicit preset, or no candidate does better.
///
/// `eps`: the advantage epsilons to try with each policy (self-hosted trees, whose
/// advantages are recomputed from rewards), each with the step's advantages under it
/// (`None`: the step's own): the epsilon search before this one judged under the
/// preset's policy, so a wrong policy could hide the right epsilon and the right
/// epsilon the right policy. The returned config carries the epsilon chosen.
pub(crate) fn search_policy(
    check: &StepCheck<'_>,
    cells: &[CellId],
    resolved: &Resolved,
    fit: (usize, f64),
    given: &Overrides,
    tol: &Tolerance,
    eps: &[(f64, Option<Advantages>)],
) -> Result<Option<(Resolved, (usize, f64))>> {
    let flagged = given.eps_low.is_some()
        || given.eps_high.is_some()
        || given.clip_ratio_c.is_some()
        || given.delta.is_some()
        || given.ratio_level.is_some()
        || given.preset_fixes_composition;
    if flagged || cells.is_empty() {
        return Ok(None);
    }
    // the importance weights the cells' own values allow (verl's rollout correction)
    let gathered: Vec<super::cell::Cell> = cells
        .iter()
        .map(|(r, m)| check.gather(*r, *m))
        .collect::<Result<_>>()?;
    let dual = dual_shown(&gathered);
    let schemes = weight_schemes(&gathered, &resolved.cfg, dual)?;
    let weights: Vec<RolloutIs> = schemes.iter().map(|(x, _)| *x).collect();
    let own = [(resolved.cfg.advantage.eps, None)];
    let eps = if eps.is_empty() { &own[..] } else { eps };
    // each policy under each epsilon (index `k` of `eps` for candidate `i·eps.len() + k`)
    let candidates: Vec<LossConfig> = policy_candidates(&resolved.cfg, &weights, dual)
        .into_iter()
        .flat_map(|c| {
            eps.iter().map(move |(e, _)| {
                let mut c = c.clone();
                c.advantage.eps = *e;
                c
            })
        })
        .collect();
    let mut per_candidate: Vec<Vec<Prep>> = (0..candidates.len())
        .map(|_| Vec::with_capacity(cells.len()))
        .collect();
    let mut with_pg = 0;
    // the levels the side's own dumped ratios show (sequence-shaped rows, varying rows)
    let mut shapes = (0usize, 0usize);
    for cell in gathered {
        match ratio_shape(&cell) {
            Some(true) => shapes.0 += 1,
            Some(false) => shapes.1 += 1,
            None => {}
        }
        let swapped: Vec<Option<LossInputs>> = eps
            .iter()
            .map(|(_, a)| match a {
                Some(a) => inputs_with_advantages(&cell, a),
                None => Ok(None),
            })
            .collect::<Result<_>>()?;
        let variants: Vec<(&LossConfig, Option<&LossInputs>)> = candidates
            .iter()
            .enumerate()
            .map(|(i, c)| (c, swapped[i % eps.len()].as_ref()))
            .collect();
        let preps = prep_each(&cell, &variants, tol)?;
        with_pg += usize::from(preps.first().is_some_and(Prep::has_pg));
        for (list, p) in per_candidate.iter_mut().zip(preps) {
            list.push(p);
        }
    }
    // On a tie in cells explained, the level the dumped ratios show wins before the
    // smaller error: a loss near ratio 1 (on-policy) fits both levels alike.
    let shown = match shapes {
        (s, t) if s > t => Some(RatioLevel::GspoToken),
        (s, t) if t > s => Some(RatioLevel::Token),
        _ => None,
    };
    let agrees = |c: &LossConfig| shown.is_some_and(|l| l == c.ratio_level);
    // every cell whose dumped ratios show a level shows the same one, and the settled
    // level is the other: at an equal fit (weights the dump does not hold blur every pg
    // term alike; on-policy, ratio ≈ 1, every level reproduces them) the level the ratios
    // themselves show is taken
    let unanimous = shapes.0.min(shapes.1) == 0 && shapes.0.max(shapes.1) >= 2;
    // every pg term reproduced, at the level the ratios show: nothing to search for
    if fit.0 >= with_pg && (!unanimous || agrees(&resolved.cfg)) {
        return Ok(None);
    }
    let shown_over = |c: &LossConfig| {
        unanimous
            && agrees(c)
            && !agrees(&resolved.cfg)
            && c.ratio_level != resolved.cfg.ratio_level
    };
    let mut best: Option<(Resolved, (usize, f64))> = None;
    for (c, preps) in candidates.iter().zip(&per_candidate) {
        let r = resolve(preps, c, given, tol)?;
        let f = pg_fit(preps, &r.cfg, tol);
        // at an equal count, fewer assumptions before the smaller error: weights the
        // evidence does not need are not read into the step (16-bit log-probs leave
        // errors a near-1 weight fits by chance: seed 8017, a batch-normalised
        // sequence cap 0.85 on a step without weights)
        let key = |c: &LossConfig, e: f64| (agrees(c), std::cmp::Reverse(assumed(c)), -e);
        let better = match &best {
            Some((br, b)) => f.0 > b.0 || (f.0 == b.0 && key(c, f.1) > key(&br.cfg, b.1)),
            None => f.0 > fit.0 || (f.0 == fit.0 && shown_over(c)),
        };
        if better {
            best = Some((r, f));
        }
    }
    Ok(best.map(|(mut r, f)| {
        let mut conv = Convention::new("policy", policy_words(&r.cfg), None, Source::Inferred);
        conv.explained = Some(f.0);
        conv.cells = Some(with_pg);
        // the weights read off the data, with the evidence that chose them
        let read = r
            .cfg
            .rollout_is
            .filter(|_| resolved.cfg.rollout_is.is_none())
            .and_then(|is| schemes.iter().find(|(x, _)| *x == is));
        if let Some((is, why)) = read {
            let value = if why.is_empty() {
                format!("{} (verl's default)", is.words())
            } else {
                format!("{} ({why})", is.words())
            };
            let mut w = Convention::new("rollout_is", value, None, Source::Inferred);
            w.explained = Some(f.0);
            w.cells = Some(with_pg);
            r.conventions.insert(0, w);
        }
        r.conventions.insert(0, conv);
        (r, f)
    }))
}

/// How many importance-weight assumptions `c` makes beyond none: the weights, and their
/// batch normalisation.
fn assumed(c: &LossConfig) -> usize {
    c.rollout_is.map_or(0, |is| 1 + usize::from(is.norm != 1.0))
}

/// The advantage epsilons [`search_policy`] tries with each policy on a self-hosted step
/// (`batch`; none otherwise), each with the step's advantages under it (`None` for the
/// one `cfg` holds: the step's own).
pub(crate) fn eps_candidates(
    batch: Option<&SelfHostedStep>,
    cfg: &LossConfig,
) -> Result<Vec<(f64, Option<Advantages>)>> {
    let Some(b) = batch else {
        return Ok(Vec::new());
    };
    crate::conventions::advantage::CANDIDATES
        .into_iter()
        .map(|e| {
            let mut a = cfg.advantage;
            let own = e == a.eps;
            a.eps = e;
            Ok((e, (!own).then(|| b.advantages_under(&a)).transpose()?))
        })
        .collect()
}

/// When the policy search chose another epsilon (`found` vs `was`), the step's advantages
/// become that epsilon's and the `adv_eps` convention says so (`preset`: the preset's).
pub(crate) fn adopt_eps(
    check: &mut StepCheck<'_>,
    eps: &[(f64, Option<Advantages>)],
    found: &LossConfig,
    was: &LossConfig,
    preset: &LossConfig,
) -> Option<Convention> {
    let e = found.advantage.eps;
    if e == was.advantage.eps {
        return None;
    }
    if let Some((_, Some(a))) = eps.iter().find(|(x, _)| *x == e) {
        check.batch = check.batch.take().map(|b| b.with_advantages(a.clone()));
    }
    let mut conv = Convention::new("adv_eps", crate::fmt::num(e), Some(e), Source::Inferred);
    conv.matches_preset = e == preset.advantage.eps;
    Some(conv)
}

/// Whether a weaver cell's dumped `prob_ratio` is constant along each valid row of two or
/// more tokens (GSPO's sequence ratio: `Some(true)`) or varies along one (`Some(false)`),
/// to one f32 ulp; `None` without a dumped ratio or such a row. Rows whose valid ratios
/// are all exactly 1 (current = old) say nothing and are skipped.
fn ratio_shape(cell: &super::cell::Cell) -> Option<bool> {
    let ratio = cell.ratio.as_ref()?;
    let (rows, width) = cell.dims();
    let mask = crate::kernels::to_f64_vec(&cell.inputs.mask).ok()?;
    if ratio.len() != rows * width || mask.len() != ratio.len() || width == 0 {
        return None;
    }
    let mut seen = false;
    for row in 0..rows {
        let vals: Vec<f64> = (0..width)
            .filter(|&p| mask[row * width + p] != 0.0)
            .map(|p| ratio[row * width + p])
            .collect();
        if vals.iter().all(|v| *v == 1.0) {
            continue;
        }
        match crate::conventions::ratio_level::row_shape(vals) {
            Some(false) => return Some(false),
            Some(true) => seen = true,
            None => {}
        }
    }
    seen.then_some(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::Layout;

    fn verdicts(statuses: &[Status]) -> Vec<Verdict> {
        statuses
            .iter()
            .enumerate()
            .map(|(i, s)| Verdict {
                file: format!("is_loss_debug/step_000000_rank0_micro{i}.pt").into(),
                layout: Layout::Weaver,
                step: 0,
                rank: 0,
                micro: i as u32,
                status: *s,
                dumped_loss: 0.1,
                recomputed_loss: 0.2,
                first_divergence: None,
                checks: Vec::new(),
                tokens: 4,
                notes: Vec::new(),
                differs: Vec::new(),
                loss_ok: false,
                own_sum: false,
                own_shift: false,
            })
            .collect()
    }

    #[test]
    fn a_picture_reproducing_no_cell_of_two_or_under_half_of_three_is_doubted() {
        use Status::{Consistent as C, Inconsistent as I};
        for (statuses, changed) in [
            (vec![I], 0),
            (vec![I, I], 2),
            (vec![I, C], 0),
            (vec![I, I, C], 2),
            (vec![I, C, C], 0),
            (vec![I, I, C, C], 0),
        ] {
            let mut v = verdicts(&statuses);
            assert_eq!(
                check_before_judging(&mut v, "agg token-mean"),
                changed,
                "{statuses:?}"
            );
            let doubted = v.iter().filter(|v| v.status == Status::CannotJudge).count();
            assert_eq!(doubted, changed);
            if statuses == [I, I] {
                // a term named in either of two cells is evidence: nothing changes
                let mut v = verdicts(&statuses);
                v[1].differs = vec!["aggregation".into()];
                assert_eq!(check_before_judging(&mut v, "agg token-mean"), 0);
            }
            if changed > 0 {
                let n = statuses.len();
                assert_eq!(
                    v[0].notes[0],
                    format!(
                        "cannot judge: the conventions used (agg token-mean) reproduce this side's own loss on only {} of {n} cells, so the recomputation is in doubt, not this cell",
                        n - changed
                    )
                );
            }
        }
    }

    #[test]
    fn a_negative_coefficient_or_an_undumped_kl_term_makes_a_following_total_cannot_judge() {
        let inferred = |name: &'static str, v: f64, se: f64, explained: usize, cells: usize| {
            let mut c = Convention::new(name, v.to_string(), Some(v), Source::Inferred);
            (c.std_err, c.explained, c.cells) = (Some(se), Some(explained), Some(cells));
            c
        };
        let kl = Convention::new(
            KL_TERM,
            "kl_loss_coef 0.01 echoed, no kl_loss or ref_log_probs dumped".into(),
            Some(0.01),
            Source::Dumped,
        );
        for (c, misfits) in [
            // one cell, a negative entropy coefficient beyond its error: an entropy penalty
            (inferred("entropy_coeff", -1.4e-3, 8e-11, 1, 1), true),
            // negative within its error: no evidence either way
            (inferred("entropy_coeff", -1e-9, 1e-8, 1, 1), false),
            (inferred("entropy_coeff", 1e-3, 1e-9, 2, 2), false),
            (inferred("entropy_coeff", 1e-3, 1e-9, 0, 2), true),
            (kl.clone(), true),
        ] {
            assert_eq!(misfit(&c), misfits, "{}", c.line());
            let mut v = verdicts(&[Status::Inconsistent]);
            let changed = doubtful_coefficients(&mut v, std::slice::from_ref(&c));
            assert_eq!(changed, usize::from(misfits), "{}", c.line());
            if misfits {
                assert_eq!(v[0].status, Status::CannotJudge);
                assert!(
                    v[0].notes[0].starts_with("cannot judge the total: "),
                    "{}",
                    v[0].notes[0]
                );
            }
        }
        // a flag's coefficient is the user's picture: judged as given
        let flag = Convention::new("entropy_coeff", "0.001".into(), Some(1e-3), Source::Flag);
        let mut v = verdicts(&[Status::Inconsistent]);
        assert_eq!(doubtful_coefficients(&mut v, &[kl.clone(), flag]), 0);
        // the echoed KL coefficient is named in the note
        let mut v = verdicts(&[Status::Inconsistent]);
        doubtful_coefficients(&mut v, &[kl]);
        assert_eq!(
            v[0].notes[0],
            "cannot judge the total: kl_loss_coef 0.01 echoed, no kl_loss or ref_log_probs \
             dumped: the loss holds kl_loss_coef · kl_loss, and no file states kl_loss; the pg \
             term follows"
        );
    }
}

//! What inference needs of one cell ([`Prep`]): its recomputed pg, entropy and KL terms
//! reduced under each base aggregation mode, with their rounding, and its dumped scalars.

use super::{at, Prep, Reduced, Table, BASE_MODES, KL_CANDIDATES};
use crate::error::{Error, Position, Result};
use crate::judge::cell::Cell;
use crate::judge::self_hosted::Advantages;
use crate::judge::terms::{f32_compute, reduce, stored_rounding, weights};
use crate::judge::Tolerance;
use crate::kernels::aggregate::AggMode;
use crate::kernels::loss::{compute, LossConfig, LossInputs};
use crate::kernels::to_f64_vec;

/// Do the dumped intermediates (`prob_ratio`, `elementwise_loss`) follow from the inputs?
/// When they do not, the cell's pg term is no evidence about the aggregation.
fn intermediates_follow(
    dumped: Option<&Vec<f64>>,
    ours: &[f64],
    mask: &[f64],
    tol: &Tolerance,
    slack: &[f64],
) -> bool {
    dumped.is_none_or(|d| {
        d.iter()
            .zip(ours)
            .zip(mask)
            .zip(slack.iter().chain(std::iter::repeat(&0.0)))
            .all(|(((d, o), m), s)| *m == 0.0 || tol.allows_with(*d, *o, *s * o.abs()))
    })
}

/// What [`resolve`] needs of one cell (gathered once, then dropped).
///
/// Errors: the kernels refuse the cell's inputs (file named).
pub fn prep(cell: &Cell, base: &LossConfig, tol: &Tolerance) -> Result<Prep> {
    let mut preps = prep_each(cell, &[(base, None)], tol)?;
    Ok(preps.remove(0))
}

/// [`prep`] of one cell under each `(cfg, inputs)` in turn, `inputs` (when given) in place
/// of the cell's own (another advantage epsilon's: only the pg term changes), so that one
/// gather serves every candidate. The parts no variant changes (mask weights, entropy and
/// KL tables) are computed once.
///
/// Errors: as [`prep`], the first variant's first.
pub fn prep_each(
    cell: &Cell,
    variants: &[(&LossConfig, Option<&LossInputs>)],
    tol: &Tolerance,
) -> Result<Vec<Prep>> {
    let path = cell.file.as_path();
    let outs = variants
        .iter()
        .map(|(base, inputs)| {
            let mut cfg = (*base).clone();
            cfg.kl = None;
            compute(inputs.unwrap_or(&cell.inputs), &cfg).map_err(|e| crate::judge::kerr(path, e))
        })
        .collect::<Result<Vec<_>>>()?;
    let (b, t) = cell.dims();
    let v = |x: &candle_core::Tensor| to_f64_vec(x).map_err(|e| crate::judge::kerr(path, e));
    let mask = v(&cell.inputs.mask)?;
    let ws: Vec<Vec<f64>> = BASE_MODES
        .iter()
        .map(|m| weights(&mask, b, t, *m))
        .collect();
    let table = |x: &[f64], rounding: &dyn Fn(&[f64], &[f64]) -> f64| -> Table {
        let mut out = [Reduced::default(); 3];
        for (o, w) in out.iter_mut().zip(&ws) {
            *o = Reduced {
                val: reduce(x, w),
                tol: rounding(x, w),
            };
        }
        out
    };
    let ent_r = match &cell.inputs.entropy {
        Some(e) => {
            let x = v(e)?;
            let dt = cell.entropy_dtype;
            Some(table(&x, &|x, w| {
                stored_rounding(x, w, dt) + f32_compute(x, w, 1.0)
            }))
        }
        None => None,
    };
    let mut kl_r = Vec::new();
    if let Some(r) = &cell.inputs.ref_log_probs {
        for est in KL_CANDIDATES {
            let k = crate::kernels::kl::kl(&cell.inputs.log_probs, r, est)
                .map_err(|e| crate::judge::kerr(path, e))?;
            kl_r.push((est, table(&v(&k)?, &|x, w| f32_compute(x, w, 4.0))));
        }
    }
    let rec = cell.record.as_ref();
    // the log-probs' stored rounding (bf16/f16 dumps of an f32 computation): per token,
    // the relative room it leaves a ratio or a loss element, `2·u·(|logp| + |old|)`
    let lp = v(&cell.inputs.log_probs)?;
    let old = match &cell.inputs.old_log_probs {
        Some(o) => v(o)?,
        None => vec![0.0; lp.len()],
    };
    let own_r = match &cell.per_token {
        Some(el) if el.len() == mask.len() => Some(table(el, &|x, w| f32_compute(x, w, 4.0))),
        _ => None,
    };
    let slack = crate::judge::terms::logprob_slack(&lp, &old, cell.logprob_dtype);
    let seq_slack = crate::judge::terms::sequence_slack(&slack, &mask, t);
    outs.iter()
        .zip(variants)
        .map(|(out, (cfg, _))| {
            let slack = match cfg.ratio_level {
                crate::kernels::loss::RatioLevel::Token => &slack,
                _ => &seq_slack,
            };
            let elem = v(&out.per_token_loss)?;
            let lp_w = |x: &[f64], w: &[f64]| {
                crate::judge::terms::logprob_rounding(x, &lp, &old, w, cell.logprob_dtype)
            };
            let pg_r = table(&elem, &|x, w| f32_compute(x, w, 4.0) + lp_w(x, w));
            let follows = cell.ratio.is_none() && cell.per_token.is_none()
                || intermediates_follow(cell.ratio.as_ref(), &v(&out.ratio)?, &mask, tol, slack)
                    && intermediates_follow(cell.per_token.as_ref(), &elem, &mask, tol, slack);
            Ok(Prep {
                t,
                rows: b,
                pg_r,
                ent_r,
                kl_r: kl_r.clone(),
                stated: cell.stated.clone(),
                pg_evidence: follows,
                pg: rec.and_then(|r| r.pg_loss),
                ent: rec.and_then(|r| r.entropy_loss),
                kl_loss: cell.kl_loss,
                loss: rec.and_then(|r| r.loss),
                total: cell.dumped_loss,
                own_r,
            })
        })
        .collect()
}

/// The inputs of a self-hosted `cell` with each row's advantage taken from `adv` (another
/// epsilon's, [`SelfHostedStep::advantages_under`]) instead: what gathering the cell from
/// a step loaded with that convention gives. `None` for a weaver cell (its advantages are
/// dumped).
///
/// [`SelfHostedStep::advantages_under`]: crate::judge::SelfHostedStep::advantages_under
pub fn inputs_with_advantages(cell: &Cell, adv: &Advantages) -> Result<Option<LossInputs>> {
    let Some((rows, f32_trainer)) = &cell.advantage_rows else {
        return Ok(None);
    };
    let a = adv.of_rows(rows, *f32_trainer);
    let n = a.len();
    let advantages = candle_core::Tensor::from_vec(a, n, &candle_core::Device::Cpu)
        .map_err(|e| Error::format(&cell.file, Position::File, e.to_string()))?;
    Ok(Some(LossInputs {
        advantages,
        ..cell.inputs.clone()
    }))
}

impl Prep {
    /// The cell dumps a pg term (`pg_loss`) to reproduce.
    pub fn has_pg(&self) -> bool {
        self.pg.is_some()
    }
}

/// [`explains_agg`] of one term only: the pg term (`entropy` false) or the entropy term.
pub(super) fn explains_term(
    p: &Prep,
    mode: AggMode,
    tol: &Tolerance,
    entropy: bool,
) -> (usize, usize) {
    let ok = |d: f64, r: Option<Reduced>| r.is_some_and(|r| tol.allows_with(d, r.val, r.tol));
    match entropy {
        false => match p.pg.filter(|_| p.pg_evidence) {
            Some(d) => (usize::from(ok(d, at(&p.pg_r, mode, p.t))), 1),
            None => (0, 0),
        },
        true => match (p.ent, &p.ent_r) {
            (Some(d), Some(e)) => (usize::from(ok(d, at(e, mode, p.t))), 1),
            _ => (0, 0),
        },
    }
}

/// How many of the cell's dumped pg (when evidence) and entropy terms `mode`
/// reproduces, of how many it dumps: `(matched, dumped)`.
pub(super) fn explains_agg(p: &Prep, mode: AggMode, tol: &Tolerance) -> (usize, usize) {
    let (mut hit, mut all) = (0, 0);
    let ok = |d: f64, r: Option<Reduced>| r.is_some_and(|r| tol.allows_with(d, r.val, r.tol));
    if let Some(d) = p.pg.filter(|_| p.pg_evidence) {
        all += 1;
        hit += usize::from(ok(d, at(&p.pg_r, mode, p.t)));
    }
    if let (Some(d), Some(e)) = (p.ent, &p.ent_r) {
        all += 1;
        hit += usize::from(ok(d, at(e, mode, p.t)));
    }
    (hit, all)
}

/// The mode the cells' entropy terms follow by themselves, when it is not `in_use` and
/// `in_use` reproduces fewer than half of them (the shared majority rule,
/// [`crate::conventions::aggregation::settle`]): NexRL's masked_mean entropy beside
/// another pg mode.
pub(super) fn entropy_mode(preps: &[Prep], in_use: AggMode, tol: &Tolerance) -> Option<AggMode> {
    // the mode in use first: it wins ties
    let mut modes = vec![in_use];
    modes.extend(
        [
            AggMode::TokenMean,
            AggMode::SeqMeanTokenSum,
            AggMode::SeqMeanTokenMean,
        ]
        .into_iter()
        .filter(|m| *m != in_use),
    );
    let (scored, total) = term_scores(preps, &modes, tol, true);
    let s = crate::conventions::aggregation::settle(&scored, total)?;
    if s.mode == in_use {
        return None;
    }
    // the mode in use reproduces fewer than half; or the other reproduces every term it
    // does and more (cells whose rows make the two modes equal tell nothing; one
    // faulty entropy term is not reproduced by either)
    let by = |m: AggMode| -> Vec<bool> {
        preps
            .iter()
            .map(|p| explains_term(p, m, tol, true).0 > 0)
            .collect()
    };
    let (other, used) = (by(s.mode), by(in_use));
    let only_other = other.iter().zip(&used).filter(|(o, u)| **o && !**u).count();
    let only_used = other.iter().zip(&used).filter(|(o, u)| !**o && **u).count();
    (scored[0].1 * 2 < total || (only_other > 0 && only_used == 0)).then_some(s.mode)
}

/// The terms reproduced with every cell's pg term under `pg` and its entropy term under
/// `ent`.
pub(super) fn hits(preps: &[Prep], (pg, ent): (AggMode, AggMode), tol: &Tolerance) -> usize {
    let of = |m: AggMode, e: bool| term_scores(preps, &[m], tol, e).0[0].1;
    of(pg, false) + of(ent, true)
}

/// How many of the cells' pg terms (`entropy` false) or entropy terms each of `modes`
/// reproduces, and how many such terms the cells dump.
pub(super) fn term_scores(
    preps: &[Prep],
    modes: &[AggMode],
    tol: &Tolerance,
    entropy: bool,
) -> (Vec<(AggMode, usize)>, usize) {
    let scored = modes
        .iter()
        .map(|m| {
            let n = preps
                .iter()
                .map(|p| explains_term(p, *m, tol, entropy).0)
                .sum();
            (*m, n)
        })
        .collect();
    let total = preps
        .iter()
        .map(|p| explains_term(p, AggMode::TokenMean, tol, entropy).1)
        .sum();
    (scored, total)
}

/// Another of `candidates` that the cells' pg terms cannot tell from `chosen`: on the
/// cells where exactly one of the two reproduces the dumped pg term, each reproduces as
/// many (a fault in one of them would decide the mode by the candidates' order), or no
/// term of any cell tells them apart (seed 7617: a one-row cell of zero terms beside a
/// total-only cell). The rival and that count.
pub(super) fn pg_rival(
    preps: &[Prep],
    chosen: AggMode,
    candidates: &[AggMode],
    tol: &Tolerance,
) -> Option<(AggMode, usize)> {
    let hit = |p: &Prep, m: AggMode, e: bool| explains_term(p, m, tol, e).0 > 0;
    // no pg term of any cell tells the two apart (rows of one token, terms all 0): the
    // order of the candidates chose, and a total-only cell may tell. An entropy term does
    // not tell the pg term's mode: NexRL reduces it by token-mean whatever the mode (seed
    // 8372: one zero-advantage cell's entropy "settled" token-mean)
    let alike = |m: AggMode| {
        preps
            .iter()
            .all(|p| hit(p, m, false) == hit(p, chosen, false))
    };
    candidates
        .iter()
        .filter(|m| **m != chosen)
        .map(|m| {
            let only = |a: AggMode, b: AggMode| {
                preps
                    .iter()
                    .filter(|p| hit(p, a, false) && !hit(p, b, false))
                    .count()
            };
            (*m, only(chosen, *m), only(*m, chosen))
        })
        .find(|(m, a, b)| a == b && (*a > 0 || alike(*m)))
        .map(|(m, a, _)| (m, a))
}

/// Check before judging, for an echoed `loss_agg_mode`: when it reproduces fewer than half
/// of the cells' dumped pg terms and another of verl's modes more than half, the cells'
/// own values win — the name does not mean the same reduction everywhere (NexRL's
/// `seq-mean-token-sum` reduces as verl's `seq-mean-token-mean`). The mode kept and why.
pub(super) fn echoed_gives_way(
    preps: &[Prep],
    dumped: AggMode,
    tol: &Tolerance,
) -> Option<(AggMode, String)> {
    let modes = [
        dumped,
        AggMode::TokenMean,
        AggMode::SeqMeanTokenSum,
        AggMode::SeqMeanTokenMean,
    ];
    // only the pg terms that tell the modes apart count (a cell whose advantages are all
    // zero has pg 0 under every mode)
    let mut scored: Vec<(AggMode, usize)> = modes.iter().map(|m| (*m, 0)).collect();
    let mut total = 0;
    for p in preps {
        let (sc, n) = term_scores(std::slice::from_ref(p), &modes, tol, false);
        if n > 0 && sc.iter().any(|x| x.1 < n) {
            total += n;
            for (acc, x) in scored.iter_mut().zip(&sc) {
                acc.1 += x.1;
            }
        }
    }
    let of = |m: AggMode| scored.iter().find(|s| s.0 == m).map_or(0, |s| s.1);
    if total == 0 || of(dumped) * 2 >= total {
        return None;
    }
    let alt = crate::conventions::aggregation::settle(&scored, total)?.mode;
    (alt != dumped && of(alt) * 2 > total).then(|| {
        (
            alt,
            format!(
                "the dumped loss_agg_mode {} reproduces {} of {total} pg terms, {} {}",
                dumped.name(),
                of(dumped),
                alt.name(),
                of(alt)
            ),
        )
    })
}

/// The pg aggregation the cells' dumped `pg_loss` shows against their own dumped per-token
/// loss: per cell, the base modes whose reduction of that loss gives the pg term (within
/// f32 rounding of the sum); a cell where one or two of the three fit tells. `Some` when
/// one mode fits more than half of the telling cells, two at least, and no other as many
/// (a faulty cell among them departs from it). The relation holds
/// whatever per-token weights the loss carries (TIS against log-probs not dumped), where a
/// recomputed pg term cannot say it; NexRL's entropy term, reduced as a token mean whatever
/// the mode, says nothing of it (seed 7573).
pub fn own_pg_mode(preps: &[Prep], tol: &Tolerance) -> Option<AggMode> {
    let mut fit = [0usize; 3];
    let mut telling = 0usize;
    for p in preps {
        let (Some(d), Some(own)) = (p.pg, p.own_r.as_ref()) else {
            continue;
        };
        let ok: Vec<bool> = own
            .iter()
            .map(|r| {
                tol.allows_with(d, r.val, r.tol + 4.0 * 2f64.powi(-24) * r.val.abs())
                    || crate::fmt::alike(d, r.val)
            })
            .collect();
        let n = ok.iter().filter(|x| **x).count();
        if n == 0 || n == ok.len() {
            continue;
        }
        telling += 1;
        for (f, o) in fit.iter_mut().zip(&ok) {
            *f += usize::from(*o);
        }
    }
    let most = *fit.iter().max()?;
    let best = fit.iter().position(|f| *f == most)?;
    (most >= 2 && 2 * most > telling && fit.iter().filter(|f| **f == most).count() == 1)
        .then(|| BASE_MODES[best])
}

//! A weaver cell whose dumped `prob_ratio` is `exp(log_probs − old_log_probs)` with
//! `old_log_probs` shifted right by one token: a fault read off the cell's own values
//! (issue 28), whatever picture of the step the other cells give — so it is named, and it
//! never puts that picture in doubt ([`super::picture::check_before_judging`]).

use super::cell::Cell;
use super::{Status, Verdict};
use crate::kernels::to_f64_vec;
use crate::tensor::DType;

/// The relative rounding of a stored log-prob dtype (the ratio was computed before it).
fn rounding(d: Option<DType>) -> f64 {
    match d {
        Some(DType::BF16) => 2f64.powi(-8),
        Some(DType::F16) => 2f64.powi(-11),
        _ => 2f64.powi(-22),
    }
}

/// Of the cell's valid tokens, how many its `ln prob_ratio` gives as `log_probs − old`
/// with `old` shifted right by `by` (column 0 kept), at the token level and at GSPO's
/// sequence level (the row's mean, every token of the row or none): `(token, sequence,
/// valid)`.
fn fits(
    lp: &[f64],
    old: &[f64],
    r: &[f64],
    m: &[f64],
    (b, t): (usize, usize),
    by: usize,
    eps: f64,
) -> (usize, usize, usize) {
    let (mut tok, mut seq, mut n) = (0, 0, 0);
    let close = |x: f64, d: f64, e: f64| (x - d).abs() <= e + 2f64.powi(-22) + 1e-7;
    for row in 0..b {
        let at = |p: usize| row * t + p;
        let terms: Vec<(f64, f64, f64)> = (0..t)
            .filter(|&p| m[at(p)] != 0.0)
            .map(|p| {
                let o = old[at(if p >= by { p - by } else { p })];
                (r[at(p)].ln(), lp[at(p)] - o, lp[at(p)].abs() * eps)
            })
            .filter(|(x, d, _)| x.is_finite() && d.is_finite())
            .collect();
        n += terms.len();
        tok += terms.iter().filter(|(x, d, e)| close(*x, *d, *e)).count();
        let k = terms.len().max(1) as f64;
        let (s, e) = terms
            .iter()
            .fold((0.0, 0.0), |(s, e), x| (s + x.1 / k, e + x.2 / k));
        if terms.iter().all(|(x, _, _)| close(*x, s, e)) {
            seq += terms.len();
        }
    }
    (tok, seq, n)
}

/// `v` (an inconsistent weaver cell whose first divergence is its `prob_ratio`) with the
/// shift named and [`Verdict::own_shift`] set when its dumped ratio follows its own
/// log-probs with `old_log_probs` shifted right by one token on at least 90 % of its
/// valid tokens (at least three), at the token or GSPO's sequence level, and unshifted
/// on at most half of them; else `v` unchanged.
pub(super) fn own_shift(cell: &Cell, mut v: Verdict) -> Verdict {
    let ratio_first = v
        .first_divergence
        .as_ref()
        .is_some_and(|d| d.name == crate::producers::weaver::PROB_RATIO);
    if v.status != Status::Inconsistent || !ratio_first {
        return v;
    }
    let (Some(r), Some(old)) = (cell.ratio.as_ref(), cell.inputs.old_log_probs.as_ref()) else {
        return v;
    };
    let (Ok(lp), Ok(old), Ok(m)) = (
        to_f64_vec(&cell.inputs.log_probs),
        to_f64_vec(old),
        to_f64_vec(&cell.inputs.mask),
    ) else {
        return v;
    };
    let dims = cell.dims();
    if [lp.len(), old.len(), m.len()].iter().any(|n| *n != r.len()) || dims.0 * dims.1 != r.len() {
        return v;
    }
    let eps = rounding(cell.logprob_dtype);
    let (t0, s0, n) = fits(&lp, &old, r, &m, dims, 0, eps);
    let (t1, s1, _) = fits(&lp, &old, r, &m, dims, 1, eps);
    let (level, k, k0) = if t1 >= s1 {
        ("token", t1, t0)
    } else {
        ("sequence (GSPO)", s1, s0)
    };
    if n >= 3 && k * 10 >= n * 9 && k0 * 2 <= n {
        v.notes.push(format!(
            "ratio: the dumped prob_ratio is exp(log_probs − old_log_probs) with old_log_probs shifted right by one token on {k} of {n} valid tokens ({level} level), unshifted on {k0}: old_log_probs shifted"
        ));
        v.own_shift = true;
    }
    v
}

//! Whether the other side's dumped `prob_ratio` follows from its own `log_probs` and
//! `old_log_probs` shifted by one token (issue 28: name the cause — "old_log_probs shifted
//! or misaligned against log_probs" — from the side's own values, not from the
//! comparison's failure alone).

use super::elem_loss::valid_positions;
use super::*;

/// The relative rounding of a stored log-prob dtype (the ratio was computed before it).
fn rounding(d: DType) -> f64 {
    match d {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        _ => 2f64.powi(-22),
    }
}

/// How many of the side's valid tokens its `ln prob_ratio` gives as `log_probs −
/// old_log_probs` with `old` shifted right by `by` tokens (column 0 kept), at the token
/// level and at GSPO's sequence level (a row's mean, every token of the row or none), out
/// of how many: `(token, sequence, valid)`.
fn fits(lp: &Mat, old: &Mat, r: &Mat, mask: Option<&Mat>, by: usize) -> (usize, usize, usize) {
    let (mut tok, mut seq, mut n) = (0, 0, 0);
    let eps = rounding(lp.dtype);
    for row in 0..r.rows {
        let (l, o, q) = (lp.row(row), old.row(row), r.row(row));
        let valid = valid_positions(mask, r.rows, r.width, row);
        let at = |p: usize| o.get(if p >= by { p - by } else { p }).copied();
        let terms: Vec<(f64, f64, f64)> = valid
            .iter()
            .filter_map(|&p| Some((q.get(p)?.ln(), l.get(p)? - at(p)?, l.get(p)?.abs() * eps)))
            .filter(|(x, d, _)| x.is_finite() && d.is_finite())
            .collect();
        n += terms.len();
        let close = |x: f64, d: f64, e: f64| (x - d).abs() <= e + 2f64.powi(-22) + 1e-7;
        tok += terms.iter().filter(|(x, d, e)| close(*x, *d, *e)).count();
        let k = terms.len().max(1) as f64;
        let (s, e) = terms
            .iter()
            .fold((0.0, 0.0), |(s, e), t| (s + t.1 / k, e + t.2 / k));
        if terms.iter().all(|(x, _, _)| close(*x, s, e)) {
            seq += terms.len();
        }
    }
    (tok, seq, n)
}

/// A failing `is_loss.prob_ratio` (in `out`) whose other side's own dumped ratio is
/// `exp(log_probs − old_log_probs)` with `old_log_probs` shifted right by one token on at
/// least 90 % of its valid tokens (at least three), at the token level or at GSPO's
/// sequence level, where the unshifted one gives at most half of them: the reason names
/// the shift, with the counts.
pub(super) fn note_shifted_old(out: &mut [Comparison], b_is: &Tensors<'_>) {
    let Some(c) = out
        .iter_mut()
        .find(|x| x.name == "is_loss.prob_ratio" && x.verdict == Verdict::Fail)
    else {
        return;
    };
    let get = |f: Field| b_is.mat(f);
    let (Some(lp), Some(old), Some(r)) = (
        get(Field::LogProbs),
        get(Field::OldLogProbs),
        get(Field::ProbRatio),
    ) else {
        return;
    };
    if [&lp, &old]
        .iter()
        .any(|m| (m.rows, m.width) != (r.rows, r.width))
    {
        return;
    }
    let mask = get(Field::EffectiveMask);
    let (t0, s0, n) = fits(&lp, &old, &r, mask.as_deref(), 0);
    let (t1, s1, _) = fits(&lp, &old, &r, mask.as_deref(), 1);
    let (level, k, k0) = if t1 >= s1 {
        ("token", t1, t0)
    } else {
        ("sequence (GSPO)", s1, s0)
    };
    if n < 3 || k * 10 < n * 9 || k0 * 2 > n {
        return;
    }
    c.reason = format!(
        "{} — old_log_probs shifted: the weaver's own prob_ratio is exp(log_probs − \
         old_log_probs shifted right by one token) at the {level} level on {k} of {n} valid \
         tokens of its dumped values, exp(log_probs − old_log_probs) on {k0}",
        c.reason
    );
}

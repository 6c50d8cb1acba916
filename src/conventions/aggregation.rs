//! Which aggregation mode (verl's `loss_agg_mode`) a side's dumped reductions show, when
//! its loss files do not echo it. One rule for both tools ([`settle`]); each brings its
//! own evidence:
//!
//! - `dumpdiff`, per self-hosted cell ([`cell_mode`]): the cell's dumped `pg_loss` and
//!   `entropy_loss` against its valid elements (`−ratio·A`, `entropy`), each reduction
//!   reproduced or not within its rounding bound ([`misfit`] ≤ 1);
//! - `losscheck`, per tree (`losscheck::infer`): every cell's dumped pg, entropy and KL
//!   terms against the recomputed ones, within the self-consistency tolerance plus their
//!   rounding.
//!
//! The rule: the candidate that reproduces the most dumped reductions wins when it
//! reproduces more than half of them, or exactly half and more than any other candidate
//! (a fault in one cell's pg term leaves its entropy term); equal counts go to the
//! earlier candidate (the caller's order: the preset's mode first, else token-mean,
//! seq-mean-token-sum, seq-mean-token-mean, then `-norm`). Otherwise nothing is settled
//! and the caller keeps its default. A convention is one choice: a minority of
//! reductions that a fault moved cannot change it, and a mode that explains no majority
//! is not guessed.

use crate::kernels::aggregate::AggMode;

/// The mode [`settle`] chose, with how many of the dumped reductions it reproduces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settled {
    /// The mode.
    pub mode: AggMode,
    /// Reductions it reproduces.
    pub explained: usize,
}

/// The rule of the module doc: `scored` is each candidate with the number of dumped
/// reductions it reproduces (in preference order), `total` the number of dumped
/// reductions. `None` when no candidate explains a majority.
pub fn settle(scored: &[(AggMode, usize)], total: usize) -> Option<Settled> {
    let (best, n) = scored
        .iter()
        .fold(None::<(AggMode, usize)>, |acc, x| match acc {
            Some(a) if a.1 >= x.1 => Some(a),
            _ => Some(*x),
        })?;
    let second = scored
        .iter()
        .filter(|x| x.0 != best)
        .map(|x| x.1)
        .max()
        .unwrap_or(0);
    let wins = 2 * n > total || (2 * n == total && n > second);
    (n > 0 && wins).then_some(Settled {
        mode: best,
        explained: n,
    })
}

/// One dumped reduction to reproduce: its elements, their unit roundoff, the dumped value.
pub struct Dumped<'a> {
    /// The valid elements, row after row.
    pub elems: &'a [f64],
    /// Unit roundoff of what the elements were computed from (their stored dtype).
    pub u: f64,
    /// The value the trainer dumped.
    pub value: f64,
}

/// How far a mode's recompute of `d` is from the dumped value, in units of its
/// tolerance: the rounding bound of the elements in their stored dtype
/// ([`super::rounding::RoundingBound`], weights of the mode) plus the trainer's f32
/// accumulation and storage of the scalar. `t`: the padded width.
pub fn misfit(m: AggMode, row_counts: &[usize], t: usize, d: &Dumped<'_>) -> f64 {
    use super::rounding::{RoundingBound, LAMBDA};
    let u32_ = 2f64.powi(-24);
    let w = m.row_weights(row_counts, t);
    let mut bound = RoundingBound::default();
    let mut magnitude = 0.0;
    for (x, w) in d.elems.iter().zip(&w) {
        bound.push(w * x, d.u);
        magnitude += (w * x).abs();
    }
    let n = d.elems.len() as f64;
    let tol = bound.tolerance()
        + (LAMBDA * n.sqrt() * u32_ * magnitude).min(n * u32_ * magnitude)
        + u32_ * d.value.abs();
    (m.reduce_rows(row_counts, d.elems, t) - d.value).abs() / tol.max(f64::MIN_POSITIVE)
}

/// The aggregation mode one cell's dumped reductions show (its `pg_loss` from `−ratio·A`
/// of the valid elements, its `entropy_loss` from its `entropy`), by [`settle`] over
/// verl's modes (`-norm` with a whole divisor: the token sum over the first dumped value),
/// a reduction reproduced when its [`misfit`] is at most 1. The padded width is taken as
/// the longest row (only a `-norm` without a horizon would use it; none is tried).
/// `None` when no mode explains a majority (the caller keeps token-mean).
pub fn cell_mode(row_counts: &[usize], dumped: &[Dumped<'_>]) -> Option<AggMode> {
    let n: usize = row_counts.iter().sum();
    let t = row_counts.iter().copied().max().unwrap_or(0);
    let pairs: Vec<&Dumped<'_>> = dumped
        .iter()
        .filter(|d| d.value != 0.0 && d.elems.len() == n && d.elems.iter().all(|v| v.is_finite()))
        .collect();
    let first = pairs.first()?;
    let mut modes = vec![
        AggMode::TokenMean,
        AggMode::SeqMeanTokenSum,
        AggMode::SeqMeanTokenMean,
    ];
    // (a divisor of 1 is the plain token-sum mode; verl's `loss_scale_factor` is a whole
    // number of tokens, and any mean is some sum over some real number)
    let norm = AggMode::SeqMeanTokenSum.reduce_rows(row_counts, first.elems, t) / first.value;
    if norm.is_finite() && norm >= 1.5 && (norm - norm.round()).abs() < 1e-3 * norm {
        modes.push(AggMode::SeqMeanTokenSumNorm {
            horizon: Some(norm.round()),
        });
    }
    let scored: Vec<(AggMode, usize)> = modes
        .into_iter()
        .map(|m| {
            let fits = pairs
                .iter()
                .filter(|d| misfit(m, row_counts, t, d) <= 1.0)
                .count();
            (m, fits)
        })
        .collect();
    settle(&scored, pairs.len()).map(|s| s.mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_majority_rule() {
        let (tm, ss, sm) = (
            AggMode::TokenMean,
            AggMode::SeqMeanTokenSum,
            AggMode::SeqMeanTokenMean,
        );
        let got = |scored: &[(AggMode, usize)], total| settle(scored, total).map(|s| s.mode);
        // more than half
        assert_eq!(got(&[(tm, 1), (ss, 3), (sm, 0)], 5), Some(ss));
        // exactly half, and more than any other
        assert_eq!(got(&[(tm, 2), (ss, 1)], 4), Some(tm));
        // exactly half, tied with another: nothing settled
        assert_eq!(got(&[(tm, 1), (ss, 1)], 2), None);
        // all explain everything: the first (preferred) candidate
        assert_eq!(got(&[(sm, 2), (tm, 2)], 2), Some(sm));
        // a minority or nothing
        assert_eq!(got(&[(tm, 1), (ss, 0)], 3), None);
        assert_eq!(got(&[(tm, 0)], 0), None);
        assert_eq!(settle(&[(tm, 3)], 4).map(|s| s.explained), Some(3));
    }

    #[test]
    fn modes_are_inferred_from_dumped_values() {
        // Two rows: [1, 2, 3] and [4] (and an empty one); seq sums 6 and 4.
        let (rows, v) = (vec![3, 0, 1], vec![1.0, 2.0, 3.0, 4.0]);
        let u = 2f64.powi(-24);
        let infer = |d: f64| {
            cell_mode(
                &rows,
                &[Dumped {
                    elems: &v,
                    u,
                    value: d,
                }],
            )
        };
        // 2.5 is also the token sum ÷ 2 (a whole divisor, the same weights): token-mean
        // comes first.
        assert_eq!(infer(2.5), Some(AggMode::TokenMean));
        // Within the f32 rounding of the dumped value, not beyond.
        assert_eq!(infer(2.5 * (1.0 + 4e-8)), Some(AggMode::TokenMean));
        assert_eq!(infer(2.5 * (1.0 + 1e-5)), None);
        assert_eq!(infer(5.0), Some(AggMode::SeqMeanTokenSum));
        assert_eq!(infer(3.0), Some(AggMode::SeqMeanTokenMean));
        assert_eq!(
            infer(0.3125),
            Some(AggMode::SeqMeanTokenSumNorm {
                horizon: Some(16.0)
            })
        );
        assert_eq!(infer(7.0), None);
        // Rows [1, 2, 3] and [4, 6]: token mean 3.2 = token sum 8 ÷ 2.5, not a whole divisor.
        let (rows, v) = (vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 6.0]);
        let d = |value: f64, u: f64| Dumped {
            elems: &v,
            u,
            value,
        };
        assert_eq!(cell_mode(&rows, &[d(3.2, u)]), Some(AggMode::TokenMean));
        // bf16 elements (u = 2⁻⁸): a 0.1 % miss is within their rounding.
        assert_eq!(
            cell_mode(&rows, &[d(3.2 * 1.001, 2f64.powi(-8))]),
            Some(AggMode::TokenMean)
        );
        // Two reductions, one reproduced by token-mean only, the other by no mode: half,
        // and more than any other mode.
        assert_eq!(
            cell_mode(&rows, &[d(3.2, u), d(99.0, u)]),
            Some(AggMode::TokenMean)
        );
    }
}

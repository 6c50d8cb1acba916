//! Each aggregation mode as the weights it gives the elements of a per-token matrix, so
//! that one recomputed matrix can be reduced under every candidate mode (inference) and
//! the rounding bound of the reduction ([`crate::conventions::rounding`]) gets its `wᵢ`.
//!
//! Every mode of [`AggMode`] is linear in the matrix: `agg(x) = Σ wᵢⱼ·xᵢⱼ` with
//! `wᵢⱼ = 0` where the mask is 0 (verl's `masked_verl` drops those elements, NaN included).

use crate::conventions::rounding::{unit_roundoff, RoundingBound};
use crate::judge::{Divergence, Tolerance};
use crate::kernels::aggregate::AggMode;
use crate::tensor::DType;

/// The weight of each element of a `[b, t]` matrix under `mode` (row-major, 0 under a
/// zero mask), following [`crate::kernels::aggregate::aggregate`] exactly.
pub fn weights(mask: &[f64], b: usize, t: usize, mode: AggMode) -> Vec<f64> {
    // each row's count summed once (the same sums, in the same order, as summing it for
    // each use)
    let counts: Vec<f64> = (0..b)
        .map(|r| mask[r * t..(r + 1) * t].iter().sum::<f64>())
        .collect();
    let total: f64 = mask.iter().sum();
    let seqs = counts.iter().filter(|c| **c > 0.0).count() as f64;
    let mut w = vec![0.0; b * t];
    for (r, count) in counts.iter().enumerate() {
        let row_w = mode.element_weight(*count, total, seqs, b, t);
        for c in 0..t {
            let m = mask[r * t + c];
            if m != 0.0 {
                w[r * t + c] = m * row_w;
            }
        }
    }
    w
}

/// `Σ wᵢ·xᵢ` over the elements of non-zero weight.
pub fn reduce(x: &[f64], w: &[f64]) -> f64 {
    x.iter()
        .zip(w)
        .filter(|(_, w)| **w != 0.0)
        .map(|(x, w)| x * w)
        .sum()
}

/// `Σ mᵢ·xᵢ` over the elements under a non-zero mask: the plain sum a producer may
/// dump instead of a mean (the "a sum, not a mean" diagnosis).
pub fn masked_sum(x: &[f64], mask: &[f64]) -> f64 {
    x.iter()
        .zip(mask)
        .filter(|(_, m)| **m != 0.0)
        .map(|(x, m)| x * m)
        .sum()
}

/// The rounding the reduction `Σ wᵢ·x̂ᵢ` inherits from `x̂` stored in `dtype` when the
/// producer reduced the unrounded values (weaver: entropy computed in f32, its loss term
/// from those, then dumped in bf16). The bound of
/// [`crate::conventions::rounding`]: `min(λ·√Σ(rᵢwᵢx̂ᵢ)², Σ rᵢ|wᵢx̂ᵢ|) + 2γₙ·Σ|wᵢx̂ᵢ|`,
/// `r = u/(1−u)`, `u` the dtype's unit roundoff (bf16 2⁻⁸). 0 for exact or absent dtypes.
pub fn stored_rounding(x: &[f64], w: &[f64], dtype: Option<DType>) -> f64 {
    let u = dtype.and_then(unit_roundoff).unwrap_or(0.0);
    let mut b = RoundingBound::default();
    for (x, w) in x.iter().zip(w).filter(|(_, w)| **w != 0.0) {
        b.push(w * x, u);
    }
    b.tolerance()
}

/// Per token, the relative room the log-probs' stored rounding leaves a ratio or a loss
/// element computed from finer values (bf16/f16 dumps of an f32 computation):
/// `2·u·(|logp| + |old|)`; empty (no room) for f32/f64 dumps.
pub fn logprob_slack(logp: &[f64], old: &[f64], dtype: Option<DType>) -> Vec<f64> {
    match dtype {
        Some(d @ (DType::BF16 | DType::F16)) => {
            let u = unit_roundoff(d).unwrap_or(0.0);
            logp.iter()
                .zip(old)
                .map(|(a, o)| 2.0 * u * (a.abs() + o.abs()))
                .collect()
        }
        _ => Vec::new(),
    }
}

/// [`logprob_slack`] for a sequence-level ratio (GSPO: one `exp(mean_t(logp − old))` per
/// row): every token of a row carries the largest slack of the row's valid tokens, since
/// the row's mean log-ratio moves with the rounding of all of them. `mask` and `slack`
/// `[rows, t]`; an empty `slack` stays empty.
pub fn sequence_slack(slack: &[f64], mask: &[f64], t: usize) -> Vec<f64> {
    if slack.is_empty() || t == 0 {
        return Vec::new();
    }
    slack
        .chunks(t)
        .zip(mask.chunks(t))
        .flat_map(|(s, m)| {
            let worst = s
                .iter()
                .zip(m)
                .filter(|(_, m)| **m != 0.0)
                .fold(0.0f64, |a, (x, _)| a.max(*x));
            std::iter::repeat_n(worst, s.len())
        })
        .collect()
}

/// The part of a recomputed pg reduction `Σ wᵢ·lᵢ` that the stored rounding of its
/// log-prob inputs leaves open: a producer that dumps bf16 or f16 log-probs computed its
/// ratio and loss from the finer values, and `lᵢ = −Aᵢ·rᵢ` moves by `|lᵢ|·δᵢ` when the
/// log-ratio moves by `δᵢ ≤ u·(|logpᵢ| + |oldᵢ|)` (`u` the dtype's unit roundoff). The
/// same probabilistic bound as [`stored_rounding`]; 0 for f32/f64 dumps (their rounding is
/// below the f32 arithmetic already allowed).
pub fn logprob_rounding(
    elem: &[f64],
    logp: &[f64],
    old: &[f64],
    w: &[f64],
    dtype: Option<DType>,
) -> f64 {
    let u = match dtype {
        Some(d @ (DType::BF16 | DType::F16)) => unit_roundoff(d).unwrap_or(0.0),
        _ => return 0.0,
    };
    let mut b = RoundingBound::default();
    for (((l, a), o), w) in elem.iter().zip(logp).zip(old).zip(w) {
        if *w != 0.0 {
            b.push(w * l * (a.abs() + o.abs()), u);
        }
    }
    b.tolerance()
}

/// The rounding of the producer's own f32 arithmetic in a reduction `Σ wᵢ·xᵢ` whose terms
/// each took `ops` f32 operations (exp, products, the weight) before an f32 sum: each term
/// carries `ops·u₃₂` relative error (the same bound with `u = ops·2⁻²⁴`), and the f32
/// accumulation `λ·√n·u₃₂·Σ|wᵢxᵢ|` (probabilistic, Higham & Mary 2019; `λ` as in
/// [`crate::conventions::rounding::LAMBDA`]).
pub fn f32_compute(x: &[f64], w: &[f64], ops: f64) -> f64 {
    let u = 2f64.powi(-24);
    let mut b = RoundingBound::default();
    for (x, w) in x.iter().zip(w).filter(|(_, w)| **w != 0.0) {
        b.push(w * x, ops * u);
    }
    let acc = crate::conventions::rounding::LAMBDA * (b.n as f64).sqrt() * u * b.magnitude;
    b.tolerance() + acc
}

/// The first valid position where `dumped` and `recomputed` (`[B, T]` row-major, `T`
/// columns) differ beyond `tol` (plus
/// `slack[i]·|recomputed|`, [`logprob_slack`]), and how many do.
pub(crate) fn first_diff(
    name: &str,
    dumped: &[f64],
    recomputed: &[f64],
    mask: &[f64],
    t: usize,
    tol: &Tolerance,
    slack: &[f64],
) -> Option<Divergence> {
    let mut first = None;
    let mut count = 0;
    let slack = slack.iter().chain(std::iter::repeat(&0.0));
    for (i, (((d, r), m), s)) in dumped
        .iter()
        .zip(recomputed)
        .zip(mask)
        .zip(slack)
        .enumerate()
    {
        if *m != 0.0 && !tol.allows_with(*d, *r, s * r.abs()) {
            count += 1;
            if first.is_none() {
                first = Some((i, *d, *r));
            }
        }
    }
    first.map(|(i, d, r)| Divergence {
        name: name.to_string(),
        row: i / t.max(1),
        pos: i % t.max(1),
        dumped: d,
        recomputed: r,
        count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_reproduce_each_verl_mode_by_hand() {
        // two rows: 3 valid of 4, 1 valid of 4
        let mask = [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        let x = [1.0, 2.0, 3.0, 99.0, 4.0, 99.0, 99.0, 99.0];
        let r = |m| reduce(&x, &weights(&mask, 2, 4, m));
        assert_eq!(r(AggMode::TokenMean), 10.0 / 4.0);
        assert_eq!(r(AggMode::SeqMeanTokenSum), (6.0 + 4.0) / 2.0);
        let stm = r(AggMode::SeqMeanTokenMean);
        assert!((stm - (2.0 + 4.0) / 2.0).abs() < 1e-7, "{stm}");
        let norm = r(AggMode::SeqMeanTokenSumNorm {
            horizon: Some(10.0),
        });
        assert!((norm - 0.5).abs() < 1e-15, "{norm}");
        assert_eq!(masked_sum(&x, &mask), 10.0);
    }

    #[test]
    fn bf16_rounding_of_a_mean_is_about_one_bf16_ulp_of_its_terms() {
        let x = [1.0; 4];
        let w = [0.25; 4];
        let r = 2f64.powi(-8) / (1.0 - 2f64.powi(-8));
        // worst case Σ r·|wx| = r, probabilistic 6·√(4·(r/4)²) = 3r: the worst case wins
        let b = stored_rounding(&x, &w, Some(DType::BF16));
        assert!((b - r).abs() < 1e-15, "{b} vs {r}");
        assert!(stored_rounding(&x, &w, Some(DType::I64)) < 1e-15);
    }

    #[test]
    fn a_sequence_ratio_carries_its_rows_worst_slack() {
        // two rows of three tokens, the last token of row 0 masked
        let slack = [0.1, 0.3, 0.9, 0.2, 0.0, 0.4];
        let mask = [1.0, 1.0, 0.0, 1.0, 1.0, 1.0];
        assert_eq!(
            sequence_slack(&slack, &mask, 3),
            vec![0.3, 0.3, 0.3, 0.4, 0.4, 0.4]
        );
        assert!(sequence_slack(&[], &mask, 3).is_empty());
    }
}

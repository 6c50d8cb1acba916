//! The tolerance a reduction inherits when it is recomputed from rounded inputs.
//!
//! A producer computes `S = Σ wᵢ·xᵢ` (a masked sum or mean; `wᵢ` = 1 or 1/n) from exact
//! values and dumps the `xᵢ` rounded to their stored dtype: `x̂ᵢ = xᵢ(1 + δᵢ)`,
//! `|δᵢ| ≤ uᵢ` (unit roundoff: bf16 2⁻⁸, f16 2⁻¹¹, f32 2⁻²⁴, f64 2⁻⁵³), so
//! `|xᵢ − x̂ᵢ| ≤ rᵢ·|x̂ᵢ|` with `rᵢ = uᵢ/(1 − uᵢ)`. Recomputing `Ŝ = Σ wᵢ·x̂ᵢ` in f64:
//!
//! ```text
//! |Ŝ − S| ≤ min( λ·√Σ (rᵢ·wᵢ·x̂ᵢ)²  ,  Σ rᵢ·|wᵢ·x̂ᵢ| )  +  2·γₙ·Σ |wᵢ·x̂ᵢ|
//! ```
//!
//! - `Σ rᵢ·|wᵢ·x̂ᵢ|` is the worst case (every rounding error the same sign): always holds.
//! - `λ·√Σ (rᵢ·wᵢ·x̂ᵢ)²` is the probabilistic bound (Higham & Mary 2019): rounding errors
//!   of distinct values are independent and centred, so by Hoeffding's inequality the sum
//!   exceeds it with probability at most `2·exp(−λ²/2)`; with `λ = 6`, 3·10⁻⁸. It grows
//!   like `√n` where the worst case grows like `n`, which is what keeps a long reduction's
//!   tolerance honest (a 4096-token mean of bf16 entropies: ~60× tighter).
//! - `γₙ = n·2⁻⁵³/(1 − n·2⁻⁵³)` covers the f64 accumulation of both the recompute and the
//!   reference (negligible below n ≈ 10⁹).
//!
//! Against torch (`conventions.json`): every draw is within the bound, and the bound is at
//! most 10× the largest error seen (it is a bound, not an estimate).

use crate::tensor::DType;

/// `λ` of the probabilistic bound: exceeded with probability ≤ `2·exp(−λ²/2)` ≈ 3·10⁻⁸.
pub const LAMBDA: f64 = 6.0;

/// The unit roundoff of a stored float dtype (half the distance from 1 to the next value);
/// `None` for integer and other exact or non-float types (they add no rounding).
pub fn unit_roundoff(dtype: DType) -> Option<f64> {
    match dtype {
        DType::BF16 => Some(2f64.powi(-8)),
        DType::F16 => Some(2f64.powi(-11)),
        DType::F32 => Some(2f64.powi(-24)),
        DType::F64 => Some(2f64.powi(-53)),
        _ => None,
    }
}

/// Accumulates the terms `wᵢ·x̂ᵢ` of one reduction, each with its input's unit roundoff.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RoundingBound {
    /// Number of terms.
    pub n: usize,
    /// `Σ (rᵢ·wᵢ·x̂ᵢ)²`.
    pub sum_sq: f64,
    /// `Σ rᵢ·|wᵢ·x̂ᵢ|`.
    pub sum_abs: f64,
    /// `Σ |wᵢ·x̂ᵢ|` (for the accumulation term).
    pub magnitude: f64,
}

impl RoundingBound {
    /// Adds one term: `weighted` = `wᵢ·x̂ᵢ` (the stored value times its weight in the
    /// reduction), `u` = the unit roundoff of the dtype `x̂ᵢ` was stored in (0 when exact).
    pub fn push(&mut self, weighted: f64, u: f64) {
        let r = u / (1.0 - u);
        let e = r * weighted.abs();
        self.n += 1;
        self.sum_sq += e * e;
        self.sum_abs += e;
        self.magnitude += weighted.abs();
    }

    /// The bound for `n` terms stored in one dtype of unit roundoff `u`, from the moments
    /// `Σ (wᵢ·x̂ᵢ)²` and `Σ |wᵢ·x̂ᵢ|`.
    pub fn from_moments(n: usize, sum_sq: f64, sum_abs: f64, u: f64) -> Self {
        let r = u / (1.0 - u);
        RoundingBound {
            n,
            sum_sq: r * r * sum_sq,
            sum_abs: r * sum_abs,
            magnitude: sum_abs,
        }
    }

    /// The allowed `|recompute − truth|` (formula in the module docs).
    pub fn tolerance(&self) -> f64 {
        let nu = self.n as f64 * f64::EPSILON / 2.0;
        let gamma = if nu < 1.0 {
            nu / (1.0 - nu)
        } else {
            f64::INFINITY
        };
        (LAMBDA * self.sum_sq.sqrt()).min(self.sum_abs) + 2.0 * gamma * self.magnitude
    }
}

/// The tolerance of `mean(x̂)` over `values` stored in `dtype` (a masked mean's valid
/// elements), e.g. an entropy loss recomputed from a bf16 `entropy` tensor.
pub fn mean_tolerance(values: &[f64], dtype: DType) -> f64 {
    let u = unit_roundoff(dtype).unwrap_or(0.0);
    let w = 1.0 / values.len().max(1) as f64;
    let mut b = RoundingBound::default();
    for v in values {
        b.push(w * v, u);
    }
    b.tolerance()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conventions::manifest;

    fn dtype(name: &str) -> DType {
        match name {
            "bfloat16" => DType::BF16,
            "float16" => DType::F16,
            "float32" => DType::F32,
            other => panic!("manifest dtype {other}"),
        }
    }

    #[test]
    fn unit_roundoffs_are_the_manifests() {
        let m = manifest::load();
        for (name, u) in m["unit_roundoff"].as_object().unwrap() {
            assert_eq!(unit_roundoff(dtype(name)), u.as_f64(), "{name}");
        }
        assert_eq!(unit_roundoff(DType::I64), None);
    }

    #[test]
    fn bound_holds_for_every_torch_draw_and_is_at_most_10x_loose() {
        let m = manifest::load();
        let cases = m["rounding"].as_array().unwrap();
        assert_eq!(cases.len(), 24);
        for case in cases {
            let u = unit_roundoff(dtype(case["dtype"].as_str().unwrap())).unwrap();
            let n = case["n"].as_u64().unwrap() as usize;
            let mut worst_ratio = 0.0f64;
            for d in case["draws"].as_array().unwrap() {
                let b = RoundingBound::from_moments(
                    n,
                    d["sum_sq"].as_f64().unwrap(),
                    d["sum_abs"].as_f64().unwrap(),
                    u,
                );
                let err = d["abs_err"].as_f64().unwrap();
                let tol = b.tolerance();
                assert!(
                    err <= tol,
                    "{} n={n}: error {err:e} > bound {tol:e}",
                    case["dtype"]
                );
                worst_ratio = worst_ratio.max(err / tol);
            }
            assert!(
                worst_ratio >= 0.1,
                "{} n={n} {}: bound {:.1}x the largest error",
                case["dtype"],
                case["reduction"],
                1.0 / worst_ratio
            );
        }
    }

    #[test]
    fn mean_of_rounded_example_is_within_the_bound_of_torchs_truth() {
        let m = manifest::load();
        for case in m["rounding"].as_array().unwrap() {
            let Some(ex) = case.get("example") else {
                continue;
            };
            if case["reduction"] != "mean" {
                continue;
            }
            let dt = dtype(case["dtype"].as_str().unwrap());
            let xs: Vec<f64> = ex["rounded"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            let truth = ex["truth"].as_f64().unwrap();
            let mean = xs.iter().sum::<f64>() / xs.len() as f64;
            let tol = mean_tolerance(&xs, dt);
            assert!(
                (mean - truth).abs() <= tol,
                "{dt:?}: {mean} vs {truth}, tol {tol:e}"
            );
            // the push path and the moment path agree
            let sq: f64 = xs.iter().map(|x| (x / 16.0).powi(2)).sum();
            let ab: f64 = xs.iter().map(|x| (x / 16.0).abs()).sum();
            let u = unit_roundoff(dt).unwrap();
            let via_moments = RoundingBound::from_moments(16, sq, ab, u).tolerance();
            assert!(
                (via_moments - tol).abs() <= 1e-12 * tol,
                "{via_moments} vs {tol}"
            );
        }
    }

    #[test]
    fn long_reductions_use_the_sqrt_n_bound_and_short_ones_the_worst_case() {
        // 4096 equal-magnitude terms: worst case n·r·|x|, probabilistic λ·√n·r·|x|
        let u = 2f64.powi(-8);
        let r = u / (1.0 - u);
        let mut b = RoundingBound::default();
        for i in 0..4096 {
            b.push(if i % 2 == 0 { 1.0 } else { -1.0 }, u);
        }
        let expect = LAMBDA * 64.0 * r
            + 2.0 * (4096.0 * f64::EPSILON / 2.0) / (1.0 - 4096.0 * f64::EPSILON / 2.0) * 4096.0;
        assert!(
            (b.tolerance() - expect).abs() <= 1e-12 * expect,
            "{} vs {expect}",
            b.tolerance()
        );
        let mut one = RoundingBound::default();
        one.push(3.0, u);
        assert!(
            (one.tolerance()
                - (3.0 * r + 2.0 * f64::EPSILON / 2.0 / (1.0 - f64::EPSILON / 2.0) * 3.0))
                .abs()
                < 1e-18
        );
        // exact inputs (integers, u = 0) leave only the accumulation term
        let mut exact = RoundingBound::default();
        exact.push(5.0, 0.0);
        assert!(exact.tolerance() < 1e-14);
    }
}

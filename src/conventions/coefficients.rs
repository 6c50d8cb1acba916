//! Loss-composition coefficients inferred from dumped loss terms.
//!
//! verl and NexRL compose a micro-batch's loss as
//! `loss = pg_loss − entropy_coeff · entropy_loss + kl_coef · kl_loss`, and most dumps hold
//! the terms but not the coefficients. Across the cells of a step the coefficients are
//! constants, so `y = loss − pg_loss = −entropy_coeff · entropy_loss + kl_coef · kl_loss`
//! is an overdetermined linear system; its least-squares solution is the inferred pair and
//! its residual says how well one pair of constants explains every cell (a large residual:
//! the loss is composed otherwise, or one cell is faulty).

use crate::tensor::DType;

use super::rounding::unit_roundoff;

/// The loss terms one cell (rank, micro) dumped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossTerms {
    /// The total loss.
    pub loss: f64,
    /// The policy-gradient term.
    pub pg_loss: f64,
    /// The aggregated entropy.
    pub entropy_loss: f64,
    /// The aggregated KL estimate, when the producer adds a KL term.
    pub kl_loss: Option<f64>,
}

/// The coefficients that best explain every cell, and how well they do.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct CoefficientFit {
    /// Weight of the entropy bonus (subtracted from the loss).
    pub entropy_coeff: f64,
    /// Weight of the KL term, when every cell dumped a KL value.
    pub kl_coef: Option<f64>,
    /// Standard error of `entropy_coeff` (from the residual, floored by the dumped values'
    /// own rounding).
    pub entropy_coeff_std_err: f64,
    /// Standard error of `kl_coef`.
    pub kl_coef_std_err: Option<f64>,
    /// Root mean square of `y − X·coefficients` over the cells.
    pub rms_residual: f64,
    /// Largest absolute residual of one cell.
    pub max_residual: f64,
    /// Number of cells fitted.
    pub cells: usize,
}

/// Why no coefficients could be inferred.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    /// No cell to fit.
    #[error("no loss cell to infer coefficients from")]
    Empty,
    /// Some cells dumped a KL value and others did not.
    #[error("kl_loss is dumped in {with} of {cells} cells: the loss composition is not the same everywhere")]
    MixedKl {
        /// Cells holding a KL value.
        with: usize,
        /// All cells.
        cells: usize,
    },
    /// A value is NaN or infinite.
    #[error("cell {cell}: a loss term is not finite")]
    NotFinite {
        /// Index of the cell in the input.
        cell: usize,
    },
    /// The columns do not determine the coefficients (all entropies zero, or entropy and KL
    /// proportional across cells).
    #[error(
        "the dumped terms do not determine the coefficients (columns are zero or proportional)"
    )]
    Degenerate,
}

/// Infers `entropy_coeff` (and `kl_coef` when every cell dumped `kl_loss`) by least squares
/// over all cells. `stored` is the dtype the loss scalars were computed in (f32 for torch
/// trainers): its rounding is the smallest residual a fit can have, and floors the
/// standard errors so that a perfect fit does not claim infinite precision.
pub fn infer(cells: &[LossTerms], stored: DType) -> Result<CoefficientFit, FitError> {
    if cells.is_empty() {
        return Err(FitError::Empty);
    }
    let with_kl = cells.iter().filter(|c| c.kl_loss.is_some()).count();
    if with_kl != 0 && with_kl != cells.len() {
        return Err(FitError::MixedKl {
            with: with_kl,
            cells: cells.len(),
        });
    }
    for (i, c) in cells.iter().enumerate() {
        let kl_ok = c.kl_loss.is_none_or(f64::is_finite);
        if !(c.loss.is_finite() && c.pg_loss.is_finite() && c.entropy_loss.is_finite() && kl_ok) {
            return Err(FitError::NotFinite { cell: i });
        }
    }
    let u = unit_roundoff(stored).unwrap_or(0.0);
    let y: Vec<f64> = cells.iter().map(|c| c.loss - c.pg_loss).collect();
    // the rounding floor: loss and pg_loss each carry half an ulp of their stored dtype
    let floor_sq = cells
        .iter()
        .map(|c| (u * (c.loss.abs() + c.pg_loss.abs())).powi(2))
        .sum::<f64>()
        / cells.len() as f64;
    let a: Vec<f64> = cells.iter().map(|c| -c.entropy_loss).collect();
    let n = cells.len();
    if with_kl == 0 {
        let aa: f64 = a.iter().map(|v| v * v).sum();
        if aa == 0.0 {
            return Err(FitError::Degenerate);
        }
        let ec = a.iter().zip(&y).map(|(x, y)| x * y).sum::<f64>() / aa;
        let res: Vec<f64> = a.iter().zip(&y).map(|(x, y)| y - ec * x).collect();
        let (rms, max) = residual_stats(&res);
        let sigma_sq = noise_variance(&res, 1).max(floor_sq);
        return Ok(CoefficientFit {
            entropy_coeff: ec,
            kl_coef: None,
            entropy_coeff_std_err: (sigma_sq / aa).sqrt(),
            kl_coef_std_err: None,
            rms_residual: rms,
            max_residual: max,
            cells: n,
        });
    }
    // every kl_loss is Some here (with_kl == cells.len())
    let b: Vec<f64> = cells.iter().map(|c| c.kl_loss.unwrap_or(0.0)).collect();
    let (aa, ab, bb) = (dot(&a, &a), dot(&a, &b), dot(&b, &b));
    let (ay, by) = (dot(&a, &y), dot(&b, &y));
    let det = aa * bb - ab * ab;
    // relative test: det is scale-dependent, Cauchy–Schwarz gives det ∈ [0, aa·bb]
    if aa == 0.0 || bb == 0.0 || det <= 1e-12 * aa * bb {
        return Err(FitError::Degenerate);
    }
    let ec = (bb * ay - ab * by) / det;
    let kc = (aa * by - ab * ay) / det;
    let res: Vec<f64> = (0..n).map(|i| y[i] - ec * a[i] - kc * b[i]).collect();
    let (rms, max) = residual_stats(&res);
    let sigma_sq = noise_variance(&res, 2).max(floor_sq);
    Ok(CoefficientFit {
        entropy_coeff: ec,
        kl_coef: Some(kc),
        entropy_coeff_std_err: (sigma_sq * bb / det).sqrt(),
        kl_coef_std_err: Some((sigma_sq * aa / det).sqrt()),
        rms_residual: rms,
        max_residual: max,
        cells: n,
    })
}

/// How many standard errors apart two fitted coefficients must be to count as different.
pub const DIFFER_SIGMAS: f64 = 6.0;

/// One coefficient that the two sides' fits put at different values.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct CoefficientDiff {
    /// `"entropy_coeff"` or `"kl_coef"`.
    pub name: &'static str,
    /// The first side's value.
    pub a: f64,
    /// The second side's value.
    pub b: f64,
    /// `|a − b|` in units of the combined standard error.
    pub sigmas: f64,
}

/// The coefficients whose fitted values differ between two sides by more than
/// [`DIFFER_SIGMAS`] combined standard errors ("entropy_coeff 1e-4 vs 1e-3"). A KL term on
/// one side only is a difference too (the absent side counts as 0 with no error).
pub fn differences(a: &CoefficientFit, b: &CoefficientFit) -> Vec<CoefficientDiff> {
    let mut out = Vec::new();
    let mut check = |name, va: f64, ea: f64, vb: f64, eb: f64| {
        let se = (ea * ea + eb * eb).sqrt();
        let gap = (va - vb).abs();
        if gap > DIFFER_SIGMAS * se && gap > f64::EPSILON * va.abs().max(vb.abs()) {
            let sigmas = if se > 0.0 { gap / se } else { f64::INFINITY };
            out.push(CoefficientDiff {
                name,
                a: va,
                b: vb,
                sigmas,
            });
        }
    };
    check(
        "entropy_coeff",
        a.entropy_coeff,
        a.entropy_coeff_std_err,
        b.entropy_coeff,
        b.entropy_coeff_std_err,
    );
    let kl = |f: &CoefficientFit| (f.kl_coef.unwrap_or(0.0), f.kl_coef_std_err.unwrap_or(0.0));
    if a.kl_coef.is_some() || b.kl_coef.is_some() {
        let ((va, ea), (vb, eb)) = (kl(a), kl(b));
        check("kl_coef", va, ea, vb, eb);
    }
    out
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn residual_stats(res: &[f64]) -> (f64, f64) {
    let rms = (res.iter().map(|r| r * r).sum::<f64>() / res.len() as f64).sqrt();
    let max = res.iter().fold(0.0f64, |m, r| m.max(r.abs()));
    (rms, max)
}

/// Unbiased residual variance with `p` fitted parameters (0 when there are no degrees of
/// freedom left: the rounding floor then decides).
fn noise_variance(res: &[f64], p: usize) -> f64 {
    if res.len() <= p {
        return 0.0;
    }
    res.iter().map(|r| r * r).sum::<f64>() / (res.len() - p) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conventions::manifest;

    fn cells_of(case: &serde_json::Value) -> Vec<LossTerms> {
        case["cells"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| LossTerms {
                loss: c["loss"].as_f64().unwrap(),
                pg_loss: c["pg_loss"].as_f64().unwrap(),
                entropy_loss: c["entropy_loss"].as_f64().unwrap(),
                kl_loss: c["kl_loss"].as_f64(),
            })
            .collect()
    }

    fn fits() -> Vec<(serde_json::Value, Vec<LossTerms>, CoefficientFit)> {
        let m = manifest::load();
        let cases = m["coefficients"].as_array().unwrap().clone();
        cases
            .into_iter()
            .map(|c| {
                let cells = cells_of(&c);
                let fit = infer(&cells, DType::F32).unwrap();
                (c, cells, fit)
            })
            .collect()
    }

    #[test]
    fn least_squares_matches_torch_lstsq_in_f64() {
        for (case, _, fit) in fits() {
            let sol: Vec<f64> = case["lstsq"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect();
            assert!(
                (fit.entropy_coeff - sol[0]).abs() <= 1e-12,
                "{case}: {fit:?}"
            );
            match fit.kl_coef {
                Some(kc) => assert!((kc - sol[1]).abs() <= 1e-12, "{case}: {fit:?}"),
                None => assert_eq!(sol.len(), 1),
            }
            let rms = case["rms_residual"].as_f64().unwrap();
            assert!(
                (fit.rms_residual - rms).abs() <= 1e-15,
                "{} vs {rms}",
                fit.rms_residual
            );
        }
    }

    #[test]
    fn inferred_coefficients_bracket_the_true_ones() {
        for (case, _, fit) in fits() {
            let ec = case["entropy_coeff"].as_f64().unwrap();
            let kc = case["kl_coef"].as_f64().unwrap();
            assert!(
                (fit.entropy_coeff - ec).abs() <= DIFFER_SIGMAS * fit.entropy_coeff_std_err,
                "{case}: {fit:?}"
            );
            // and the error bar is tight: 1e-4 vs 1e-3 must be told apart
            assert!(fit.entropy_coeff_std_err < 1e-5, "{fit:?}");
            if let (Some(k), Some(e)) = (fit.kl_coef, fit.kl_coef_std_err) {
                assert!((k - kc).abs() <= DIFFER_SIGMAS * e, "{case}: {fit:?}");
            }
        }
    }

    #[test]
    fn sides_with_other_entropy_coeff_differ_and_equal_ones_do_not() {
        let f = fits();
        // case 0: entropy_coeff 1e-4, case 1: 1e-3 (no KL in either)
        let d = differences(&f[0].2, &f[1].2);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].name, "entropy_coeff");
        assert_eq!(
            (d[0].a, d[0].b),
            (f[0].2.entropy_coeff, f[1].2.entropy_coeff)
        );
        // the same case split into two halves: same coefficient on both "sides"
        let cells = &f[0].1;
        let (x, y) = cells.split_at(cells.len() / 2);
        let (fx, fy) = (infer(x, DType::F32).unwrap(), infer(y, DType::F32).unwrap());
        assert!(differences(&fx, &fy).is_empty(), "{fx:?} {fy:?}");
        // KL on one side only (case 3 has kl_coef 1e-3, case 0 none)
        let d = differences(&f[0].2, &f[3].2);
        assert!(d.iter().any(|d| d.name == "kl_coef" && d.b > 0.0), "{d:?}");
    }

    /// Both sides' cells of a committed scenario (truth.json `cells`).
    fn scenario_sides(text: &str) -> (serde_json::Value, Vec<LossTerms>, Vec<LossTerms>) {
        let t: serde_json::Value = serde_json::from_str(text).unwrap();
        let side = |p: &str| -> Vec<LossTerms> {
            t["cells"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| LossTerms {
                    loss: c[format!("{p}_loss")].as_f64().unwrap(),
                    pg_loss: c[format!("{p}_pg_loss")].as_f64().unwrap(),
                    entropy_loss: c[format!("{p}_entropy_loss")].as_f64().unwrap(),
                    kl_loss: c[format!("{p}_kl_loss")].as_f64(),
                })
                .collect()
        };
        let (a, b) = (side("self_hosted"), side("weaver"));
        (t, a, b)
    }

    #[test]
    fn scenario_with_a_changed_entropy_coeff_is_told_apart() {
        // seed 6: self-hosted entropy_coeff 0, weaver 1e-4 (six cells, one with a wrong mask
        // that the weaver used consistently, so its terms still compose)
        let (t, sh, wv) =
            scenario_sides(include_str!("../../fixtures/scenarios/seed-006/truth.json"));
        let want = &t["dumpdiff"]["coefficients"][0];
        let (fa, fb) = (
            infer(&sh, DType::F32).unwrap(),
            infer(&wv, DType::F32).unwrap(),
        );
        let (ea, eb) = (
            want["self-hosted"].as_f64().unwrap(),
            want["weaver"].as_f64().unwrap(),
        );
        assert!(
            (fa.entropy_coeff - ea).abs() <= DIFFER_SIGMAS * fa.entropy_coeff_std_err,
            "{fa:?}"
        );
        assert!(
            (fb.entropy_coeff - eb).abs() <= DIFFER_SIGMAS * fb.entropy_coeff_std_err,
            "{fb:?}"
        );
        let d = differences(&fa, &fb);
        assert_eq!(
            d.iter().map(|d| d.name).collect::<Vec<_>>(),
            ["entropy_coeff"]
        );
    }

    #[test]
    fn scenarios_with_equal_coefficients_do_not_differ() {
        // seed 18: KL k1 1e-2, no entropy; seed 4: entropy 1e-2 and KL k3 1e-2, both sides
        for text in [
            include_str!("../../fixtures/scenarios/seed-018/truth.json"),
            include_str!("../../fixtures/scenarios/seed-004/truth.json"),
        ] {
            let (t, sh, wv) = scenario_sides(text);
            let c = &t["conventions"];
            for cells in [&sh, &wv] {
                let f = infer(cells, DType::F32).unwrap();
                let ec = c["entropy_coeff"].as_f64().unwrap();
                let kc = c["kl_coef"].as_f64().unwrap();
                assert!(
                    (f.entropy_coeff - ec).abs() <= DIFFER_SIGMAS * f.entropy_coeff_std_err,
                    "{f:?}"
                );
                let (k, e) = (f.kl_coef.unwrap(), f.kl_coef_std_err.unwrap());
                assert!((k - kc).abs() <= DIFFER_SIGMAS * e, "{f:?}");
            }
            let (fa, fb) = (
                infer(&sh, DType::F32).unwrap(),
                infer(&wv, DType::F32).unwrap(),
            );
            assert!(differences(&fa, &fb).is_empty(), "{fa:?} {fb:?}");
        }
    }

    #[test]
    fn a_cell_with_another_composition_shows_in_the_residual() {
        let (_, mut cells, clean) = fits().swap_remove(0);
        cells[2].loss *= 23.0; // one micro summed its loss over 23 tokens
        let fit = infer(&cells, DType::F32).unwrap();
        assert!(
            fit.max_residual > 1e4 * clean.max_residual.max(1e-12),
            "{fit:?}"
        );
    }

    #[test]
    fn degenerate_and_malformed_inputs_are_refused() {
        let t = |e: f64, kl: Option<f64>| LossTerms {
            loss: 1.0,
            pg_loss: 1.0,
            entropy_loss: e,
            kl_loss: kl,
        };
        assert_eq!(infer(&[], DType::F32), Err(FitError::Empty));
        assert_eq!(
            infer(&[t(0.0, None), t(0.0, None)], DType::F32),
            Err(FitError::Degenerate)
        );
        assert_eq!(
            infer(&[t(1.0, Some(0.5)), t(2.0, Some(1.0))], DType::F32),
            Err(FitError::Degenerate)
        );
        assert_eq!(
            infer(&[t(1.0, Some(0.5)), t(2.0, None)], DType::F32),
            Err(FitError::MixedKl { with: 1, cells: 2 })
        );
        assert_eq!(
            infer(&[t(f64::NAN, None)], DType::F32),
            Err(FitError::NotFinite { cell: 0 })
        );
    }
}

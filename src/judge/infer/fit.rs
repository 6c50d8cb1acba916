//! Least squares of the loss-composition coefficients over a tree's cells
//! ([`crate::conventions::coefficients::infer`]), robust to a minority of cells composed
//! otherwise, and the underdetermined case (one cell with both terms).

use super::Prep;
use crate::conventions::coefficients::{infer, LossTerms};
use crate::tensor::DType;

/// Entropy and KL coefficients that the cells cannot tell apart: each alone (the other 0)
/// is fitted, and the one that explains the cells better (at equal fit, the non-negative
/// one, entropy first) is taken, flagged as underdetermined.
pub(super) fn underdetermined(cells: &[&Prep]) -> Option<Fit> {
    let e = fit(cells, None, Some(0.0));
    let k = fit(cells, Some(0.0), None);
    let pick = match (e, k) {
        (Some(e), Some(k)) => {
            let score = |f: &Fit, c: f64| (f.explained, c >= 0.0);
            let ke = k.kc.map_or(0.0, |x| x.0);
            if score(&k, ke) > score(&e, e.ec) {
                k
            } else {
                e
            }
        }
        (Some(e), None) => e,
        (None, Some(k)) => k,
        (None, None) => return None,
    };
    Some(Fit {
        underdetermined: true,
        kc: Some(pick.kc.unwrap_or((0.0, 0.0))),
        ..pick
    })
}

pub(super) struct Fit {
    /// The cells could not separate the coefficients (see [`underdetermined`]).
    pub(super) underdetermined: bool,
    /// Standard errors of `(entropy_coeff, kl_coef)` from the cells' rounding alone: the
    /// uncertainty cells are judged with.
    pub(super) trusted_se: (f64, f64),
    pub(super) ec: f64,
    pub(super) ec_se: f64,
    pub(super) kc: Option<(f64, f64)>,
    pub(super) rms: f64,
    pub(super) explained: usize,
    pub(super) cells: usize,
}

/// Whether a cell's composition `loss − pg_loss = −e·entropy_loss + k·kl_loss` holds
/// under `(e, k)`: its residual within its own f32 rounding plus what the coefficients'
/// standard errors `se` allow on its terms.
pub(super) fn cell_fits(p: &Prep, (e, k): (f64, f64), se: (f64, f64)) -> bool {
    let u = 2f64.powi(-24);
    let (loss, pg, ent) = (
        p.loss.unwrap_or(0.0),
        p.pg.unwrap_or(0.0),
        p.ent.unwrap_or(0.0),
    );
    let kl = p.kl_loss.unwrap_or(0.0);
    let r = loss - pg + e * ent - k * kl;
    r.abs()
        <= 8.0 * u * (loss.abs() + pg.abs() + (e * ent).abs() + (k * kl).abs())
            + crate::conventions::rounding::LAMBDA * (se.0 * ent.abs() + se.1 * kl.abs())
            + 1e-12
}

/// Least squares of the unknown coefficients (`ec`/`kc` `None`) over `cells`, the known
/// ones moved to the left-hand side; cells whose residual exceeds their f32 rounding are
/// dropped and the fit redone when they are a minority.
pub(super) fn fit(cells: &[&Prep], ec: Option<f64>, kc: Option<f64>) -> Option<Fit> {
    let u = 2f64.powi(-24);
    // each cell weighted by the median cell's rounding over its own (at most 1): a cell
    // whose totals are orders above the others' rounds them away, so it neither pulls the
    // fit nor is explained by a fit it pulled (seed 9024: two summed totals of ~10 beside
    // four of ~0.1; seed 7768: two legitimate totals of 2e4)
    let sigma = |p: &Prep| u * (p.loss.unwrap_or(0.0).abs() + p.pg.unwrap_or(0.0).abs());
    let median = {
        let mut s: Vec<f64> = cells.iter().map(|p| sigma(p)).collect();
        s.sort_by(f64::total_cmp);
        s.get(s.len() / 2).copied().unwrap_or(0.0)
    };
    let weight = |p: &Prep| {
        let s = sigma(p);
        if s > median && median > 0.0 {
            median / s
        } else {
            1.0
        }
    };
    let terms_of = |p: &Prep| -> LossTerms {
        let (loss, pg, ent) = (
            p.loss.unwrap_or(0.0),
            p.pg.unwrap_or(0.0),
            p.ent.unwrap_or(0.0),
        );
        let kl = p.kl_loss.unwrap_or(0.0);
        match (ec, kc) {
            // both unknown
            (None, None) => LossTerms {
                loss,
                pg_loss: pg,
                entropy_loss: ent,
                kl_loss: Some(kl),
            },
            // entropy unknown, KL known: move it left
            (None, Some(k)) => LossTerms {
                loss: loss - k * kl,
                pg_loss: pg,
                entropy_loss: ent,
                kl_loss: None,
            },
            // KL unknown, entropy known: fit kl_coef in the entropy slot (y = −c·(−kl))
            (Some(e), None) => LossTerms {
                loss: loss + e * ent,
                pg_loss: pg,
                entropy_loss: -kl,
                kl_loss: None,
            },
            (Some(_), Some(_)) => LossTerms {
                loss,
                pg_loss: pg,
                entropy_loss: ent,
                kl_loss: None,
            },
        }
    };
    let terms = |keep: &[bool]| -> Vec<LossTerms> {
        cells
            .iter()
            .zip(keep)
            .filter(|(_, k)| **k)
            .map(|(p, _)| (p, weight(p)))
            .map(|(p, w)| {
                let t = terms_of(p);
                LossTerms {
                    loss: w * t.loss,
                    pg_loss: w * t.pg_loss,
                    entropy_loss: w * t.entropy_loss,
                    kl_loss: t.kl_loss.map(|k| w * k),
                }
            })
            .collect()
    };
    let run = |keep: &[bool]| infer(&terms(keep), DType::F32).ok();
    let all = vec![true; cells.len()];
    let Some(mut f) = run(&all) else {
        // both coefficients unknown and the cells cannot separate them (one cell, or
        // entropy and KL proportional across cells): the better of the one-coefficient fits
        if ec.is_none() && kc.is_none() {
            return underdetermined(cells);
        }
        return None;
    };
    let coef = |f: &crate::conventions::coefficients::CoefficientFit| match (ec, kc) {
        (None, None) => (f.entropy_coeff, f.kl_coef.unwrap_or(0.0)),
        (None, Some(k)) => (f.entropy_coeff, k),
        (Some(e), None) => (e, f.entropy_coeff),
        (Some(e), Some(k)) => (e, k),
    };
    let fits = |ek: (f64, f64), se: (f64, f64)| -> Vec<bool> {
        cells.iter().map(|p| cell_fits(p, ek, se)).collect()
    };
    // the standard error the cells' f32 rounding alone leaves a coefficient (`σ/‖column‖`,
    // σ the median cell's u·(|loss| + |pg_loss|)): what a fit may be trusted to, so that a
    // fit that misses a cell cannot widen its own tolerance with its residual — nor a few
    // cells of huge totals widen every other's (seed 7768: totals of 2e4 beside totals of
    // 1 let an unstated KL term's scatter pass as rounding under the mean square)
    let floor_se = |col: &dyn Fn(&Prep) -> f64| -> f64 {
        let aa: f64 = cells.iter().map(|p| col(p).powi(2)).sum();
        if aa > 0.0 {
            median / aa.sqrt()
        } else {
            0.0
        }
    };
    let se = (
        if ec.is_none() {
            floor_se(&|p| p.ent.unwrap_or(0.0))
        } else {
            0.0
        },
        if kc.is_none() {
            floor_se(&|p| p.kl_loss.unwrap_or(0.0))
        } else {
            0.0
        },
    );
    let mut keep = fits(coef(&f), se);
    let good = keep.iter().filter(|k| **k).count();
    if good < cells.len() && 2 * good > cells.len() {
        f = run(&keep)?;
        keep = fits(coef(&f), se);
    }
    let (e, k) = coef(&f);
    let kc_out = match (ec, kc) {
        (None, None) => Some((k, f.kl_coef_std_err.unwrap_or(0.0))),
        (Some(_), None) => Some((k, f.entropy_coeff_std_err)),
        _ => None,
    };
    Some(Fit {
        underdetermined: false,
        trusted_se: se,
        ec: e,
        ec_se: if ec.is_none() {
            f.entropy_coeff_std_err
        } else {
            0.0
        },
        kc: kc_out,
        rms: f.rms_residual,
        explained: keep.iter().filter(|k| **k).count(),
        cells: cells.len(),
    })
}

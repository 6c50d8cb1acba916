//! Tolerance propagation for quantities derived from log-probabilities.
//!
//! A derived element inherits the error its inputs are allowed to carry; judging it by
//! its own dtype alone either fails clean runs (long tails of large |log p|) or needs a
//! blanket widening that hides real faults. The rules, per element of the reference side:
//!
//! - **log-ratio** `Δ = logp − old`: its inputs may each be off by their own tolerance,
//!   so `E = tol_logp(logp) + tol_old(old)` (`atol + rtol·|x|` of the pair each input is
//!   compared as).
//! - **ratio** `r = exp(Δ)`: `|exp(Δ + e) − exp(Δ)| ≤ r·(e^E − 1)` for `|e| ≤ E`
//!   (first order `r·E`; the exact bound keeps large `E` honest).
//! - **elementwise loss** `−r·A`: `|A|·r·(e^E − 1)` (advantages are compared on their own).
//! - **masked mean** (loss, pg_loss, avg_ratio): the mean of its elements' tolerances.
//! - **count fraction** `k/n` (`clip_frac`: share of valid tokens with `|r − 1| > ε`):
//!   only tokens whose ratio lies within its tolerance of a clip boundary `1 ± ε` can
//!   flip, so the fraction may move by `flips / n`.
//!
//! What a derived value is compared with is then `allowed = atol + rtol·|a| + propagated`,
//! where `atol`/`rtol` are the default (or rule) tolerance of the value's own precision:
//! the rounding of the result itself comes on top of what it inherits.

use std::sync::Arc;

/// The allowed log-ratio error at one element: the sum of both inputs' allowed errors.
pub fn log_ratio_allowed(tol_logp: f64, tol_old: f64) -> f64 {
    tol_logp + tol_old
}

/// The allowed error of `r = exp(Δ)` when `Δ` may be off by `e_log`: `r·(e^E − 1)`.
pub fn ratio_allowed(ratio: f64, e_log: f64) -> f64 {
    ratio_allowed_from_exp_m1(ratio, e_log.exp_m1())
}

/// [`ratio_allowed`] from `e^E − 1` already computed (a vectorised pass takes a whole
/// run's at once): the same product, so the same bits.
pub fn ratio_allowed_from_exp_m1(ratio: f64, e_log_exp_m1: f64) -> f64 {
    ratio.abs() * e_log_exp_m1
}

/// The allowed error of `−r·A` given the ratio's allowed error.
pub fn product_allowed(ratio_allowed: f64, advantage: f64) -> f64 {
    advantage.abs() * ratio_allowed
}

/// True when a ratio with allowed error `allowed` could lie on either side of a clip
/// boundary `1 − eps_low` or `1 + eps_high`, i.e. its clip decision may flip.
pub fn may_flip(ratio: f64, allowed: f64, eps_low: f64, eps_high: f64) -> bool {
    (ratio - (1.0 - eps_low)).abs() <= allowed || (ratio - (1.0 + eps_high)).abs() <= allowed
}

/// One valid element of the reference side's importance-sampling chain.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ChainElem {
    /// `exp(logp − old)`.
    pub ratio: f64,
    /// The ratio's propagated allowed error.
    pub ratio_allowed: f64,
    /// `|A|` of the element's row, when advantages are known.
    pub abs_advantage: Option<f64>,
}

/// A run of a chain's valid elements: `len` consecutive values of one row, from `start`
/// in the row-major ratios and allowances, and the row's `|A|` when known.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ElemRun {
    /// Offset of the first element in the row-major values.
    pub start: usize,
    /// Elements in the run (never 0).
    pub len: usize,
    /// `|A|` of the run's row, when advantages are known.
    pub abs_advantage: Option<f64>,
}

/// Consecutive valid elements of one run ([`ChainStats::pieces`]).
#[derive(Debug, Clone, Copy)]
pub struct Piece<'a> {
    /// Offset of the first in the row-major values (where a vector of the same layout
    /// holds what else is known of them).
    pub at: usize,
    /// Their ratios.
    pub ratio: &'a [f64],
    /// Their ratios' allowed errors (as long as `ratio`).
    pub allowed: &'a [f64],
    /// `|A|` of their row, when advantages are known.
    pub abs_advantage: Option<f64>,
}

/// The propagated tolerances of one micro's masked aggregates, from its valid elements:
/// runs over the chain's own row-major ratios and their allowances (shared, not copied:
/// a chain of 64 × 8k tokens would otherwise write 10 MB of elements per micro).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChainStats {
    ratio: Arc<Vec<f64>>,
    allowed: Arc<Vec<f64>>,
    runs: Vec<ElemRun>,
    count: usize,
}

impl ChainStats {
    /// The elements of `runs` (in order) over `ratio` and `allowed`, which hold the same
    /// layout; runs that reach past either are cut at its end, empty ones dropped.
    pub fn new(ratio: Arc<Vec<f64>>, allowed: Arc<Vec<f64>>, runs: Vec<ElemRun>) -> ChainStats {
        let end = ratio.len().min(allowed.len());
        let runs: Vec<ElemRun> = runs
            .into_iter()
            .map(|r| ElemRun {
                len: r.len.min(end.saturating_sub(r.start)),
                ..r
            })
            .filter(|r| r.len > 0)
            .collect();
        let count = runs.iter().map(|r| r.len).sum();
        ChainStats {
            ratio,
            allowed,
            runs,
            count,
        }
    }

    /// A chain of exactly these elements, in order (each its own run).
    pub fn from_elems(elems: &[ChainElem]) -> ChainStats {
        let runs = elems
            .iter()
            .enumerate()
            .map(|(start, e)| ElemRun {
                start,
                len: 1,
                abs_advantage: e.abs_advantage,
            })
            .collect();
        ChainStats::new(
            Arc::new(elems.iter().map(|e| e.ratio).collect()),
            Arc::new(elems.iter().map(|e| e.ratio_allowed).collect()),
            runs,
        )
    }

    /// Valid elements (the `n` of every masked mean and count fraction).
    pub fn count(&self) -> usize {
        self.count
    }

    /// The valid elements, in order.
    pub fn iter(&self) -> impl Iterator<Item = ChainElem> + '_ {
        self.pieces(usize::MAX).flat_map(|p| {
            p.ratio
                .iter()
                .zip(p.allowed)
                .map(move |(&ratio, &ratio_allowed)| ChainElem {
                    ratio,
                    ratio_allowed,
                    abs_advantage: p.abs_advantage,
                })
        })
    }

    /// The valid elements in order, as slices of at most `max` elements within a run:
    /// what a loop over the elements reads at full speed.
    pub fn pieces(&self, max: usize) -> impl Iterator<Item = Piece<'_>> + '_ {
        let max = max.max(1);
        self.runs.iter().flat_map(move |r| {
            let (ratio, allowed) = (
                &self.ratio[r.start..r.start + r.len],
                &self.allowed[r.start..r.start + r.len],
            );
            ratio.chunks(max).zip(allowed.chunks(max)).enumerate().map(
                move |(k, (ratio, allowed))| Piece {
                    at: r.start + k * max,
                    ratio,
                    allowed,
                    abs_advantage: r.abs_advantage,
                },
            )
        })
    }

    /// Propagated tolerance of the masked mean ratio (`avg_ratio`).
    pub fn mean_ratio_allowed(&self) -> Option<f64> {
        // `Iterator::sum`'s fold from −0.0, in element order.
        let mut sum = std::iter::empty::<f64>().sum::<f64>();
        for p in self.pieces(usize::MAX) {
            for &a in p.allowed {
                sum += a;
            }
        }
        mean(std::iter::once(sum), self.count())
    }

    /// Propagated tolerance of the masked mean of `−r·A` (token-mean `loss`, `pg_loss`);
    /// None when any element's advantage is unknown.
    pub fn mean_loss_allowed(&self) -> Option<f64> {
        let mut sum = 0.0;
        for p in self.pieces(usize::MAX) {
            let adv = p.abs_advantage?;
            for &a in p.allowed {
                sum += product_allowed(a, adv);
            }
        }
        mean(std::iter::once(sum), self.count())
    }

    /// Tokens whose clip decision at `1 − eps_low`, `1 + eps_high` may flip.
    pub fn flips(&self, eps_low: f64, eps_high: f64) -> usize {
        self.pieces(usize::MAX)
            .map(|p| {
                p.ratio
                    .iter()
                    .zip(p.allowed)
                    .filter(|(&r, &a)| may_flip(r, a, eps_low, eps_high))
                    .count()
            })
            .sum()
    }

    /// Propagated tolerance of a clip fraction: `flips / n`.
    pub fn clip_fraction_allowed(&self, eps_low: f64, eps_high: f64) -> Option<f64> {
        (self.count() > 0).then(|| self.flips(eps_low, eps_high) as f64 / self.count() as f64)
    }
}

/// `Σ values / n`, None for `n == 0`.
fn mean(values: impl Iterator<Item = f64>, n: usize) -> Option<f64> {
    (n > 0).then(|| values.sum::<f64>() / n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elem(ratio: f64, ratio_allowed: f64, adv: f64) -> ChainElem {
        ChainElem {
            ratio,
            ratio_allowed,
            abs_advantage: Some(adv),
        }
    }

    #[test]
    fn ratio_bound_covers_the_worst_input_error() {
        // logp = −10 at bf16 rtol 1.6e-2: E = 0.16; the true Δ may move by up to E.
        let e = log_ratio_allowed(1e-5 + 1.6e-2 * 10.0, 1e-5 + 1.3e-6 * 10.0);
        let delta: f64 = 0.02;
        let r = delta.exp();
        let allowed = ratio_allowed(r, e);
        assert_eq!(allowed, r * e.exp_m1());
        assert!(((delta + e).exp() - r).abs() <= allowed);
        assert!((r - (delta - e).exp()).abs() <= allowed);
        // and nothing much wider: a shift twice as large is beyond it
        assert!(((delta + 2.0 * e).exp() - r).abs() > allowed);
    }

    #[test]
    fn masked_means_average_element_tolerances() {
        let s = ChainStats::from_elems(&[elem(1.0, 0.1, 2.0), elem(2.0, 0.3, 0.5)]);
        assert_eq!(s.mean_ratio_allowed(), Some(0.2));
        assert_eq!(s.mean_loss_allowed(), Some((0.2 + 0.15) / 2.0));
        let unknown = ChainStats::from_elems(&[ChainElem {
            abs_advantage: None,
            ..elem(1.0, 0.1, 0.0)
        }]);
        assert_eq!(unknown.mean_loss_allowed(), None);
        assert_eq!(ChainStats::default().mean_ratio_allowed(), None);
    }

    #[test]
    fn runs_read_the_rows_in_place_in_order() {
        // Three rows of width 4 in row-major values: row 0's positions 1..3, row 2's 0..2
        // and 3..4 (then past the end: cut), an empty run (dropped), row 1 not valid.
        let ratio: Vec<f64> = (0..12).map(|i| 1.0 + i as f64 / 100.0).collect();
        let allowed: Vec<f64> = (0..12).map(|i| i as f64 / 1000.0).collect();
        let run = |start, len, adv| ElemRun {
            start,
            len,
            abs_advantage: adv,
        };
        let s = ChainStats::new(
            Arc::new(ratio),
            Arc::new(allowed),
            vec![
                run(1, 2, Some(2.0)),
                run(5, 0, Some(9.0)),
                run(8, 2, None),
                run(11, 3, Some(0.5)),
            ],
        );
        let got: Vec<ChainElem> = s.iter().collect();
        let want = [
            (1.01, 0.001, Some(2.0)),
            (1.02, 0.002, Some(2.0)),
            (1.08, 0.008, None),
            (1.09, 0.009, None),
            (1.11, 0.011, Some(0.5)),
        ]
        .map(|(ratio, ratio_allowed, abs_advantage)| ChainElem {
            ratio,
            ratio_allowed,
            abs_advantage,
        });
        assert_eq!(got, want);
        assert_eq!(s.count(), 5);
        assert_eq!(
            s.mean_ratio_allowed(),
            Some((0.001 + 0.002 + 0.008 + 0.009 + 0.011) / 5.0)
        );
        // An unknown |A| in the middle run: no loss allowance.
        assert_eq!(s.mean_loss_allowed(), None);
    }

    #[test]
    fn clip_fraction_tolerance_counts_tokens_near_the_boundary() {
        // 1.19 ± 0.02 reaches 1.2; 0.79 ± 0.005 does not reach 0.8; 1.0 is far from both.
        let s = ChainStats::from_elems(&[
            elem(1.19, 0.02, 1.0),
            elem(0.79, 0.005, 1.0),
            elem(1.0, 0.05, 1.0),
            elem(0.805, 0.01, 1.0),
        ]);
        assert_eq!(s.flips(0.2, 0.2), 2);
        assert_eq!(s.clip_fraction_allowed(0.2, 0.2), Some(0.5));
        // asymmetric clip (DAPO clip-higher, 1.28): 1.19 is no longer near; 0.805 still is
        assert_eq!(s.flips(0.2, 0.28), 1);
    }
}

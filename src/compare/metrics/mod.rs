//! Streaming comparison metrics for one pair of aligned value sequences: one pass, f64,
//! no allocation per element. The caller aligns (mask, rows, padding); this module only
//! sees `(a, b, row, pos)` quadruples and the tolerance to count against.

mod exp_memo;
mod runs;
#[cfg(test)]
mod tests;
mod ulp;

use serde::Serialize;

use crate::compare::tolerance::{RelativeTo, Tolerance};
use crate::tensor::DType;
use exp_memo::ExpMemo;
use runs::{all_finite, count_ones, finite_and_identical, fold_finite, Folded};

/// ULP distances and the float grid values sit on, where callers have always found them.
pub use ulp::{effective_dtype, ulp_distance, GridScan};

/// Where an element sits inside its cell: the reference side's row and position, and
/// the other side's row when rows were matched by content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct ElemLoc {
    /// Row on the reference (first) side.
    pub row: usize,
    /// Row on the other side (differs from `row` when rows were reordered).
    pub other_row: usize,
    /// Position along the last axis (response token index).
    pub pos: usize,
}

/// One element worth pointing at: its location and both values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ElemDiff {
    /// Where it is.
    #[serde(flatten)]
    pub loc: ElemLoc,
    /// Value on the reference side.
    pub a: f64,
    /// Value on the other side.
    pub b: f64,
    /// `|a − b|` (infinite when exactly one side is NaN).
    pub abs_diff: f64,
}

/// The log-prob mismatch measures RL practitioners track between two policies'
/// log-probabilities of the same tokens (rollout vs trainer).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LogProbMetrics {
    /// Mean k1 KL estimate `a − b` (reference minus other).
    pub mean_k1: f64,
    /// Mean k3 KL estimate `exp(b − a) − (b − a) − 1` (non-negative, low variance).
    pub mean_k3: f64,
    /// Max `|exp(a) − exp(b)|`: the largest probability difference.
    pub max_prob_diff: f64,
    /// Mean `|exp(a) − exp(b)|`.
    pub mean_prob_diff: f64,
}

/// Every metric of one tensor pair, computed over the compared (aligned, valid) elements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairMetrics {
    /// Elements compared.
    pub count: u64,
    /// Largest `|a − b|`, with its location and both values (None when nothing compared).
    pub max_abs: Option<ElemDiff>,
    /// Mean `|a − b|` over finite pairs.
    pub mean_abs: f64,
    /// Largest `|a − b| / |a|` over pairs with `a != 0` (a = reference).
    pub max_rel: f64,
    /// Root mean square of `a − b` over finite pairs.
    pub rmse: f64,
    /// Cosine similarity of the two vectors (None when either is all zero).
    pub cosine: Option<f64>,
    /// Pearson correlation (None when either side is constant).
    pub pearson: Option<f64>,
    /// Largest distance in units in the last place, when both sides have the same float dtype.
    pub max_ulp: Option<u64>,
    /// NaN count on the reference side.
    pub nan_a: u64,
    /// NaN count on the other side.
    pub nan_b: u64,
    /// ±Inf count on the reference side.
    pub inf_a: u64,
    /// ±Inf count on the other side.
    pub inf_b: u64,
    /// Elements beyond tolerance.
    pub beyond: u64,
    /// `beyond / count` (0 when nothing compared).
    pub beyond_fraction: f64,
    /// The first element beyond tolerance in row-major order of the reference side.
    pub first_beyond: Option<ElemDiff>,
    /// The largest `|a − b|` over that element's allowed difference (its own tolerance,
    /// propagated input error included): how many tolerances off the worst element is.
    pub max_excess: f64,
    /// RL log-prob mismatch measures, for log-prob pairs only.
    pub logprob: Option<LogProbMetrics>,
}

impl PairMetrics {
    /// A systematic difference: four or more elements, at least 80 % beyond tolerance,
    /// each still correlated with the other side's (pearson ≥ 0.9) — the shape a change
    /// of the whole distribution gives (a temperature on one side), not a misalignment,
    /// which decorrelates.
    pub fn systematic(&self) -> bool {
        self.count >= 4 && self.beyond_fraction >= 0.8 && self.pearson.is_some_and(|p| p >= 0.9)
    }
}

/// One-pass accumulator behind [`PairMetrics`].
#[derive(Debug, Clone)]
pub struct Accumulator {
    tol: Tolerance,
    ulp_dtype: Option<DType>,
    logprob: bool,
    count: u64,
    finite: u64,
    max_abs: Option<ElemDiff>,
    sum_abs: f64,
    max_rel: f64,
    sum_sq: f64,
    sa: f64,
    sb: f64,
    saa: f64,
    sbb: f64,
    sab: f64,
    max_ulp: u64,
    nan_a: u64,
    nan_b: u64,
    inf_a: u64,
    inf_b: u64,
    beyond: u64,
    first_beyond: Option<(ElemLoc, ElemDiff)>,
    max_excess: f64,
    k1: f64,
    k3: f64,
    max_pd: f64,
    sum_pd: f64,
}

impl Accumulator {
    /// A fresh accumulator counting against `tol`. `ulp_dtype` is the shared float dtype
    /// when both sides have it (ULP distances are meaningless otherwise); `logprob` turns
    /// on the KL / probability-difference measures.
    pub fn new(tol: Tolerance, ulp_dtype: Option<DType>, logprob: bool) -> Self {
        Accumulator {
            tol,
            ulp_dtype: ulp_dtype.filter(|d| d.is_float()),
            logprob,
            count: 0,
            finite: 0,
            max_abs: None,
            sum_abs: 0.0,
            max_rel: 0.0,
            sum_sq: 0.0,
            sa: 0.0,
            sb: 0.0,
            saa: 0.0,
            sbb: 0.0,
            sab: 0.0,
            max_ulp: 0,
            nan_a: 0,
            nan_b: 0,
            inf_a: 0,
            inf_b: 0,
            beyond: 0,
            first_beyond: None,
            max_excess: 0.0,
            k1: 0.0,
            k3: 0.0,
            max_pd: 0.0,
            sum_pd: 0.0,
        }
    }

    /// Add one aligned pair. `a` is the reference value, `b` the other side's.
    pub fn push(&mut self, a: f64, b: f64, loc: ElemLoc) {
        self.push_allowing(a, b, 0.0, loc);
    }

    /// Add one aligned pair whose allowed difference is the tolerance's plus `extra`, the
    /// error propagated from the element's inputs.
    #[inline]
    pub fn push_allowing(&mut self, a: f64, b: f64, extra: f64, loc: ElemLoc) {
        self.count += 1;
        self.nan_a += a.is_nan() as u64;
        self.nan_b += b.is_nan() as u64;
        self.inf_a += a.is_infinite() as u64;
        self.inf_b += b.is_infinite() as u64;
        let abs_diff = if a.is_nan() || b.is_nan() {
            if a.is_nan() && b.is_nan() {
                0.0
            } else {
                f64::INFINITY
            }
        } else if a == b {
            0.0
        } else {
            (a - b).abs()
        };
        let diff = ElemDiff {
            loc,
            a,
            b,
            abs_diff,
        };
        if self.max_abs.is_none_or(|m| abs_diff > m.abs_diff) {
            self.max_abs = Some(diff);
        }
        let allowed = self.tol.allowed_pair(a, b) + extra;
        let excess = if abs_diff == 0.0 {
            0.0
        } else if allowed > 0.0 {
            abs_diff / allowed
        } else {
            f64::INFINITY
        };
        if excess > self.max_excess || excess.is_nan() {
            self.max_excess = if excess.is_nan() {
                f64::INFINITY
            } else {
                excess
            };
        }
        if !self.tol.allows_with(a, b, extra) {
            self.beyond += 1;
            let earlier = self
                .first_beyond
                .is_none_or(|(l, _)| (loc.row, loc.pos) < (l.row, l.pos));
            if earlier {
                self.first_beyond = Some((loc, diff));
            }
        }
        if let Some(dt) = self.ulp_dtype {
            self.max_ulp = self.max_ulp.max(ulp_distance(a, b, dt));
        }
        if a.is_finite() && b.is_finite() {
            self.finite += 1;
            self.sum_abs += abs_diff;
            if a != 0.0 {
                self.max_rel = self.max_rel.max(abs_diff / a.abs());
            }
            self.sum_sq += (a - b) * (a - b);
            self.sa += a;
            self.sb += b;
            self.saa += a * a;
            self.sbb += b * b;
            self.sab += a * b;
            if self.logprob {
                self.k1 += a - b;
                if a == b && a < 700.0 {
                    // k3 = e^0 − 0 − 1 and |e^a − e^b| are exactly +0 (e^a finite below
                    // 700): adding +0 to these sums and taking max with it change nothing.
                    return;
                }
                let d = b - a;
                self.k3 += d.exp() - d - 1.0;
                let pd = (a.exp() - b.exp()).abs();
                self.max_pd = self.max_pd.max(pd);
                self.sum_pd += pd;
            }
        }
    }

    /// Add a run of aligned pairs of one row pair, in order: `a[i]`, `b[i]` at position
    /// `pos.at(i)` (ascending; a list as long as the run), allowed `extra[i]` on top of
    /// the tolerance (0 past its end). Exactly [`Accumulator::push_allowing`] on each pair
    /// in turn (same sums in the same order, same maxima and locations), but the
    /// order-free parts run branch-free over the run and a run equal on both sides only
    /// feeds the sums that can still differ.
    pub fn push_run(
        &mut self,
        a: &[f64],
        b: &[f64],
        extra: Option<&[f64]>,
        pos: Positions<'_>,
        row: usize,
        other_row: usize,
    ) {
        self.push_run_known(a, b, extra, pos, row, other_row, false);
    }

    /// [`Accumulator::push_run`] of a run whose other side is the same values, bit for
    /// bit (the caller found both sides' stored bytes equal and decoded one): exactly
    /// `push_run(a, a, …)`, without comparing the run with itself.
    pub fn push_run_same(
        &mut self,
        a: &[f64],
        extra: Option<&[f64]>,
        pos: Positions<'_>,
        row: usize,
        other_row: usize,
    ) {
        self.push_run_known(a, a, extra, pos, row, other_row, true);
    }

    /// [`Accumulator::push_run`]; `same` when `b` is known to equal `a` bit for bit.
    #[allow(clippy::too_many_arguments)]
    fn push_run_known(
        &mut self,
        a: &[f64],
        b: &[f64],
        extra: Option<&[f64]>,
        pos: Positions<'_>,
        row: usize,
        other_row: usize,
        same: bool,
    ) {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let loc = |i: usize| ElemLoc {
            row,
            other_row,
            pos: pos.at(i),
        };
        let (finite, identical) = if same {
            (all_finite(a), true)
        } else {
            finite_and_identical(a, b)
        };
        let short = extra.is_some_and(|e| e.len() < n);
        let extra = extra.map(|e| &e[..n.min(e.len())]);
        if !finite || short || self.tol.relative_to != RelativeTo::Reference {
            // NaN / Inf: the element-by-element rules (rare: such a value is a finding);
            // the lane folds below scale by the reference side only.
            for i in 0..n {
                let e = extra.and_then(|e| e.get(i)).copied().unwrap_or(0.0);
                self.push_allowing(a[i], b[i], e, loc(i));
            }
            return;
        }
        if n == 0 {
            return;
        }
        self.count += n as u64;
        self.finite += n as u64;
        // From here on every value is finite: no NaN or infinite counts, and
        // |a − b| is `(a − b).abs()` (0 when equal).
        if identical && self.sums_tied() && (!self.logprob || a.iter().all(|&x| x < 700.0)) {
            self.push_identical(a, loc(0));
            return;
        }
        let (best, beyond, max_ulp) = self.order_free(a, b, extra);
        if best.is_some_and(|m| self.max_abs.is_none_or(|cur| m > cur.abs_diff)) {
            // The first element holding the run's largest |a − b|, as the in-order scan keeps.
            if let Some(i) = best.and_then(|m| (0..n).find(|&i| (a[i] - b[i]).abs() == m)) {
                self.max_abs = Some(ElemDiff {
                    loc: loc(i),
                    a: a[i],
                    b: b[i],
                    abs_diff: (a[i] - b[i]).abs(),
                });
            }
        }
        if beyond > 0 {
            self.beyond += beyond;
            let (atol, rtol) = (self.tol.atol, self.tol.rtol);
            let out = |i: usize| {
                let e = extra.map_or(0.0, |e| e[i]);
                let allowed = atol + rtol * a[i].abs() + e;
                a[i] != b[i] && ((a[i] - b[i]).abs() > allowed || allowed.is_nan())
            };
            // Positions ascend within the run: its first element beyond is its earliest.
            if let Some(i) = (0..n).find(|&i| out(i)) {
                let l = loc(i);
                let earlier = self
                    .first_beyond
                    .is_none_or(|(f, _)| (l.row, l.pos) < (f.row, f.pos));
                if earlier {
                    let diff = ElemDiff {
                        loc: l,
                        a: a[i],
                        b: b[i],
                        abs_diff: (a[i] - b[i]).abs(),
                    };
                    self.first_beyond = Some((l, diff));
                }
            }
        }
        self.max_ulp = self.max_ulp.max(max_ulp);
        self.ordered_sums(a, b);
    }

    /// Whether `sb`, `sbb` and `sab` still equal `sa`, `saa` and `saa` bit for bit (only
    /// runs equal on both sides were pushed): a run equal on both sides then moves only
    /// `sa` and `saa` ([`Accumulator::push_identical`]).
    fn sums_tied(&self) -> bool {
        self.sa.to_bits() == self.sb.to_bits()
            && self.saa.to_bits() == self.sbb.to_bits()
            && self.saa.to_bits() == self.sab.to_bits()
    }

    /// [`Accumulator::push_run`] of a run equal bit for bit on both sides that holds only
    /// +0 and 1, known by its length `n`, its first value and its count of ones, without
    /// its values: what `push_run` does with such a run when its sums are tied and whole
    /// ([`Accumulator::push_identical`]'s count of ones). False, and nothing done, when that
    /// shortcut does not apply (the caller then pushes the values).
    pub fn push_zero_one_run(&mut self, n: usize, first: f64, ones: u64, loc: ElemLoc) -> bool {
        if n == 0 {
            return true;
        }
        if self.logprob
            || self.tol.relative_to != RelativeTo::Reference
            || !(self.sums_tied() && whole_sum(self.sa) && whole_sum(self.saa))
        {
            return false;
        }
        self.count += n as u64;
        self.finite += n as u64;
        if self.max_abs.is_none() {
            self.max_abs = Some(ElemDiff {
                loc,
                a: first,
                b: first,
                abs_diff: 0.0,
            });
        }
        self.sa += ones as f64;
        self.saa += ones as f64;
        (self.sb, self.sbb, self.sab) = (self.sa, self.saa, self.saa);
        true
    }

    /// [`Accumulator::push_run`] of a run equal bit for bit on both sides, below 700, while
    /// `sb`, `sbb`, `sab` still equal `sa`, `saa`: |a − b|, its powers, k1, k3 and the
    /// probability difference add +0 (a no-op on these never-negative-zero sums), so only
    /// `sa` and `saa` move, and the tied sums follow them exactly.
    fn push_identical(&mut self, a: &[f64], first: ElemLoc) {
        if self.max_abs.is_none() {
            self.max_abs = Some(ElemDiff {
                loc: first,
                a: a[0],
                b: a[0],
                abs_diff: 0.0,
            });
        }
        let (mut sa, mut saa) = (self.sa, self.saa);
        // 0/1 values (masks) onto whole sums below 2^52: every partial sum is an exact
        // integer, so adding the count of ones at once is the same as adding one by one.
        let (ones, zero_one) = count_ones(a);
        if zero_one && whole_sum(sa) && whole_sum(saa) {
            sa += ones as f64;
            saa += ones as f64;
        } else {
            for &x in a {
                sa += x;
                saa += x * x;
            }
        }
        (self.sa, self.saa) = (sa, saa);
        (self.sb, self.sbb, self.sab) = (sa, saa, saa);
    }

    /// The order-free part of a finite run: largest |a − b| (None when it cannot beat
    /// anything), maximum excess and relative difference (folded in), elements beyond.
    fn order_free(
        &mut self,
        a: &[f64],
        b: &[f64],
        extra: Option<&[f64]>,
    ) -> (Option<f64>, u64, u64) {
        let (atol, rtol) = (self.tol.atol, self.tol.rtol);
        let mut f = Folded {
            max_abs: f64::NEG_INFINITY,
            max_excess: self.max_excess,
            max_rel: self.max_rel,
            beyond: 0,
            max_ulp: 0,
        };
        // Without an extra, each element adds +0.0 to its allowance, as `push` does.
        static ZEROS: [f64; 4096] = [0.0; 4096];
        for start in (0..a.len()).step_by(ZEROS.len()) {
            let end = (start + ZEROS.len()).min(a.len());
            let e = extra.map_or(&ZEROS[..end - start], |e| &e[start..end]);
            let (xa, xb) = (&a[start..end], &b[start..end]);
            f = f.merge(fold_finite(xa, xb, e, atol, rtol, self.ulp_dtype));
        }
        self.max_excess = f.max_excess;
        self.max_rel = f.max_rel;
        (Some(f.max_abs).filter(|&m| m >= 0.0), f.beyond, f.max_ulp)
    }

    /// The order-dependent sums of a finite run, each added in element order.
    fn ordered_sums(&mut self, a: &[f64], b: &[f64]) {
        let (mut sum_abs, mut sum_sq) = (self.sum_abs, self.sum_sq);
        let (mut sa, mut sb, mut saa, mut sbb, mut sab) =
            (self.sa, self.sb, self.saa, self.sbb, self.sab);
        for (&x, &y) in a.iter().zip(b) {
            sum_abs += (x - y).abs();
            sum_sq += (x - y) * (x - y);
            sa += x;
            sb += y;
            saa += x * x;
            sbb += y * y;
            sab += x * y;
        }
        (self.sum_abs, self.sum_sq) = (sum_abs, sum_sq);
        (self.sa, self.sb, self.saa, self.sbb, self.sab) = (sa, sb, saa, sbb, sab);
        if self.logprob {
            let mut s = LogProbSums {
                k1: self.k1,
                k3: self.k3,
                max_pd: self.max_pd,
                sum_pd: self.sum_pd,
            };
            s.add_memo(a, b);
            (self.k1, self.k3, self.max_pd, self.sum_pd) = (s.k1, s.k3, s.max_pd, s.sum_pd);
        }
    }

    /// The metrics of everything pushed.
    pub fn finish(self) -> PairMetrics {
        let n = self.finite as f64;
        let mean = |s: f64| if self.finite > 0 { s / n } else { 0.0 };
        let cosine = {
            let den = (self.saa * self.sbb).sqrt();
            (den > 0.0).then(|| self.sab / den)
        };
        let pearson = {
            let va = self.saa - self.sa * self.sa / n.max(1.0);
            let vb = self.sbb - self.sb * self.sb / n.max(1.0);
            let cov = self.sab - self.sa * self.sb / n.max(1.0);
            (self.finite > 1 && va > 0.0 && vb > 0.0).then(|| cov / (va * vb).sqrt())
        };
        PairMetrics {
            count: self.count,
            max_abs: self.max_abs,
            mean_abs: mean(self.sum_abs),
            max_rel: self.max_rel,
            rmse: mean(self.sum_sq).sqrt(),
            cosine,
            pearson,
            max_ulp: self.ulp_dtype.map(|_| self.max_ulp),
            nan_a: self.nan_a,
            nan_b: self.nan_b,
            inf_a: self.inf_a,
            inf_b: self.inf_b,
            beyond: self.beyond,
            beyond_fraction: if self.count > 0 {
                self.beyond as f64 / self.count as f64
            } else {
                0.0
            },
            first_beyond: self.first_beyond.map(|(_, d)| d),
            max_excess: self.max_excess,
            logprob: self.logprob.then(|| LogProbMetrics {
                mean_k1: mean(self.k1),
                mean_k3: mean(self.k3),
                max_prob_diff: self.max_pd,
                mean_prob_diff: mean(self.sum_pd),
            }),
        }
    }
}

/// Whether a sum is a whole number below 2^52 (4e15), so that adding a count of ones to it
/// at once gives the bits that adding the ones one by one gives.
fn whole_sum(v: f64) -> bool {
    v.fract() == 0.0 && (0.0..4.0e15).contains(&v)
}

/// The order-dependent sums and the maximum behind [`LogProbMetrics`], over finite pairs.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LogProbSums {
    k1: f64,
    k3: f64,
    max_pd: f64,
    sum_pd: f64,
}

impl LogProbSums {
    /// Add the finite pairs `(a[i], b[i])` in order: `k1 += a − b`; unless `a == b < 700`
    /// (every term then +0), `k3 += e^(b−a) − (b−a) − 1` and `|e^a − e^b|` to the
    /// probability difference's sum and maximum. e^a and e^b of log-probs on a coarse
    /// grid repeat: looked up (same bits).
    fn add_memo(&mut self, a: &[f64], b: &[f64]) {
        let mut s = *self;
        ExpMemo::with(|memo| {
            for (&x, &y) in a.iter().zip(b) {
                s.add(x, y, || {
                    (memo.exp_off_grid(y - x), memo.exp(x), memo.exp(y))
                });
            }
        });
        *self = s;
    }

    /// One finite pair: `exps` gives e^(y−x), e^x and e^y, asked only when the pair is
    /// not `x == y < 700` (then every term but k1's is +0).
    #[inline(always)]
    fn add(&mut self, x: f64, y: f64, exps: impl FnOnce() -> (f64, f64, f64)) {
        self.k1 += x - y;
        if x == y && x < 700.0 {
            return;
        }
        let (e_d, e_x, e_y) = exps();
        let d = y - x;
        self.k3 += e_d - d - 1.0;
        let pd = (e_x - e_y).abs();
        self.max_pd = self.max_pd.max(pd);
        self.sum_pd += pd;
    }
}

/// Where the pairs of a [`Accumulator::push_run`] sit along their row.
#[derive(Debug, Clone, Copy)]
pub enum Positions<'a> {
    /// Consecutive positions from this one.
    From(usize),
    /// One position per pair.
    At(&'a [usize]),
}

impl Positions<'_> {
    /// The position of pair `i`.
    #[inline]
    pub fn at(self, i: usize) -> usize {
        match self {
            Positions::From(p) => p + i,
            Positions::At(ps) => ps[i],
        }
    }
}

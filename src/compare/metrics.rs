//! Streaming comparison metrics for one pair of aligned value sequences: one pass, f64,
//! no allocation per element. The caller aligns (mask, rows, padding); this module only
//! sees `(a, b, row, pos)` quadruples and the tolerance to count against.

use serde::Serialize;

use crate::compare::tolerance::Tolerance;
use crate::tensor::DType;

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
        let allowed = self.tol.allowed(a) + extra;
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
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let loc = |i: usize| ElemLoc {
            row,
            other_row,
            pos: pos.at(i),
        };
        let (finite, identical) = finite_and_identical(a, b);
        let short = extra.is_some_and(|e| e.len() < n);
        let extra = extra.map(|e| &e[..n.min(e.len())]);
        if !finite || short {
            // NaN / Inf: the element-by-element rules (rare: such a value is a finding).
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
        let sums_tied = self.sa.to_bits() == self.sb.to_bits()
            && self.saa.to_bits() == self.sbb.to_bits()
            && self.saa.to_bits() == self.sab.to_bits();
        if identical && sums_tied && (!self.logprob || a.iter().all(|&x| x < 700.0)) {
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
        let whole = |v: f64| v.fract() == 0.0 && (0.0..4.0e15).contains(&v);
        if zero_one && whole(sa) && whole(saa) {
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
            let (mut k1, mut k3, mut max_pd, mut sum_pd) =
                (self.k1, self.k3, self.max_pd, self.sum_pd);
            for (&x, &y) in a.iter().zip(b) {
                k1 += x - y;
                if x == y && x < 700.0 {
                    continue;
                }
                let d = y - x;
                k3 += d.exp() - d - 1.0;
                let pd = (x.exp() - y.exp()).abs();
                max_pd = max_pd.max(pd);
                sum_pd += pd;
            }
            (self.k1, self.k3, self.max_pd, self.sum_pd) = (k1, k3, max_pd, sum_pd);
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

/// What [`fold_finite`] gathers from a run: maxima and a count, all order-free.
#[derive(Debug, Clone, Copy)]
struct Folded {
    max_abs: f64,
    max_excess: f64,
    max_rel: f64,
    beyond: u64,
    max_ulp: u64,
}

impl Folded {
    /// Both runs' maxima and counts (every value is non-negative, none NaN: exact in any order).
    fn merge(self, o: Folded) -> Folded {
        Folded {
            max_abs: self.max_abs.max(o.max_abs),
            max_excess: self.max_excess.max(o.max_excess),
            max_rel: self.max_rel.max(o.max_rel),
            beyond: self.beyond + o.beyond,
            max_ulp: self.max_ulp.max(o.max_ulp),
        }
    }
}

/// The order-free measures of finite pairs with their extra allowances, with the rules of
/// [`Accumulator::push_allowing`] (ULP distances on `ulp`'s grid, 0 without one); uses
/// AVX2 where the CPU has it (same results: IEEE operations, and maxima of non-negative,
/// non-NaN values do not depend on the order).
fn fold_finite(
    a: &[f64],
    b: &[f64],
    e: &[f64],
    atol: f64,
    rtol: f64,
    ulp: Option<DType>,
) -> Folded {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked on the line above.
        return unsafe { fold_finite_avx2(a, b, e, atol, rtol, ulp) };
    }
    fold_finite_dispatch(a, b, e, atol, rtol, ulp)
}

/// [`fold_finite_dispatch`] compiled for AVX2 (4 lanes of f64: division and maxima vectorise).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fold_finite_avx2(
    a: &[f64],
    b: &[f64],
    e: &[f64],
    atol: f64,
    rtol: f64,
    ulp: Option<DType>,
) -> Folded {
    fold_finite_dispatch(a, b, e, atol, rtol, ulp)
}

/// One loop per ULP grid, so that each is branch-free.
#[inline(always)]
fn fold_finite_dispatch(
    a: &[f64],
    b: &[f64],
    e: &[f64],
    atol: f64,
    rtol: f64,
    ulp: Option<DType>,
) -> Folded {
    let ord16 = |bits: u16| -> i64 {
        let mag = (bits & 0x7fff) as i64;
        if bits >> 15 != 0 {
            -mag
        } else {
            mag
        }
    };
    match ulp {
        None => fold_finite_body(a, b, e, atol, rtol, |_, _| 0),
        // ulp_distance on the f32 grid, in i64 (the distance fits).
        Some(DType::F32) => fold_finite_body(a, b, e, atol, rtol, |x, y| {
            let ord = |v: f64| -> i64 {
                let bits = (v as f32).to_bits();
                let mag = (bits & 0x7fff_ffff) as i64;
                if bits >> 31 != 0 {
                    -mag
                } else {
                    mag
                }
            };
            (ord(x) - ord(y)).unsigned_abs()
        }),
        Some(DType::BF16) => fold_finite_body(a, b, e, atol, rtol, |x, y| {
            let (p, q) = (half::bf16::from_f64(x), half::bf16::from_f64(y));
            (ord16(p.to_bits()) - ord16(q.to_bits())).unsigned_abs()
        }),
        Some(DType::F16) => fold_finite_body(a, b, e, atol, rtol, |x, y| {
            let (p, q) = (half::f16::from_f64(x), half::f16::from_f64(y));
            (ord16(p.to_bits()) - ord16(q.to_bits())).unsigned_abs()
        }),
        Some(dt) => fold_finite_body(a, b, e, atol, rtol, |x, y| ulp_distance(x, y, dt)),
    }
}

/// Lanes of [`fold_finite_body`]: each keeps its own maxima, so the loop vectorises.
const LANES: usize = 4;

#[inline(always)]
fn fold_finite_body(
    a: &[f64],
    b: &[f64],
    e: &[f64],
    atol: f64,
    rtol: f64,
    ulp: impl Fn(f64, f64) -> u64,
) -> Folded {
    let n = a.len().min(b.len()).min(e.len());
    let (a, b, e) = (&a[..n], &b[..n], &e[..n]);
    let mut m_abs = [f64::NEG_INFINITY; LANES];
    let mut m_exc = [0.0f64; LANES];
    let mut m_rel = [0.0f64; LANES];
    let mut beyond = [0u64; LANES];
    let mut m_ulp = [0u64; LANES];
    let mut lane = |l: usize, x: f64, y: f64, extra: f64| {
        let d = (x - y).abs();
        let allowed = atol + rtol * x.abs() + extra;
        let q = d / allowed;
        let exc = if allowed > 0.0 { q } else { f64::INFINITY };
        let exc = if d == 0.0 { 0.0 } else { exc };
        // A NaN excess (∞/∞) counts as infinite, as in `push_allowing`.
        let exc = if exc.is_nan() { f64::INFINITY } else { exc };
        let r = d / x.abs();
        let rel = if x != 0.0 { r } else { 0.0 };
        m_abs[l] = m_abs[l].max(d);
        m_exc[l] = m_exc[l].max(exc);
        m_rel[l] = m_rel[l].max(rel);
        // Beyond: not within `allowed` (a NaN allowance admits nothing; d is never NaN).
        beyond[l] += (x != y && (d > allowed || allowed.is_nan())) as u64;
        m_ulp[l] = m_ulp[l].max(ulp(x, y));
    };
    let whole = n - n % LANES;
    let blocks = a[..whole]
        .chunks_exact(LANES)
        .zip(b[..whole].chunks_exact(LANES))
        .zip(e[..whole].chunks_exact(LANES));
    for ((xa, xb), xe) in blocks {
        for (l, ((&x, &y), &e)) in xa.iter().zip(xb).zip(xe).enumerate() {
            lane(l, x, y, e);
        }
    }
    for i in whole..n {
        lane(0, a[i], b[i], e[i]);
    }
    let max = |m: [f64; LANES]| m.into_iter().fold(f64::NEG_INFINITY, f64::max);
    Folded {
        max_abs: max(m_abs),
        max_excess: max(m_exc),
        max_rel: max(m_rel),
        beyond: beyond.into_iter().sum(),
        max_ulp: m_ulp.into_iter().fold(0, u64::max),
    }
}

/// Whether every value of both runs is finite, and whether the runs are equal bit for bit
/// (one branch-free pass in lanes, so that it vectorises).
fn finite_and_identical(a: &[f64], b: &[f64]) -> (bool, bool) {
    const EXP: u64 = 0x7ff0_0000_0000_0000;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let (mut bad, mut diff) = ([0u64; LANES], [0u64; LANES]);
    let mut lane = |l: usize, x: f64, y: f64| {
        let (x, y) = (x.to_bits(), y.to_bits());
        bad[l] |= ((x & EXP == EXP) | (y & EXP == EXP)) as u64;
        diff[l] |= x ^ y;
    };
    let whole = n - n % LANES;
    for (xa, xb) in a[..whole]
        .chunks_exact(LANES)
        .zip(b[..whole].chunks_exact(LANES))
    {
        for (l, (&x, &y)) in xa.iter().zip(xb).enumerate() {
            lane(l, x, y);
        }
    }
    for i in whole..n {
        lane(0, a[i], b[i]);
    }
    (bad.iter().all(|&v| v == 0), diff.iter().all(|&v| v == 0))
}

/// How many values are exactly 1, and whether all are 0 or 1 (−0 counts as 0), in lanes.
fn count_ones(a: &[f64]) -> (u64, bool) {
    let (mut ones, mut other) = ([0u64; LANES], [0u64; LANES]);
    let mut lane = |l: usize, x: f64| {
        ones[l] += (x == 1.0) as u64;
        other[l] |= !((x == 0.0) | (x == 1.0)) as u64;
    };
    let whole = a.len() - a.len() % LANES;
    for xa in a[..whole].chunks_exact(LANES) {
        for (l, &x) in xa.iter().enumerate() {
            lane(l, x);
        }
    }
    for &x in &a[whole..] {
        lane(0, x);
    }
    (ones.iter().sum(), other.iter().all(|&v| v == 0))
}

/// Map a float's bits to an integer line where adjacent floats differ by one.
fn ordered(bits: u64, sign_bit: u64) -> i128 {
    if bits & sign_bit != 0 {
        -((bits & !sign_bit) as i128)
    } else {
        bits as i128
    }
}

/// Distance in units in the last place of `dtype` between two values of that dtype
/// (held in f64 exactly). NaN against anything is `u64::MAX`; equal values (±0 too) are 0.
pub fn ulp_distance(a: f64, b: f64, dtype: DType) -> u64 {
    if a.is_nan() || b.is_nan() {
        return if a.is_nan() && b.is_nan() {
            0
        } else {
            u64::MAX
        };
    }
    if a == b {
        return 0;
    }
    let (x, y) = match dtype {
        DType::F64 => (ordered(a.to_bits(), 1 << 63), ordered(b.to_bits(), 1 << 63)),
        DType::F32 => (
            ordered((a as f32).to_bits() as u64, 1 << 31),
            ordered((b as f32).to_bits() as u64, 1 << 31),
        ),
        DType::BF16 => (
            ordered(half::bf16::from_f64(a).to_bits() as u64, 1 << 15),
            ordered(half::bf16::from_f64(b).to_bits() as u64, 1 << 15),
        ),
        DType::F16 => (
            ordered(half::f16::from_f64(a).to_bits() as u64, 1 << 15),
            ordered(half::f16::from_f64(b).to_bits() as u64, 1 << 15),
        ),
        _ => return (a - b).abs().min(u64::MAX as f64) as u64,
    };
    u64::try_from((x - y).unsigned_abs()).unwrap_or(u64::MAX)
}

/// The coarsest float precision whose grid holds every value exactly: an f32 tensor of
/// bf16-rounded numbers is bf16 data, a `.jsonl` f64 list of f32 numbers is f32 data.
/// Non-float dtypes come back unchanged.
pub fn effective_dtype(declared: DType, values: &[f64]) -> DType {
    let mut scan = GridScan::new(declared);
    scan.feed(values);
    if scan.needs_f16() {
        scan.feed_f16(values);
    }
    scan.finish()
}

/// [`effective_dtype`] over values seen in pieces (a tensor decoded chunk by chunk): feed
/// every piece, then, only if [`GridScan::needs_f16`], every piece again to
/// [`GridScan::feed_f16`] (the f16 test is the costly one and rarely decides).
#[derive(Debug, Clone, Copy)]
pub struct GridScan {
    declared: DType,
    /// Every finite value fed is an f32.
    f32: bool,
    /// … on the bf16 grid.
    bf16: bool,
    /// … on the f16 grid (None until [`GridScan::feed_f16`]).
    f16: Option<bool>,
}

impl GridScan {
    /// Nothing seen yet.
    pub fn new(declared: DType) -> Self {
        GridScan {
            declared,
            f32: true,
            bf16: true,
            f16: None,
        }
    }

    /// The declared dtype decides alone (not a float, or already a 16-bit float).
    fn fixed(&self) -> bool {
        !self.declared.is_float() || matches!(self.declared, DType::BF16 | DType::F16)
    }

    /// True when no further [`GridScan::feed`] can change the answer.
    pub fn settled(&self) -> bool {
        self.fixed()
            || (self.declared == DType::F64 && !self.f32)
            || (self.declared == DType::F32 && !self.bf16)
    }

    /// Look at more values (f32 and bf16 grids).
    pub fn feed(&mut self, values: &[f64]) {
        if self.settled() {
            return;
        }
        // Blocks of values, so that a decided scan stops early and each block's loop is
        // branch-free (it vectorises).
        for block in values.chunks(1024) {
            let (mut f32_ok, mut bf16_ok) = (true, true);
            for &v in block {
                // bf16 is the upper half of f32: a value is on its grid when it is an f32
                // whose low 16 bits are zero (the same test as a bf16 round trip).
                let f = v as f32;
                let exact = f as f64 == v;
                let skip = !v.is_finite();
                f32_ok &= skip | exact;
                bf16_ok &= skip | (exact & (f.to_bits() & 0xFFFF == 0));
            }
            self.f32 &= f32_ok;
            self.bf16 &= bf16_ok;
            if self.settled() {
                return;
            }
        }
    }

    /// Record that some value (an f32) lies off the bf16 grid, as [`GridScan::feed`] of it
    /// would.
    pub fn saw_off_bf16(&mut self) {
        self.bf16 = false;
    }

    /// True when the answer, after every value went through [`GridScan::feed`], depends
    /// on the f16 grid: the values are f32s, not all on the bf16 grid.
    pub fn needs_f16(&self) -> bool {
        !self.fixed() && self.f32 && !self.bf16 && self.f16 != Some(false)
    }

    /// Look at more values for the f16 grid.
    pub fn feed_f16(&mut self, values: &[f64]) {
        if self.f16 != Some(false) {
            let on_grid = values
                .iter()
                .filter(|v| v.is_finite())
                .all(|&v| half::f16::from_f64(v).to_f64() == v);
            self.f16 = Some(on_grid);
        }
    }

    /// The precision of everything fed.
    pub fn finish(self) -> DType {
        let d = self.declared;
        if self.fixed() {
            return d;
        }
        if !self.f32 {
            // Not even f32s: f64 data, or (declared f32) off every coarser grid too.
            return if d == DType::F64 {
                DType::F64
            } else {
                DType::F32
            };
        }
        if self.bf16 {
            DType::BF16
        } else if self.f16 == Some(true) {
            DType::F16
        } else {
            DType::F32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tol(atol: f64, rtol: f64) -> Tolerance {
        Tolerance::new(atol, rtol, "test")
    }

    fn loc(row: usize, pos: usize) -> ElemLoc {
        ElemLoc {
            row,
            other_row: row,
            pos,
        }
    }

    #[test]
    fn metrics_match_hand_computation() {
        let a = [1.0, 2.0, 3.0, 4.0];
        let b = [1.0, 2.5, 3.0, 3.0];
        let mut acc = Accumulator::new(tol(0.1, 0.0), None, false);
        for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
            acc.push(x, y, loc(i / 2, i % 2));
        }
        let m = acc.finish();
        assert_eq!(m.count, 4);
        let max = m.max_abs.unwrap();
        assert_eq!(
            (max.loc.row, max.loc.pos, max.a, max.b, max.abs_diff),
            (1, 1, 4.0, 3.0, 1.0)
        );
        assert_eq!(m.mean_abs, 1.5 / 4.0);
        assert_eq!(m.max_rel, 0.25);
        assert_eq!(m.rmse, (1.25f64 / 4.0).sqrt());
        // cosine: a·b = 1 + 5 + 9 + 12 = 27; |a|² = 30; |b|² = 1 + 6.25 + 9 + 9 = 25.25
        assert_eq!(m.cosine.unwrap(), 27.0 / (30.0f64 * 25.25).sqrt());
        assert_eq!(m.beyond, 2);
        assert_eq!(m.beyond_fraction, 0.5);
        let first = m.first_beyond.unwrap();
        assert_eq!((first.loc.row, first.loc.pos), (0, 1));
        assert!(m.max_ulp.is_none() && m.logprob.is_none());
    }

    #[test]
    fn pearson_of_affine_pair_is_one() {
        let mut acc = Accumulator::new(tol(1e9, 0.0), None, false);
        for i in 0..10 {
            acc.push(i as f64, 2.0 * i as f64 + 1.0, loc(0, i));
        }
        let p = acc.finish().pearson.unwrap();
        assert!((p - 1.0).abs() < 1e-12, "{p}");
    }

    #[test]
    fn nan_on_one_side_is_beyond_and_counted() {
        let mut acc = Accumulator::new(tol(1.0, 1.0), Some(DType::F32), false);
        acc.push(f64::NAN, 1.0, loc(0, 0));
        acc.push(f64::NAN, f64::NAN, loc(0, 1));
        acc.push(f64::INFINITY, f64::INFINITY, loc(0, 2));
        let m = acc.finish();
        assert_eq!(
            (m.nan_a, m.nan_b, m.inf_a, m.inf_b, m.beyond),
            (2, 1, 1, 1, 1)
        );
        assert_eq!(m.max_abs.unwrap().abs_diff, f64::INFINITY);
        assert_eq!(m.max_ulp, Some(u64::MAX));
    }

    #[test]
    fn logprob_measures() {
        let mut acc = Accumulator::new(tol(1.0, 0.0), None, true);
        acc.push(-1.0, -1.5, loc(0, 0));
        acc.push(-2.0, -2.0, loc(0, 1));
        let lp = acc.finish().logprob.unwrap();
        assert_eq!(lp.mean_k1, 0.25);
        let d: f64 = -0.5;
        assert_eq!(lp.mean_k3, (d.exp() - d - 1.0) / 2.0);
        let pd = ((-1.0f64).exp() - (-1.5f64).exp()).abs();
        assert_eq!(lp.max_prob_diff, pd);
        assert_eq!(lp.mean_prob_diff, pd / 2.0);
    }

    #[test]
    fn ulp_distances_per_dtype() {
        let one = 1.0f64;
        let next_f32 = f32::from_bits(1.0f32.to_bits() + 3) as f64;
        assert_eq!(ulp_distance(one, next_f32, DType::F32), 3);
        let next_bf16 = half::bf16::from_bits(half::bf16::ONE.to_bits() + 2).to_f64();
        assert_eq!(ulp_distance(next_bf16, one, DType::BF16), 2);
        // across zero: the smallest negative and positive subnormals are 2 apart
        let tiny = f32::from_bits(1) as f64;
        assert_eq!(ulp_distance(-tiny, tiny, DType::F32), 2);
        assert_eq!(ulp_distance(0.0, -0.0, DType::F64), 0);
    }

    #[test]
    fn effective_dtype_sees_bf16_inside_f32() {
        let bf = [half::bf16::from_f64(-2.3).to_f64(), 0.0, 1.0];
        assert_eq!(effective_dtype(DType::F32, &bf), DType::BF16);
        let f32s = [(-2.3f32) as f64, 0.1f32 as f64];
        assert_eq!(effective_dtype(DType::F32, &f32s), DType::F32);
        assert_eq!(effective_dtype(DType::F64, &f32s), DType::F32);
        assert_eq!(effective_dtype(DType::F64, &[0.1]), DType::F64);
        assert_eq!(effective_dtype(DType::I64, &[1.0]), DType::I64);
    }

    #[test]
    fn bf16_grid_test_matches_a_round_trip() {
        let probe = [
            0.0,
            -0.0,
            1.0,
            -2.3,
            1e-40,
            -1e-42,
            3.0e38,
            1e39,
            0.1,
            65504.0,
            1.0e-5,
            f32::MIN_POSITIVE as f64,
            f32::MAX as f64,
        ];
        for &x in &probe {
            for v in [x, half::bf16::from_f64(x).to_f64(), (x as f32) as f64] {
                let want = if half::bf16::from_f64(v).to_f64() == v {
                    DType::BF16
                } else {
                    DType::F32
                };
                let got = effective_dtype(DType::F32, &[v]);
                let got = if got == DType::F16 { DType::F32 } else { got };
                assert_eq!(got, want, "{v:e}");
            }
        }
    }

    /// A small deterministic generator (64-bit LCG, high bits).
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn unit(&mut self) -> f64 {
            self.next() as f64 / (1u64 << 31) as f64
        }

        /// A value from the palette runs are made of: ordinary numbers on the f32 and
        /// bf16 grids, signed zeros, non-finite values, huge and ≥ 700 log-probs.
        fn value(&mut self) -> f64 {
            match self.below(20) {
                0 => f64::NAN,
                1 => f64::INFINITY,
                2 => f64::NEG_INFINITY,
                3 => -0.0,
                4 => 0.0,
                5 => 1.0,
                6 => 1.0e308,
                7 => 700.5,
                8 => half::bf16::from_f64(-5.0 * self.unit()).to_f64(),
                _ => (-10.0 * self.unit()) as f32 as f64,
            }
        }
    }

    /// One run of pairs: identical, 0/1 identical, close, or anything.
    fn run(g: &mut Lcg, n: usize) -> (Vec<f64>, Vec<f64>) {
        let mode = g.below(5);
        let mut a = Vec::with_capacity(n);
        let mut b = Vec::with_capacity(n);
        for _ in 0..n {
            let x = match mode {
                0 => g.below(2) as f64,
                1 | 2 => (-10.0 * g.unit()) as f32 as f64,
                _ => g.value(),
            };
            let y = match mode {
                0 | 1 => x,
                2 => x + 1e-4 * (g.unit() - 0.5),
                _ if g.below(3) == 0 => x,
                _ => g.value(),
            };
            a.push(x);
            b.push(y);
        }
        (a, b)
    }

    #[test]
    fn push_run_equals_push_allowing_element_by_element() {
        let mut g = Lcg(7);
        let tols = [(1e-5, 1.6e-2), (0.0, 0.0), (1e-3, 0.0), (-1e-3, 1e-3)];
        let ulps = [
            None,
            Some(DType::F32),
            Some(DType::BF16),
            Some(DType::F16),
            Some(DType::F64),
        ];
        for case in 0..400 {
            let (atol, rtol) = tols[case % tols.len()];
            let ulp = ulps[(case / tols.len()) % ulps.len()];
            let logprob = case % 3 == 0;
            let with_extra = case % 4 == 1;
            let t = Tolerance::new(atol, rtol, "test");
            let mut one = Accumulator::new(t.clone(), ulp, logprob);
            let mut runs = Accumulator::new(t, ulp, logprob);
            for r in 0..1 + g.below(6) as usize {
                let n = g.below(40) as usize;
                let (a, b) = run(&mut g, n);
                let extra: Vec<f64> = (0..n)
                    .map(|_| match g.below(10) {
                        0 => f64::NAN,
                        1 => f64::INFINITY,
                        2 => -1e-3,
                        _ => 1e-3 * g.unit(),
                    })
                    .collect();
                // Ascending positions, with gaps or consecutive.
                let gaps = g.below(2) == 0;
                let start = g.below(5) as usize;
                let pos: Vec<usize> = (0..n)
                    .map(|i| start + if gaps { 3 * i } else { i })
                    .collect();
                let (row, other_row) = (g.below(4) as usize, r);
                for i in 0..n {
                    let e = if with_extra { extra[i] } else { 0.0 };
                    let loc = ElemLoc {
                        row,
                        other_row,
                        pos: pos[i],
                    };
                    one.push_allowing(a[i], b[i], e, loc);
                }
                let ex = with_extra.then_some(&extra[..]);
                let at = if gaps {
                    Positions::At(&pos)
                } else {
                    Positions::From(start)
                };
                runs.push_run(&a, &b, ex, at, row, other_row);
            }
            // Every internal sum and extreme, then the metrics.
            assert_eq!(format!("{one:?}"), format!("{runs:?}"), "case {case}");
            let (x, y) = (one.finish(), runs.finish());
            assert_eq!(format!("{x:?}"), format!("{y:?}"), "case {case}");
        }
    }

    #[test]
    fn long_runs_of_masks_and_identical_values_equal_the_element_path() {
        // Identical 0/1 runs take the counting path, other identical runs only feed the
        // reference sums; both must leave every sum as the element-by-element path does.
        let mut g = Lcg(11);
        for case in 0..40 {
            let t = Tolerance::new(0.0, 0.0, "test");
            let mut one = Accumulator::new(t.clone(), None, case % 2 == 0);
            let mut runs = Accumulator::new(t, None, case % 2 == 0);
            for r in 0..6 {
                let n = 5000 + g.below(3000) as usize;
                let ones = g.below(2) == 0;
                let a: Vec<f64> = (0..n)
                    .map(|_| {
                        if ones {
                            g.below(2) as f64
                        } else {
                            (-3.0 * g.unit()) as f32 as f64
                        }
                    })
                    .collect();
                let mut b = a.clone();
                if g.below(4) == 0 {
                    let i = g.below(n as u64) as usize;
                    b[i] += 0.5;
                }
                for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
                    one.push(
                        x,
                        y,
                        ElemLoc {
                            row: r,
                            other_row: r,
                            pos: i,
                        },
                    );
                }
                runs.push_run(&a, &b, None, Positions::From(0), r, r);
            }
            // Every internal sum and extreme, then the metrics.
            assert_eq!(format!("{one:?}"), format!("{runs:?}"), "case {case}");
            let (x, y) = (one.finish(), runs.finish());
            assert_eq!(format!("{x:?}"), format!("{y:?}"), "case {case}");
        }
    }

    #[test]
    fn ones_are_counted_only_onto_whole_sums() {
        // Near 2^53 (or after a fraction) adding 1.0 one at a time rounds: counting at once
        // would not.
        let two53 = (1u64 << 53) as f64;
        for first in [1.0 / 3.0, 1.0e-17, two53 - 10.0, two53 + 2.0] {
            let t = Tolerance::new(0.0, 0.0, "test");
            let mut one = Accumulator::new(t.clone(), None, false);
            let mut runs = Accumulator::new(t, None, false);
            let ones = vec![1.0; 1000];
            let loc = |pos| ElemLoc {
                row: 0,
                other_row: 0,
                pos,
            };
            one.push(first, first, loc(0));
            for (i, &x) in ones.iter().enumerate() {
                one.push(x, x, loc(i + 1));
            }
            runs.push_run(&[first], &[first], None, Positions::From(0), 0, 0);
            runs.push_run(&ones, &ones, None, Positions::From(1), 0, 0);
            // Then a differing pair, so that the sums show in cosine and Pearson.
            let (p, q) = (-3.0 * first - 7.5, 2.0 * first + 0.25);
            one.push(p, q, loc(2000));
            runs.push_run(&[p], &[q], None, Positions::From(2000), 0, 0);
            assert_eq!(format!("{one:?}"), format!("{runs:?}"), "{first}");
            let (x, y) = (one.finish(), runs.finish());
            assert_eq!(format!("{x:?}"), format!("{y:?}"), "{first}");
        }
    }

    #[test]
    fn grid_scan_in_pieces_equals_effective_dtype() {
        let mut g = Lcg(3);
        for case in 0..200 {
            let declared = [DType::F64, DType::F32, DType::BF16, DType::I64][case % 4];
            let n = 1 + g.below(50) as usize;
            let kind = g.below(4);
            let v: Vec<f64> = (0..n)
                .map(|_| match (kind, g.below(8)) {
                    (_, 0) => f64::NAN,
                    (0, _) => half::bf16::from_f64(g.unit()).to_f64(),
                    (1, _) => half::f16::from_f64(g.unit()).to_f64(),
                    (2, _) => g.unit() as f32 as f64,
                    _ => g.unit(),
                })
                .collect();
            let cut = g.below(n as u64) as usize;
            let mut scan = GridScan::new(declared);
            scan.feed(&v[..cut]);
            scan.feed(&v[cut..]);
            if scan.needs_f16() {
                scan.feed_f16(&v[..cut]);
                scan.feed_f16(&v[cut..]);
            }
            assert_eq!(scan.finish(), effective_dtype(declared, &v), "case {case}");
        }
    }
}

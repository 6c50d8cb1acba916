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
    if !declared.is_float() {
        return declared;
    }
    let finite = || values.iter().filter(|v| v.is_finite());
    if declared == DType::F64 && !finite().all(|&v| (v as f32) as f64 == v) {
        return DType::F64;
    }
    if matches!(declared, DType::BF16 | DType::F16) {
        return declared;
    }
    // bf16 is the upper half of f32: a value is on its grid when it is an f32 whose low
    // 16 bits are zero (the same test as a bf16 round trip, without the conversion).
    if finite().all(|&v| {
        let f = v as f32;
        f as f64 == v && f.to_bits() & 0xFFFF == 0
    }) {
        return DType::BF16;
    }
    if finite().all(|&v| half::f16::from_f64(v).to_f64() == v) {
        return DType::F16;
    }
    DType::F32
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
}

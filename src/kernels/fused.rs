//! Fused path of [`super::loss::compute`] and [`super::loss::compute_with_grad`], f64 and
//! f32, CPU: one pass per row (rayon over rows) over the inputs' own storage (borrowed,
//! not copied, when already contiguous in the compute dtype) computes the ratio, the
//! per-token loss, the KL/entropy terms, every sum the aggregations and metrics need and,
//! with the gradient, d(total loss)/d(log_probs) `[B, T]`. The candle kernels
//! ([`super::loss::compute_candle`], [`super::loss::compute_with_grad_candle`]) are the
//! reference it is tested against.
//!
//! Forward: each per-token value is computed with the same operations, in the same dtype,
//! as the candle kernels (bit-identical: same libm `exp`); only sums are ordered otherwise
//! (lanes, 256-token chunks, rows in order): ~1e-14 relative in f64, ~1e-6 in f32,
//! where blocked sums are closer to the f64 value than candle's.
//!
//! Backward: candle's reverse-mode autograd of that graph, written out per token: the
//! aggregation sends each entry `w·m` (verl modes: 0 where `m = 0`), `maximum`/`minimum`
//! split a tie 0.5/0.5, `clamp_torch` passes no gradient at or beyond a bound (torch 2.x's
//! `clamp`), `exp` multiplies by its output (0·inf gives NaN, as in candle), `x − x.detach()`
//! carries gradient 1. f64 gradients are bit-identical to candle's. The whole-batch
//! denominators come from a mask-count pre-pass; GSPO's sequence ratio needs a row sum, so
//! its rows get a second sweep.
//!
//! Layout of a row: per 256-token chunk, the `exp`s first (a loop of calls only, so that
//! the main loop keeps its accumulators in registers), then groups of 4 (f64) or 8 (f32)
//! tokens, each step a loop over the lanes with the configuration branches hoisted out of
//! it, which LLVM vectorizes. The outputs are written once, without a zero-fill pass.

use std::mem::MaybeUninit;

use candle_core::{DType, Device, Layout, Storage, Tensor, WithDType};
use rayon::prelude::*;

use super::aggregate::AggMode;
use super::kl::KlEstimator;
use super::loss::RatioLevel;
use super::loss::{KlPlacement, LossConfig, LossInputs, LossOutput, Metrics, PolicyKind};
use super::KResult;

/// The float types the fused path runs in.
pub(crate) trait Float:
    WithDType
    + Copy
    + Send
    + Sync
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + std::ops::AddAssign
    + std::ops::DivAssign
    + std::ops::SubAssign
{
    fn exp_(self) -> Self;
    fn abs_(self) -> Self;
    fn finite(self) -> bool;
}

impl Float for f64 {
    fn exp_(self) -> Self {
        self.exp()
    }
    fn abs_(self) -> Self {
        self.abs()
    }
    fn finite(self) -> bool {
        self.is_finite()
    }
}

impl Float for f32 {
    fn exp_(self) -> Self {
        self.exp()
    }
    fn abs_(self) -> Self {
        self.abs()
    }
    fn finite(self) -> bool {
        self.is_finite()
    }
}

/// The values of a contiguous CPU storage window, borrowed (`None` off the CPU).
fn cpu_slice<'g, T: Float>(storage: &'g Storage, layout: &Layout) -> KResult<Option<&'g [T]>> {
    let Storage::Cpu(cpu) = storage else {
        return Ok(None);
    };
    let all: &[T] = T::cpu_storage_as_slice(cpu)?;
    Ok(layout.contiguous_offsets().and_then(|(a, b)| all.get(a..b)))
}

/// `clamp_torch` on one value (bounds already in `T`).
#[inline(always)]
fn clamp<T: Float>(x: T, lo: Option<T>, hi: Option<T>) -> T {
    let mut y = x;
    if let Some(lo) = lo {
        if y <= lo {
            y = lo;
        }
    }
    if let Some(hi) = hi {
        if y >= hi {
            y = hi;
        }
    }
    y
}

/// Whether `clamp_torch` passes the gradient at `x`: strictly inside the bounds (NaN too,
/// as its `where` keeps NaN on the input branch).
#[inline(always)]
fn passes<T: Float>(x: T, lo: Option<T>, hi: Option<T>) -> bool {
    !(lo.is_some_and(|lo| x <= lo) || hi.is_some_and(|hi| x >= hi))
}

/// `x − x` as candle computes `x - x.detach()`: 0 for a finite `x`, NaN for ±inf/NaN.
#[inline(always)]
#[allow(clippy::eq_op)]
fn self_diff<T: Float>(x: T) -> T {
    x - x
}

#[inline(always)]
fn b2f<T: Float>(b: bool) -> T {
    if b {
        T::one()
    } else {
        T::zero()
    }
}

/// candle's `maximum` / `minimum`.
#[inline(always)]
fn maximum<T: Float>(a: T, b: T) -> T {
    if a < b {
        b
    } else {
        a
    }
}
#[inline(always)]
fn minimum<T: Float>(a: T, b: T) -> T {
    if a > b {
        b
    } else {
        a
    }
}

/// The gradient candle's `maximum`/`minimum` sends to one operand: `[node == x]·g /
/// ([node == other] + 1)` (a tie splits 0.5/0.5, NaN sends 0·g). Dividing by 2 or 1 is
/// multiplying by 0.5 or 1, exactly.
#[inline(always)]
fn extremum_grad<T: Float>(node: T, x: T, other: T, g: T) -> T {
    let split = if node == other {
        T::from_f64(0.5)
    } else {
        T::one()
    };
    b2f::<T>(node == x) * g * split
}

/// Gradient into one entry of a matrix aggregated under mask `m`, when the masked matrix
/// receives `w` per entry: verl modes (`where(m≠0, x, 0)·m`) send 0 where `m = 0`, TRL
/// modes (`x·m`) send `w·m`.
#[inline(always)]
fn agg_entry<T: Float>(verl: bool, w: T, m: T) -> T {
    if verl && m == T::zero() {
        T::zero()
    } else {
        w * m
    }
}

/// The argument of the one `exp` a KL estimator takes (computed ahead, in a call-only
/// loop), or `None` for the estimators without one.
#[inline(always)]
fn kl_exp_arg<T: Float>(lp: T, rf: T, est: KlEstimator) -> Option<T> {
    match est {
        KlEstimator::K1 | KlEstimator::Abs | KlEstimator::K2 => None,
        KlEstimator::K3 => Some(rf - lp),
        KlEstimator::K3Verl | KlEstimator::K3VerlStraightThrough => Some(clamp(
            rf - lp,
            Some(T::from_f64(-20.0)),
            Some(T::from_f64(20.0)),
        )),
        KlEstimator::MlxRatio => Some(lp - rf),
    }
}

/// Per-token KL estimate as [`super::kl::kl`] (`e` = exp of [`kl_exp_arg`]) and, with
/// `GRAD`, for an upstream gradient `g` on it, its contribution to d/d(log_probs) as
/// candle's autograd of [`super::kl::kl`] computes it.
#[inline(always)]
fn kl_term<T: Float, const GRAD: bool>(lp: T, rf: T, est: KlEstimator, e: T, g: T) -> (T, T) {
    let d = lp - rf;
    let half = T::from_f64(0.5);
    let two = T::from_f64(2.0);
    let zero = T::zero();
    let one = T::one();
    let m1 = T::from_f64(-1.0);
    // `x.sqr().affine(0.5, 0)` backward: (x · (g·0.5 + 0))·2 + 0.
    let k2_grad = |g: T| d * (g * half + zero) * two + zero;
    // `(exp(k) − k).affine(1, −1)` backward into k: (0 − g') + g'·exp(k), g' = g·1 + 0.
    let k3_grad = |g: T| {
        let gi = g * one + zero;
        (zero - gi) + gi * e
    };
    match est {
        KlEstimator::K1 => (d, g),
        KlEstimator::Abs => (d.abs_(), g * if d >= zero { one } else { -one }),
        KlEstimator::K2 => (d * d * half + zero, if GRAD { k2_grad(g) } else { zero }),
        KlEstimator::K3 => {
            // r = ref − logp: logp is the subtrahend.
            let r = rf - lp;
            let v = (e - r) * one + m1;
            (v, if GRAD { zero - k3_grad(g) } else { zero })
        }
        KlEstimator::K3Verl | KlEstimator::K3VerlStraightThrough => {
            let (lo, hi) = (Some(T::from_f64(-20.0)), Some(T::from_f64(20.0)));
            let r = rf - lp;
            let k = clamp(r, lo, hi);
            let kld = (e - k) * one + m1;
            let (lo2, hi2) = (Some(T::from_f64(-10.0)), Some(T::from_f64(10.0)));
            let v = clamp(kld, lo2, hi2);
            if est == KlEstimator::K3VerlStraightThrough {
                let back = d * d * half + zero;
                return (self_diff(back) + v, if GRAD { k2_grad(g) } else { zero });
            }
            if !GRAD {
                return (v, zero);
            }
            let g_kld = if passes(kld, lo2, hi2) { g } else { zero };
            let g_r = if passes(r, lo, hi) {
                k3_grad(g_kld)
            } else {
                zero
            };
            (v, zero - g_r)
        }
        KlEstimator::MlxRatio => {
            let v = (e * e - d) * one + m1;
            if !GRAD {
                return (v, zero);
            }
            let gi = g * one + zero;
            // e·e: both operands are e.
            let g_e = gi * e + gi * e;
            (v, (zero - gi) + g_e * e)
        }
    }
}

/// Row sums: `trl` = Σ x·m, `verl` = Σ where(m≠0, x, 0)·m.
#[derive(Clone, Copy)]
struct Pair<T> {
    trl: T,
    verl: T,
}

impl<T: Float> Pair<T> {
    fn zero() -> Self {
        Pair {
            trl: T::zero(),
            verl: T::zero(),
        }
    }
}

/// One row's sums: everything the aggregations and the metrics need (`first`: TRL's
/// low/high/region clip indicators at the row's first token, GSPO's per-sequence value).
#[derive(Clone, Copy)]
struct Row<T> {
    cnt: T,
    pt: Pair<T>,
    k: Pair<T>,
    e: Pair<T>,
    low: T,
    high: T,
    region: T,
    first: [T; 3],
    frac: T,
    lower: T,
    ppo_kl: T,
    approx: T,
    avg: T,
    clip: T,
}

impl<T: Float> Row<T> {
    fn zero() -> Self {
        let z = T::zero();
        Row {
            cnt: z,
            pt: Pair::zero(),
            k: Pair::zero(),
            e: Pair::zero(),
            low: z,
            high: z,
            region: z,
            first: [z; 3],
            frac: z,
            lower: z,
            ppo_kl: z,
            approx: z,
            avg: z,
            clip: z,
        }
    }
}

/// [`super::aggregate::aggregate`] from per-row sums.
fn aggregate<T: Float>(
    rows: &[Row<T>],
    pick: impl Fn(&Row<T>) -> Pair<T>,
    mode: AggMode,
    t: usize,
) -> T {
    let b = rows.len();
    let sum = |f: &dyn Fn(&Row<T>) -> T| {
        let mut s = T::zero();
        for r in rows {
            s += f(r);
        }
        s
    };
    let one = T::one();
    match mode {
        AggMode::TokenMean => sum(&|r| pick(r).verl) / sum(&|r| r.cnt),
        AggMode::SeqMeanTokenMean
        | AggMode::SeqMeanTokenSum
        | AggMode::SeqMeanTokenSumNorm { .. } => {
            let mut num = T::zero();
            let mut den = T::zero();
            for r in rows {
                let mut seq = pick(r).verl;
                if mode == AggMode::SeqMeanTokenMean {
                    seq /= r.cnt * one + T::from_f64(1e-8);
                }
                let sm: T = b2f(r.cnt > T::zero());
                num += if sm != T::zero() { seq } else { T::zero() } * sm;
                den += sm;
            }
            let loss = num / den;
            match mode {
                AggMode::SeqMeanTokenSumNorm { horizon } => {
                    loss / T::from_f64(horizon.unwrap_or(t as f64))
                }
                _ => loss,
            }
        }
        AggMode::TrlGrpo => {
            let mut s = T::zero();
            for r in rows {
                s += pick(r).trl / clamp(r.cnt, Some(one), None);
            }
            s * T::from_f64(1.0 / b as f64) + T::zero()
        }
        AggMode::TrlBnpo => sum(&|r| pick(r).trl) / clamp(sum(&|r| r.cnt), Some(one), None),
        AggMode::TrlDrGrpo {
            max_completion_length,
        } => {
            let l = max_completion_length.unwrap_or(t as f64);
            sum(&|r| pick(r).trl) / T::from_f64(b as f64 * l)
        }
        AggMode::TrlDapo { num_items_in_batch } => {
            let n = match num_items_in_batch {
                Some(n) => n.max(1.0),
                None => sum(&|r| r.cnt).to_f64().max(1.0),
            };
            sum(&|r| pick(r).trl) / T::from_f64(n)
        }
    }
}

/// Backward of [`aggregate`]: for an upstream gradient `g` on the aggregate, what each
/// row's masked entries receive (then [`agg_entry`] per token), from the rows' mask
/// counts — candle's autograd of [`super::aggregate::aggregate`] step by step.
fn aggregate_grad<T: Float>(mode: AggMode, g: T, counts: &[T], t: usize) -> Vec<T> {
    let b = counts.len();
    let zero = T::zero();
    let one = T::one();
    let mut total = zero;
    for c in counts {
        total += *c;
    }
    let same = |w: T| vec![w; b];
    match mode {
        AggMode::TokenMean => same(g / total),
        AggMode::SeqMeanTokenMean
        | AggMode::SeqMeanTokenSum
        | AggMode::SeqMeanTokenSumNorm { .. } => {
            let g1 = match mode {
                AggMode::SeqMeanTokenSumNorm { horizon } => {
                    g / T::from_f64(horizon.unwrap_or(t as f64))
                }
                _ => g,
            };
            let mut den = zero;
            for c in counts {
                den += b2f(*c > zero);
            }
            let g2 = g1 / den;
            counts
                .iter()
                .map(|&c| {
                    let sm: T = b2f(c > zero);
                    let gs = if sm != zero { g2 * sm } else { zero };
                    if mode == AggMode::SeqMeanTokenMean {
                        gs / (c * one + T::from_f64(1e-8))
                    } else {
                        gs
                    }
                })
                .collect()
        }
        AggMode::TrlGrpo => {
            // mean_all = sum_all.affine(1/B, 0).
            let g1 = g * T::from_f64(1.0 / b as f64) + zero;
            counts
                .iter()
                .map(|&c| g1 / clamp(c, Some(one), None))
                .collect()
        }
        AggMode::TrlBnpo => same(g / clamp(total, Some(one), None)),
        AggMode::TrlDrGrpo {
            max_completion_length,
        } => {
            let l = max_completion_length.unwrap_or(t as f64);
            same(g / T::from_f64(b as f64 * l))
        }
        AggMode::TrlDapo { num_items_in_batch } => {
            let n = match num_items_in_batch {
                Some(n) => n.max(1.0),
                None => total.to_f64().max(1.0),
            };
            same(g / T::from_f64(n))
        }
    }
}

/// PPO clip parameters in `T`.
#[derive(Clone, Copy)]
struct Clip<T> {
    lo: T,
    hi: T,
    delta: Option<T>,
    c: Option<T>,
}

/// Tests compare the AVX2 build of the row kernel with the baseline one.
#[cfg(test)]
static BASELINE_ONLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[cfg(test)]
fn baseline_only() -> bool {
    BASELINE_ONLY.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(not(test))]
#[inline(always)]
fn baseline_only() -> bool {
    false
}

/// What one row pass reads, with the config's scalars in `T`.
struct Kernel<'a, T> {
    t: usize,
    lp: &'a [T],
    old: Option<&'a [T]>,
    mask: &'a [T],
    adv: &'a [T],
    adv_per_token: bool,
    refp: Option<&'a [T]>,
    ent: Option<&'a [T]>,
    level: RatioLevel,
    token_clamp: Option<(T, T)>,
    seq_clamp: Option<(T, T)>,
    clip: Option<Clip<T>>,
    kl: Option<(KlEstimator, T, KlPlacement)>,
    verl: bool,
}

/// Per-row gradient weights: what the aggregated policy term and the separately
/// aggregated KL send to each masked entry of the row.
#[derive(Clone, Copy)]
struct RowW<T> {
    pt: T,
    k: T,
}

/// Tokens per chunk of a row: the `exp`s of a chunk run first, in a loop of calls only,
/// so that the main loop has no calls; chunk partial sums are then folded into the row's
/// (blocked summation, which also keeps f32 sums accurate).
const CHUNK: usize = 256;

/// Per-lane partial sums (the fields of [`Row`]).
#[derive(Clone, Copy)]
struct Acc<T, const N: usize> {
    cnt: [T; N],
    pt: [T; N],
    pt_v: [T; N],
    k: [T; N],
    k_v: [T; N],
    e: [T; N],
    e_v: [T; N],
    low: [T; N],
    high: [T; N],
    region: [T; N],
    frac: [T; N],
    lower: [T; N],
    ppo_kl: [T; N],
    approx: [T; N],
    avg: [T; N],
    clip: [T; N],
}

impl<T: Float, const N: usize> Acc<T, N> {
    fn zero() -> Self {
        let z = [T::zero(); N];
        Acc {
            cnt: z,
            pt: z,
            pt_v: z,
            k: z,
            k_v: z,
            e: z,
            e_v: z,
            low: z,
            high: z,
            region: z,
            frac: z,
            lower: z,
            ppo_kl: z,
            approx: z,
            avg: z,
            clip: z,
        }
    }

    /// Add the lanes into `s` and reset them.
    fn fold_into(&mut self, s: &mut Row<T>) {
        let sum = |x: &[T; N]| {
            let mut v = T::zero();
            for &y in x {
                v += y;
            }
            v
        };
        s.cnt += sum(&self.cnt);
        s.pt.trl += sum(&self.pt);
        s.pt.verl += sum(&self.pt_v);
        s.k.trl += sum(&self.k);
        s.k.verl += sum(&self.k_v);
        s.e.trl += sum(&self.e);
        s.e.verl += sum(&self.e_v);
        s.low += sum(&self.low);
        s.high += sum(&self.high);
        s.region += sum(&self.region);
        s.frac += sum(&self.frac);
        s.lower += sum(&self.lower);
        s.ppo_kl += sum(&self.ppo_kl);
        s.approx += sum(&self.approx);
        s.avg += sum(&self.avg);
        s.clip += sum(&self.clip);
        *self = Acc::zero();
    }
}

/// One row's inputs and per-row constants.
struct RowCtx<'r, T> {
    lp: &'r [T],
    od: Option<&'r [T]>,
    ms: &'r [T],
    rf: Option<&'r [T]>,
    en: Option<&'r [T]>,
    /// The row's advantages (`t` values) or its one advantage.
    adv: &'r [T],
    /// Sequence log-ratio (sequence levels).
    seq: T,
    /// Whether the sequence ratio's clamp passes the gradient (TRL GSPO).
    seq_pass: bool,
    /// GSPO-token's cap on the log-ratio.
    gspo_hi: Option<T>,
    w: RowW<T>,
}

/// Σ x in 8 interleaved partial sums (vectorizable; the order of a masked count does not
/// matter, 0/1 masks sum exactly).
fn lane_sum<T: Float>(x: &[T]) -> T {
    let mut acc = [T::zero(); 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            acc[l] += c[l];
        }
    }
    let mut s = T::zero();
    for v in acc.into_iter().chain(chunks.remainder().iter().copied()) {
        s += v;
    }
    s
}

/// `where(m ≠ 0, x, 0)·m`.
#[inline(always)]
fn mv<T: Float>(m: T, x: T) -> T {
    let kept = if m != T::zero() { x } else { T::zero() };
    kept * m
}

impl<'a, T: Float> Kernel<'a, T> {
    /// [`Kernel::row`] compiled for AVX2 when the CPU has it (the same IEEE operations on
    /// wider registers, no FMA: bit-identical results, tested).
    fn row_dispatch<const GRAD: bool>(
        &self,
        i: usize,
        rr: &mut [MaybeUninit<T>],
        pp: &mut [MaybeUninit<T>],
        gg: &mut [MaybeUninit<T>],
        w: RowW<T>,
    ) -> Row<T> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && !baseline_only() {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { self.row_avx2::<GRAD>(i, rr, pp, gg, w) };
        }
        self.row::<GRAD>(i, rr, pp, gg, w)
    }

    /// [`Kernel::row`] with AVX2 code generation; callers check the CPU first.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn row_avx2<const GRAD: bool>(
        &self,
        i: usize,
        rr: &mut [MaybeUninit<T>],
        pp: &mut [MaybeUninit<T>],
        gg: &mut [MaybeUninit<T>],
        w: RowW<T>,
    ) -> Row<T> {
        self.row::<GRAD>(i, rr, pp, gg, w)
    }

    /// One row: writes the ratio (`rr`), per-token loss (`pp`) and, with `GRAD`, the
    /// gradient (`gg`) of each of its `t` tokens exactly once (every element: the caller
    /// relies on it); returns the row sums.
    #[inline(always)]
    fn row<const GRAD: bool>(
        &self,
        i: usize,
        rr: &mut [MaybeUninit<T>],
        pp: &mut [MaybeUninit<T>],
        gg: &mut [MaybeUninit<T>],
        w: RowW<T>,
    ) -> Row<T> {
        let t = self.t;
        let span = i * t..(i + 1) * t;
        let lp = &self.lp[span.clone()];
        let od = self.old.map(|o| &o[span.clone()]);
        let ms = &self.mask[span.clone()];
        let zero = T::zero();
        let one = T::one();
        let old_at = |j: usize| od.map_or(lp[j], |o| o[j]);
        // Sequence log-ratio (sequence levels only): Σ d·m / clamp(Σ m, 1), and what every
        // finite-logp token's ratio then is.
        let (seq, len) = if self.level == RatioLevel::Token {
            (zero, one)
        } else {
            let mut num = zero;
            let mut len = zero;
            for j in 0..t {
                num += (lp[j] - old_at(j)) * ms[j];
                len += ms[j];
            }
            let len = clamp(len, Some(one), None);
            (num / len, len)
        };
        let gspo_hi = self.seq_clamp.map(|c| c.1);
        let (seq_arg, seq_pass) = match (self.level, self.seq_clamp) {
            (RatioLevel::Sequence, Some((lo, hi))) => (
                clamp(seq, Some(lo), Some(hi)),
                passes(seq, Some(lo), Some(hi)),
            ),
            (RatioLevel::GspoToken, _) => (clamp(zero + seq, None, gspo_hi), true),
            _ => (seq, true),
        };
        let seq_r = if self.level == RatioLevel::Token {
            zero
        } else {
            seq_arg.exp_()
        };
        let c = RowCtx {
            lp,
            od,
            ms,
            rf: self.refp.map(|r| &r[span.clone()]),
            en: self.ent.map(|e| &e[span.clone()]),
            adv: if self.adv_per_token {
                &self.adv[span]
            } else {
                &self.adv[i..i + 1]
            },
            seq,
            seq_pass,
            gspo_hi,
            w,
        };
        let kl = match (self.kl, c.rf) {
            (Some((est, ..)), Some(rf)) if kl_exp_arg(zero, zero, est).is_some() => Some((est, rf)),
            _ => None,
        };
        let mut rb = [zero; CHUNK];
        let mut ke = [zero; CHUNK];
        // GSPO with a KL term: the KL part of each token's gradient, until the row sum is
        // known.
        let mut seq_kl = if GRAD && self.level == RatioLevel::Sequence && self.kl.is_some() {
            vec![zero; t]
        } else {
            Vec::new()
        };
        // GSPO's gradient row sum: f64 in token order, as candle's f64 sum (bit-identical);
        // f32 in 8 interleaved partial sums, as accurate as candle's vectorized f32 sum.
        let mut g_seq = [zero; 8];
        let mut s = Row::zero();
        let mut start = 0;
        while start < t {
            let end = (start + CHUNK).min(t);
            // The exps of the chunk: ratios into `rb` (then `rr`), the KL estimator's into `ke`.
            let rb = &mut rb[..end - start];
            match self.level {
                RatioLevel::Token => {
                    for (k, r) in rb.iter_mut().enumerate() {
                        let j = start + k;
                        let d = lp[j] - old_at(j);
                        *r = match self.token_clamp {
                            Some((lo, hi)) => clamp(d, Some(lo), Some(hi)),
                            None => d,
                        }
                        .exp_();
                    }
                }
                RatioLevel::Sequence => rb.fill(seq_r),
                RatioLevel::GspoToken => {
                    for (k, r) in rb.iter_mut().enumerate() {
                        let x = lp[start + k];
                        *r = if x.finite() {
                            seq_r
                        } else {
                            clamp(self_diff(x) + seq, None, gspo_hi).exp_()
                        };
                    }
                }
            }
            for (o, r) in rr[start..end].iter_mut().zip(rb.iter()) {
                o.write(*r);
            }
            if let Some((est, rf)) = kl {
                for j in start..end {
                    ke[j - start] = kl_exp_arg(lp[j], rf[j], est).map_or(zero, |x| x.exp_());
                }
            }
            // 4 f64 or 8 f32 lanes: one AVX2 register (two SSE2 ones) per step.
            if std::mem::size_of::<T>() == 8 {
                self.groups::<4, GRAD>(
                    &c,
                    start,
                    end,
                    rb,
                    &ke,
                    pp,
                    gg,
                    &mut seq_kl,
                    &mut s,
                    &mut g_seq,
                );
            } else {
                self.groups::<8, GRAD>(
                    &c,
                    start,
                    end,
                    rb,
                    &ke,
                    pp,
                    gg,
                    &mut seq_kl,
                    &mut s,
                    &mut g_seq,
                );
            }
            start = end;
        }
        if GRAD && self.level == RatioLevel::Sequence {
            // seq = Σ d·m / len: each token gets (Σ_row g / len)·m.
            let mut total = zero;
            for g in g_seq {
                total += g;
            }
            let g_num = total / len;
            for j in 0..t {
                let g = g_num * ms[j];
                gg[j].write(match seq_kl.get(j) {
                    Some(k) => *k + g,
                    None => g,
                });
            }
        }
        s
    }

    /// Tokens `start..end` of a row (one chunk: ratios in `rb`, KL exps in `ke`, both
    /// indexed from `start`) in groups of `N`, the rest one by one; folds the chunk's sums
    /// into `s`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn groups<const N: usize, const GRAD: bool>(
        &self,
        c: &RowCtx<'_, T>,
        start: usize,
        end: usize,
        rb: &[T],
        ke: &[T],
        pp: &mut [MaybeUninit<T>],
        gg: &mut [MaybeUninit<T>],
        seq_kl: &mut [T],
        s: &mut Row<T>,
        g_seq: &mut [T; 8],
    ) {
        let mut acc = Acc::<T, N>::zero();
        let mut tail = Acc::<T, 1>::zero();
        let mut j = start;
        while j + N <= end {
            let (r, k) = (&rb[j - start..][..N], &ke[j - start..][..N]);
            self.group::<N, GRAD>(c, j, r, k, pp, gg, seq_kl, &mut acc, s, g_seq);
            j += N;
        }
        while j < end {
            let (r, k) = (&rb[j - start..][..1], &ke[j - start..][..1]);
            self.group::<1, GRAD>(c, j, r, k, pp, gg, seq_kl, &mut tail, s, g_seq);
            j += 1;
        }
        acc.fold_into(s);
        tail.fold_into(s);
    }

    /// Tokens `j0..j0 + N` of a row whose ratios are already computed (`rb`, and the KL
    /// exps `ke`, N values each): per-token loss into `pp`, gradient into `gg` (GSPO: its
    /// KL part into `seq_kl`, the rest waits for the row sum `g_seq`, accumulated in token
    /// order), sums into `acc` (and `s.first`).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn group<const N: usize, const GRAD: bool>(
        &self,
        c: &RowCtx<'_, T>,
        j0: usize,
        rb: &[T],
        ke: &[T],
        pp: &mut [MaybeUninit<T>],
        gg: &mut [MaybeUninit<T>],
        seq_kl: &mut [T],
        acc: &mut Acc<T, N>,
        s: &mut Row<T>,
        g_seq: &mut [T; 8],
    ) {
        use std::array::from_fn;
        let z = T::zero();
        let one = T::one();
        let f = |x: f64| T::from_f64(x);
        let (half, m1, p2) = (f(0.5), f(-1.0), f(0.2));
        let x: [T; N] = from_fn(|l| c.lp[j0 + l]);
        let o: [T; N] = match c.od {
            Some(o) => from_fn(|l| o[j0 + l]),
            None => x,
        };
        let m: [T; N] = from_fn(|l| c.ms[j0 + l]);
        let r: [T; N] = from_fn(|l| rb[l]);
        let a: [T; N] = if self.adv_per_token {
            from_fn(|l| c.adv[j0 + l])
        } else {
            [c.adv[0]; N]
        };
        let d: [T; N] = from_fn(|l| x[l] - o[l]);
        let lr: [T; N] = match self.token_clamp {
            Some((lo, hi)) => from_fn(|l| clamp(d[l], Some(lo), Some(hi))),
            None => d,
        };
        let neg_a: [T; N] = from_fn(|l| -a[l]);
        // ppo_clip's intermediates, for its backward.
        let mut l1 = [z; N];
        let mut l2 = [z; N];
        let mut clip1 = [z; N];
        let mut l3 = [z; N];
        let mut clip2 = [z; N];
        let mut pt: [T; N] = match &self.clip {
            Some(cp) => {
                let coef: [T; N] = match cp.delta {
                    Some(dl) => from_fn(|l| clamp(r[l], None, Some(dl))),
                    None => r,
                };
                // TRL clip fractions.
                let low: [T; N] = from_fn(|l| b2f(coef[l] < cp.lo && a[l] < z));
                let high: [T; N] = from_fn(|l| b2f(coef[l] > cp.hi && a[l] > z));
                let region: [T; N] =
                    from_fn(
                        |l| b2f((coef[l] < cp.lo && a[l] < z) || (coef[l] > cp.hi && a[l] > z)),
                    );
                if j0 == 0 {
                    s.first = [low[0], high[0], region[0]];
                }
                for l in 0..N {
                    acc.low[l] += low[l] * m[l];
                    acc.high[l] += high[l] * m[l];
                    acc.region[l] += region[l] * m[l];
                }
                // verl clip fractions.
                let clipped: [T; N] = from_fn(|l| clamp(r[l], Some(cp.lo), Some(cp.hi)));
                let vl1: [T; N] = from_fn(|l| neg_a[l] * r[l]);
                l2 = from_fn(|l| neg_a[l] * clipped[l]);
                for l in 0..N {
                    acc.frac[l] += mv(m[l], b2f(l2[l] > vl1[l]));
                }
                // ppo_clip.
                l1 = from_fn(|l| neg_a[l] * coef[l]);
                clip1 = from_fn(|l| maximum(l1[l], l2[l]));
                match cp.c {
                    None => clip1,
                    Some(cc) => {
                        l3 = from_fn(|l| neg_a[l] * cc + z);
                        for l in 0..N {
                            let vclip1 = maximum(vl1[l], l2[l]);
                            acc.lower[l] += mv(m[l], b2f::<T>(vclip1 > l3[l]) * b2f(a[l] < z));
                        }
                        clip2 = from_fn(|l| minimum(l3[l], clip1[l]));
                        from_fn(|l| if a[l] < z { clip2[l] } else { clip1[l] })
                    }
                }
            }
            None => from_fn(|l| neg_a[l] * r[l]),
        };
        for l in 0..N {
            acc.ppo_kl[l] += mv(m[l], -lr[l]);
            acc.approx[l] += (d[l] * d[l] * half + z) * m[l];
            acc.avg[l] += r[l] * m[l];
            acc.clip[l] += b2f::<T>((r[l] * one + m1).abs_() > p2) * m[l];
        }
        // d(loss)/d(per_token) and the KL term's contribution to d/d(logp).
        let g_pt: [T; N] = match (GRAD, self.verl) {
            (false, _) => [z; N],
            (true, true) => from_fn(|l| agg_entry(true, c.w.pt, m[l])),
            (true, false) => from_fn(|l| agg_entry(false, c.w.pt, m[l])),
        };
        let mut g_kl = [z; N];
        if let (Some((est, coef, place)), Some(rf)) = (self.kl, c.rf) {
            for l in 0..N {
                let g_k = match (GRAD, place) {
                    (false, _) => z,
                    (true, KlPlacement::PerToken) => g_pt[l] * coef + z,
                    (true, KlPlacement::Separate) => agg_entry(self.verl, c.w.k, m[l]),
                };
                let (k, gk) = kl_term::<T, GRAD>(x[l], rf[j0 + l], est, ke[l], g_k);
                g_kl[l] = gk;
                acc.k[l] += k * m[l];
                acc.k_v[l] += mv(m[l], k);
                if place == KlPlacement::PerToken {
                    pt[l] += k * coef + z;
                }
            }
        }
        if let Some(e) = c.en {
            for l in 0..N {
                acc.e[l] += e[j0 + l] * m[l];
                acc.e_v[l] += mv(m[l], e[j0 + l]);
            }
        }
        for l in 0..N {
            acc.pt[l] += pt[l] * m[l];
            acc.pt_v[l] += mv(m[l], pt[l]);
            acc.cnt[l] += m[l];
            pp[j0 + l].write(pt[l]);
        }
        if !GRAD {
            return;
        }
        // Backward of ppo_clip / importance sampling into the ratio: where(A<0) →
        // minimum(l3, clip1) → maximum(l1, l2) → the clamps `min(r, delta)` and
        // `clamp(r, lo, hi)`.
        let g_r: [T; N] = match &self.clip {
            None => from_fn(|l| g_pt[l] * neg_a[l]),
            Some(cp) => {
                let g_c1: [T; N] = match cp.c {
                    None => g_pt,
                    Some(_) => from_fn(|l| {
                        let neg = a[l] < z;
                        let g_c2 = if neg { g_pt[l] } else { z };
                        let g_w = if neg { z } else { g_pt[l] };
                        g_w + extremum_grad(clip2[l], clip1[l], l3[l], g_c2)
                    }),
                };
                let g_r1: [T; N] =
                    from_fn(|l| extremum_grad(clip1[l], l1[l], l2[l], g_c1[l]) * neg_a[l]);
                let g_cl: [T; N] =
                    from_fn(|l| extremum_grad(clip1[l], l2[l], l1[l], g_c1[l]) * neg_a[l]);
                let via1: [T; N] = match cp.delta {
                    Some(dl) => from_fn(|l| if r[l] >= dl { z } else { g_r1[l] }),
                    None => g_r1,
                };
                from_fn(|l| {
                    via1[l]
                        + if passes(r[l], Some(cp.lo), Some(cp.hi)) {
                            g_cl[l]
                        } else {
                            z
                        }
                })
            }
        };
        // Through exp (× its output), then the clamp on its argument.
        let g_pol: [T; N] = match self.level {
            RatioLevel::Token => match self.token_clamp {
                Some((lo, hi)) => from_fn(|l| {
                    if passes(d[l], Some(lo), Some(hi)) {
                        g_r[l] * r[l]
                    } else {
                        z
                    }
                }),
                None => from_fn(|l| g_r[l] * r[l]),
            },
            RatioLevel::GspoToken => from_fn(|l| {
                let gl = if x[l].finite() {
                    z + c.seq
                } else {
                    self_diff(x[l]) + c.seq
                };
                if passes(gl, None, c.gspo_hi) {
                    g_r[l] * r[l]
                } else {
                    z
                }
            }),
            RatioLevel::Sequence => {
                // Broadcast backward: the row sum reaches every token in the row's last
                // sweep.
                for l in 0..N {
                    let g = if c.seq_pass { g_r[l] * r[l] } else { z };
                    let lane = if std::mem::size_of::<T>() == 8 {
                        0
                    } else {
                        (j0 + l) % 8
                    };
                    g_seq[lane] += g;
                }
                [z; N]
            }
        };
        let with_kl = self.kl.is_some() && c.rf.is_some();
        match (self.level, with_kl) {
            (RatioLevel::Sequence, true) => seq_kl[j0..j0 + N].copy_from_slice(&g_kl),
            (RatioLevel::Sequence, false) => {}
            (_, true) => {
                for l in 0..N {
                    gg[j0 + l].write(g_pol[l] + g_kl[l]);
                }
            }
            (_, false) => {
                for l in 0..N {
                    gg[j0 + l].write(g_pol[l]);
                }
            }
        }
    }
}

/// The fused forward pass, or `None` when it does not apply (non-CPU inputs or anything
/// the candle path must refuse with its own message: wrong shapes, a missing reference,
/// a bad `clip_ratio_c`); the caller then runs the candle path.
pub fn compute_fused(inp: &LossInputs, cfg: &LossConfig) -> KResult<Option<LossOutput>> {
    let out = match cfg.precision.dtype() {
        DType::F64 => run::<f64, false>(inp, cfg)?,
        _ => run::<f32, false>(inp, cfg)?,
    };
    Ok(out.map(|(o, _)| o))
}

/// The fused forward pass plus d(total loss)/d(log_probs) `[B, T]` in `cfg.precision`
/// (candle autograd's values, see the module docs), or `None` where [`compute_fused`]
/// declines.
pub fn compute_fused_with_grad(
    inp: &LossInputs,
    cfg: &LossConfig,
) -> KResult<Option<(LossOutput, Tensor)>> {
    let out = match cfg.precision.dtype() {
        DType::F64 => run::<f64, true>(inp, cfg)?,
        _ => run::<f32, true>(inp, cfg)?,
    };
    Ok(out.and_then(|(o, g)| g.map(|g| (o, g))))
}

fn run<T: Float, const GRAD: bool>(
    inp: &LossInputs,
    cfg: &LossConfig,
) -> KResult<Option<(LossOutput, Option<Tensor>)>> {
    let [b, t] = *inp.log_probs.dims() else {
        return Ok(None);
    };
    let same = |x: &Tensor| x.dims() == [b, t] && matches!(x.device(), Device::Cpu);
    if !same(&inp.log_probs) || !same(&inp.mask) {
        return Ok(None);
    }
    for x in [&inp.old_log_probs, &inp.ref_log_probs, &inp.entropy]
        .into_iter()
        .flatten()
    {
        if !same(x) {
            return Ok(None);
        }
    }
    let adv_per_token = match inp.advantages.dims() {
        [n] if *n == b => false,
        [n, 1] if *n == b => false,
        [n, m] if *n == b && *m == t => true,
        _ => return Ok(None),
    };
    if cfg.kl.is_some() && inp.ref_log_probs.is_none() {
        return Ok(None);
    }
    if let PolicyKind::Clip(cp) = &cfg.policy {
        if cp.clip_ratio_c.is_some_and(|c| c <= 1.0) {
            return Ok(None);
        }
    }
    // Inputs in `T`, contiguous: the same storage when they already are (no copy).
    let conv = |x: &Tensor| -> KResult<Tensor> { Ok(x.to_dtype(T::DTYPE)?.contiguous()?) };
    let opt = |x: &Option<Tensor>| x.as_ref().map(conv).transpose();
    let held: [Option<Tensor>; 6] = [
        Some(conv(&inp.log_probs)?),
        opt(&inp.old_log_probs)?,
        Some(conv(&inp.mask)?),
        Some(conv(&inp.advantages)?),
        if cfg.kl.is_some() {
            opt(&inp.ref_log_probs)?
        } else {
            None
        },
        opt(&inp.entropy)?,
    ];
    let guards: Vec<_> = held
        .iter()
        .map(|x| x.as_ref().map(|x| x.storage_and_layout()))
        .collect();
    let mut slices: Vec<Option<&[T]>> = Vec::with_capacity(guards.len());
    for g in &guards {
        match g {
            Some((storage, layout)) => match cpu_slice::<T>(storage, layout)? {
                Some(s) => slices.push(Some(s)),
                None => return Ok(None),
            },
            None => slices.push(None),
        }
    }
    let (Some(lp), old, Some(mask), Some(adv), refp, ent) = (
        slices[0], slices[1], slices[2], slices[3], slices[4], slices[5],
    ) else {
        return Ok(None);
    };
    let f = |x: f64| T::from_f64(x);
    let kern = Kernel {
        t,
        lp,
        old,
        mask,
        adv,
        adv_per_token,
        refp,
        ent,
        level: cfg.ratio_level,
        token_clamp: match cfg.ratio_level {
            RatioLevel::Token => cfg.log_ratio_clamp.map(|(lo, hi)| (f(lo), f(hi))),
            _ => None,
        },
        seq_clamp: cfg.log_ratio_clamp.map(|(lo, hi)| (f(lo), f(hi))),
        clip: match &cfg.policy {
            PolicyKind::Clip(cp) => Some(Clip {
                lo: f(1.0 - cp.eps_low),
                hi: f(1.0 + cp.eps_high),
                delta: cp.delta.map(f),
                c: cp.clip_ratio_c.map(f),
            }),
            PolicyKind::ImportanceSampling => None,
        },
        kl: cfg.kl.map(|k| (k.estimator, f(k.coef), k.placement)),
        verl: cfg.agg.is_verl(),
    };
    let zero = T::zero();
    let one = T::one();

    // Backward needs the whole-batch denominators first: a pass over the mask.
    let weights: Vec<RowW<T>> = if GRAD {
        let counts: Vec<T> = if t == 0 {
            vec![zero; b]
        } else {
            mask.par_chunks(t).map(lane_sum).collect()
        };
        let pt = aggregate_grad(cfg.agg, one, &counts, t);
        let k = match &kern.kl {
            Some((_, coef, KlPlacement::Separate)) => {
                aggregate_grad(cfg.agg, one * *coef + zero, &counts, t)
            }
            _ => vec![zero; b],
        };
        pt.into_iter()
            .zip(k)
            .map(|(pt, k)| RowW { pt, k })
            .collect()
    } else {
        Vec::new()
    };
    let w_at = |i: usize| {
        weights
            .get(i)
            .copied()
            .unwrap_or(RowW { pt: zero, k: zero })
    };

    // Outputs without a zero-fill pass: the row pass writes every element once.
    let n = b * t;
    let mut ratio: Vec<T> = Vec::with_capacity(n);
    let mut per_token: Vec<T> = Vec::with_capacity(n);
    let mut grad: Vec<T> = Vec::with_capacity(if GRAD { n } else { 0 });
    let rows: Vec<Row<T>> = {
        let rr = &mut ratio.spare_capacity_mut()[..n];
        let pp = &mut per_token.spare_capacity_mut()[..n];
        if t == 0 {
            (0..b)
                .map(|i| kern.row::<GRAD>(i, &mut [], &mut [], &mut [], w_at(i)))
                .collect()
        } else if GRAD {
            rr.par_chunks_mut(t)
                .zip(pp.par_chunks_mut(t))
                .zip(grad.spare_capacity_mut()[..n].par_chunks_mut(t))
                .enumerate()
                .map(|(i, ((rr, pp), gg))| kern.row_dispatch::<true>(i, rr, pp, gg, w_at(i)))
                .collect()
        } else {
            rr.par_chunks_mut(t)
                .zip(pp.par_chunks_mut(t))
                .enumerate()
                .map(|(i, (rr, pp))| kern.row_dispatch::<false>(i, rr, pp, &mut [], w_at(i)))
                .collect()
        }
    };
    // SAFETY: `Kernel::row` writes every element of its row's `rr`, `pp` and (with
    // `GRAD`) `gg` slices (phase 1 covers each chunk of 0..t for the ratios, the groups of
    // each chunk cover it for the per-token loss and gradient, GSPO's last sweep covers
    // 0..t), and the rows above cover 0..b: the first `n` elements of each capacity are
    // initialised. A panic in the pass unwinds before this point, leaving them empty.
    unsafe {
        ratio.set_len(n);
        per_token.set_len(n);
        if GRAD {
            grad.set_len(n);
        }
    }

    let total = |g: &dyn Fn(&Row<T>) -> T| {
        let mut s = zero;
        for r in &rows {
            s += g(r);
        }
        s
    };
    let cnt = total(&|r| r.cnt);
    let mean_trl = |x: T| (x / clamp(cnt, Some(one), None)).to_f64();
    let mean_verl = |x: T| (x / (cnt * one + f(1e-8))).to_f64();
    let mut metrics = Metrics::default();
    if let PolicyKind::Clip(cp) = &cfg.policy {
        let trl = |k: usize, g: &dyn Fn(&Row<T>) -> T| {
            if cfg.ratio_level == RatioLevel::Sequence {
                let n = b.max(1) as f64;
                total(&|r| r.first[k]).to_f64() / n
            } else {
                mean_trl(total(g))
            }
        };
        metrics.clip_ratio_low = trl(0, &|r| r.low);
        metrics.clip_ratio_high = trl(1, &|r| r.high);
        metrics.clip_ratio_region = trl(2, &|r| r.region);
        metrics.pg_clipfrac = mean_verl(total(&|r| r.frac));
        metrics.pg_clipfrac_lower = match cp.clip_ratio_c {
            Some(_) => mean_verl(total(&|r| r.lower)),
            None => 0.0,
        };
    }
    metrics.ppo_kl = mean_verl(total(&|r| r.ppo_kl));
    metrics.approx_kl = mean_trl(total(&|r| r.approx));
    metrics.avg_ratio = mean_trl(total(&|r| r.avg));
    metrics.clip_frac = mean_trl(total(&|r| r.clip));

    let mut kl_loss = None;
    if let Some(term) = &cfg.kl {
        metrics.kl = Some(mean_trl(total(&|r| r.k.trl)));
        if term.placement == KlPlacement::Separate {
            kl_loss = Some(aggregate(&rows, |r| r.k, cfg.agg, t));
        }
    }
    let pg_loss = aggregate(&rows, |r| r.pt, cfg.agg, t);
    let mut loss = pg_loss;
    if let (Some(kl_loss), Some(term)) = (kl_loss, &cfg.kl) {
        loss += kl_loss * f(term.coef) + zero;
    }
    let mut entropy_loss = None;
    if inp.entropy.is_some() {
        let el = aggregate(&rows, |r| r.e, cfg.entropy_agg, t);
        metrics.entropy = Some(mean_trl(total(&|r| r.e.trl)));
        if cfg.entropy_coeff != 0.0 {
            loss -= el * f(cfg.entropy_coeff) + zero;
        }
        entropy_loss = Some(el);
    }
    let dev = &Device::Cpu;
    let scalar = |v: T| Tensor::new(v, dev);
    let grad = if GRAD {
        Some(Tensor::from_vec(grad, (b, t), dev)?)
    } else {
        None
    };
    Ok(Some((
        LossOutput {
            loss: scalar(loss)?,
            pg_loss: scalar(pg_loss)?,
            kl_loss: kl_loss.map(scalar).transpose()?,
            entropy_loss: entropy_loss.map(scalar).transpose()?,
            ratio: Tensor::from_vec(ratio, (b, t), dev)?,
            per_token_loss: Tensor::from_vec(per_token, (b, t), dev)?,
            metrics,
        },
        grad,
    )))
}

#[cfg(test)]
mod tests {
    use super::super::aggregate::AggMode;
    use super::super::kl::KlEstimator;
    use super::super::loss::{
        compute_candle, compute_with_grad_candle, KlPlacement, KlTerm, LossConfig, LossInputs,
        LossOutput,
    };
    use super::super::policy_loss::ClipParams;
    use super::super::presets::{preset, PRESETS};
    use super::super::{to_f64, to_f64_vec, Precision};
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// Largest relative difference seen per quantity, for the bounds the asserts use.
    #[derive(Default)]
    struct Worst {
        scalar: f64,
        token: f64,
        grad: f64,
    }

    /// `a` and `b` agree: both NaN, equal (infinities included), or finite within `tol`
    /// relative to max(|a|, |b|, `scale`); zero only where the other is zero. Returns the
    /// relative difference.
    fn agree(what: &str, a: f64, b: f64, tol: f64, scale: f64) -> Result<f64, String> {
        if a.is_nan() || b.is_nan() {
            return if a.is_nan() && b.is_nan() {
                Ok(0.0)
            } else {
                Err(format!("{what}: fused {a:e} vs candle {b:e} (NaN pattern)"))
            };
        }
        if a == b {
            return Ok(0.0);
        }
        if a == 0.0 || b == 0.0 || !a.is_finite() || !b.is_finite() {
            return Err(format!(
                "{what}: fused {a:e} vs candle {b:e} (zero/inf pattern)"
            ));
        }
        let rel = (a - b).abs() / a.abs().max(b.abs()).max(scale);
        if rel > tol {
            return Err(format!("{what}: fused {a:e} vs candle {b:e} (rel {rel:e})"));
        }
        Ok(rel)
    }

    /// Scalars may differ by the order of whole-batch sums: relative to max(|a|, |b|, 1).
    fn agree_sum(what: &str, a: f64, b: f64, tol: f64) -> Result<f64, String> {
        if a.is_nan() || b.is_nan() || !a.is_finite() || !b.is_finite() {
            return agree(what, a, b, 0.0, 0.0);
        }
        let rel = (a - b).abs() / a.abs().max(b.abs()).max(1.0);
        if rel > tol {
            return Err(format!("{what}: fused {a:e} vs candle {b:e} (rel {rel:e})"));
        }
        Ok(rel)
    }

    fn vals(t: &Tensor) -> Result<Vec<f64>, String> {
        to_f64_vec(t).map_err(|e| e.to_string())
    }

    /// Forward outputs: per-token tensors element by element (`tok` relative), scalars and
    /// metrics within `sum` relative.
    fn same_forward(
        ctx: &str,
        f: &LossOutput,
        c: &LossOutput,
        tok: f64,
        sum: f64,
        w: &mut Worst,
    ) -> Result<(), String> {
        let s = |t: &Tensor| to_f64(t).unwrap_or(f64::NAN);
        let o = |x: &Option<Tensor>| x.as_ref().map(s);
        if o(&f.kl_loss).is_some() != o(&c.kl_loss).is_some()
            || o(&f.entropy_loss).is_some() != o(&c.entropy_loss).is_some()
            || f.metrics.kl.is_some() != c.metrics.kl.is_some()
            || f.metrics.entropy.is_some() != c.metrics.entropy.is_some()
        {
            return Err(format!("{ctx}: optional outputs differ"));
        }
        if f.loss.dtype() != c.loss.dtype() || f.ratio.dtype() != c.ratio.dtype() {
            return Err(format!("{ctx}: dtypes differ"));
        }
        let (m, n) = (&f.metrics, &c.metrics);
        for (name, a, b) in [
            ("loss", s(&f.loss), s(&c.loss)),
            ("pg_loss", s(&f.pg_loss), s(&c.pg_loss)),
            (
                "kl_loss",
                o(&f.kl_loss).unwrap_or(0.0),
                o(&c.kl_loss).unwrap_or(0.0),
            ),
            (
                "entropy_loss",
                o(&f.entropy_loss).unwrap_or(0.0),
                o(&c.entropy_loss).unwrap_or(0.0),
            ),
            ("clip_ratio_low", m.clip_ratio_low, n.clip_ratio_low),
            ("clip_ratio_high", m.clip_ratio_high, n.clip_ratio_high),
            (
                "clip_ratio_region",
                m.clip_ratio_region,
                n.clip_ratio_region,
            ),
            ("pg_clipfrac", m.pg_clipfrac, n.pg_clipfrac),
            (
                "pg_clipfrac_lower",
                m.pg_clipfrac_lower,
                n.pg_clipfrac_lower,
            ),
            ("ppo_kl", m.ppo_kl, n.ppo_kl),
            ("approx_kl", m.approx_kl, n.approx_kl),
            ("avg_ratio", m.avg_ratio, n.avg_ratio),
            ("clip_frac", m.clip_frac, n.clip_frac),
            ("kl", m.kl.unwrap_or(0.0), n.kl.unwrap_or(0.0)),
            (
                "entropy",
                m.entropy.unwrap_or(0.0),
                n.entropy.unwrap_or(0.0),
            ),
        ] {
            w.scalar = w
                .scalar
                .max(agree_sum(&format!("{ctx} {name}"), a, b, sum)?);
        }
        for (name, x, y) in [
            ("ratio", &f.ratio, &c.ratio),
            ("per_token", &f.per_token_loss, &c.per_token_loss),
        ] {
            if x.dims() != y.dims() {
                return Err(format!("{ctx} {name}: {:?} vs {:?}", x.dims(), y.dims()));
            }
            for (k, (a, b)) in vals(x)?.iter().zip(&vals(y)?).enumerate() {
                w.token = w
                    .token
                    .max(agree(&format!("{ctx} {name}[{k}]"), *a, *b, tok, 0.0)?);
            }
        }
        Ok(())
    }

    /// Gradients: same shape and dtype, same zero/NaN/inf pattern, finite values within
    /// `tol` relative (`scaled`: relative to the tensor's largest finite |value| at least,
    /// for f32, where a GSPO token's KL and sequence parts may cancel).
    fn same_grad(
        ctx: &str,
        f: &Tensor,
        c: &Tensor,
        tol: f64,
        scaled: bool,
        w: &mut Worst,
    ) -> Result<(), String> {
        if f.dims() != c.dims() || f.dtype() != c.dtype() {
            return Err(format!(
                "{ctx} grad: {:?} {:?} vs {:?} {:?}",
                f.dims(),
                f.dtype(),
                c.dims(),
                c.dtype()
            ));
        }
        let (fv, cv) = (vals(f)?, vals(c)?);
        let scale = if scaled {
            cv.iter()
                .filter(|x| x.is_finite())
                .fold(0.0f64, |m, x| m.max(x.abs()))
        } else {
            0.0
        };
        for (k, (a, b)) in fv.iter().zip(&cv).enumerate() {
            w.grad = w
                .grad
                .max(agree(&format!("{ctx} grad[{k}]"), *a, *b, tol, scale)?);
        }
        Ok(())
    }

    /// Deterministic pseudo-random values in [0, 1).
    fn lcg(seed: &mut u64) -> f64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A log-ratio `d`, exactly representable in the precision's dtype, whose `exp` in that
    /// dtype is exactly `target` cast to it: `logp = d`, `old = 0` puts a ratio exactly on a
    /// clip bound.
    fn exact_log(target: f64, p: Precision) -> Result<f64, String> {
        for k in 0..4096i64 {
            for s in [1i64, -1] {
                let hit = match p {
                    Precision::F64 => {
                        let d = f64::from_bits((target.ln().to_bits() as i64 + s * k) as u64);
                        (d.exp() == target).then_some(d)
                    }
                    Precision::F32 => {
                        let base = (target as f32).ln().to_bits() as i64;
                        let d = f32::from_bits((base + s * k) as u32);
                        (d.exp() == target as f32).then_some(d as f64)
                    }
                };
                if let Some(d) = hit {
                    return Ok(d);
                }
            }
        }
        Err(format!("no {p:?} log-ratio with exp = {target}"))
    }

    /// One input set, f64 values exactly representable in the case's precision.
    struct Case {
        name: &'static str,
        b: usize,
        t: usize,
        lp: Vec<f64>,
        old: Vec<f64>,
        /// `b` values (per row) or `b·t` (per token).
        adv: Vec<f64>,
        mask: Vec<f64>,
    }

    fn round_to(p: Precision, v: Vec<f64>) -> Vec<f64> {
        match p {
            Precision::F64 => v,
            Precision::F32 => v.into_iter().map(|x| x as f32 as f64).collect(),
        }
    }

    fn random_case(b: usize, t: usize, seed: &mut u64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut lp = Vec::new();
        let mut old = Vec::new();
        for _ in 0..b * t {
            let o = -3.0 * lcg(seed) - 1e-3;
            old.push(o);
            lp.push(o + 0.6 * (lcg(seed) - 0.5));
        }
        let adv: Vec<f64> = (0..b).map(|_| 2.0 * lcg(seed) - 1.0).collect();
        (lp, old, adv)
    }

    /// Random rows, exact clip/clamp boundaries for every preset's epsilons (both advantage
    /// signs), overflowing ratios, GSPO rows whose sequence ratio sits on a bound, NaN and
    /// ±inf inputs, empty rows, empty micro-batches.
    fn cases(p: Precision) -> Result<Vec<Case>, String> {
        let mut out = Vec::new();
        let mut seed = 7u64;
        let (b, t) = (6, 37);
        let (lp, old, adv) = random_case(b, t, &mut seed);
        let mut mask = vec![1.0; b * t];
        mask[2 * t..3 * t].iter_mut().for_each(|m| *m = 0.0);
        mask[4 * t + 10..5 * t].iter_mut().for_each(|m| *m = 0.0);
        let mut adv0 = adv.clone();
        adv0[5] = 0.0;
        out.push(Case {
            name: "random+empty-row",
            b,
            t,
            lp: lp.clone(),
            old: old.clone(),
            adv: adv0,
            mask: mask.clone(),
        });
        out.push(Case {
            name: "all-masked",
            b,
            t,
            lp: lp.clone(),
            old: old.clone(),
            adv: adv.clone(),
            mask: vec![0.0; b * t],
        });
        // Rows longer than a chunk (CHUNK = 256), not a multiple of the lane count.
        let (b, t) = (3, 601);
        let (mut lp_l, old_l, adv_l) = random_case(b, t, &mut seed);
        let mut mask_l = vec![1.0; b * t];
        mask_l[t + 300..2 * t].iter_mut().for_each(|m| *m = 0.0);
        mask_l[2 * t..2 * t + 17].iter_mut().for_each(|m| *m = 0.0);
        for j in [0, 255, 256, 257, 512, 600] {
            lp_l[j] = old_l[j] + exact_log(1.2, p)?;
        }
        out.push(Case {
            name: "long-rows",
            b,
            t,
            lp: lp_l,
            old: old_l,
            adv: adv_l,
            mask: mask_l,
        });

        // Exact bounds: 1 ± eps of trl/verl (0.2), dapo (0.28), gspo (3e-4/4e-4), mlx
        // (1e-4), dual clip c = 2.5 (exp never lands on 3.0 in f64, nor 3.5 in f32), delta 1.5; log-ratios exactly ±20 (verl clamp), 10
        // (GSPO-token clamp), overflow ±800, ±25.
        let mut bounds = Vec::new();
        for target in [
            1.0 - 0.2,
            1.0 + 0.2,
            1.0 + 0.28,
            1.0 - 3e-4,
            1.0 + 4e-4,
            1.0 - 1e-4,
            1.0 + 1e-4,
            2.5,
            1.5,
        ] {
            bounds.push(exact_log(target, p)?);
        }
        bounds.extend([0.0, 20.0, -20.0, 10.0, 800.0, -800.0, 25.0, -25.0, 19.5]);
        let (b, t) = (9, 24);
        let (mut lp, mut old, _) = random_case(b, t, &mut seed);
        let mut mask = vec![1.0; b * t];
        for i in 0..4 {
            for (j, d) in bounds.iter().enumerate() {
                lp[i * t + j] = *d;
                old[i * t + j] = 0.0;
            }
            mask[i * t + t - 3..(i + 1) * t]
                .iter_mut()
                .for_each(|m| *m = 0.0);
        }
        lp[t - 1] = f64::NEG_INFINITY;
        // Rows 4-7: every valid token at one GSPO bound (2 or 4 valid tokens, so that the
        // sequence mean is exactly that log-ratio); row 8 empty.
        for (i, (d, n)) in [
            (exact_log(1.0 + 4e-4, p)?, 2),
            (exact_log(1.0 - 3e-4, p)?, 4),
            (10.0, 4),
            (exact_log(1.0 + 0.2, p)?, 1),
        ]
        .into_iter()
        .enumerate()
        {
            let i = i + 4;
            mask[i * t..(i + 1) * t]
                .iter_mut()
                .enumerate()
                .for_each(|(j, m)| *m = if j < n { 1.0 } else { 0.0 });
            for j in 0..n {
                lp[i * t + j] = d;
                old[i * t + j] = 0.0;
            }
        }
        mask[8 * t..9 * t].iter_mut().for_each(|m| *m = 0.0);
        let adv_row = vec![0.7, -0.9, 1.0, -1.0, 0.5, -0.5, 0.3, 2.0, -0.2];
        let adv_tok: Vec<f64> = (0..b * t)
            .map(|k| match k % 3 {
                0 => -1.0,
                1 => 0.5,
                _ => 2.0,
            })
            .collect();
        out.push(Case {
            name: "boundaries",
            b,
            t,
            lp: lp.clone(),
            old: old.clone(),
            adv: adv_row.clone(),
            mask: mask.clone(),
        });
        out.push(Case {
            name: "boundaries+per-token-adv",
            b,
            t,
            lp: lp.clone(),
            old: old.clone(),
            adv: adv_tok,
            mask: mask.clone(),
        });

        // Non-finite inputs under the mask only (verl modes must not leak them) and at
        // valid tokens.
        let (b, t) = (5, 16);
        let (lp, old, adv) = random_case(b, t, &mut seed);
        let mut mask = vec![1.0; b * t];
        for i in 0..b {
            mask[i * t + 12..(i + 1) * t]
                .iter_mut()
                .for_each(|m| *m = 0.0);
        }
        let mut lp_m = lp.clone();
        let mut old_m = old.clone();
        lp_m[13] = f64::INFINITY;
        lp_m[t + 14] = f64::NAN;
        old_m[2 * t + 15] = f64::NEG_INFINITY;
        lp_m[3 * t + 12] = f64::NEG_INFINITY;
        out.push(Case {
            name: "nonfinite-masked",
            b,
            t,
            lp: lp_m,
            old: old_m,
            adv: adv.clone(),
            mask: mask.clone(),
        });
        let mut lp_v = lp.clone();
        let mut old_v = old.clone();
        lp_v[3] = f64::INFINITY;
        lp_v[t + 5] = f64::NAN;
        old_v[2 * t + 7] = f64::NEG_INFINITY;
        lp_v[3 * t + 1] = f64::NEG_INFINITY;
        let mut adv_v = adv.clone();
        adv_v[4] = f64::NAN;
        out.push(Case {
            name: "nonfinite-valid",
            b,
            t,
            lp: lp_v,
            old: old_v,
            adv: adv_v,
            mask,
        });
        out.push(Case {
            name: "t=0",
            b: 3,
            t: 0,
            lp: vec![],
            old: vec![],
            adv: vec![0.5, -0.5, 1.0],
            mask: vec![],
        });
        out.push(Case {
            name: "b=0",
            b: 0,
            t: 5,
            lp: vec![],
            old: vec![],
            adv: vec![],
            mask: vec![],
        });
        Ok(out
            .into_iter()
            .map(|c| Case {
                lp: round_to(p, c.lp),
                old: round_to(p, c.old),
                adv: round_to(p, c.adv),
                ..c
            })
            .collect())
    }

    const ESTIMATORS: [KlEstimator; 7] = [
        KlEstimator::K1,
        KlEstimator::Abs,
        KlEstimator::K2,
        KlEstimator::K3,
        KlEstimator::K3Verl,
        KlEstimator::K3VerlStraightThrough,
        KlEstimator::MlxRatio,
    ];

    /// Every preset, and around it each aggregation mode, ratio level (with and without a
    /// log-ratio clamp), dual clip, TRL delta; with `extras`, every KL estimator in both
    /// placements with an entropy bonus.
    fn configs(p: Precision, extras: bool) -> Result<Vec<LossConfig>, String> {
        let mut out = Vec::new();
        for name in PRESETS {
            let mut cfg = preset(name).map_err(|e| e.to_string())?;
            cfg.precision = p;
            out.push(cfg.clone());
            if extras {
                for (n, est) in ESTIMATORS.into_iter().enumerate() {
                    for placement in [KlPlacement::PerToken, KlPlacement::Separate] {
                        let mut c = cfg.clone();
                        c.entropy_coeff = 0.01;
                        if n % 2 == 1 {
                            c.entropy_agg = cfg.agg;
                        }
                        c.kl = Some(KlTerm {
                            estimator: est,
                            coef: 0.1,
                            placement,
                        });
                        out.push(c);
                    }
                }
                continue;
            }
            for agg in [
                AggMode::TokenMean,
                AggMode::SeqMeanTokenMean,
                AggMode::SeqMeanTokenSum,
                AggMode::SeqMeanTokenSumNorm { horizon: None },
                AggMode::SeqMeanTokenSumNorm {
                    horizon: Some(16.0),
                },
                AggMode::TrlGrpo,
                AggMode::TrlBnpo,
                AggMode::TrlDrGrpo {
                    max_completion_length: None,
                },
                AggMode::TrlDrGrpo {
                    max_completion_length: Some(30.0),
                },
                AggMode::TrlDapo {
                    num_items_in_batch: None,
                },
                AggMode::TrlDapo {
                    num_items_in_batch: Some(7.0),
                },
            ] {
                if agg != cfg.agg {
                    out.push(LossConfig { agg, ..cfg.clone() });
                }
            }
            for level in [
                RatioLevel::Token,
                RatioLevel::Sequence,
                RatioLevel::GspoToken,
            ] {
                for clamp in [None, Some((-20.0, 10.0)), Some((f64::NEG_INFINITY, 10.0))] {
                    if (level, clamp) != (cfg.ratio_level, cfg.log_ratio_clamp) {
                        out.push(LossConfig {
                            ratio_level: level,
                            log_ratio_clamp: clamp,
                            ..cfg.clone()
                        });
                    }
                }
            }
            if let PolicyKind::Clip(cp) = cfg.policy {
                for (delta, c) in [(None, Some(2.5)), (Some(1.5), None), (Some(1.5), Some(2.5))] {
                    out.push(LossConfig {
                        policy: PolicyKind::Clip(ClipParams {
                            delta,
                            clip_ratio_c: c,
                            ..cp
                        }),
                        ..cfg.clone()
                    });
                }
            }
        }
        Ok(out)
    }

    /// Runs the whole grid in precision `p`: fused forward vs [`compute_candle`], fused
    /// gradient vs candle autograd ([`compute_with_grad_candle`]).
    fn grid(
        p: Precision,
        tok: f64,
        sum: f64,
        grad: f64,
    ) -> Result<Worst, Box<dyn std::error::Error>> {
        let dev = &Device::Cpu;
        let dt = p.dtype();
        let mut worst = Worst::default();
        let mut runs = 0;
        for case in cases(p)? {
            let (b, t) = (case.b, case.t);
            let ent: Vec<f64> = (0..b * t).map(|k| (k % 11) as f64 * 0.3).collect();
            let refp: Vec<f64> = round_to(
                p,
                case.lp
                    .iter()
                    .enumerate()
                    .map(|(k, v)| match k % 5 {
                        4 => v - 21.0,
                        3 => v + 20.0,
                        _ => v - 0.05 * (k % 7) as f64,
                    })
                    .collect(),
            );
            let mk = |v: &[f64]| Tensor::from_vec(v.to_vec(), (b, t), dev)?.to_dtype(dt);
            let adv_t = if case.adv.len() == b * t && t != 1 && b * t != b {
                mk(&case.adv)?
            } else {
                Tensor::from_vec(case.adv.clone(), b, dev)?.to_dtype(dt)?
            };
            for with_old in [true, false] {
                for extras in [false, true] {
                    let inp = LossInputs {
                        log_probs: mk(&case.lp)?,
                        old_log_probs: with_old.then(|| mk(&case.old)).transpose()?,
                        ref_log_probs: extras.then(|| mk(&refp)).transpose()?,
                        advantages: adv_t.clone(),
                        mask: mk(&case.mask)?,
                        entropy: extras.then(|| mk(&ent)).transpose()?,
                    };
                    for cfg in configs(p, extras)? {
                        let ctx = format!(
                            "{} {} {:?} {:?} {:?} kl={:?} old={with_old}",
                            case.name, cfg.preset, cfg.ratio_level, cfg.agg, cfg.policy, cfg.kl
                        );
                        let fwd = compute_fused(&inp, &cfg)?.ok_or("the fused path declined")?;
                        let (fo, fg) = compute_fused_with_grad(&inp, &cfg)?
                            .ok_or("the fused path declined")?;
                        let (co, cg) = compute_with_grad_candle(&inp, &cfg)?;
                        same_forward(&ctx, &fwd, &co, tok, sum, &mut worst)?;
                        same_forward(&ctx, &fo, &co, tok, sum, &mut worst)?;
                        same_grad(&ctx, &fg, &cg, grad, p == Precision::F32, &mut worst)?;
                        runs += 1;
                    }
                }
            }
        }
        assert!(runs > 1000, "only {runs} runs");
        Ok(worst)
    }

    /// f64: per-token values bit-identical, sums and every gradient entry within 1e-12
    /// relative of candle (observed: sums ~1e-16, gradients bit-identical).
    #[test]
    fn fused_forward_and_gradient_match_candle_autograd_f64() -> TestResult {
        let w = grid(Precision::F64, 0.0, 1e-12, 1e-12)?;
        eprintln!("f64 worst: sums {:e}, gradient {:e}", w.scalar, w.grad);
        assert!(w.scalar <= 1e-12 && w.token == 0.0 && w.grad <= 1e-12);
        Ok(())
    }

    /// f32: per-token values bit-identical; whole-batch sums within 1e-5 of max(|x|, 1)
    /// (blocked partial sums vs candle's vectorized ones; observed 3e-6); gradients within
    /// 1e-5 of max(|x|, largest |gradient|) (observed ~1e-6: only GSPO's row sum of up to
    /// 601 terms is ordered differently, everything else is bit-identical).
    #[test]
    fn fused_forward_and_gradient_match_candle_autograd_f32() -> TestResult {
        let w = grid(Precision::F32, 0.0, 1e-5, 1e-5)?;
        eprintln!("f32 worst: sums {:e}, gradient {:e}", w.scalar, w.grad);
        assert!(w.token == 0.0);
        Ok(())
    }

    /// The tie and boundary convention, pinned by value in both implementations (torch
    /// 2.x gives the same: `torch.clamp` passes no gradient at a bound, `torch.min`/`max`
    /// split a tie 0.5/0.5). One row, verl-vanilla with dual clip c = 2.5, token mean over 7
    /// valid tokens (w = 1/7):
    /// a ratio exactly at `1 ± eps` is a tie of the clipped and unclipped terms whose
    /// clipped branch is at its bound, so it gets half the unclipped gradient `−A·r·w`;
    /// inside the bounds both branches pass (0.5 + 0.5); a ratio exactly at the dual-clip
    /// `c` ties `−A·c` (constant) with the unclipped term: half again.
    #[test]
    fn ratios_exactly_on_a_clip_bound_get_half_the_gradient() -> TestResult {
        for p in [Precision::F64, Precision::F32] {
            let dev = &Device::Cpu;
            let e = 0.5f64.exp();
            // (log-ratio, advantage, mask, expected gradient / w).
            let toks = [
                (exact_log(1.2, p)?, 1.0, 1.0, -0.5 * 1.2),
                (exact_log(0.8, p)?, -1.0, 1.0, 0.5 * 0.8),
                (0.0, 1.0, 1.0, -1.0),
                (exact_log(1.2, p)?, -1.0, 1.0, 0.5 * 1.2),
                (0.5, 1.0, 1.0, 0.0),
                (0.5, -1.0, 1.0, e),
                (exact_log(2.5, p)?, -1.0, 1.0, 0.5 * 2.5),
                (1.5, -1.0, 0.0, 0.0),
            ];
            let t = toks.len();
            let mk = |k: usize| {
                let v: Vec<f64> = toks.iter().map(|x| [x.0, x.1, x.2][k]).collect::<Vec<_>>();
                Tensor::from_vec(v, (1, t), dev)?.to_dtype(p.dtype())
            };
            let inp = LossInputs {
                log_probs: mk(0)?,
                old_log_probs: Some(Tensor::zeros((1, t), p.dtype(), dev)?),
                ref_log_probs: None,
                advantages: mk(1)?,
                mask: mk(2)?,
                entropy: None,
            };
            let mut cfg = preset("verl-vanilla")?;
            cfg.precision = p;
            cfg.policy = PolicyKind::Clip(ClipParams {
                eps_low: 0.2,
                eps_high: 0.2,
                delta: None,
                clip_ratio_c: Some(2.5),
            });
            let w = 1.0 / 7.0;
            for (name, g) in [
                (
                    "fused",
                    compute_fused_with_grad(&inp, &cfg)?.ok_or("declined")?.1,
                ),
                ("candle", compute_with_grad_candle(&inp, &cfg)?.1),
            ] {
                let g = to_f64_vec(&g)?;
                for (j, (x, want)) in g.iter().zip(toks.iter().map(|x| x.3 * w)).enumerate() {
                    let tol = if p == Precision::F64 { 1e-15 } else { 1e-6 };
                    let ok = if want == 0.0 {
                        *x == 0.0
                    } else {
                        ((x - want) / want).abs() <= tol
                    };
                    assert!(ok, "{p:?} {name} token {j}: {x:e}, want {want:e}");
                }
            }
        }
        Ok(())
    }

    /// verl's log-ratio clamp ±20 and GSPO-token's cap 10: a log-ratio exactly at the
    /// bound gets no gradient, one just inside does.
    #[test]
    fn log_ratio_exactly_on_its_clamp_gets_no_gradient() -> TestResult {
        let dev = &Device::Cpu;
        let lp = Tensor::new(&[[20.0f64, -20.0, 19.5, -19.5]], dev)?;
        let inp = LossInputs {
            log_probs: lp.clone(),
            old_log_probs: Some(lp.zeros_like()?),
            ref_log_probs: None,
            advantages: Tensor::new(&[1.0f64], dev)?,
            mask: lp.ones_like()?,
            entropy: None,
        };
        let mut cfg = preset("nexrl-is")?;
        cfg.log_ratio_clamp = Some((-20.0, 20.0));
        let g = to_f64_vec(&compute_fused_with_grad(&inp, &cfg)?.ok_or("declined")?.1)?;
        let want = [0.0, 0.0, -19.5f64.exp() / 4.0, -(-19.5f64).exp() / 4.0];
        assert_eq!(g[..2], want[..2]);
        for k in 2..4 {
            assert!(((g[k] - want[k]) / want[k]).abs() < 1e-15, "{g:?}");
        }
        // GSPO-token: row 0's sequence log-ratio is exactly 10 (the cap), row 1's 9.5.
        let lp = Tensor::new(&[[10.0f64, 10.0], [9.5, 9.5]], dev)?;
        let inp = LossInputs {
            log_probs: lp.clone(),
            old_log_probs: Some(lp.zeros_like()?),
            mask: lp.ones_like()?,
            advantages: Tensor::new(&[1.0f64, 1.0], dev)?,
            ..inp
        };
        cfg.ratio_level = RatioLevel::GspoToken;
        cfg.log_ratio_clamp = Some((f64::NEG_INFINITY, 10.0));
        let (_, g) = compute_fused_with_grad(&inp, &cfg)?.ok_or("declined")?;
        let (_, c) = compute_with_grad_candle(&inp, &cfg)?;
        let (g, c) = (to_f64_vec(&g)?, to_f64_vec(&c)?);
        assert_eq!(g, c);
        assert_eq!(g[..2], [0.0, 0.0]);
        assert!(g[2] < 0.0 && g[3] < 0.0);
        Ok(())
    }

    /// The row kernel compiled for AVX2 (what runs on this machine when it has AVX2) and
    /// for the x86-64 baseline give the same bits: loss, metrics, ratio, per-token loss and
    /// gradient, for every preset and KL estimator on the boundary and long-row cases.
    #[test]
    fn avx2_and_baseline_builds_give_identical_bits() -> TestResult {
        use std::sync::atomic::Ordering;
        let dev = &Device::Cpu;
        let bits = |o: &LossOutput, g: &Tensor| -> Result<Vec<u64>, String> {
            let mut v: Vec<u64> = [&o.loss, &o.pg_loss, &o.ratio, &o.per_token_loss, g]
                .iter()
                .map(|t| vals(t))
                .collect::<Result<Vec<_>, _>>()?
                .concat()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            let m = &o.metrics;
            v.extend(
                [
                    m.clip_ratio_low,
                    m.pg_clipfrac,
                    m.ppo_kl,
                    m.approx_kl,
                    m.avg_ratio,
                ]
                .map(f64::to_bits),
            );
            Ok(v)
        };
        let mut runs = 0;
        for p in [Precision::F64, Precision::F32] {
            for case in cases(p)?
                .into_iter()
                .filter(|c| c.name.starts_with("boundaries") || c.name == "long-rows")
            {
                let (b, t) = (case.b, case.t);
                let mk = |v: &[f64]| Tensor::from_vec(v.to_vec(), (b, t), dev)?.to_dtype(p.dtype());
                let adv = if case.adv.len() == b * t {
                    mk(&case.adv)?
                } else {
                    Tensor::from_vec(case.adv.clone(), b, dev)?.to_dtype(p.dtype())?
                };
                let inp = LossInputs {
                    log_probs: mk(&case.lp)?,
                    old_log_probs: Some(mk(&case.old)?),
                    ref_log_probs: Some(mk(&case.old)?),
                    advantages: adv,
                    mask: mk(&case.mask)?,
                    entropy: Some(mk(&case.mask)?),
                };
                for cfg in configs(p, true)? {
                    BASELINE_ONLY.store(false, Ordering::Relaxed);
                    let (o1, g1) = compute_fused_with_grad(&inp, &cfg)?.ok_or("declined")?;
                    BASELINE_ONLY.store(true, Ordering::Relaxed);
                    let (o2, g2) = compute_fused_with_grad(&inp, &cfg)?.ok_or("declined")?;
                    BASELINE_ONLY.store(false, Ordering::Relaxed);
                    assert!(
                        bits(&o1, &g1)? == bits(&o2, &g2)?,
                        "{} {}",
                        case.name,
                        cfg.preset
                    );
                    runs += 1;
                }
            }
        }
        assert!(runs > 100);
        Ok(())
    }

    #[test]
    fn fused_declines_what_candle_refuses() -> TestResult {
        let dev = &Device::Cpu;
        let x = Tensor::zeros((2, 3), DType::F64, dev)?;
        let inp = LossInputs {
            log_probs: x.clone(),
            old_log_probs: Some(Tensor::zeros((2, 4), DType::F64, dev)?),
            ref_log_probs: None,
            advantages: Tensor::zeros(2, DType::F64, dev)?,
            mask: x,
            entropy: None,
        };
        let cfg = preset("trl-grpo")?;
        assert!(compute_fused(&inp, &cfg)?.is_none());
        assert!(compute_fused_with_grad(&inp, &cfg)?.is_none());
        assert!(super::super::loss::compute(&inp, &cfg).is_err());
        assert!(super::super::loss::compute_with_grad(&inp, &cfg).is_err());
        Ok(())
    }

    /// Inputs already in the compute dtype and contiguous are read in place; others
    /// (another dtype, a strided view) are converted first, with the same results.
    #[test]
    fn strided_and_other_dtype_inputs_give_the_same_results() -> TestResult {
        let dev = &Device::Cpu;
        let (b, t) = (4, 9);
        let mut seed = 3u64;
        let (lp, old, adv) = random_case(b, t, &mut seed);
        let mk = |v: &[f64]| Tensor::from_vec(v.to_vec(), (b, t), dev);
        let mask = Tensor::ones((b, t), DType::U8, dev)?;
        let base = LossInputs {
            log_probs: mk(&lp)?,
            old_log_probs: Some(mk(&old)?),
            ref_log_probs: None,
            advantages: Tensor::from_vec(adv, b, dev)?,
            mask: mask.to_dtype(DType::F64)?,
            entropy: None,
        };
        let strided = LossInputs {
            log_probs: mk(&lp)?.t()?.contiguous()?.t()?,
            old_log_probs: Some(mk(&old)?.to_dtype(DType::F32)?.to_dtype(DType::F64)?),
            mask,
            ..base.clone()
        };
        assert!(!strided.log_probs.is_contiguous());
        let cfg = preset("verl-vanilla")?;
        let (a, ga) = compute_fused_with_grad(&base, &cfg)?.ok_or("declined")?;
        let (s, gs) = compute_fused_with_grad(&strided, &cfg)?.ok_or("declined")?;
        let (_, gc) = compute_with_grad_candle(&strided, &cfg)?;
        let (x, y) = (
            to_f64(&a.loss)?,
            to_f64(&compute_candle(&base, &cfg)?.loss)?,
        );
        assert!((x - y).abs() <= 1e-12 * y.abs(), "{x} vs {y}");
        assert_eq!(to_f64_vec(&gs)?, to_f64_vec(&gc)?);
        // old rounded through f32 changes the values: the strided run is not the base run.
        assert_ne!(to_f64(&a.loss)?, to_f64(&s.loss)?);
        assert_eq!(ga.dims(), gs.dims());
        Ok(())
    }
}

//! Order-free folds over a run of aligned pairs, in lanes so that they vectorise (AVX2
//! where the CPU has it, with the same results): the fast path of
//! [`super::Accumulator::push_run`].

use super::ulp::ulp_distance;
use crate::tensor::DType;

/// What [`fold_finite`] gathers from a run: maxima and a count, all order-free.
#[derive(Debug, Clone, Copy)]
pub(super) struct Folded {
    pub(super) max_abs: f64,
    pub(super) max_excess: f64,
    pub(super) max_rel: f64,
    pub(super) beyond: u64,
    pub(super) max_ulp: u64,
}

impl Folded {
    /// Both runs' maxima and counts (every value is non-negative, none NaN: exact in any order).
    pub(super) fn merge(self, o: Folded) -> Folded {
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
/// [`super::Accumulator::push_allowing`] (ULP distances on `ulp`'s grid, 0 without one); uses
/// AVX2 where the CPU has it (same results: IEEE operations, and maxima of non-negative,
/// non-NaN values do not depend on the order).
pub(super) fn fold_finite(
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
pub(super) unsafe fn fold_finite_avx2(
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
pub(super) fn fold_finite_dispatch(
    a: &[f64],
    b: &[f64],
    e: &[f64],
    atol: f64,
    rtol: f64,
    ulp: Option<DType>,
) -> Folded {
    // On the f32, bf16 and f16 grids the distance of two finite values is below 2^32: kept
    // in u32 lanes (AVX2 has their maxima, not u64's), it lets the whole loop vectorise.
    let ord16 = |bits: u16| -> i32 {
        let mag = (bits & 0x7fff) as i32;
        if bits >> 15 != 0 {
            -mag
        } else {
            mag
        }
    };
    match ulp {
        None => fold_finite_body(a, b, e, atol, rtol, |_, _| 0u32),
        // ulp_distance on the f32 grid: the ordered values lie in ±(2^31 − 1), so their
        // distance, the larger minus the smaller, is exact as a wrapping u32 difference.
        Some(DType::F32) => fold_finite_body(a, b, e, atol, rtol, |x, y| {
            let ord = |v: f64| -> i32 {
                let bits = (v as f32).to_bits();
                let mag = (bits & 0x7fff_ffff) as i32;
                if bits >> 31 != 0 {
                    -mag
                } else {
                    mag
                }
            };
            let (p, q) = (ord(x), ord(y));
            p.max(q).wrapping_sub(p.min(q)) as u32
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
pub(super) const LANES: usize = 4;

/// `U`: the integer the ULP distances are kept in (u32 where they fit: see
/// [`fold_finite_dispatch`]).
#[inline(always)]
pub(super) fn fold_finite_body<U: Copy + Ord + Default + Into<u64>>(
    a: &[f64],
    b: &[f64],
    e: &[f64],
    atol: f64,
    rtol: f64,
    ulp: impl Fn(f64, f64) -> U,
) -> Folded {
    let n = a.len().min(b.len()).min(e.len());
    let (a, b, e) = (&a[..n], &b[..n], &e[..n]);
    let mut m_abs = [f64::NEG_INFINITY; LANES];
    let mut m_exc = [0.0f64; LANES];
    let mut m_rel = [0.0f64; LANES];
    let mut beyond = [0u64; LANES];
    let mut m_ulp = [U::default(); LANES];
    // Maxima of values never NaN nor −0 (finite inputs; NaN excesses replaced below): a
    // plain comparison is `f64::max` here, and a single vector instruction.
    let max = |m: f64, v: f64| if v > m { v } else { m };
    // An element's |a − b| and its allowed difference.
    let diff = |x: f64, y: f64, extra: f64| ((x - y).abs(), atol + rtol * x.abs() + extra);
    // What every element adds besides its excess and relative difference.
    let rest = |l: usize,
                (x, y, d, allowed): (f64, f64, f64, f64),
                m_abs: &mut [f64; LANES],
                beyond: &mut [u64; LANES],
                m_ulp: &mut [U; LANES]| {
        m_abs[l] = max(m_abs[l], d);
        // Beyond: not within `allowed` (a NaN allowance admits nothing; d is never NaN).
        // Non-short-circuit `&`, `|`: no branch in the loop.
        beyond[l] += ((x != y) & ((d > allowed) | allowed.is_nan())) as u64;
        m_ulp[l] = m_ulp[l].max(ulp(x, y));
    };
    // The excess and relative difference of one element.
    let quotients = |x: f64, d: f64, allowed: f64| {
        let q = d / allowed;
        let exc = if allowed > 0.0 { q } else { f64::INFINITY };
        let exc = if d == 0.0 { 0.0 } else { exc };
        // A NaN excess (∞/∞) counts as infinite, as in `push_allowing`.
        let exc = if exc.is_nan() { f64::INFINITY } else { exc };
        let r = d / x.abs();
        let rel = if x != 0.0 { r } else { 0.0 };
        (exc, rel)
    };
    let whole = n - n % LANES;
    let blocks = a[..whole]
        .chunks_exact(LANES)
        .zip(b[..whole].chunks_exact(LANES))
        .zip(e[..whole].chunks_exact(LANES));
    for ((xa, xb), xe) in blocks {
        let mut el = [(0.0, 0.0, 0.0, 0.0); LANES];
        for l in 0..LANES {
            let (d, allowed) = diff(xa[l], xb[l], xe[l]);
            el[l] = (xa[l], xb[l], d, allowed);
        }
        // When no lane's quotients can exceed its maxima (see `below`), the block skips
        // both divisions: the maxima stay as they are.
        let mut skip = true;
        for (l, &(x, _, d, allowed)) in el.iter().enumerate() {
            let exc_stays = (d == 0.0) | ((allowed > 0.0) & below(d, m_exc[l], allowed));
            let rel_stays = (d == 0.0) | (x == 0.0) | below(d, m_rel[l], x.abs());
            skip &= exc_stays & rel_stays;
        }
        if !skip {
            for (l, &(x, _, d, allowed)) in el.iter().enumerate() {
                let (exc, rel) = quotients(x, d, allowed);
                m_exc[l] = max(m_exc[l], exc);
                m_rel[l] = max(m_rel[l], rel);
            }
        }
        for (l, &v) in el.iter().enumerate() {
            rest(l, v, &mut m_abs, &mut beyond, &mut m_ulp);
        }
    }
    for i in whole..n {
        let (x, y) = (a[i], b[i]);
        let (d, allowed) = diff(x, y, e[i]);
        let (exc, rel) = quotients(x, d, allowed);
        m_exc[0] = max(m_exc[0], exc);
        m_rel[0] = max(m_rel[0], rel);
        rest(0, (x, y, d, allowed), &mut m_abs, &mut beyond, &mut m_ulp);
    }
    let max = |m: [f64; LANES]| m.into_iter().fold(f64::NEG_INFINITY, f64::max);
    Folded {
        max_abs: max(m_abs),
        max_excess: max(m_exc),
        max_rel: max(m_rel),
        beyond: beyond.into_iter().sum(),
        max_ulp: m_ulp.into_iter().map(Into::into).fold(0, u64::max),
    }
}

/// True only when `d / den` (finite `d ≥ 0`, `den > 0`) rounds to at most `m`, a maximum
/// of such quotients (≥ 0, never NaN), so that `max(m, d / den)` is `m`: when `d` is at
/// most `m·den` computed and shrunk by 2^−50. Each product is off by at most 2^−53 of
/// itself, so then `d < m·den` exactly, `d / den < m`, and its rounding is at most `m`.
/// A product below the normal range (relative error unbounded) or NaN (0·∞) says false;
/// one that overflows is above any finite `d`, so true holds there.
#[inline(always)]
fn below(d: f64, m: f64, den: f64) -> bool {
    let t = m * den * (1.0 - 1.0 / (1u64 << 50) as f64);
    (t >= f64::MIN_POSITIVE) & (d <= t)
}

/// Whether every value of both runs is finite, and whether the runs are equal bit for bit
/// (one branch-free pass that vectorises; AVX2 where the CPU has it).
pub(super) fn finite_and_identical(a: &[f64], b: &[f64]) -> (bool, bool) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked on the line above.
        return unsafe { finite_and_identical_avx2(a, b) };
    }
    finite_and_identical_body(a, b)
}

/// [`finite_and_identical_body`] compiled for AVX2 (integer tests only: same answer).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn finite_and_identical_avx2(a: &[f64], b: &[f64]) -> (bool, bool) {
    finite_and_identical_body(a, b)
}

#[inline(always)]
fn finite_and_identical_body(a: &[f64], b: &[f64]) -> (bool, bool) {
    const EXP: u64 = 0x7ff0_0000_0000_0000;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    // Integer or-reductions: the compiler vectorises them without lanes of our own.
    let (mut bad, mut diff) = (0u64, 0u64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x.to_bits(), y.to_bits());
        bad |= ((x & EXP == EXP) | (y & EXP == EXP)) as u64;
        diff |= x ^ y;
    }
    (bad == 0, diff == 0)
}

/// Whether every value is finite (one branch-free pass): the first half of
/// [`finite_and_identical`] of a run with itself.
pub(super) fn all_finite(a: &[f64]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked on the line above.
        return unsafe { all_finite_avx2(a) };
    }
    all_finite_body(a)
}

/// [`all_finite_body`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn all_finite_avx2(a: &[f64]) -> bool {
    all_finite_body(a)
}

#[inline(always)]
fn all_finite_body(a: &[f64]) -> bool {
    const EXP: u64 = 0x7ff0_0000_0000_0000;
    let mut bad = 0u64;
    for &x in a {
        bad |= (x.to_bits() & EXP == EXP) as u64;
    }
    bad == 0
}

/// How many values are exactly 1, and whether all are 0 or 1 (−0 counts as 0), in one pass.
pub(super) fn count_ones(a: &[f64]) -> (u64, bool) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2, checked on the line above.
        return unsafe { count_ones_avx2(a) };
    }
    count_ones_body(a)
}

/// [`count_ones_body`] compiled for AVX2 (comparisons and counts: same answer).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn count_ones_avx2(a: &[f64]) -> (u64, bool) {
    count_ones_body(a)
}

#[inline(always)]
fn count_ones_body(a: &[f64]) -> (u64, bool) {
    let (mut ones, mut other) = (0u64, 0u64);
    for &x in a {
        ones += (x == 1.0) as u64;
        other |= !((x == 0.0) | (x == 1.0)) as u64;
    }
    (ones, other == 0)
}

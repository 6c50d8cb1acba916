//! The AVX2+FMA kernels: glibc 2.36's `_fma` variants of `exp`, `log` (ARM
//! optimized-routines) and `expm1`, `log1p` (Sun fdlibm), four lanes at a time. Each
//! kernel repeats, on its common path, the operations of the function's disassembly on
//! this machine in the same order: a fused multiply-add wherever GCC contracted one
//! (`vfmadd…sd`), a separate multiply and add where it did not, the same constants. A lane
//! off the vectorised paths (huge, NaN, infinite, negative `ln`, …) is recomputed with the
//! scalar std function, which is glibc itself.
//!
//! Callers must check [`super::VecMath::simd`] for the function first: these kernels are
//! correct only where the probe in [`super::VecMath::get`] found them equal to glibc.

use std::arch::x86_64::*;

use super::tables::{EXP_TAB, LOG_TAB};

/// `f64` constant from its bits (the constants below are glibc's, read with gdb).
const fn c(bits: u64) -> f64 {
    f64::from_bits(bits)
}

// exp (`e_exp.c`, `e_exp_data.c`: N = 128, `__exp_data` fields).
/// `InvLn2N` = N/ln2.
const EXP_INV_LN2_N: f64 = c(0x4067_1547_652b_82fe);
/// `NegLn2hiN`, `NegLn2loN`: −ln2/N in two parts.
const EXP_NEG_LN2_HI_N: f64 = c(0xbf76_2e42_fefa_0000);
const EXP_NEG_LN2_LO_N: f64 = c(0xbd0c_f79a_bc9e_3b3a);
/// `Shift` = 0x1.8p52: rounds `x·N/ln2` to an integer in the low mantissa bits.
const EXP_SHIFT: f64 = c(0x4338_0000_0000_0000);
/// `poly[0..4]` = C2..C5.
const EXP_C2: f64 = c(0x3fdf_ffff_ffff_fdbd);
const EXP_C3: f64 = c(0x3fc5_5555_5555_543c);
const EXP_C4: f64 = c(0x3fa5_5555_cf17_2b91);
const EXP_C5: f64 = c(0x3f81_1111_67a4_d017);

// log (`e_log.c`, `e_log_data.c`: N = 128, `__log_data` fields).
/// `ln2hi`, `ln2lo`.
const LOG_LN2_HI: f64 = c(0x3fe6_2e42_fefa_3800);
const LOG_LN2_LO: f64 = c(0x3d2e_f357_93c7_6730);
/// `poly[0..5]` = A0..A4 (the table path).
const LOG_A: [f64; 5] = [
    c(0xbfe0_0000_0000_0001),
    c(0x3fd5_5555_5551_305b),
    c(0xbfcf_ffff_ffeb_4590),
    c(0x3fc9_99b3_24f1_0111),
    c(0xbfc5_5575_e506_c89f),
];
/// `poly1[0..11]` = B0..B10 (the path close to 1; B0 = −0.5).
const LOG_B: [f64; 11] = [
    c(0xbfe0_0000_0000_0000),
    c(0x3fd5_5555_5555_5577),
    c(0xbfcf_ffff_ffff_fdcb),
    c(0x3fc9_9999_9995_dd0c),
    c(0xbfc5_5555_5567_45a7),
    c(0x3fc2_4924_a344_de30),
    c(0xbfbf_ffff_a442_3d65),
    c(0x3fbc_7184_282a_d6ca),
    c(0xbfb9_99eb_43b0_68ff),
    c(0x3fb7_8182_f7af_d085),
    c(0xbfb5_5213_75d1_45cd),
];
/// `OFF`: the bits of 0x1.6p-1, where the table's subintervals start.
const LOG_OFF: i64 = 0x3fe6_0000_0000_0000;
/// The window `LO <= ix < HI` of the path close to 1: 1 − 0x1p-4 and 1 + 0x1.09p-4.
const LOG_LO: i64 = 0x3fee_0000_0000_0000;
const LOG_HI: i64 = 0x3ff1_0900_0000_0000;

// expm1 (`s_expm1.c`): Q1..Q5.
const EXPM1_Q: [f64; 5] = [
    c(0xbfa1_1111_1111_10f4),
    c(0x3f5a_01a0_19fe_5585),
    c(0xbf14_ce19_9eaa_dbb7),
    c(0x3ed0_cfca_86e6_5239),
    c(0xbe8a_fdb7_6e09_c32d),
];

// log1p (`s_log1p.c`): Lp1..Lp7.
const LOG1P_LP: [f64; 7] = [
    c(0x3fe5_5555_5555_5593),
    c(0x3fd9_9999_9997_fa04),
    c(0x3fd2_4924_9422_9359),
    c(0x3fcc_71c5_1d8e_78af),
    c(0x3fc7_4664_96cb_03de),
    c(0x3fc3_9a09_d078_c69f),
    c(0x3fc2_f112_df3e_5244),
];

/// Four copies of `v`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn splat(v: f64) -> __m256d {
    _mm256_set1_pd(v)
}

/// Four copies of `v`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn splat_i(v: i64) -> __m256i {
    _mm256_set1_epi64x(v)
}

/// All-ones in the lanes where `a > b` as signed 64-bit integers.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn gt(a: __m256i, b: i64) -> __m256i {
    _mm256_cmpgt_epi64(a, splat_i(b))
}

/// All-ones in the lanes where `a < b` as signed 64-bit integers.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn lt(a: __m256i, b: i64) -> __m256i {
    _mm256_cmpgt_epi64(splat_i(b), a)
}

/// `mask ? b : a`, lane by lane (`mask` all-ones or all-zeros per lane).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn select(mask: __m256i, b: __m256d, a: __m256d) -> __m256d {
    _mm256_blendv_pd(a, b, _mm256_castsi256_pd(mask))
}

/// The bits of `x` with the sign cleared (`|x|`'s bits, a non-negative i64).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn abs_bits(x: __m256d) -> __m256i {
    _mm256_and_si256(_mm256_castpd_si256(x), splat_i(0x7fff_ffff_ffff_ffff))
}

/// `y`, with the lanes set in `other` replaced by `f` of that lane of `x`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn patch(x: __m256d, y: __m256d, other: __m256i, f: fn(f64) -> f64) -> __m256d {
    let m = _mm256_movemask_pd(_mm256_castsi256_pd(other));
    if m == 0 {
        return y;
    }
    let (mut xa, mut ya) = ([0.0; 4], [0.0; 4]);
    // SAFETY: each array holds 4 f64, the width of one unaligned 256-bit store or load.
    unsafe {
        _mm256_storeu_pd(xa.as_mut_ptr(), x);
        _mm256_storeu_pd(ya.as_mut_ptr(), y);
    }
    patch_lanes(&xa, &mut ya, m, f);
    // SAFETY: as above.
    unsafe { _mm256_loadu_pd(ya.as_ptr()) }
}

/// `ya[i] = f(xa[i])` for the bits `i` set in `m`: the rare lanes off the vector paths.
#[cold]
#[inline(never)]
fn patch_lanes(xa: &[f64; 4], ya: &mut [f64; 4], m: i32, f: fn(f64) -> f64) {
    for i in 0..4 {
        if m & (1 << i) != 0 {
            ya[i] = f(xa[i]);
        }
    }
}

/// `(tab[2i], tab[2i+1])` for each lane's `i`, as two vectors: one 128-bit load of each
/// lane's adjacent pair, then a transpose (faster than two gathers on the CPUs tried).
///
/// # Safety
/// `tab` must point to `2n` readable f64 and every lane of `i` be below `n`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn pairs(tab: *const f64, i: __m256i) -> (__m256d, __m256d) {
    let mut ia = [0i64; 4];
    // SAFETY: `ia` holds 4 i64, the width of one unaligned 256-bit store.
    unsafe { _mm256_storeu_si256(ia.as_mut_ptr() as *mut __m256i, i) };
    // SAFETY: each `2·ia[j]` is below `2n` (the caller's promise): 2 f64 readable there.
    let [p0, p1, p2, p3] = ia.map(|j| unsafe { _mm_loadu_pd(tab.add(2 * j as usize)) });
    let a = _mm256_insertf128_pd::<1>(_mm256_castpd128_pd256(p0), p2);
    let b = _mm256_insertf128_pd::<1>(_mm256_castpd128_pd256(p1), p3);
    (_mm256_unpacklo_pd(a, b), _mm256_unpackhi_pd(a, b))
}

/// `exp` of four lanes, the bits of `f64::exp`. Vectorised: glibc's main path
/// (2^-54 <= |x| < 512) and its tiny path (|x| < 2^-54: `1 + x`); the rest (|x| >= 512,
/// infinities, NaN: glibc's `specialcase` and overflow handling) is scalar.
///
/// Exact only where [`super::VecMath::simd`]`(Func::Exp)` holds (its probe passed).
///
/// # Safety
/// The CPU must have AVX2 and FMA: without `unsafe` from code compiled with both, else
/// checked by the caller (a set [`super::VecMath::simd`] flag implies it).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn exp_pd(x: __m256d) -> __m256d {
    let abs = abs_bits(x);
    // glibc: `abstop - top12(0x1p-54) >= top12(512) - top12(0x1p-54)` leaves the main path.
    let tiny = lt(abs, 0x3c90_0000_0000_0000);
    let other = gt(abs, 0x407f_ffff_ffff_ffff);
    // kd = x·N/ln2 + Shift (fma); ki its bits; r = x − kd·ln2/N in two fmas.
    let kd = _mm256_fmadd_pd(x, splat(EXP_INV_LN2_N), splat(EXP_SHIFT));
    let ki = _mm256_castpd_si256(kd);
    let kd = _mm256_sub_pd(kd, splat(EXP_SHIFT));
    let r = _mm256_fmadd_pd(kd, splat(EXP_NEG_LN2_HI_N), x);
    let r = _mm256_fmadd_pd(kd, splat(EXP_NEG_LN2_LO_N), r);
    // i = ki mod N; top = ki << 45.
    let i = _mm256_and_si256(ki, splat_i(127));
    // SAFETY: i <= 127 in every lane (masked just above), and the table has 128 pairs.
    let (tail, sbits) = unsafe { pairs(EXP_TAB.as_ptr() as *const f64, i) };
    let sbits = _mm256_castpd_si256(sbits);
    let sbits = _mm256_add_epi64(sbits, _mm256_slli_epi64::<45>(ki));
    // tmp = tail + r + r2·(C2 + r·C3) + r2·r2·(C4 + r·C5), contracted as GCC did.
    let c23 = _mm256_fmadd_pd(r, splat(EXP_C3), splat(EXP_C2));
    let tr = _mm256_add_pd(r, tail);
    let r2 = _mm256_mul_pd(r, r);
    let c45 = _mm256_fmadd_pd(r, splat(EXP_C5), splat(EXP_C4));
    let tmp = _mm256_fmadd_pd(c23, r2, tr);
    let r4 = _mm256_mul_pd(r2, r2);
    let tmp = _mm256_fmadd_pd(r4, c45, tmp);
    // scale + scale·tmp.
    let scale = _mm256_castsi256_pd(sbits);
    let y = _mm256_fmadd_pd(scale, tmp, scale);
    let y = select(tiny, _mm256_add_pd(x, splat(1.0)), y);
    patch(x, y, other, f64::exp)
}

/// `exp_m1` of four lanes, the bits of `f64::exp_m1`. Vectorised: fdlibm's `k == 0` path
/// (2^-54 <= |x| <= 0.5·ln2, high word <= 0x3fd62e42) and its tiny path (|x| < 2^-54:
/// `x`); larger |x| (argument reduction, overflow), infinities and NaN are scalar.
///
/// Exact only where [`super::VecMath::simd`]`(Func::ExpM1)` holds (its probe passed).
///
/// # Safety
/// The CPU must have AVX2 and FMA: without `unsafe` from code compiled with both, else
/// checked by the caller (a set [`super::VecMath::simd`] flag implies it).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn exp_m1_pd(x: __m256d) -> __m256d {
    let abs = abs_bits(x);
    let tiny = lt(abs, 0x3c90_0000_0000_0000);
    let other = gt(abs, 0x3fd6_2e42_ffff_ffff);
    let [q1, q2, q3, q4, q5] = EXPM1_Q;
    // hfx = 0.5·x, hxs = x·hfx, r1 = 1 + hxs·Q1 + h2·R2 + h4·R3.
    let hfx = _mm256_mul_pd(x, splat(0.5));
    let hxs = _mm256_mul_pd(x, hfx);
    let rr2 = _mm256_fmadd_pd(hxs, splat(q3), splat(q2));
    let rr3 = _mm256_fmadd_pd(hxs, splat(q5), splat(q4));
    let h2 = _mm256_mul_pd(hxs, hxs);
    let rr1 = _mm256_fmadd_pd(hxs, splat(q1), splat(1.0));
    let h4 = _mm256_mul_pd(h2, h2);
    let r1 = _mm256_fmadd_pd(h2, rr2, rr1);
    let r1 = _mm256_fmadd_pd(h4, rr3, r1);
    // t = 3 − r1·hfx; e = hxs·((r1 − t)/(6 − x·t)); result x − (x·e − hxs).
    let t = _mm256_fnmadd_pd(r1, hfx, splat(3.0));
    let num = _mm256_sub_pd(r1, t);
    let den = _mm256_fnmadd_pd(x, t, splat(6.0));
    let e = _mm256_mul_pd(_mm256_div_pd(num, den), hxs);
    let y = _mm256_sub_pd(x, _mm256_fmsub_pd(e, x, hxs));
    let y = select(tiny, x, y);
    patch(x, y, other, f64::exp_m1)
}

/// `ln` of four lanes, the bits of `f64::ln`. Vectorised: glibc's path close to 1
/// (1 − 2^-4 <= x < 1 + 0x1.09p-4, and `ln(1) = +0`) and its table path (positive normal
/// finite x); zero, negative, subnormal, infinite and NaN lanes are scalar. Computes only
/// the path(s) the lanes need (a branch on the lanes' mix).
///
/// Exact only where [`super::VecMath::simd`]`(Func::Ln)` holds (its probe passed).
///
/// # Safety
/// The CPU must have AVX2 and FMA: without `unsafe` from code compiled with both, else
/// checked by the caller (a set [`super::VecMath::simd`] flag implies it).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn ln_pd(x: __m256d) -> __m256d {
    match _mm256_movemask_pd(_mm256_castsi256_pd(ln_near_mask(x))) {
        0 => ln_lanes::<LN_TABLE>(x),
        0b1111 => ln_lanes::<LN_NEAR_1>(x),
        _ => ln_lanes::<LN_BOTH>(x),
    }
}

/// Which of `ln`'s paths [`ln_lanes`] computes: the table path, the path close to 1, or
/// both (blended).
const LN_TABLE: u8 = 1;
const LN_NEAR_1: u8 = 2;
const LN_BOTH: u8 = 3;

/// All-ones in the lanes in glibc `log`'s window close to 1 (`ix − LO < HI − LO`).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn ln_near_mask(x: __m256d) -> __m256i {
    let ix = _mm256_castpd_si256(x);
    _mm256_and_si256(gt(ix, LOG_LO - 1), lt(ix, LOG_HI))
}

/// `ln` of four lanes computing the paths `PATHS` names. With [`LN_TABLE`] a lane close to
/// 1, and with [`LN_NEAR_1`] a lane not close to 1, gets the wrong formula: callers pass
/// none, or overwrite its result.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn ln_lanes<const PATHS: u8>(x: __m256d) -> __m256d {
    let ix = _mm256_castpd_si256(x);
    // glibc: `top16 - 0x0010 >= 0x7ff0 - 0x0010` leaves the table path.
    let other = _mm256_or_si256(lt(ix, 0x0010_0000_0000_0000), gt(ix, 0x7fef_ffff_ffff_ffff));
    let y = match PATHS {
        LN_TABLE => ln_table(ix),
        LN_NEAR_1 => ln_near_1(x),
        _ => select(ln_near_mask(x), ln_near_1(x), ln_table(ix)),
    };
    // glibc returns +0 for x == 1 before the path close to 1.
    let one = _mm256_cmpeq_epi64(ix, splat_i(0x3ff0_0000_0000_0000));
    let y = _mm256_andnot_pd(_mm256_castsi256_pd(one), y);
    patch(x, y, other, f64::ln)
}

/// glibc `log`'s path close to 1: r = x − 1, r + r2·B0 in an exact-ish hi + lo split,
/// plus r3 times a degree-9 polynomial.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn ln_near_1(x: __m256d) -> __m256d {
    let b = |i: usize| splat(LOG_B[i]);
    let r = _mm256_sub_pd(x, splat(1.0));
    let p1 = _mm256_fmadd_pd(r, b(2), b(1));
    let p4 = _mm256_fmadd_pd(r, b(5), b(4));
    let r2 = _mm256_mul_pd(r, r);
    let p7 = _mm256_fmadd_pd(r, b(8), b(7));
    let p1 = _mm256_fmadd_pd(r2, b(3), p1);
    let p4 = _mm256_fmadd_pd(r2, b(6), p4);
    let r3 = _mm256_mul_pd(r, r2);
    let p7 = _mm256_fmadd_pd(r2, b(9), p7);
    let p7 = _mm256_fmadd_pd(r3, b(10), p7);
    let p4 = _mm256_fmadd_pd(p7, r3, p4);
    let p = _mm256_fmadd_pd(p4, r3, p1);
    // w = r·2^27; rhi = r + w − w (both contracted); rlo = r − rhi.
    let two27 = splat(c(0x41a0_0000_0000_0000));
    let rw = _mm256_fmadd_pd(r, two27, r);
    let rhi = _mm256_fnmadd_pd(two27, r, rw);
    let rhi2 = _mm256_mul_pd(rhi, rhi);
    let rlo = _mm256_sub_pd(r, rhi);
    // hi = r + rhi²·B0; lo = r − hi + rhi²·B0 + B0·rlo·(rhi + r); y = r3·p + lo + hi.
    let hi = _mm256_fmadd_pd(rhi2, b(0), r);
    let d = _mm256_sub_pd(r, hi);
    let s = _mm256_add_pd(r, rhi);
    let lo = _mm256_fmadd_pd(rhi2, b(0), d);
    let m = _mm256_mul_pd(b(0), rlo);
    let lo = _mm256_fmadd_pd(m, s, lo);
    let y = _mm256_fmadd_pd(p, r3, lo);
    _mm256_add_pd(hi, y)
}

/// glibc `log`'s table path: x = 2^k·z, log(x) = k·ln2 + log(c) + log1p(z/c − 1) with
/// (1/c, log c) from [`LOG_TAB`].
#[inline]
#[target_feature(enable = "avx2,fma")]
fn ln_table(ix: __m256i) -> __m256d {
    let [a0, a1, a2, a3, a4] = LOG_A;
    let tmp = _mm256_sub_epi64(ix, splat_i(LOG_OFF));
    // i = (tmp >> 45) mod N.
    let i = _mm256_and_si256(_mm256_srli_epi64::<45>(tmp), splat_i(127));
    // k = tmp >> 52 (arithmetic; AVX2 has no 64-bit one): the top 12 bits are k in two's
    // complement; flipping bit 11 makes them k + 2048, which as the low mantissa bits of
    // 2^52 gives 2^52 + 2048 + k exactly.
    let kbits = _mm256_xor_si256(_mm256_srli_epi64::<52>(tmp), splat_i(0x4330_0000_0000_0800));
    let kd = _mm256_sub_pd(_mm256_castsi256_pd(kbits), splat(c(0x4330_0000_0000_0800)));
    // iz = ix − (tmp & 0xfff << 52): z in [0x1.6p-1, 0x1.6p0).
    let iz = _mm256_sub_epi64(
        ix,
        _mm256_and_si256(tmp, splat_i(0xfff0_0000_0000_0000_u64 as i64)),
    );
    let z = _mm256_castsi256_pd(iz);
    // SAFETY: i <= 127 in every lane (masked above), and the table has 128 pairs.
    let (invc, logc) = unsafe { pairs(LOG_TAB.as_ptr() as *const f64, i) };
    // r = z·invc − 1 (fma); hi + lo = r + logc + k·ln2.
    let r = _mm256_fmadd_pd(z, invc, splat(-1.0));
    let w = _mm256_fmadd_pd(kd, splat(LOG_LN2_HI), logc);
    let hi = _mm256_add_pd(r, w);
    let r2 = _mm256_mul_pd(r, r);
    let lo = _mm256_add_pd(_mm256_sub_pd(w, hi), r);
    let lo = _mm256_fmadd_pd(kd, splat(LOG_LN2_LO), lo);
    // y = lo + r2·A0 + r3·(A1 + r·A2 + r2·(A3 + r·A4)) + hi.
    let r3 = _mm256_mul_pd(r, r2);
    let p34 = _mm256_fmadd_pd(r, splat(a4), splat(a3));
    let p12 = _mm256_fmadd_pd(r, splat(a2), splat(a1));
    let lo = _mm256_fmadd_pd(r2, splat(a0), lo);
    let p = _mm256_fmadd_pd(p34, r2, p12);
    let y = _mm256_fmadd_pd(r3, p, lo);
    _mm256_add_pd(y, hi)
}

/// `ln_1p` of four lanes, the bits of `f64::ln_1p`. Vectorised: fdlibm's `k == 0` path
/// (2^-29 <= |x|, x < 0x1.a827ap-2 and, when negative, high word of |x| < 0x3fd2bec4) and
/// its two tiny paths (|x| < 2^-54: `x`; |x| < 2^-29: `x − x²·0.5`); the rest (x beyond
/// about −0.29 or 0.41, infinities, NaN) is scalar.
///
/// Exact only where [`super::VecMath::simd`]`(Func::Ln1p)` holds (its probe passed).
///
/// # Safety
/// The CPU must have AVX2 and FMA: without `unsafe` from code compiled with both, else
/// checked by the caller (a set [`super::VecMath::simd`] flag implies it).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub fn ln_1p_pd(x: __m256d) -> __m256d {
    let ix = _mm256_castpd_si256(x);
    let abs = abs_bits(x);
    let tiny0 = lt(abs, 0x3c90_0000_0000_0000);
    let tiny1 = lt(abs, 0x3e20_0000_0000_0000);
    // fdlibm: `hx < 0x3fda827a` (signed) else scalar; negative lanes with
    // `hx > (int) 0xbfd2bec3` take the `k != 0` path: scalar.
    let other = _mm256_or_si256(
        gt(ix, 0x3fda_8279_ffff_ffff),
        _mm256_and_si256(lt(ix, 0), gt(abs, 0x3fd2_bec3_ffff_ffff)),
    );
    let [lp1, lp2, lp3, lp4, lp5, lp6, lp7] = LOG1P_LP;
    // hfsq = 0.5·x·x; s = x/(2 + x); z = s².
    let hfsq = _mm256_mul_pd(_mm256_mul_pd(x, splat(0.5)), x);
    let s = _mm256_div_pd(x, _mm256_add_pd(x, splat(2.0)));
    let z = _mm256_mul_pd(s, s);
    let rr2 = _mm256_fmadd_pd(z, splat(lp3), splat(lp2));
    let rr3 = _mm256_fmadd_pd(z, splat(lp5), splat(lp4));
    let rr4 = _mm256_fmadd_pd(z, splat(lp7), splat(lp6));
    let z2 = _mm256_mul_pd(z, z);
    let z4 = _mm256_mul_pd(z2, z2);
    let z6 = _mm256_mul_pd(z2, z4);
    // R = z·Lp1 + z2·R2 + z4·R3 + z6·R4 (z2·R2 rounded, then three fmas).
    let t = _mm256_mul_pd(z2, rr2);
    let rr = _mm256_fmadd_pd(z, splat(lp1), t);
    let rr = _mm256_fmadd_pd(z4, rr3, rr);
    let rr = _mm256_fmadd_pd(z6, rr4, rr);
    // x − (hfsq − s·(hfsq + R)).
    let u = _mm256_mul_pd(_mm256_add_pd(rr, hfsq), s);
    let y = _mm256_sub_pd(x, _mm256_sub_pd(hfsq, u));
    let small = _mm256_fnmadd_pd(_mm256_mul_pd(x, x), splat(0.5), x);
    let y = select(tiny1, small, y);
    let y = select(tiny0, x, y);
    patch(x, y, other, f64::ln_1p)
}

/// `xs[i] = k(xs[i])` four at a time, the last `len % 4` with the scalar `f`.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn map_slice(xs: &mut [f64], k: impl Fn(__m256d) -> __m256d, f: fn(f64) -> f64) {
    let mut chunks = xs.chunks_exact_mut(4);
    for ch in &mut chunks {
        // SAFETY: `ch` has exactly 4 elements: one unaligned 256-bit load and store.
        unsafe { _mm256_storeu_pd(ch.as_mut_ptr(), k(_mm256_loadu_pd(ch.as_ptr()))) };
    }
    for x in chunks.into_remainder() {
        *x = f(*x);
    }
}

/// [`exp_pd`] over a slice.
#[target_feature(enable = "avx2,fma")]
pub(super) fn exp_slice(xs: &mut [f64]) {
    map_slice(xs, |v| exp_pd(v), f64::exp)
}

/// [`exp_m1_pd`] over a slice.
#[target_feature(enable = "avx2,fma")]
pub(super) fn exp_m1_slice(xs: &mut [f64]) {
    map_slice(xs, |v| exp_m1_pd(v), f64::exp_m1)
}

/// [`ln_pd`] over a slice, in blocks of [`LN_BLOCK`]: a block with no lane close to 1, or
/// only such lanes, computes one path; a mixed block computes both paths for every lane
/// when most lanes are close to 1, else goes to [`ln_mixed_block`] (no branch per vector:
/// mispredicted on mixed data, those cost more than computing a second path).
#[target_feature(enable = "avx2,fma")]
pub(super) fn ln_slice(xs: &mut [f64]) {
    for block in xs.chunks_mut(LN_BLOCK) {
        let mut near = 0;
        for ch in block.chunks_exact(4) {
            // SAFETY: `ch` has exactly 4 elements: one unaligned 256-bit load.
            let x = unsafe { _mm256_loadu_pd(ch.as_ptr()) };
            near += _mm256_movemask_pd(_mm256_castsi256_pd(ln_near_mask(x))).count_ones();
        }
        let lanes = (block.len() / 4 * 4) as u32;
        // (A block under 4 long has no lane: `near` is 0 and all of it is scalar.)
        if near == 0 {
            map_slice(block, |v| ln_lanes::<LN_TABLE>(v), f64::ln)
        } else if near == lanes {
            map_slice(block, |v| ln_lanes::<LN_NEAR_1>(v), f64::ln)
        } else if 2 * near > lanes {
            map_slice(block, |v| ln_lanes::<LN_BOTH>(v), f64::ln)
        } else {
            ln_mixed_block(block)
        }
    }
}

/// Block length of [`ln_slice`] (at most 256: [`ln_mixed_block`] keeps indices in u8).
const LN_BLOCK: usize = 64;

/// For each 4-bit lane mask `m`: the 32-bit element indices that move the 64-bit lanes set
/// in `m` to the front of a vector, in order (`_mm256_permutevar8x32_ps`).
const COMPRESS: [[i32; 8]; 16] = {
    let mut t = [[0i32; 8]; 16];
    let mut m = 0;
    while m < 16 {
        let (mut lane, mut n) = (0i32, 0);
        while lane < 4 {
            if m & (1 << lane) != 0 {
                t[m][2 * n] = 2 * lane;
                t[m][2 * n + 1] = 2 * lane + 1;
                n += 1;
            }
            lane += 1;
        }
        m += 1;
    }
    t
};

/// For each 4-bit lane mask `m`: the numbers of its set lanes as bytes, lowest first.
const LANE_BYTES: [u32; 16] = {
    let mut t = [0u32; 16];
    let mut m = 0;
    while m < 16 {
        let (mut lane, mut n) = (0, 0);
        while lane < 4 {
            if m & (1 << lane) != 0 {
                t[m] |= (lane as u32) << (8 * n);
                n += 1;
            }
            lane += 1;
        }
        m += 1;
    }
    t
};

/// `ln` of a block (at most [`LN_BLOCK`] long) holding lanes on both paths: the table path
/// for every vector, while the lanes close to 1 are packed (value and position) to the
/// front of a side buffer; then the path close to 1 on that buffer, four at a time, its
/// results stored back at their positions. The tail (`len % 4`) is scalar.
#[target_feature(enable = "avx2,fma")]
fn ln_mixed_block(block: &mut [f64]) {
    let mut near_x = [1.0f64; LN_BLOCK + 4];
    let mut near_at = [0u8; LN_BLOCK + 4];
    let mut n = 0;
    let mut chunks = block.chunks_exact_mut(4);
    for (j, ch) in (&mut chunks).enumerate() {
        // SAFETY: `ch` has exactly 4 elements: one unaligned 256-bit load.
        let x = unsafe { _mm256_loadu_pd(ch.as_ptr()) };
        let m = _mm256_movemask_pd(_mm256_castsi256_pd(ln_near_mask(x))) as usize & 0b1111;
        // SAFETY: a row of COMPRESS holds 8 i32: one unaligned 256-bit load.
        let perm = unsafe { _mm256_loadu_si256(COMPRESS[m].as_ptr() as *const __m256i) };
        let packed = _mm256_castps_pd(_mm256_permutevar8x32_ps(_mm256_castpd_ps(x), perm));
        // n <= 4·j <= LN_BLOCK − 4 here, so both 4-element windows are in bounds.
        let dst = &mut near_x[n..n + 4];
        // SAFETY: `dst` has exactly 4 elements: one unaligned 256-bit store.
        unsafe { _mm256_storeu_pd(dst.as_mut_ptr(), packed) };
        let at = LANE_BYTES[m] + (4 * j as u32) * 0x0101_0101;
        near_at[n..n + 4].copy_from_slice(&at.to_le_bytes());
        n += m.count_ones() as usize;
        // SAFETY: as the load above.
        unsafe { _mm256_storeu_pd(ch.as_mut_ptr(), ln_lanes::<LN_TABLE>(x)) };
    }
    for x in chunks.into_remainder() {
        *x = x.ln();
    }
    // Past the packed lanes: 1.0 (an in-window value) for the last vector's spare lanes.
    near_x[n..n + 4].fill(1.0);
    for k in (0..n).step_by(4) {
        let mut y = [0.0; 4];
        // SAFETY: k < n <= LN_BLOCK, so `near_x[k..k + 4]` is in bounds; `y` holds 4 f64.
        unsafe {
            let x = _mm256_loadu_pd(near_x[k..k + 4].as_ptr());
            _mm256_storeu_pd(y.as_mut_ptr(), ln_lanes::<LN_NEAR_1>(x));
        }
        for (l, &v) in y.iter().enumerate().take(n - k) {
            block[near_at[k + l] as usize] = v;
        }
    }
}

/// [`ln_1p_pd`] over a slice.
#[target_feature(enable = "avx2,fma")]
pub(super) fn ln_1p_slice(xs: &mut [f64]) {
    map_slice(xs, |v| ln_1p_pd(v), f64::ln_1p)
}

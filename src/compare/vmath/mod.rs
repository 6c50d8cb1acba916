//! `exp`, `exp_m1`, `ln` and `ln_1p` over slices of f64, four lanes at a time, returning
//! exactly the bits of the scalar std functions (glibc's libm here). The metric loops call
//! these on millions of elements and every output byte must stay the same, so only a
//! bit-exact vector port will do: `x86` repeats, operation for operation, glibc 2.36's
//! AVX2+FMA variants (`__ieee754_exp_fma`, `__expm1_fma`, `__ieee754_log_fma`,
//! `__log1p_fma`) on their common paths and hands every other lane to the std function.
//!
//! The port is exact only against that glibc on a CPU where it picks those variants, so
//! [`VecMath::get`] turns a kernel on only with glibc 2.36 loaded, AVX2+FMA present, and
//! the kernel equal to the std function on each of its [`probes`] (a few thousand values
//! over every vectorised branch and its thresholds), checked once per process; else the
//! scalar std function. (The version check because a differently contracted build would
//! differ only on rare inputs, which a probe of this size would likely miss.)

#[cfg(target_arch = "x86_64")]
mod tables;
#[cfg(target_arch = "x86_64")]
pub mod x86;

#[cfg(test)]
mod tests;

use std::sync::OnceLock;

/// One of the four functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    /// `f64::exp`.
    Exp,
    /// `f64::exp_m1`.
    ExpM1,
    /// `f64::ln`.
    Ln,
    /// `f64::ln_1p`.
    Ln1p,
}

impl Func {
    /// All four, in the order of [`VecMath`]'s flags.
    pub const ALL: [Func; 4] = [Func::Exp, Func::ExpM1, Func::Ln, Func::Ln1p];

    /// The scalar std function (glibc's, on Linux).
    pub fn scalar(self) -> fn(f64) -> f64 {
        match self {
            Func::Exp => f64::exp,
            Func::ExpM1 => f64::exp_m1,
            Func::Ln => f64::ln,
            Func::Ln1p => f64::ln_1p,
        }
    }
}

/// Which of the four functions run vectorised in this process: resolved once ([`get`]),
/// the AVX2+FMA kernel of a function when the CPU has both features and the kernel
/// matched the std function bit for bit on [`probes`]; else the scalar std calls. Every
/// entry point gives `f64::exp` & co.'s bits either way.
///
/// [`get`]: VecMath::get
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VecMath {
    /// Indexed by `Func as usize`. Invariant: `true` only on x86-64 with AVX2 and FMA.
    simd: [bool; 4],
}

/// The process's choice, resolved at first use.
static VEC_MATH: OnceLock<VecMath> = OnceLock::new();

impl VecMath {
    /// The process's choice (the probe runs once, on the first call: about 0.2 ms).
    #[inline]
    pub fn get() -> VecMath {
        *VEC_MATH.get_or_init(resolve)
    }

    /// The scalar std calls for all four (a reference for tests and benchmarks).
    pub const SCALAR: VecMath = VecMath { simd: [false; 4] };

    /// Whether `f` runs vectorised.
    #[inline]
    pub fn simd(self, f: Func) -> bool {
        self.simd[f as usize]
    }

    /// `xs[i] = xs[i].exp()`, the same bits.
    #[inline]
    pub fn exp_in_place(self, xs: &mut [f64]) {
        self.apply(Func::Exp, xs)
    }

    /// `xs[i] = xs[i].exp_m1()`, the same bits.
    #[inline]
    pub fn exp_m1_in_place(self, xs: &mut [f64]) {
        self.apply(Func::ExpM1, xs)
    }

    /// `xs[i] = xs[i].ln()`, the same bits.
    #[inline]
    pub fn ln_in_place(self, xs: &mut [f64]) {
        self.apply(Func::Ln, xs)
    }

    /// `xs[i] = xs[i].ln_1p()`, the same bits.
    #[inline]
    pub fn ln_1p_in_place(self, xs: &mut [f64]) {
        self.apply(Func::Ln1p, xs)
    }

    /// `xs[i] = f(xs[i])`, vectorised when `f`'s flag is set.
    pub fn apply(self, f: Func, xs: &mut [f64]) {
        #[cfg(target_arch = "x86_64")]
        if self.simd(f) {
            // SAFETY: a set flag means the CPU has AVX2 and FMA (the field's invariant).
            unsafe { simd_apply(f, xs) };
            return;
        }
        // One loop per function: direct calls, not through `Func::scalar`'s pointer.
        match f {
            Func::Exp => xs.iter_mut().for_each(|x| *x = x.exp()),
            Func::ExpM1 => xs.iter_mut().for_each(|x| *x = x.exp_m1()),
            Func::Ln => xs.iter_mut().for_each(|x| *x = x.ln()),
            Func::Ln1p => xs.iter_mut().for_each(|x| *x = x.ln_1p()),
        }
    }
}

/// `f`'s AVX2+FMA kernel over `xs`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn simd_apply(f: Func, xs: &mut [f64]) {
    match f {
        Func::Exp => x86::exp_slice(xs),
        Func::ExpM1 => x86::exp_m1_slice(xs),
        Func::Ln => x86::ln_slice(xs),
        Func::Ln1p => x86::ln_1p_slice(xs),
    }
}

/// Whether the CPU can run the kernels.
fn cpu_has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the loaded C library is glibc 2.36, the one the kernels were ported from.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn libc_is_glibc_2_36() -> bool {
    extern "C" {
        /// glibc's `gnu_get_libc_version(3)`: the running glibc's version, e.g. "2.36".
        fn gnu_get_libc_version() -> *const std::ffi::c_char;
    }
    // SAFETY: glibc returns a pointer to a static NUL-terminated string.
    let v = unsafe { std::ffi::CStr::from_ptr(gnu_get_libc_version()) };
    v.to_bytes() == b"2.36"
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn libc_is_glibc_2_36() -> bool {
    false
}

/// Each kernel on, where the CPU and the C library allow, unless it differs from the std
/// function on one of its [`probes`].
fn resolve() -> VecMath {
    let mut vm = VecMath::SCALAR;
    if cpu_has_avx2_fma() && libc_is_glibc_2_36() {
        for f in Func::ALL {
            let xs = probes(f);
            let mut ys = xs.clone();
            let one = VecMath {
                simd: std::array::from_fn(|i| i == f as usize),
            };
            one.apply(f, &mut ys);
            let g = f.scalar();
            vm.simd[f as usize] = xs
                .iter()
                .zip(&ys)
                .all(|(&x, &y)| y.to_bits() == g(x).to_bits());
        }
    }
    vm
}

/// High words (top 32 bits) of the thresholds between `f`'s branches in glibc, as the
/// disassembly tests them: the probes and tests take values at and beside each, of both
/// signs.
pub fn thresholds(f: Func) -> &'static [u64] {
    match f {
        // |x| = 2^-54 (tiny path), 512 (special case), ~709.78 (overflow).
        Func::Exp => &[0x3c90_0000, 0x4080_0000, 0x4086_232b, 0x4086_2e42],
        // |x| = 2^-54 (tiny), 0.5·ln2 (k = 0 ends), 1.5·ln2 (k = ±1 ends), 56·ln2.
        Func::ExpM1 => &[
            0x3c90_0000,
            0x3fd6_2e42,
            0x3fd6_2e43,
            0x3ff0_a2b2,
            0x4043_687a,
        ],
        // The window close to 1, 1 itself, the smallest normal, infinity.
        Func::Ln => &[
            0x3fee_0000,
            0x3ff1_0900,
            0x3ff0_0000,
            0x0010_0000,
            0x7ff0_0000,
        ],
        // |x| = 2^-54, 2^-29 (tiny paths), 0x1.a827ap-2 (k = 0 ends above), −0x1.2bec4p-2
        // (k = 0 ends below), −1.
        Func::Ln1p => &[
            0x3c90_0000,
            0x3e20_0000,
            0x3fda_827a,
            0x3fd2_bec4,
            0x3ff0_0000,
        ],
    }
}

/// Values beside each threshold: `t << 32` and its 3 neighbours on either side, of both
/// signs.
pub fn threshold_values(f: Func) -> Vec<f64> {
    let mut out = Vec::new();
    for &t in thresholds(f) {
        for sign in [0, 1u64 << 63] {
            for d in -3i64..=3 {
                let bits = (t << 32).wrapping_add_signed(d) | sign;
                out.push(f64::from_bits(bits));
            }
        }
    }
    out
}

/// The values [`VecMath::get`] checks `f`'s kernel on: its [`threshold_values`], a few
/// specials (signed zeros, infinities, NaN, a subnormal), and 1024 deterministic values
/// in each of `f`'s input ranges (spanning every vectorised branch, and for `ln` each
/// kind of block of its slice loop).
pub fn probes(f: Func) -> Vec<f64> {
    let mut out = threshold_values(f);
    out.extend([
        0.0,
        -0.0,
        1.0,
        -1.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1e-310,
    ]);
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut uniform = move || {
        // xorshift64: values in [0, 1).
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    // (lo, hi, log-uniform): ranges covering the branches.
    let ranges: &[(f64, f64, bool)] = match f {
        Func::Exp => &[
            (-1.0, 1.0, false),
            (-30.0, 30.0, false),
            (-600.0, 600.0, false),
        ],
        Func::ExpM1 => &[
            (-0.35, 0.35, false),
            (1e-20, 0.35, true),
            (-0.35, -1e-20, true),
        ],
        // (`ln` also by the mix of its slice blocks: mostly table, mostly or only close
        // to 1, only table.)
        Func::Ln => &[
            (0.5, 2.0, false),
            (0.93, 1.07, false),
            (0.95, 1.05, false),
            (1e-300, 1e300, true),
        ],
        Func::Ln1p => &[
            (-0.3, 0.42, false),
            (1e-20, 0.42, true),
            (-0.3, -1e-20, true),
        ],
    };
    for &(lo, hi, log) in ranges {
        for _ in 0..1024 {
            let u = uniform();
            out.push(if log {
                // Same sign at both ends: |lo|·(hi/lo)^u, in logs.
                lo.signum() * (lo.abs().ln() + (hi.abs().ln() - lo.abs().ln()) * u).exp()
            } else {
                lo + (hi - lo) * u
            });
        }
    }
    out
}

//! `exp` without glibc's errno wrapper. On x86-64 glibc, `exp` is a small wrapper that
//! calls the exponential proper (`__ieee754_exp`, exported as `__exp_finite`) and sets
//! `errno` on overflow; Rust never reads that `errno`, and in the metric passes and the
//! ratio chain the wrapper costs about as much time as the exponential it wraps. [`Exp`]
//! calls the wrapped function directly: the same code on the same argument, so the same
//! bits (checked against `f64::exp` when resolved, and by the tests). Elsewhere, or when
//! the symbol is missing or disagrees, it is `f64::exp`.

use std::sync::OnceLock;

/// A C-ABI `double (*)(double)`.
type CExp = unsafe extern "C" fn(f64) -> f64;

/// `f64::exp` with the C ABI (the fallback).
extern "C" fn std_exp(x: f64) -> f64 {
    x.exp()
}

/// `f64::exp`, bit for bit, without glibc's errno wrapper where available. Get it once
/// per loop ([`Exp::get`]) and call it per element.
#[derive(Clone, Copy)]
pub struct Exp {
    /// Invariant: glibc's `__exp_finite` (checked on [`PROBES`]) or [`std_exp`].
    f: CExp,
}

/// The exponential [`Exp::get`] resolves to, once.
static EXP: OnceLock<Exp> = OnceLock::new();

impl Exp {
    /// The process's exponential.
    #[inline]
    pub fn get() -> Exp {
        *EXP.get_or_init(resolve)
    }

    /// `x.exp()`, the same bits.
    #[inline(always)]
    pub fn call(self, x: f64) -> f64 {
        // SAFETY: `f` is glibc's `double __exp_finite(double)` or `std_exp`, both defined
        // for every double (the field's invariant).
        unsafe { (self.f)(x) }
    }

    /// Whether this bypasses glibc's wrapper (for the tests).
    pub fn unwrapped(self) -> bool {
        self.f as usize != std_exp as CExp as usize
    }
}

/// glibc's `__exp_finite@GLIBC_2.15`, when the loaded libm exports it.
#[cfg(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64"))]
fn glibc_exp_finite() -> Option<CExp> {
    use std::ffi::{c_char, c_void};
    extern "C" {
        /// glibc's `dlvsym(3)`: a symbol of a given version from the loaded objects.
        fn dlvsym(
            handle: *mut c_void,
            symbol: *const c_char,
            version: *const c_char,
        ) -> *mut c_void;
    }
    // RTLD_DEFAULT (null): the global scope, where libm is loaded with the program.
    // SAFETY: both names are NUL-terminated; dlvsym only reads them.
    let p = unsafe {
        dlvsym(
            std::ptr::null_mut(),
            c"__exp_finite".as_ptr(),
            c"GLIBC_2.15".as_ptr(),
        )
    };
    // SAFETY: a non-null result is the address of glibc's `double __exp_finite(double)`.
    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, CExp>(p) })
}

#[cfg(not(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64")))]
fn glibc_exp_finite() -> Option<CExp> {
    None
}

/// Values [`resolve`] checks a candidate on: ordinary, tiny, near overflow and underflow,
/// past both, signed zeros, infinities, NaN.
const PROBES: [f64; 14] = [
    0.5,
    -3.75,
    1e-300,
    -1e-18,
    709.78,
    709.79,
    -745.13,
    -745.14,
    -0.0,
    0.0,
    1000.0,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
];

/// glibc's unwrapped exponential when found and equal to `f64::exp` on [`PROBES`].
fn resolve() -> Exp {
    let fallback = Exp { f: std_exp };
    match glibc_exp_finite() {
        Some(f) => {
            let e = Exp { f };
            let same = PROBES
                .iter()
                .all(|&x| e.call(x).to_bits() == x.exp().to_bits());
            if same {
                e
            } else {
                fallback
            }
        }
        None => fallback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_f64_exp_bit_for_bit() {
        // 4 M arguments over exp's whole domain (and past it), log-prob-like values and
        // their differences, random bit patterns (NaN payloads, subnormals, infinities),
        // every probe: the same bits as f64::exp.
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let exp = Exp::get();
        for i in 0..4_000_000u32 {
            let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
            let x = match i % 4 {
                0 => -800.0 + 1520.0 * u,
                1 => -30.0 * u,
                2 => (u - 0.5) * 1e-3,
                _ => f64::from_bits(next()),
            };
            assert_eq!(exp.call(x).to_bits(), x.exp().to_bits(), "{x:e}");
        }
        for x in PROBES {
            assert_eq!(exp.call(x).to_bits(), x.exp().to_bits(), "{x:e}");
        }
        // Not vacuous where the bypass exists: on x86-64 glibc it is taken.
        if cfg!(all(
            target_os = "linux",
            target_env = "gnu",
            target_arch = "x86_64"
        )) {
            assert!(exp.unwrapped());
        }
    }
}

//! Per-token operations of the fused path and their gradients, each as candle computes it
//! (same operations in the same dtype): torch's clamp, candle's `maximum`/`minimum` and
//! their tie split, the aggregation's per-entry weight, the KL estimators.

use candle_core::WithDType;

use crate::kernels::kl::KlEstimator;

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
    #[inline(always)]
    fn exp_(self) -> Self {
        self.exp()
    }
    #[inline(always)]
    fn abs_(self) -> Self {
        self.abs()
    }
    #[inline(always)]
    fn finite(self) -> bool {
        self.is_finite()
    }
}

impl Float for f32 {
    #[inline(always)]
    fn exp_(self) -> Self {
        self.exp()
    }
    #[inline(always)]
    fn abs_(self) -> Self {
        self.abs()
    }
    #[inline(always)]
    fn finite(self) -> bool {
        self.is_finite()
    }
}

/// `clamp_torch` on one value (bounds already in `T`).
#[inline(always)]
pub(super) fn clamp<T: Float>(x: T, lo: Option<T>, hi: Option<T>) -> T {
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
pub(super) fn passes<T: Float>(x: T, lo: Option<T>, hi: Option<T>) -> bool {
    !(lo.is_some_and(|lo| x <= lo) || hi.is_some_and(|hi| x >= hi))
}

/// `x − x` as candle computes `x - x.detach()`: 0 for a finite `x`, NaN for ±inf/NaN.
#[inline(always)]
#[allow(clippy::eq_op)]
pub(super) fn self_diff<T: Float>(x: T) -> T {
    x - x
}

#[inline(always)]
pub(super) fn b2f<T: Float>(b: bool) -> T {
    if b {
        T::one()
    } else {
        T::zero()
    }
}

/// candle's `maximum` / `minimum`.
#[inline(always)]
pub(super) fn maximum<T: Float>(a: T, b: T) -> T {
    if a < b {
        b
    } else {
        a
    }
}
#[inline(always)]
pub(super) fn minimum<T: Float>(a: T, b: T) -> T {
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
pub(super) fn extremum_grad<T: Float>(node: T, x: T, other: T, g: T) -> T {
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
pub(super) fn agg_entry<T: Float>(verl: bool, w: T, m: T) -> T {
    if verl && m == T::zero() {
        T::zero()
    } else {
        w * m
    }
}

/// The argument of the one `exp` a KL estimator takes (computed ahead, in a call-only
/// loop), or `None` for the estimators without one.
#[inline(always)]
pub(super) fn kl_exp_arg<T: Float>(lp: T, rf: T, est: KlEstimator) -> Option<T> {
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

/// Per-token KL estimate as [`crate::kernels::kl::kl`] (`e` = exp of [`kl_exp_arg`]) and, with
/// `GRAD`, for an upstream gradient `g` on it, its contribution to d/d(log_probs) as
/// candle's autograd of [`crate::kernels::kl::kl`] computes it.
#[inline(always)]
pub(super) fn kl_term<T: Float, const GRAD: bool>(
    lp: T,
    rf: T,
    est: KlEstimator,
    e: T,
    g: T,
) -> (T, T) {
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

/// `where(m ≠ 0, x, 0)·m`.
#[inline(always)]
pub(super) fn mv<T: Float>(m: T, x: T) -> T {
    let kept = if m != T::zero() { x } else { T::zero() };
    kept * m
}

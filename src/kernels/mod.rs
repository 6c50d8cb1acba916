//! Reference GRPO/GSPO kernels written with candle tensors (SPEC §4).
//!
//! Every kernel takes `[B, T]` tensors (B rows, T response positions), an explicit float
//! mask (1.0 valid, 0.0 padding) and computes in the dtype of its inputs: f64 by default,
//! f32 when a trainer's own rounding must be reproduced ([`Precision`]). Each function
//! names the framework whose convention it follows; the expected values in the tests come
//! from those frameworks' own code (`fixtures/gen/make_kernel_refs.py`).
//!
//! Clamps follow torch's gradient convention (no gradient at the boundary, see
//! [`clamp_torch`]); `maximum`/`minimum` split the gradient at ties as torch does.
//! [`loss::compute`] and [`loss::compute_with_grad`] run [`fused`], the same values in one
//! pass per row with an analytic backward; these candle kernels are its reference. Both
//! share the configuration, input and output types of [`config`], so `loss` depends on
//! `fused` and neither imports the other back.

pub mod advantage;
pub mod aggregate;
pub mod config;
pub mod fused;
#[cfg(test)]
mod fused_vs_candle;
pub mod kl;
pub mod loss;
pub mod metrics;
pub mod policy_loss;
pub mod presets;
pub mod ratio;
pub mod rollout_is;

use candle_core::{DType, Device, Tensor};

/// Floating-point precision of a kernel computation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f64: the reference (default).
    #[default]
    F64,
    /// f32: reproduces the rounding of a trainer that computes its loss in float32.
    F32,
}

impl Precision {
    /// The candle dtype of this precision.
    pub fn dtype(self) -> DType {
        match self {
            Precision::F64 => DType::F64,
            Precision::F32 => DType::F32,
        }
    }
}

/// What a kernel refuses.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// Two inputs that must have the same shape do not.
    #[error("shape mismatch: {a} is {a_shape:?} but {b} is {b_shape:?}")]
    Shape {
        /// First input's name.
        a: String,
        /// Its shape.
        a_shape: Vec<usize>,
        /// Second input's name.
        b: String,
        /// Its shape.
        b_shape: Vec<usize>,
    },
    /// An input or a parameter is not usable (wrong rank, bad epsilon, unknown name...).
    #[error("{0}")]
    Invalid(String),
    /// candle itself failed (an internal error: shapes are checked before).
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Result of a kernel.
pub type KResult<T> = Result<T, KernelError>;

/// Refuse a tensor that is not 2-d `[B, T]`; returns `(B, T)`.
pub fn dims2(name: &str, t: &Tensor) -> KResult<(usize, usize)> {
    match t.dims() {
        [b, n] => Ok((*b, *n)),
        d => Err(KernelError::Invalid(format!(
            "{name} must be 2-d [B, T], got shape {d:?}"
        ))),
    }
}

/// Refuse two tensors of different shapes, naming both sizes.
pub fn same_shape(a: &str, ta: &Tensor, b: &str, tb: &Tensor) -> KResult<()> {
    if ta.dims() != tb.dims() {
        return Err(KernelError::Shape {
            a: a.to_string(),
            a_shape: ta.dims().to_vec(),
            b: b.to_string(),
            b_shape: tb.dims().to_vec(),
        });
    }
    Ok(())
}

/// A tensor of `like`'s shape, dtype and device filled with `v`.
pub fn full_like(like: &Tensor, v: f64) -> KResult<Tensor> {
    Ok(Tensor::full(v, like.dims(), like.device())?.to_dtype(like.dtype())?)
}

/// A 0-d tensor holding `v` in `dtype`.
pub fn scalar(v: f64, dtype: DType) -> KResult<Tensor> {
    Ok(Tensor::new(v, &Device::Cpu)?.to_dtype(dtype)?)
}

/// `torch.clamp(x, min=lo, max=hi)` with python-scalar bounds, value and gradient as torch
/// 2.x computes them: the gradient is 1 strictly inside `(lo, hi)` and 0 at a boundary or
/// beyond (checked against torch: a ratio exactly at `1 + eps` gets no gradient through the
/// clipped branch). NaN stays NaN. Shape and dtype of `x`.
pub fn clamp_torch(x: &Tensor, lo: Option<f64>, hi: Option<f64>) -> KResult<Tensor> {
    let mut y = x.clone();
    if let Some(lo) = lo {
        let below = y.le(lo)?;
        y = below.where_cond(&full_like(&y, lo)?, &y)?;
    }
    if let Some(hi) = hi {
        let above = y.ge(hi)?;
        y = above.where_cond(&full_like(&y, hi)?, &y)?;
    }
    Ok(y)
}

/// The single value of a 0-d or one-element tensor, as f64.
pub fn to_f64(t: &Tensor) -> KResult<f64> {
    Ok(t.flatten_all()?
        .to_dtype(DType::F64)?
        .to_vec1::<f64>()?
        .first()
        .copied()
        .unwrap_or(f64::NAN))
}

/// A `[B, T]` tensor as row-major f64 values.
pub fn to_f64_vec(t: &Tensor) -> KResult<Vec<f64>> {
    Ok(t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?)
}

/// A u8 condition (`t != 0`) from a float mask.
pub fn mask_bool(mask: &Tensor) -> KResult<Tensor> {
    Ok(mask.ne(0.0)?)
}

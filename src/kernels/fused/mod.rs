//! Fused path of [`super::loss::compute`] and [`super::loss::compute_with_grad`], f64 and
//! f32, CPU: one pass per row (rayon over rows) over the inputs' own storage (borrowed,
//! not copied, when already contiguous in the compute dtype) computes the ratio, the
//! per-token loss, the KL/entropy terms, every sum the aggregations and metrics need and,
//! with the gradient, d(total loss)/d(log_probs) `[B, T]`. The candle kernels
//! ([`super::loss::compute_candle`], [`super::loss::compute_with_grad_candle`]) are the
//! reference it is tested against (in `kernels/fused_vs_candle/`, beside both, so that
//! `fused` never imports `loss`).
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

mod aggregate;
mod driver;
mod row;
mod scalar;

use candle_core::{DType, Tensor};

use super::config::{LossConfig, LossInputs, LossOutput, LossScale};
use super::KResult;
use driver::run;

/// Lets the tests ([`super::fused_vs_candle`]) compare the AVX2 build of the row kernel
/// with the baseline one.
#[cfg(test)]
pub(super) use row::BASELINE_ONLY;

/// The fused forward pass, or `None` when it does not apply (non-CPU inputs or anything
/// the candle path must refuse with its own message: wrong shapes, a missing reference,
/// a bad `clip_ratio_c`); the caller then runs the candle path.
pub fn compute_fused(inp: &LossInputs, cfg: &LossConfig) -> KResult<Option<LossOutput>> {
    // a scaled total (verl's loss_scale_factor) and importance weights are the candle path's
    if cfg.loss_scale != LossScale::One || cfg.rollout_is.is_some() {
        return Ok(None);
    }
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
    if cfg.loss_scale != LossScale::One || cfg.rollout_is.is_some() {
        return Ok(None);
    }
    let out = match cfg.precision.dtype() {
        DType::F64 => run::<f64, true>(inp, cfg)?,
        _ => run::<f32, true>(inp, cfg)?,
    };
    Ok(out.and_then(|(o, g)| g.map(|g| (o, g))))
}

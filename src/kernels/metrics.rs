//! Training metrics as each framework logs them. Inputs `[B, T]` of one float dtype; every
//! result is an f64 scalar.

use candle_core::Tensor;

use super::aggregate::{masked_mean_trl, masked_mean_verl};
use super::policy_loss::ClipParams;
use super::{clamp_torch, to_f64, KResult};

/// TRL's clip fractions (`clip_ratio/low_mean`, `high_mean`, `region_mean`):
/// low = `ratio < 1−eps_low ∧ A < 0`, high = `ratio > 1+eps_high ∧ A > 0`, region = either,
/// masked mean `Σ x·m / max(Σ m, 1)`. With `per_sequence` (GSPO) the ratio is one value
/// per row and the mean is over rows (`B`), as TRL does for `[B, 1]` coefficients.
/// `ratio` is TRL's `coef_1` (after `delta`, if any). Returns `(low, high, region)`.
pub fn trl_clip_fractions(
    ratio: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    p: &ClipParams,
    per_sequence: bool,
) -> KResult<(f64, f64, f64)> {
    let dt = ratio.dtype();
    let low = (ratio.lt(1.0 - p.eps_low)? * advantages.lt(0.0)?)?;
    let high = (ratio.gt(1.0 + p.eps_high)? * advantages.gt(0.0)?)?;
    let region = low.maximum(&high)?;
    let mean = |x: &Tensor| -> KResult<f64> {
        let x = x.to_dtype(dt)?;
        if per_sequence {
            let col = x.narrow(1, 0, 1.min(x.dim(1)?))?;
            let n = col.dim(0)?.max(1) as f64;
            Ok(to_f64(&col.sum_all()?)? / n)
        } else {
            to_f64(&masked_mean_trl(&x, mask)?)
        }
    };
    Ok((mean(&low)?, mean(&high)?, mean(&region)?))
}

/// verl's `actor/pg_clipfrac` (`−A·clip(r) > −A·r`) and `actor/pg_clipfrac_lower`
/// (dual clip active: `max(−A·r, −A·clip(r)) > −A·c ∧ A < 0`; 0 without dual clip), both
/// verl `masked_mean` (`/(Σ m + 1e-8)`). Returns `(pg_clipfrac, pg_clipfrac_lower)`.
pub fn verl_clip_fractions(
    ratio: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    p: &ClipParams,
) -> KResult<(f64, f64)> {
    let dt = ratio.dtype();
    let neg_a = advantages.neg()?;
    let l1 = (&neg_a * ratio)?;
    let l2 = (&neg_a * clamp_torch(ratio, Some(1.0 - p.eps_low), Some(1.0 + p.eps_high))?)?;
    let frac = to_f64(&masked_mean_verl(&l2.gt(&l1)?.to_dtype(dt)?, mask)?)?;
    let lower = match p.clip_ratio_c {
        Some(c) => {
            let clip1 = l1.maximum(&l2)?;
            let l3 = neg_a.affine(c, 0.0)?;
            let x = (clip1.gt(&l3)?.to_dtype(dt)? * advantages.lt(0.0)?.to_dtype(dt)?)?;
            to_f64(&masked_mean_verl(&x, mask)?)?
        }
        None => 0.0,
    };
    Ok((frac, lower))
}

/// verl's `actor/ppo_kl`: masked mean of `−(logp − old)` (`log_ratio` as the loss used it:
/// clamped ±20 for vanilla, unclamped for GSPO), verl `masked_mean`.
pub fn verl_ppo_kl(log_ratio: &Tensor, mask: &Tensor) -> KResult<f64> {
    to_f64(&masked_mean_verl(&log_ratio.neg()?, mask)?)
}

/// NexRL's metrics: `approx_kl` = masked mean `½(logp − old)²`, `avg_ratio` = masked mean
/// ratio, `clip_frac` = masked mean `|ratio − 1| > 0.2`; masked mean `Σ x·m / max(Σ m, 1)`.
/// Returns `(approx_kl, avg_ratio, clip_frac)`.
pub fn nexrl_metrics(
    log_ratio: &Tensor,
    ratio: &Tensor,
    mask: &Tensor,
) -> KResult<(f64, f64, f64)> {
    let dt = ratio.dtype();
    let approx = to_f64(&masked_mean_trl(&log_ratio.sqr()?.affine(0.5, 0.0)?, mask)?)?;
    let avg = to_f64(&masked_mean_trl(ratio, mask)?)?;
    let clip = (ratio.affine(1.0, -1.0)?.abs()?.gt(0.2)?).to_dtype(dt)?;
    let clip = to_f64(&masked_mean_trl(&clip, mask)?)?;
    Ok((approx, avg, clip))
}

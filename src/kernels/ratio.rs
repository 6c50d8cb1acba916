//! Importance ratios between the current and the old policy.
//!
//! Shapes: `log_probs`, `old_log_probs`, `mask` are `[B, T]` of one float dtype; every
//! result is `[B, T]` (sequence-level values are broadcast over the row).

use candle_core::Tensor;

use super::{clamp_torch, dims2, same_shape, KResult};

/// Token-level log-ratio `logp − old`, optionally clamped to `[lo, hi]` (verl vanilla
/// clamps ±20 "for stability"; TRL does not clamp). `[B, T]`.
pub fn token_log_ratio(
    log_probs: &Tensor,
    old_log_probs: &Tensor,
    clamp: Option<(f64, f64)>,
) -> KResult<Tensor> {
    dims2("log_probs", log_probs)?;
    same_shape("log_probs", log_probs, "old_log_probs", old_log_probs)?;
    let d = (log_probs - old_log_probs)?;
    match clamp {
        Some((lo, hi)) => clamp_torch(&d, Some(lo), Some(hi)),
        None => Ok(d),
    }
}

/// Token-level ratio `exp(clamp(logp − old))`. `[B, T]`.
pub fn token_ratio(
    log_probs: &Tensor,
    old_log_probs: &Tensor,
    clamp: Option<(f64, f64)>,
) -> KResult<Tensor> {
    Ok(token_log_ratio(log_probs, old_log_probs, clamp)?.exp()?)
}

/// GSPO sequence-level log-ratio `Σ m·(logp − old) / max(Σ m, 1)`, `[B, 1]`; the gradient
/// flows through every valid token (TRL `importance_sampling_level="sequence"`).
pub fn sequence_log_ratio(
    log_probs: &Tensor,
    old_log_probs: &Tensor,
    mask: &Tensor,
) -> KResult<Tensor> {
    same_shape("log_probs", log_probs, "mask", mask)?;
    let d = token_log_ratio(log_probs, old_log_probs, None)?;
    let num = (d * mask)?.sum_keepdim(1)?;
    let len = clamp_torch(&mask.sum_keepdim(1)?, Some(1.0), None)?;
    Ok((num / len)?)
}

/// GSPO sequence ratio broadcast to `[B, T]`: `exp(clamp(sequence_log_ratio))`
/// (TRL GSPO; no clamp in TRL).
pub fn sequence_ratio(
    log_probs: &Tensor,
    old_log_probs: &Tensor,
    mask: &Tensor,
    clamp: Option<(f64, f64)>,
) -> KResult<Tensor> {
    let s = sequence_log_ratio(log_probs, old_log_probs, mask)?.broadcast_as(log_probs.dims())?;
    let s = match clamp {
        Some((lo, hi)) => clamp_torch(&s, Some(lo), Some(hi))?,
        None => s,
    };
    Ok(s.exp()?)
}

/// GSPO-token ratio (verl `compute_policy_loss_gspo`): `exp(min(logp − sg(logp) +
/// sg(seq_log_ratio), max_log))` — equal in value to the sequence ratio, but its gradient
/// with respect to `logp[i, t]` is the ratio itself at that token (stop-gradient on the
/// sequence term). `max_log` is verl's clamp (10.0). `[B, T]`.
pub fn gspo_token_ratio(
    log_probs: &Tensor,
    old_log_probs: &Tensor,
    mask: &Tensor,
    max_log: Option<f64>,
) -> KResult<Tensor> {
    let (_, _) = dims2("log_probs", log_probs)?;
    // verl: sum(neg_kl * mask) / sum(mask).clamp(min=1), detached.
    let seq = sequence_log_ratio(log_probs, old_log_probs, mask)?.detach();
    let l = ((log_probs - log_probs.detach())?.broadcast_add(&seq))?;
    Ok(clamp_torch(&l, None, max_log)?.exp()?)
}

//! The whole policy loss of one micro-batch, from dumped inputs, under a [`LossConfig`]
//! (built from a preset in [`super::presets`]), plus its per-token gradient with respect to
//! `log_probs`.
//!
//! Two implementations of one graph: the candle kernels of this module's siblings
//! ([`compute_candle`], and [`compute_with_grad_candle`] through candle's reverse-mode
//! autograd) are the reference; [`super::fused`] computes the same values in one pass per
//! row, gradient included, and is what [`compute`] and [`compute_with_grad`] run whenever it
//! applies (CPU tensors the candle path accepts), in f64 and f32.

use candle_core::{Tensor, Var};

use super::aggregate::aggregate;
use super::kl::kl;
use super::metrics::{nexrl_metrics, trl_clip_fractions, verl_clip_fractions, verl_ppo_kl};
use super::policy_loss::{importance_sampling, ppo_clip};
use super::ratio::{gspo_token_ratio, sequence_ratio, token_log_ratio};
use super::{clamp_torch, dims2, same_shape, to_f64, to_f64_vec, KResult, KernelError};

/// The shared types, where callers have always found them (defined in [`super::config`]).
pub use super::config::{
    KlPlacement, KlTerm, LossConfig, LossInputs, LossOutput, LossScale, Metrics, PolicyKind,
    RatioLevel,
};

struct Prepared {
    logp: Tensor,
    old: Tensor,
    reference: Option<Tensor>,
    adv: Tensor,
    mask: Tensor,
    entropy: Option<Tensor>,
    rollout: Option<Tensor>,
}

fn prepare(inp: &LossInputs, logp: Tensor, cfg: &LossConfig) -> KResult<Prepared> {
    let dt = cfg.precision.dtype();
    let (b, t) = dims2("log_probs", &logp)?;
    let mask = inp.mask.to_dtype(dt)?;
    same_shape("log_probs", &logp, "mask", &mask)?;
    let old = match &inp.old_log_probs {
        Some(o) => o.to_dtype(dt)?,
        None => logp.detach(),
    };
    same_shape("log_probs", &logp, "old_log_probs", &old)?;
    // an optional [B, T] input, in the computation's dtype and checked against log_probs
    let aligned = |name: &str, x: &Option<Tensor>| -> KResult<Option<Tensor>> {
        x.as_ref()
            .map(|x| {
                let x = x.to_dtype(dt)?;
                same_shape("log_probs", &logp, name, &x)?;
                Ok(x)
            })
            .transpose()
    };
    let reference = aligned("ref_log_probs", &inp.ref_log_probs)?;
    let entropy = aligned("entropy", &inp.entropy)?;
    let rollout = aligned("rollout_log_probs", &inp.rollout_log_probs)?;
    let adv = inp.advantages.to_dtype(dt)?;
    let adv = match adv.dims() {
        [n] if *n == b => adv.unsqueeze(1)?.broadcast_as((b, t))?.contiguous()?,
        [n, 1] if *n == b => adv.broadcast_as((b, t))?.contiguous()?,
        [n, m] if *n == b && *m == t => adv,
        d => {
            return Err(KernelError::Invalid(format!(
                "advantages must be [B] = [{b}] or [B, T] = [{b}, {t}], got {d:?}"
            )))
        }
    };
    Ok(Prepared {
        logp,
        old,
        reference,
        adv,
        mask,
        entropy,
        rollout,
    })
}

/// The candle computation: loss, intermediates and metrics as candle tensors (the
/// reference graph the fused path and its backward reproduce).
fn run(p: &Prepared, cfg: &LossConfig) -> KResult<LossOutput> {
    let token_clamp = match cfg.ratio_level {
        RatioLevel::Token => cfg.log_ratio_clamp,
        _ => None,
    };
    let log_ratio = token_log_ratio(&p.logp, &p.old, token_clamp)?;
    let ratio = match cfg.ratio_level {
        RatioLevel::Token => log_ratio.exp()?,
        RatioLevel::Sequence => sequence_ratio(&p.logp, &p.old, &p.mask, cfg.log_ratio_clamp)?,
        RatioLevel::GspoToken => gspo_token_ratio(
            &p.logp,
            &p.old,
            &p.mask,
            cfg.log_ratio_clamp.map(|(_, hi)| hi),
        )?,
    };
    let mut metrics = Metrics::default();
    let mut per_token = match &cfg.policy {
        PolicyKind::Clip(cp) => {
            let (lo, hi, region) = {
                let coef = match cp.delta {
                    Some(d) => clamp_torch(&ratio, None, Some(d))?,
                    None => ratio.clone(),
                };
                trl_clip_fractions(
                    &coef,
                    &p.adv,
                    &p.mask,
                    cp,
                    cfg.ratio_level == RatioLevel::Sequence,
                )?
            };
            metrics.clip_ratio_low = lo;
            metrics.clip_ratio_high = hi;
            metrics.clip_ratio_region = region;
            let (frac, lower) = verl_clip_fractions(&ratio, &p.adv, &p.mask, cp)?;
            metrics.pg_clipfrac = frac;
            metrics.pg_clipfrac_lower = lower;
            ppo_clip(&ratio, &p.adv, cp)?
        }
        PolicyKind::ImportanceSampling => importance_sampling(&ratio, &p.adv)?,
    };
    if let Some(is) = cfg.rollout_is {
        // verl's rollout-correction weights (see `LossConfig::rollout_is`), no gradient
        let rollout = p.rollout.as_ref().ok_or_else(|| {
            KernelError::Invalid(
                "importance weights need rollout_log_probs, which the inputs lack".into(),
            )
        })?;
        let (rows, width) = dims2("mask", &p.mask)?;
        let w = is.weights(
            &to_f64_vec(&p.old)?,
            &to_f64_vec(rollout)?,
            &to_f64_vec(&p.mask)?,
            rows,
            width,
        );
        let w =
            Tensor::from_vec(w, (rows, width), per_token.device())?.to_dtype(per_token.dtype())?;
        per_token = (per_token * w)?;
    }
    let raw_log_ratio = if token_clamp.is_some() {
        token_log_ratio(&p.logp, &p.old, None)?
    } else {
        log_ratio.clone()
    };
    metrics.ppo_kl = verl_ppo_kl(&log_ratio, &p.mask)?;
    let (approx, avg, clip) = nexrl_metrics(&raw_log_ratio, &ratio, &p.mask)?;
    metrics.approx_kl = approx;
    metrics.avg_ratio = avg;
    metrics.clip_frac = clip;

    let mut kl_loss = None;
    if let Some(term) = &cfg.kl {
        let reference = p.reference.as_ref().ok_or_else(|| {
            KernelError::Invalid("the KL term needs ref_log_probs, which the inputs lack".into())
        })?;
        let k = kl(&p.logp, reference, term.estimator)?;
        metrics.kl = Some(to_f64(&super::aggregate::masked_mean_trl(&k, &p.mask)?)?);
        match term.placement {
            KlPlacement::PerToken => per_token = (per_token + k.affine(term.coef, 0.0)?)?,
            KlPlacement::Separate => kl_loss = Some(aggregate(&k, &p.mask, cfg.agg)?),
        }
    }
    let pg_loss = aggregate(&per_token, &p.mask, cfg.agg)?;
    let mut loss = pg_loss.clone();
    if let (Some(kl_loss), Some(term)) = (&kl_loss, &cfg.kl) {
        loss = (loss + kl_loss.affine(term.coef, 0.0)?)?;
    }
    let mut entropy_loss = None;
    if let Some(e) = &p.entropy {
        let el = aggregate(e, &p.mask, cfg.entropy_agg)?;
        metrics.entropy = Some(to_f64(&super::aggregate::masked_mean_trl(e, &p.mask)?)?);
        if cfg.entropy_coeff != 0.0 {
            loss = (loss - el.affine(cfg.entropy_coeff, 0.0)?)?;
        }
        entropy_loss = Some(el);
    }
    // the producer's factor on the total (verl's loss_scale_factor), rows = B
    if let Some(f) = cfg.loss_scale.factor(p.mask.dims()[0]) {
        loss = loss.affine(f, 0.0)?;
    }
    Ok(LossOutput {
        loss,
        pg_loss,
        kl_loss,
        entropy_loss,
        ratio,
        per_token_loss: per_token,
        metrics,
    })
}

/// Compute the loss, intermediates and metrics of one micro-batch under `cfg`.
/// Shapes per [`LossInputs`]; computed in `cfg.precision`. Refuses mismatched shapes
/// (naming both), a KL term without `ref_log_probs`, and a bad `clip_ratio_c`.
///
/// Runs the fused single-pass path ([`super::fused`]: same per-token values; whole-batch
/// sums agree with [`compute_candle`] to ~1e-14 relative in f64, ~1e-6 in f32) and falls
/// back to the candle kernels for inputs it does not take (non-CPU tensors, inputs the
/// candle path refuses).
pub fn compute(inputs: &LossInputs, cfg: &LossConfig) -> KResult<LossOutput> {
    match super::fused::compute_fused(inputs, cfg)? {
        Some(out) => Ok(out),
        None => compute_candle(inputs, cfg),
    }
}

/// [`compute`] through the candle kernels only (the reference the fused path is tested
/// against).
pub fn compute_candle(inputs: &LossInputs, cfg: &LossConfig) -> KResult<LossOutput> {
    let logp = inputs.log_probs.to_dtype(cfg.precision.dtype())?;
    run(&prepare(inputs, logp, cfg)?, cfg)
}

/// [`compute`] plus the gradient of the total loss with respect to `log_probs`, `[B, T]`
/// in `cfg.precision`. Ties at `max`/`min` split the gradient 0.5/0.5 and clamps pass none
/// at their bounds (torch 2.x's `clamp`: a ratio exactly on a clip bound gets half the
/// gradient, through the unclipped branch only); zero where the loss does not depend on a
/// token (padding, clipped tokens, empty micro-batches), NaN where 0·inf occurs (an
/// overflowed ratio). The fused analytic backward ([`super::fused::compute_fused_with_grad`])
/// when it applies, else [`compute_with_grad_candle`]; both give the same values.
pub fn compute_with_grad(inputs: &LossInputs, cfg: &LossConfig) -> KResult<(LossOutput, Tensor)> {
    match super::fused::compute_fused_with_grad(inputs, cfg)? {
        Some(out) => Ok(out),
        None => compute_with_grad_candle(inputs, cfg),
    }
}

/// [`compute_with_grad`] by candle's reverse-mode autograd over the candle kernels (the
/// reference for the fused backward); metrics from the candle kernels too.
pub fn compute_with_grad_candle(
    inputs: &LossInputs,
    cfg: &LossConfig,
) -> KResult<(LossOutput, Tensor)> {
    let logp = inputs.log_probs.to_dtype(cfg.precision.dtype())?;
    let var = Var::from_tensor(&logp)?;
    let prepared = prepare(inputs, var.as_tensor().clone(), cfg)?;
    let out = run(&prepared, cfg)?;
    let grads = out.loss.backward()?;
    let grad = match grads.get(var.as_tensor()) {
        Some(g) => g.clone(),
        None => var.as_tensor().zeros_like()?.detach(),
    };
    Ok((out, grad))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::presets::preset;
    use candle_core::Device;

    /// verl's token-level TIS and its `loss_scale_factor`, against the formulas written
    /// out: `w = min(exp(old − rollout)·mask, 2)`, `pg = mean(max(−A·r, −A·clip(r)) · w)`
    /// over valid tokens, `loss = pg · rows / 8`.
    #[test]
    fn importance_weights_and_the_loss_scale_follow_verl() {
        let dev = &Device::Cpu;
        let t = |v: &[f64]| Tensor::from_vec(v.to_vec(), (1, v.len()), dev).unwrap();
        let (logp, old, rollout) = (
            [-1.0, -0.5, -2.0, -0.1],
            [-1.1, -0.5, -1.0, -0.3],
            [-1.2, -1.5, -1.0, 0.0],
        );
        let (adv, mask) = (0.7, [1.0, 1.0, 1.0, 0.0]);
        let inputs = LossInputs {
            log_probs: t(&logp),
            old_log_probs: Some(t(&old)),
            ref_log_probs: None,
            advantages: Tensor::from_vec(vec![adv], 1, dev).unwrap(),
            mask: t(&mask),
            entropy: None,
            rollout_log_probs: Some(t(&rollout)),
        };
        let mut cfg = preset("verl-vanilla").unwrap();
        cfg.agg = crate::kernels::aggregate::AggMode::TokenMean;
        cfg.rollout_is = Some(crate::kernels::rollout_is::RolloutIs::token_cap(2.0));
        cfg.loss_scale = LossScale::RowsOver(8.0);
        let out = compute(&inputs, &cfg).unwrap();
        let mut want = 0.0;
        for i in 0..3 {
            let r = (logp[i] - old[i]).exp();
            let w = ((old[i] - rollout[i]).exp() * mask[i]).min(2.0);
            want += (-adv * r).max(-adv * r.clamp(0.8, 1.2)) * w / 3.0;
        }
        let pg = to_f64(&out.pg_loss).unwrap();
        assert!((pg - want).abs() < 1e-15, "{pg} vs {want}");
        assert!((to_f64(&out.loss).unwrap() - want / 8.0).abs() < 1e-15);
        // without rollout log-probs the weights cannot be made: refused, named
        let bare = LossInputs {
            rollout_log_probs: None,
            ..inputs
        };
        let e = compute(&bare, &cfg).unwrap_err().to_string();
        assert!(e.contains("rollout_log_probs"), "{e}");
    }
}

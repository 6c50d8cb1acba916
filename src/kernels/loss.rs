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

use super::advantage::AdvantageConfig;
use super::aggregate::{aggregate, AggMode};
use super::kl::{kl, KlEstimator};
use super::metrics::{nexrl_metrics, trl_clip_fractions, verl_clip_fractions, verl_ppo_kl};
use super::policy_loss::{importance_sampling, ppo_clip, ClipParams};
use super::ratio::{gspo_token_ratio, sequence_ratio, token_log_ratio};
use super::{clamp_torch, dims2, same_shape, to_f64, KResult, KernelError, Precision};

/// Where the importance ratio lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RatioLevel {
    /// `exp(logp − old)` per token (PPO/GRPO).
    Token,
    /// GSPO: one ratio per sequence, gradient through the sequence mean (TRL `sequence`).
    Sequence,
    /// GSPO-token: same value, per-token gradient (verl `gspo` with stop-gradients).
    GspoToken,
}

/// The policy-gradient term.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum PolicyKind {
    /// PPO clip (TRL grpo family, verl vanilla/gspo, mlx).
    Clip(ClipParams),
    /// `−ratio·A`, no clip (NexRL `importance_sampling`).
    ImportanceSampling,
}

/// Where a KL penalty enters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KlPlacement {
    /// Added per token before aggregation: `l + β·kl` (TRL `beta`).
    PerToken,
    /// Aggregated separately with the same mode and added: `pg + β·agg(kl)` (verl
    /// `use_kl_loss`).
    Separate,
}

/// A KL penalty against the reference policy.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct KlTerm {
    /// Estimator.
    pub estimator: KlEstimator,
    /// Coefficient (TRL `beta`, verl `kl_loss_coef`).
    pub coef: f64,
    /// How it is combined.
    pub placement: KlPlacement,
}

/// Every knob of a loss computation; presets fill it, flags override single fields.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LossConfig {
    /// Preset name this config started from.
    pub preset: String,
    /// Ratio level.
    pub ratio_level: RatioLevel,
    /// Clamp on the log-ratio before `exp` (verl vanilla ±20; verl GSPO `(−∞, 10]`).
    pub log_ratio_clamp: Option<(f64, f64)>,
    /// Policy-gradient term.
    pub policy: PolicyKind,
    /// Aggregation of the per-token loss.
    pub agg: AggMode,
    /// Optional KL penalty (needs `ref_log_probs`).
    pub kl: Option<KlTerm>,
    /// Entropy bonus coefficient: `loss −= coeff · agg(entropy)` (needs `entropy`).
    pub entropy_coeff: f64,
    /// Aggregation of the entropy bonus (TRL: masked token mean; verl: the loss's mode).
    pub entropy_agg: AggMode,
    /// Advantages from rewards and group ids, when advantages are not given.
    pub advantage: AdvantageConfig,
    /// Compute in f64 (default) or f32.
    pub precision: Precision,
}

/// Dumped inputs of one micro-batch. `log_probs`, `old_log_probs`, `ref_log_probs`,
/// `mask`, `entropy`: `[B, T]` (any float dtype; the mask may be int/bool, non-zero =
/// valid). `advantages`: `[B]` (one per sequence) or `[B, T]`.
#[derive(Debug, Clone)]
pub struct LossInputs {
    /// Current policy log-probs `[B, T]`.
    pub log_probs: Tensor,
    /// Behaviour (old) policy log-probs `[B, T]`; `None` = on-policy (`logp.detach()`, TRL).
    pub old_log_probs: Option<Tensor>,
    /// Reference policy log-probs `[B, T]` for the KL term.
    pub ref_log_probs: Option<Tensor>,
    /// Advantages `[B]` or `[B, T]`.
    pub advantages: Tensor,
    /// Response mask `[B, T]`.
    pub mask: Tensor,
    /// Per-token entropy `[B, T]` for the entropy bonus and metric.
    pub entropy: Option<Tensor>,
}

/// Scalar metrics of a loss computation, each under its framework's name and convention.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Metrics {
    /// TRL `clip_ratio/low_mean`.
    pub clip_ratio_low: f64,
    /// TRL `clip_ratio/high_mean`.
    pub clip_ratio_high: f64,
    /// TRL `clip_ratio/region_mean`.
    pub clip_ratio_region: f64,
    /// verl `actor/pg_clipfrac`.
    pub pg_clipfrac: f64,
    /// verl `actor/pg_clipfrac_lower`.
    pub pg_clipfrac_lower: f64,
    /// verl `actor/ppo_kl`.
    pub ppo_kl: f64,
    /// NexRL `approx_kl` (masked mean `½Δ²`).
    pub approx_kl: f64,
    /// NexRL `avg_ratio`.
    pub avg_ratio: f64,
    /// NexRL `clip_frac` (`|r − 1| > 0.2`).
    pub clip_frac: f64,
    /// Masked mean of the per-token KL (TRL `kl`), when a KL term is configured.
    pub kl: Option<f64>,
    /// Masked mean entropy, when entropy is given.
    pub entropy: Option<f64>,
}

/// Everything a loss computation produces.
#[derive(Debug, Clone)]
pub struct LossOutput {
    /// The total loss (0-d): policy term + KL − entropy bonus.
    pub loss: Tensor,
    /// The policy-gradient term alone (0-d).
    pub pg_loss: Tensor,
    /// Aggregated KL (0-d), when configured.
    pub kl_loss: Option<Tensor>,
    /// Aggregated entropy (0-d), when entropy is given.
    pub entropy_loss: Option<Tensor>,
    /// Ratio used by the loss `[B, T]` (sequence ratios broadcast over the row).
    pub ratio: Tensor,
    /// Per-token loss before aggregation `[B, T]` (unmasked).
    pub per_token_loss: Tensor,
    /// Logged metrics.
    pub metrics: Metrics,
}

struct Prepared {
    logp: Tensor,
    old: Tensor,
    reference: Option<Tensor>,
    adv: Tensor,
    mask: Tensor,
    entropy: Option<Tensor>,
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
    let reference = match &inp.ref_log_probs {
        Some(r) => {
            let r = r.to_dtype(dt)?;
            same_shape("log_probs", &logp, "ref_log_probs", &r)?;
            Some(r)
        }
        None => None,
    };
    let entropy = match &inp.entropy {
        Some(e) => {
            let e = e.to_dtype(dt)?;
            same_shape("log_probs", &logp, "entropy", &e)?;
            Some(e)
        }
        None => None,
    };
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

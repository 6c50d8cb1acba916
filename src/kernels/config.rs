//! The types every loss computation shares: its configuration ([`LossConfig`] and its
//! parts), its inputs ([`LossInputs`]) and its outputs ([`LossOutput`], [`Metrics`]).
//! [`super::loss`] (the candle reference) and [`super::fused`] (the single-pass path) both
//! read and build them; keeping them here lets the dependency point one way only
//! (`loss` → `fused` → `config`).

use candle_core::Tensor;

use super::advantage::AdvantageConfig;
use super::aggregate::AggMode;
use super::kl::KlEstimator;
use super::policy_loss::ClipParams;
use super::Precision;

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

/// A factor the producer multiplies its total loss by before dumping it (the pg, entropy
/// and KL terms stay unscaled). verl's actor (`verl/workers/actor/dp_actor.py`,
/// `update_policy`, volcengine/verl@cc62eca): `loss = policy_loss * loss_scale_factor`,
/// with `loss_scale_factor = response_mask.shape[0] / ppo_mini_batch_size` under dynamic
/// batch size and `1 / gradient_accumulation` otherwise.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "value")]
pub enum LossScale {
    /// The total as composed (TRL, NexRL's `loss/` files).
    One,
    /// `rows / n` for a micro-batch of `rows` sequences (`n`: the mini-batch's rows).
    RowsOver(f64),
    /// One factor for every micro-batch (`1 / gradient_accumulation`).
    Constant(f64),
}

impl LossScale {
    /// The total as composed (nothing to write).
    pub fn is_one(&self) -> bool {
        *self == LossScale::One
    }

    /// The factor on the total loss of a micro-batch of `rows` sequences (`None` for
    /// [`LossScale::One`]).
    pub fn factor(&self, rows: usize) -> Option<f64> {
        match self {
            LossScale::One => None,
            LossScale::RowsOver(n) => Some(rows as f64 / n),
            LossScale::Constant(s) => Some(*s),
        }
    }
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
    /// The factor on the dumped total loss ([`LossScale::One`] in every preset; not
    /// written when one).
    #[serde(skip_serializing_if = "LossScale::is_one")]
    pub loss_scale: LossScale,
    /// Importance weights against the rollout engine's log-probs (verl 0.9.1
    /// `rollout_corr_helper.py` `compute_rollout_correction_weights`: token-level TIS
    /// `min(exp(clamp(old − rollout, ±20)) · mask, cap)`, an IcePop band, or one weight per
    /// row; [`super::rollout_is`]) multiplying the pg loss element before aggregation
    /// (`pg_losses * rollout_is_weights` in `core_algos.py`
    /// `compute_policy_loss_vanilla`/`_gspo`). Needs [`LossInputs::rollout_log_probs`].
    /// `None` in every preset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout_is: Option<super::rollout_is::RolloutIs>,
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
    /// The rollout engine's log-probs `[B, T]` (verl `rollout_log_probs`), for
    /// [`LossConfig::rollout_is`]'s importance weights.
    pub rollout_log_probs: Option<Tensor>,
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

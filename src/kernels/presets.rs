//! Named bundles of each framework's conventions (`--preset`), every field overridable.
//!
//! | preset | ratio | policy | aggregation | advantages |
//! |---|---|---|---|---|
//! | `trl-grpo` | token | clip 0.2/0.2 | TRL `grpo` | group, unbiased std + 1e-4 |
//! | `trl-bnpo` | token | clip 0.2/0.2 | TRL `bnpo` | as trl-grpo |
//! | `trl-dr-grpo` | token | clip 0.2/0.2 | TRL `dr_grpo` | no std (Dr. GRPO) |
//! | `trl-dapo` | token | clip 0.2/0.28 | TRL `dapo` | as trl-grpo |
//! | `trl-gspo` | sequence | clip 3e-4/4e-4 | TRL `grpo` | as trl-grpo |
//! | `verl-vanilla` | token, log-ratio ±20 | clip 0.2/0.2, dual clip c = 3 | `token-mean` | group, unbiased std + 1e-6, singleton → r |
//! | `verl-dr-grpo` | as verl-vanilla | as verl-vanilla | `seq-mean-token-sum-norm` | no std |
//! | `verl-gspo` | GSPO-token, log ≤ 10 | clip 3e-4/4e-4 | `seq-mean-token-mean` | as verl-vanilla |
//! | `nexrl-is` | token | `−ratio·A` | `token-mean` | as trl-grpo |
//! | `mlx-grpo` | token (ratio vs the reference) | clip 1e-4/1e-4 | `token-mean` (batch) | group, population std + 1e-4, singleton → 0 |
//!
//! mlx-grpo follows mlx-lm-lora's own source, `mlx_lm_lora/trainer/grpo_trainer.py` at
//! commit `dfaaaed530d122cd03156f7e43d1f876d2af3dbc` (Goekdeniz-Guelmez/mlx-lm-lora):
//! - advantages (`calculate_rewards_and_advantages`): `mx.std(prompt_rewards)` (l.313) is
//!   MLX's default `ddof = 0`, the population std; `/(std_reward + 1e-4)` (l.320–322); a
//!   prompt with one completion gets advantage `0.0` (l.323–325);
//! - clip: `epsilon` defaults to `1e-4` (`GRPOTrainingArgs`, l.35–37; `grpo_loss`, l.397)
//!   and `epsilon_high` to `epsilon` (l.475); `coef_2 = mx.clip(coef_1, 1 − epsilon,
//!   1 + epsilon_high)`, `−min(coef_1·A, coef_2·A)` (l.476–488). (The earlier preset used
//!   0.2/0.2, SPEC §4's generic value: fixed.) Override with `--eps-low/--eps-high`;
//! - aggregation, `grpo_loss_type = "grpo"` (the default, l.67–72): `(l·m).sum() /
//!   m.sum()` over the whole micro-batch (l.507–508) — a token mean, NOT TRL's per-sequence
//!   `grpo`; `"bnpo"` divides by `max(m.sum(), 1)` (l.509–510, `--agg bnpo`), `"dr_grpo"` by
//!   `B · max_tokens` (l.511–514, `--agg dr_grpo`). Unlike verl's `token-mean`, mlx's
//!   `l·m` lets a NaN under the mask through;
//! - ratio: `log_ratio = logp − stop_gradient(ref_logp)` (l.465): mlx has no separate old
//!   policy, the reference model plays that role, so pass the reference log-probs as
//!   `old_log_probs`; `importance_sampling_level = "sequence"` (l.137–141) is
//!   `--ratio-level sequence`;
//! - KL: `beta` defaults to `0.1` (l.34) and adds per token `coef_1·exp(logp − ref) −
//!   (logp − ref) − 1` (l.491–501) — [`super::kl::KlEstimator::MlxRatio`] (`--kl mlx
//!   --kl-coef 0.1`, token level). The preset leaves it off so that inputs without
//!   `ref_log_probs` can be checked.
//!
//! MLX runs on Apple silicon only, so mlx-lm-lora could not be run here: unlike the TRL
//! and verl presets, mlx-grpo's values are not checked against the framework's output,
//! only its conventions against the cited source lines.

use super::advantage::{AdvantageConfig, SingletonRule, StdMode};
use super::aggregate::AggMode;
use super::config::{LossConfig, LossScale, PolicyKind, RatioLevel};
use super::policy_loss::ClipParams;
use super::{KResult, KernelError, Precision};

/// Every preset name, in the order `--help` lists them.
pub const PRESETS: [&str; 10] = [
    "trl-grpo",
    "trl-bnpo",
    "trl-dr-grpo",
    "trl-dapo",
    "trl-gspo",
    "verl-vanilla",
    "verl-dr-grpo",
    "verl-gspo",
    "nexrl-is",
    "mlx-grpo",
];

const TRL_ADV: AdvantageConfig = AdvantageConfig {
    std: StdMode::GroupUnbiased,
    eps: 1e-4,
    singleton: SingletonRule::ZeroStd,
};
const VERL_ADV: AdvantageConfig = AdvantageConfig {
    std: StdMode::GroupUnbiased,
    eps: 1e-6,
    singleton: SingletonRule::VerlMeanZeroStdOne,
};

fn clip(lo: f64, hi: f64) -> PolicyKind {
    PolicyKind::Clip(ClipParams {
        eps_low: lo,
        eps_high: hi,
        delta: None,
        clip_ratio_c: None,
    })
}

/// The [`LossConfig`] of a named preset (see the module table). Unknown names are refused
/// with the list of known ones.
pub fn preset(name: &str) -> KResult<LossConfig> {
    let base = LossConfig {
        preset: name.to_string(),
        ratio_level: RatioLevel::Token,
        log_ratio_clamp: None,
        policy: clip(0.2, 0.2),
        agg: AggMode::TrlGrpo,
        kl: None,
        entropy_coeff: 0.0,
        entropy_agg: AggMode::TrlBnpo,
        advantage: TRL_ADV,
        precision: Precision::F64,
        loss_scale: LossScale::One,
        rollout_is: None,
    };
    let cfg = match name {
        "trl-grpo" => base,
        "trl-bnpo" => LossConfig {
            agg: AggMode::TrlBnpo,
            ..base
        },
        "trl-dr-grpo" => LossConfig {
            agg: AggMode::TrlDrGrpo {
                max_completion_length: None,
            },
            advantage: AdvantageConfig {
                std: StdMode::None,
                ..TRL_ADV
            },
            ..base
        },
        "trl-dapo" => LossConfig {
            agg: AggMode::TrlDapo {
                num_items_in_batch: None,
            },
            policy: clip(0.2, 0.28),
            ..base
        },
        "trl-gspo" => LossConfig {
            ratio_level: RatioLevel::Sequence,
            policy: clip(3e-4, 4e-4),
            ..base
        },
        "verl-vanilla" | "verl-dr-grpo" => {
            let dr = name == "verl-dr-grpo";
            LossConfig {
                log_ratio_clamp: Some((-20.0, 20.0)),
                policy: PolicyKind::Clip(ClipParams {
                    eps_low: 0.2,
                    eps_high: 0.2,
                    delta: None,
                    clip_ratio_c: Some(3.0),
                }),
                agg: if dr {
                    AggMode::SeqMeanTokenSumNorm { horizon: None }
                } else {
                    AggMode::TokenMean
                },
                entropy_agg: if dr {
                    AggMode::SeqMeanTokenSumNorm { horizon: None }
                } else {
                    AggMode::TokenMean
                },
                advantage: if dr {
                    AdvantageConfig {
                        std: StdMode::None,
                        ..VERL_ADV
                    }
                } else {
                    VERL_ADV
                },
                ..base
            }
        }
        "verl-gspo" => LossConfig {
            ratio_level: RatioLevel::GspoToken,
            log_ratio_clamp: Some((f64::NEG_INFINITY, 10.0)),
            policy: clip(3e-4, 4e-4),
            agg: AggMode::SeqMeanTokenMean,
            entropy_agg: AggMode::SeqMeanTokenMean,
            advantage: VERL_ADV,
            ..base
        },
        "nexrl-is" => LossConfig {
            policy: PolicyKind::ImportanceSampling,
            agg: AggMode::TokenMean,
            entropy_agg: AggMode::TokenMean,
            ..base
        },
        "mlx-grpo" => LossConfig {
            policy: clip(1e-4, 1e-4),
            agg: AggMode::TokenMean,
            entropy_agg: AggMode::TokenMean,
            advantage: AdvantageConfig {
                std: StdMode::GroupPopulation,
                eps: 1e-4,
                singleton: SingletonRule::ZeroStd,
            },
            ..base
        },
        other => {
            return Err(KernelError::Invalid(format!(
                "unknown preset {other:?}; known presets: {}",
                PRESETS.join(", ")
            )))
        }
    };
    Ok(cfg)
}

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
//! | `mlx-grpo` | token | clip 0.2/0.2 | TRL `grpo` | group, population std + 1e-4 |
//!
//! mlx-grpo follows SPEC §4 (mlx-lm-lora's GRPO: population std, eps 1e-4); its source
//! was not run here, so its values are not checked against the framework.

use super::advantage::{AdvantageConfig, SingletonRule, StdMode};
use super::aggregate::AggMode;
use super::loss::{LossConfig, PolicyKind, RatioLevel};
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

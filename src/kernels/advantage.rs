//! Outcome advantages from per-sequence rewards and group ids (GRPO family).
//!
//! Conventions:
//! - TRL (`GRPOTrainer._generate_and_score_completions`, trl 1.16.0 grpo_trainer.py
//!   l.2765–2787): `(r − group mean) / (nanstd_unbiased + 1e-4)`; `scale_rewards="batch"`
//!   divides by the unbiased std of the whole batch; `"none"` does not divide (Dr. GRPO).
//!   A group of one (num_generations = 1) gets std 0, hence advantage 0.
//! - verl (`core_algos.compute_grpo_outcome_advantage`): unbiased std, eps 1e-6; a group
//!   of one gets mean 0 and std 1 (advantage `r / (1 + eps)`); `norm_adv_by_std_in_grpo =
//!   false` drops the division (Dr. GRPO).
//! - mlx (mlx-lm-lora `grpo_trainer.py` l.308–325, cited in [`super::presets`]): population
//!   std (`mx.std`, ddof 0), eps 1e-4; a group of one
//!   has std 0 and advantage 0.

use std::collections::BTreeMap;

use candle_core::{Device, Tensor};

use super::{KResult, KernelError, Precision};

/// Which standard deviation divides the centred rewards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StdMode {
    /// Unbiased (n − 1) std of each group (TRL, verl).
    GroupUnbiased,
    /// Population (n) std of each group (mlx).
    GroupPopulation,
    /// Unbiased std of the whole batch, group mean still subtracted (TRL `scale_rewards="batch"`).
    BatchUnbiased,
    /// No division (Dr. GRPO: TRL `scale_rewards="none"`, verl `norm_adv_by_std_in_grpo=false`).
    None,
}

/// What a group holding a single sequence gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SingletonRule {
    /// mean 0, std 1: the advantage is the reward itself, `/(1+eps)` (verl).
    VerlMeanZeroStdOne,
    /// std 0: the advantage is `(r − r)/(0 + eps) = 0` (TRL with one generation, mlx).
    ZeroStd,
}

/// Advantage convention knobs.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct AdvantageConfig {
    /// Which std divides.
    pub std: StdMode,
    /// Added to the std before dividing (TRL/mlx 1e-4, verl 1e-6).
    pub eps: f64,
    /// Groups of one sequence.
    pub singleton: SingletonRule,
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// Std with `ddof` (1 unbiased, 0 population); NaN for an unbiased std of one value.
fn std(v: &[f64], ddof: usize) -> f64 {
    let m = mean(v);
    let ss: f64 = v.iter().map(|x| (x - m) * (x - m)).sum();
    if v.len() <= ddof {
        return f64::NAN;
    }
    (ss / (v.len() - ddof) as f64).sqrt()
}

/// Group-normalised advantages, one per sequence.
///
/// `rewards`: `[N]` f64 sequence rewards; `groups`: `[N]` group labels (any ordered key:
/// verl's `uid`, TRL's `i / num_generations`). Returns `[N]` f64. Refuses length
/// mismatches and an empty batch.
pub fn group_advantages<K: Ord + Clone>(
    rewards: &[f64],
    groups: &[K],
    cfg: &AdvantageConfig,
) -> KResult<Vec<f64>> {
    if rewards.len() != groups.len() {
        return Err(KernelError::Invalid(format!(
            "rewards has {} entries but group ids has {}",
            rewards.len(),
            groups.len()
        )));
    }
    if rewards.is_empty() {
        return Err(KernelError::Invalid("no rewards".into()));
    }
    let mut members: BTreeMap<K, Vec<f64>> = BTreeMap::new();
    for (r, g) in rewards.iter().zip(groups) {
        members.entry(g.clone()).or_default().push(*r);
    }
    let batch_std = std(rewards, 1);
    let mut out = Vec::with_capacity(rewards.len());
    for (r, g) in rewards.iter().zip(groups) {
        let vals = members.get(g).map(Vec::as_slice).unwrap_or(&[]);
        let (m, s) = if vals.len() == 1 {
            match cfg.singleton {
                SingletonRule::VerlMeanZeroStdOne => (0.0, 1.0),
                SingletonRule::ZeroStd => (vals[0], 0.0),
            }
        } else {
            let s = match cfg.std {
                StdMode::GroupUnbiased => std(vals, 1),
                StdMode::GroupPopulation => std(vals, 0),
                StdMode::BatchUnbiased => batch_std,
                StdMode::None => 0.0,
            };
            (mean(vals), s)
        };
        out.push(match cfg.std {
            StdMode::None => r - m,
            _ => (r - m) / (s + cfg.eps),
        });
    }
    Ok(out)
}

/// [`group_advantages`] broadcast over a response mask as verl returns them:
/// `A[i] * mask[i, t]`, shape `[N, T]`, in `precision`. `mask`: `[N, T]` float.
pub fn token_advantages(adv: &[f64], mask: &Tensor, precision: Precision) -> KResult<Tensor> {
    let (n, _) = super::dims2("response_mask", mask)?;
    if n != adv.len() {
        return Err(KernelError::Invalid(format!(
            "advantages has {} rows but response_mask has {n}",
            adv.len()
        )));
    }
    let a = Tensor::from_slice(adv, (n, 1), &Device::Cpu)?.to_dtype(precision.dtype())?;
    Ok(a.broadcast_mul(&mask.to_dtype(precision.dtype())?)?)
}

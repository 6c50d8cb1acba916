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

/// [`group_advantages`] with NexRL's run ids: when several trajectories of a group share a
/// run id (an agent run yielding more than one), NexRL's GRPO mean is two-stage — the mean
/// of each run's mean reward — and its std the unbiased std of those run means (1 when the
/// group holds one run): `nexrl/algorithm/core_algos.py` `compute_grpo_outcome_advantage(
/// …, run_ids)`, nex-agi/NexRL@6860191. Used only under the unbiased group std (NexRL's);
/// without run ids, or with every run holding one trajectory, it is [`group_advantages`].
/// `rewards`, `groups`, `runs`: one entry per trajectory (`[B]`, f64).
pub fn group_advantages_runs<K: Ord + Clone>(
    rewards: &[f64],
    groups: &[K],
    runs: &[Option<String>],
    cfg: &AdvantageConfig,
) -> KResult<Vec<f64>> {
    let stats = match cfg.std {
        StdMode::GroupUnbiased => two_stage(rewards, groups, runs),
        _ => None,
    };
    let Some(stats) = stats else {
        return group_advantages(rewards, groups, cfg);
    };
    Ok(rewards
        .iter()
        .zip(stats)
        .map(|(r, (m, s, n))| {
            let (m, s) = match (n, cfg.singleton) {
                (1, SingletonRule::VerlMeanZeroStdOne) => (0.0, 1.0),
                (1, SingletonRule::ZeroStd) => (*r, 0.0),
                _ => (m, s),
            };
            (r - m) / (s + cfg.eps)
        })
        .collect())
}

/// Per trajectory, NexRL's two-stage group statistics `(mean, std, group size)` (see
/// [`group_advantages_runs`]): `None` unless every trajectory has a run id and some run
/// holds more than one trajectory of its group, or the lengths differ.
pub fn two_stage<K: Ord + Clone>(
    rewards: &[f64],
    groups: &[K],
    runs: &[Option<String>],
) -> Option<Vec<(f64, f64, usize)>> {
    if rewards.len() != groups.len() || runs.len() != groups.len() {
        return None;
    }
    let keyed: Vec<(&K, &String)> = groups
        .iter()
        .zip(runs)
        .map(|(g, r)| r.as_ref().map(|r| (g, r)))
        .collect::<Option<_>>()?;
    let distinct: std::collections::BTreeSet<&(&K, &String)> = keyed.iter().collect();
    if distinct.len() == keyed.len() {
        return None;
    }
    // per group: its rewards by run, in first-seen order of the runs
    let mut members: BTreeMap<&K, Vec<(&String, Vec<f64>)>> = BTreeMap::new();
    for (r, (g, run)) in rewards.iter().zip(&keyed) {
        let runs = members.entry(*g).or_default();
        match runs.iter_mut().find(|(k, _)| k == run) {
            Some((_, v)) => v.push(*r),
            None => runs.push((*run, vec![*r])),
        }
    }
    let stats: BTreeMap<&K, (f64, f64, usize)> = members
        .into_iter()
        .map(|(g, runs)| {
            let n = runs.iter().map(|(_, v)| v.len()).sum();
            let means: Vec<f64> = runs.iter().map(|(_, v)| mean(v)).collect();
            let s = if means.len() <= 1 {
                1.0
            } else {
                std(&means, 1)
            };
            (g, (mean(&means), s, n))
        })
        .collect();
    Some(keyed.iter().map(|(g, _)| stats[*g]).collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: AdvantageConfig = AdvantageConfig {
        std: StdMode::GroupUnbiased,
        eps: 1e-6,
        singleton: SingletonRule::ZeroStd,
    };

    fn runs(ids: &[&str]) -> Vec<Option<String>> {
        ids.iter().map(|s| Some(s.to_string())).collect()
    }

    #[test]
    fn nexrls_run_ids_give_the_two_stage_mean_and_the_std_of_run_means() {
        // one group; runs a (rewards 1, 0), b (1), c (0): run means 0.5, 1, 0, their mean
        // 0.5 and unbiased std 0.5 (NexRL compute_grpo_outcome_advantage with run_ids)
        let g = ["g"; 4];
        let adv = group_advantages_runs(
            &[1.0, 0.0, 1.0, 0.0],
            &g,
            &runs(&["a", "a", "b", "c"]),
            &CFG,
        )
        .unwrap();
        let k = 0.5 / (0.5 + 1e-6);
        assert_eq!(adv, vec![k, -k, k, -k]);
        // one run in the group: its mean, std 1 (NexRL's guard against Bessel's NaN)
        let adv = group_advantages_runs(&[1.0, 0.0, 0.0, 0.0], &g, &runs(&["r"; 4]), &CFG).unwrap();
        let d = 1.0 + 1e-6;
        assert_eq!(adv, vec![0.75 / d, -0.25 / d, -0.25 / d, -0.25 / d]);
        // every run of one trajectory, or no run ids: the plain group advantages
        let r = [1.0, 0.0, 1.0, 0.0];
        let plain = group_advantages(&r, &g, &CFG).unwrap();
        assert_eq!(
            group_advantages_runs(&r, &g, &runs(&["a", "b", "c", "d"]), &CFG).unwrap(),
            plain
        );
        assert_eq!(
            group_advantages_runs(&r, &g, &[None, None, None, None], &CFG).unwrap(),
            plain
        );
        // another std mode: run ids are NexRL's GRPO only
        let pop = AdvantageConfig {
            std: StdMode::GroupPopulation,
            ..CFG
        };
        assert_eq!(
            group_advantages_runs(&r, &g, &runs(&["a", "a", "b", "c"]), &pop).unwrap(),
            group_advantages(&r, &g, &pop).unwrap()
        );
    }
}

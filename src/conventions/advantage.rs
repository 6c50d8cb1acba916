//! The epsilon of group-normalised advantages `(r − mean)/(std + ε)`: a convention of each
//! producer (TRL 1e-4, verl 1e-6) that no dump states. Two kinds of evidence settle it,
//! one rule set for both tools:
//!
//! - dumped advantages beside the rewards they came from (dumpdiff: the weaver's
//!   `is_loss_debug` rows against the self-hosted trajectories; remote-api
//!   `prepared_trajectories`): each row implies ε exactly ([`eps_estimate`]); the median
//!   of the rows in range, snapped to a [`CUSTOMARY`] value ([`infer_eps`]);
//! - rewards only (losscheck on a self-hosted tree): each of [`CANDIDATES`] is tried and
//!   the one under which the most cells' dumped pg terms follow is taken.

use std::collections::BTreeMap;

use crate::kernels::advantage::{AdvantageConfig, SingletonRule, StdMode};
use crate::model::trajectory::TrajectorySummary;

/// Per trajectory of the batch, `(r − mean, std)` of the group-normalised advantage
/// `(r − mean) / (std + eps)` under `cfg` (its std mode and singleton rule): what an
/// advantage needs besides `eps`. `None` when a reward or group is missing, or the
/// convention does not divide by a std (no epsilon to infer).
pub fn advantage_parts(traj: &TrajectorySummary, cfg: &AdvantageConfig) -> Option<Vec<(f64, f64)>> {
    if cfg.std == StdMode::None || traj.rows.is_empty() {
        return None;
    }
    let rewards: Vec<f64> = traj.rows.iter().map(|t| t.reward).collect::<Option<_>>()?;
    let groups: Vec<&str> = traj
        .rows
        .iter()
        .map(|t| t.group.as_deref())
        .collect::<Option<_>>()?;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let std = |v: &[f64], ddof: usize| {
        let m = mean(v);
        (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - ddof) as f64).sqrt()
    };
    // NexRL's run ids: the two-stage mean and std of the run means
    if cfg.std == StdMode::GroupUnbiased {
        let runs: Vec<Option<String>> = traj.rows.iter().map(|t| t.ids.run_id.clone()).collect();
        if let Some(stats) = crate::kernels::advantage::two_stage(&rewards, &groups, &runs) {
            return Some(
                rewards
                    .iter()
                    .zip(stats)
                    .map(|(r, (m, s, n))| match (n, cfg.singleton) {
                        (1, SingletonRule::VerlMeanZeroStdOne) => (*r, 1.0),
                        (1, SingletonRule::ZeroStd) => (0.0, 0.0),
                        _ => (r - m, s),
                    })
                    .collect(),
            );
        }
    }
    let mut members: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (r, g) in rewards.iter().zip(&groups) {
        members.entry(g).or_default().push(*r);
    }
    let batch_std = if rewards.len() > 1 {
        std(&rewards, 1)
    } else {
        f64::NAN
    };
    Some(
        rewards
            .iter()
            .zip(&groups)
            .map(|(r, g)| {
                let vals = members.get(g).map(Vec::as_slice).unwrap_or(&[]);
                if vals.len() == 1 {
                    return match cfg.singleton {
                        SingletonRule::VerlMeanZeroStdOne => (*r, 1.0),
                        SingletonRule::ZeroStd => (0.0, 0.0),
                    };
                }
                let s = match cfg.std {
                    StdMode::GroupUnbiased => std(vals, 1),
                    StdMode::GroupPopulation => std(vals, 0),
                    StdMode::BatchUnbiased => batch_std,
                    StdMode::None => 0.0,
                };
                (r - mean(vals), s)
            })
            .collect(),
    )
}

/// The epsilon one dumped advantage `a` implies for a trajectory with `(r − mean, std)`
/// = `(d, s)`: `a = d / (s + eps)` ⇒ `eps = d / a − s`. `None` when `a` or `d` is zero
/// (no information) or their signs differ.
pub fn eps_estimate(d: f64, s: f64, a: f64) -> Option<f64> {
    (d != 0.0 && a != 0.0 && d.signum() == a.signum() && s.is_finite()).then(|| d / a - s)
}

/// Largest epsilon taken for a convention (TRL 1e-4, verl 1e-6; 0.1 would be a different
/// normalisation, not an epsilon).
const EPS_MAX: f64 = 1e-2;

/// The customary epsilons an inferred one is snapped to when within f32 rounding of one.
pub const CUSTOMARY: [f64; 6] = [0.0, 1e-8, 1e-6, 1e-5, 1e-4, 1e-3];

/// The epsilons a tree that dumps rewards but no advantages is judged under besides its
/// preset's (losscheck on self-hosted trees: the one under which most cells' pg terms
/// follow): TRL's `1e-4` (`grpo_trainer.py`, `(r − mean)/(std + 1e-4)`) and verl's `1e-6`
/// (`core_algos.py`, `compute_grpo_outcome_advantage(epsilon=1e-6)`).
pub const CANDIDATES: [f64; 2] = [1e-4, 1e-6];

/// The epsilon that the per-row estimates of every cell agree on: the median of those in
/// `[−1e-6, EPS_MAX]` (a row normalised otherwise, e.g. by the population std, implies a
/// negative epsilon and is left out), snapped to the customary value it is within f32
/// rounding of. `None` without estimates in range.
pub fn infer_eps(estimates: &[f64]) -> Option<(f64, usize)> {
    let mut v: Vec<f64> = estimates
        .iter()
        .copied()
        .filter(|e| e.is_finite() && (-1e-6..=EPS_MAX).contains(e))
        .collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let med = v[v.len() / 2].max(0.0);
    let snapped = CUSTOMARY
        .into_iter()
        .find(|c| (med - c).abs() <= 2e-7 + 1e-3 * c)
        .unwrap_or(med);
    Some((snapped, v.len()))
}

/// The advantage epsilon that given per-trajectory advantages (remote-api
/// `prepared_trajectories`, by self-hosted batch index) imply for the trajectories'
/// rewards and groups under `preset`'s normalisation ([`advantage_parts`],
/// [`eps_estimate`], [`infer_eps`]). `None` for an unknown preset, missing rewards or
/// groups, or no row that tells.
pub fn eps_of_advantages(
    traj: &TrajectorySummary,
    preset: &str,
    advantages: &[f64],
) -> Option<f64> {
    let cfg = crate::kernels::presets::preset(preset).ok()?.advantage;
    let parts = advantage_parts(traj, &cfg)?;
    let est: Vec<f64> = parts
        .iter()
        .zip(advantages)
        .filter(|(_, a)| a.is_finite())
        .filter_map(|(&(d, s), &a)| eps_estimate(d, s, a))
        .collect();
    infer_eps(&est).map(|(e, _)| e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eps_is_the_median_of_rows_in_range_snapped() {
        // d = 0.5, s = 0.7071: a verl row (1e-6), a TRL-normalised outlier (negative).
        let (d, s) = (0.5, std::f64::consts::FRAC_1_SQRT_2);
        let a = |eps: f64| ((d / (s + eps)) as f32) as f64;
        let est: Vec<f64> = [1e-6, 1e-6, 1e-6]
            .iter()
            .map(|&e| eps_estimate(d, s, a(e)).unwrap())
            .chain([eps_estimate(d, s, d / 0.5).unwrap()])
            .collect();
        assert!(est[3] < -0.2);
        assert_eq!(infer_eps(&est), Some((1e-6, 3)));
        assert_eq!(eps_estimate(0.0, s, 0.3), None);
        assert_eq!(eps_estimate(0.5, s, -0.3), None);
        assert_eq!(infer_eps(&[-0.2]), None);
    }
}

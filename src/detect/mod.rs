//! Failure-signature detectors over the normalised log frame. One trait, one file per
//! family; every detector has a flag, documented default thresholds (overridable with
//! `--threshold name=value`) and a severity.
//!
//! | detector | fires when (defaults) | severity |
//! |---|---|---|
//! | zero-loss | \|loss\| ≤ 1e-8 on ≥ 2 consecutive logged steps; an error when at least half of them show no signal (reward std / \|adv\| / grad norm ≤ 1e-6, frac_reward_zero_std 1, an "All advantages are near zero" warning; kl 0 only in a log with no reward); info when grad_norm or reward_std > 0 (the GRPO display) | error / info / warning without evidence |
//! | dead-groups | frac_reward_zero_std ≥ 0.5 on ≥ 25 % of logged steps, or reward std exactly 0 on ≥ 2 steps (or ≥ 25 %), or every group dead on 10 logged steps in a row whatever their share | warning, error when ≥ 90 % |
//! | nan-grad | any non-finite grad_norm/loss/kl/reward/entropy, `nan_gradient` events, grad_nan_count > 0, loss 0.0 next to a NaN grad norm | critical |
//! | grad-spike | grad_norm > 10 × median of the previous 20 (≥ 5 of history) | warning |
//! | zero-grad | 0 ≤ grad_norm ≤ 1e-10 for ≥ 2 consecutive steps | error |
//! | kl-explosion | kl > 1.0, or kl > 10 × median of previous 20 and > 0.1 | error |
//! | kl-negative | kl < −1e-6 (k3/low-var KL cannot be negative) | error |
//! | entropy-collapse | entropy < 0.05 or < 10 % of its first-5 median, ≥ 3 consecutive steps | warning |
//! | truncation | truncation_ratio ≥ 0.2; num_eos_tokens 0 on most steps; mean length = max length | warning, error ≥ 0.5 / no EOS / mean = max |
//! | empty-completions | completion_len_min = 0, empty_count > 0, `empty_completion_tokens` events | warning, error when ≥ 25 % of completions are empty |
//! | adv-explosion | 0 < reward_std < 1e-3 (advantages divided by a tiny std) or \|adv\| > 10 | warning |
//! | slowdown | lower quartile of the last quarter > 1.5 × the first quarter's (spikes left out); at least half the later steps slower than 2 × the first (compile) step; a spike > 3 × median of previous 20 that no eval/checkpoint explains and that does not recur with a fixed period | warning (compile, eval/checkpoint and periodic spikes: info, named) |
//! | mem-growth | peak memory grows > 20 % from first to last (and > 5 % over the second half: a warm-up that settles is not a leak), ≥ 5 points, rising ≥ 80 % of the time | warning |
//! | logprob-mismatch | means, not a single token's max: prob diff mean > 0.05, \|logp diff\| mean > 0.1, rollout KL (verl rollout_corr, OpenRLHF vllm_kl) > 0.1, \|ratio_mean − 1\| > 0.2, "All sequence_log_probs are near zero" | error |
//! | plateau | reward mean of last 25 % ≤ first 25 % + 0.01 over ≥ 20 points; or ≥ 4 points over ≥ 500 steps within ±20 % of their mean; or ≥ 5 points within ±1 % of their mean (stuck); a reward earned, then exactly 0 on the last ≥ 3 logged steps (collapsed); with no reward or RL metric, a loss within ±0.3 % of its mean on ≥ 6 logged steps (frozen) | warning |
//! | grad-not-flowing | grad_norm exactly 0 while reward_std > 0 (and not every group dead) | error |
//! | clip-high | clip ratio ≥ 0.2 on at least half of the steps | warning, error ≥ 0.5 |
//! | reward-constant | a reward component identical at every one of ≥ 5 logged steps (≥ 3 when it is 0: never matches; 1.0 everywhere: always matches, no signal) | warning |
//! | bounds | grad norm (also the critic's) > 1e4, \|loss\| > 1e4, entropy > ln(262144) nats: absolute, from the first step | error (loss: warning) |
//! | first-update | at an explicit step 0/1: \|ppo_kl\| > 2e-3, clip fraction > 0.02, \|ratio − 1\| > 0.02 or KL to the reference > 0.05 | warning |
//! | kl-zero | kl exactly 0 on ≥ 10 consecutive logged steps (β = 0 or reference = policy); only in a log with a reward (RL), not DPO/KTO | warning |
//! | preference | DPO/KTO/ORPO (recognised from `rewards/*`, `logps/*`): accuracies 1.0 (warning) or 0.5 (error) on ≥ 80 % of ≥ 5 steps; margins saturating (last-quarter loss ≤ 0.05, margin ≥ 5 and rising); chosen and rejected log-probs both falling by > 5 % | warning / error |
//!
//! | stages | `[Micro k] n. <stage>: … time=…s` lines: the stage with the largest share of iteration time (info); a stage whose last-quarter mean > 1.5 × its first quarter's | info / warning |
//!
//! The completions themselves (blank, garbled, template leak, loops, one answer for every
//! prompt, never-terminating) are judged by [`completions_text`]; [`hypotheses`] gives a
//! verdict per hypothesis for a run that does not improve (`logscan --why`).
//!
//! On a preference run (DPO family) GRPO's KL rules do not run (KTO's `kl` is a batch estimate)
//! and zero-grad fires on a single step (a DPO loss always has a gradient).

mod bounds;
pub mod classify;
mod completions;
pub mod completions_eos;
pub mod completions_text;
mod crash;
pub mod hypotheses;
mod kl;
mod loss;
mod numeric;
mod perf;
pub mod preference;
mod stages;
mod window;

use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::frames::log::frame::LogFrame;
use crate::model::log::LogEvent;
pub(crate) use window::spikes;

pub use crate::json::json_num;
pub use crate::model::finding::{Finding, Severity, MAX_STEPS_LISTED};

/// Every threshold: (name, default, meaning). The module doc's table says the same.
pub const THRESHOLDS: &[(&str, f64, &str)] = &[
    ("zero_loss.eps", 1e-8, "|loss| at or below this is zero"),
    (
        "zero_loss.std_eps",
        1e-6,
        "reward std, |advantage|, grad norm or kl at or below this is zero",
    ),
    (
        "zero_loss.min_steps",
        2.0,
        "consecutive logged steps needed",
    ),
    (
        "dead_groups.frac",
        0.5,
        "frac_reward_zero_std at or above this marks a dead-group step",
    ),
    (
        "dead_groups.min_share",
        0.25,
        "share of logged steps that must be dead-group steps",
    ),
    (
        "dead_groups.error_share",
        0.9,
        "share of dead-group steps that makes it an error",
    ),
    // A step with reward_std exactly 0 (mean of group stds: TRL, DebugTrainer) wasted
    // every group; two of them are a pattern, not a rounding accident.
    (
        "dead_groups.min_steps",
        2.0,
        "steps with reward_std exactly 0 reported below dead_groups.min_share",
    ),
    // ... as long as they are not a rounding accident in a long healthy run (1 in 20).
    (
        "dead_groups.min_wasted_share",
        0.05,
        "share of logged steps those reward_std-0 steps must reach",
    ),
    // Ten fully dead steps in a row are reported whatever their share of the run.
    (
        "dead_groups.sustained_steps",
        10.0,
        "consecutive logged steps with every group dead reported below dead_groups.min_share",
    ),
    (
        "grad_spike.factor",
        10.0,
        "grad_norm above factor x median of the previous window",
    ),
    ("grad_spike.window", 20.0, "previous steps in the median"),
    (
        "grad_spike.min_history",
        5.0,
        "previous steps needed before judging",
    ),
    ("zero_grad.eps", 1e-10, "grad_norm at or below this is zero"),
    (
        "zero_grad.min_steps",
        2.0,
        "consecutive logged steps needed",
    ),
    ("kl_explosion.abs", 1.0, "kl above this is an explosion"),
    (
        "kl_explosion.factor",
        10.0,
        "kl above factor x median of previous window (and above floor)",
    ),
    (
        "kl_explosion.floor",
        0.1,
        "relative rule applies only above this kl",
    ),
    ("kl_negative.eps", 1e-6, "kl below -eps is negative"),
    (
        "entropy_collapse.abs",
        0.05,
        "entropy below this is collapsed",
    ),
    (
        "entropy_collapse.ratio",
        0.1,
        "entropy below ratio x its first-5 median is collapsed",
    ),
    (
        "entropy_collapse.min_steps",
        3.0,
        "consecutive logged steps needed",
    ),
    (
        "truncation.ratio",
        0.2,
        "truncation ratio at or above this is a warning",
    ),
    (
        "truncation.error_ratio",
        0.5,
        "truncation ratio at or above this is an error",
    ),
    (
        "empty.error_frac",
        0.25,
        "share of empty completions that makes it an error",
    ),
    (
        "adv_explosion.std_max",
        1e-3,
        "0 < reward std below this blows advantages up",
    ),
    ("adv_explosion.abs", 10.0, "|advantage| above this"),
    (
        "slowdown.spike_factor",
        3.0,
        "step time above factor x median of previous window",
    ),
    ("slowdown.window", 20.0, "previous steps in the median"),
    (
        "slowdown.trend_factor",
        1.5,
        "last-quarter median above factor x first-quarter median",
    ),
    (
        "slowdown.compile_factor",
        2.0,
        "first step above factor x median of the rest is compile time",
    ),
    (
        "mem_growth.frac",
        0.2,
        "growth from first to last above this fraction",
    ),
    ("mem_growth.min_points", 5.0, "points needed"),
    (
        "logprob_mismatch.diff_mean",
        0.05,
        "mean rollout/trainer prob diff above this",
    ),
    // verl docs (rollout_corr.md): |rollout_corr/kl| > 0.1 is a significant off-policy gap;
    // healthy runs log ~1e-3. Used for rollout_corr/kl, k3_kl and OpenRLHF vllm_kl.
    (
        "logprob_mismatch.kl",
        0.1,
        "rollout-to-trainer KL (verl rollout_corr/kl, k3_kl; OpenRLHF vllm_kl) above this",
    ),
    // TRL sampling/sampling_logp_difference/mean is mean |logp_train - logp_vllm|, the same
    // per-token scale as the k1 KL above: the same 0.1 bound.
    (
        "logprob_mismatch.logp_diff_mean",
        0.1,
        "mean |logp trainer - logp rollout| (TRL sampling/*, verl log_ppl_abs_diff) above this",
    ),
    (
        "logprob_mismatch.ratio_dev",
        0.2,
        "|ratio_mean - 1| above this",
    ),
    (
        "plateau.min_gain",
        0.01,
        "reward gain (last vs first quarter) below this is a plateau",
    ),
    // 20 logged points: a GRPO reward over fewer steps is too noisy to call flat.
    ("plateau.min_points", 20.0, "reward points needed"),
    (
        "plateau.flat_min_points",
        4.0,
        "with fewer points than plateau.min_points: points needed for the long-horizon rule",
    ),
    // A thousand-step PPO/GRPO run should move its reward; 500 steps is half of that.
    (
        "plateau.flat_min_span",
        500.0,
        "long-horizon rule: logged steps must span at least this many steps",
    ),
    (
        "plateau.flat_band",
        0.2,
        "long-horizon rule: reward range within this fraction of its mean is flat",
    ),
    // A learning model's batch loss moves by 1-5 % from batch to batch; aws-samples/deep-
    // learning-models#45's BERT held 11.166-11.177 (0.1 %) for 70 steps, MLM accuracy 0.
    (
        "plateau.frozen_loss_band",
        0.003,
        "supervised log: loss range within this fraction of its mean on every logged step is frozen",
    ),
    (
        "plateau.frozen_loss_points",
        6.0,
        "supervised log: logged losses needed for the frozen-loss rule",
    ),
    // A batch-mean reward-model score moves by more than 1 % from step to step while the
    // policy learns; a run that stays inside 1 % of its mean collapsed or stopped learning.
    (
        "plateau.stuck_band",
        0.01,
        "short-log rule: reward range within this fraction of its mean is stuck",
    ),
    (
        "plateau.stuck_min_points",
        5.0,
        "short-log rule: reward points needed",
    ),
    (
        "plateau.collapse_min_steps",
        3.0,
        "a reward earned, then exactly 0 on at least this many logged steps to the end: collapsed",
    ),
    (
        "reward_constant.min_points",
        5.0,
        "logged points a reward component needs before it is judged constant",
    ),
    // A reward function at exactly 0 on three logged steps (each a batch mean) has not
    // matched once in hundreds of completions.
    (
        "reward_constant.zero_min_points",
        3.0,
        "logged points a reward component at exactly 0 needs before it is judged never matching",
    ),
    // PPO practice (OpenAI baselines / SB3 docs): clipfrac around 0.1-0.2 is normal; above
    // 0.2 the step is too large for the trust region, above 0.5 most of it is discarded.
    (
        "clip_high.ratio",
        0.2,
        "clip ratio at or above this, on at least half of the steps, is too high",
    ),
    (
        "clip_high.error_ratio",
        0.5,
        "clip ratio at or above this makes it an error",
    ),
    // No healthy LLM run logs a pre-clip grad norm of 1e4 (healthy: 0.01-100).
    (
        "bounds.grad_norm",
        1e4,
        "grad norm (policy or critic) above this is broken whatever the history",
    ),
    ("bounds.loss", 1e4, "|loss| above this is broken"),
    // TRL's `logits/chosen` is the mean logit over the tokens and the vocabulary: healthy
    // DPO runs log -2 to -110 (trl#1236, trl#570); -2e8 (LLaMA-Factory#7380) is no logit
    // a softmax could have been fed.
    (
        "bounds.logits",
        1e4,
        "|mean logit| of a preference batch above this is broken numerics",
    ),
    // On the first update ratio = 1 exactly for the first micro-batch; mini-batch averages
    // of healthy verl runs stay near 1e-4 (ppo_kl) and 1e-3 (clip fraction).
    (
        "first_update.ppo_kl",
        2e-3,
        "|ppo_kl| at the run's first step above this",
    ),
    (
        "first_update.clip",
        0.02,
        "clip fraction at the run's first step above this",
    ),
    (
        "first_update.ratio",
        0.02,
        "|ratio_mean - 1| at the run's first step above this",
    ),
    // The reference is the initial policy: its KL is 0 on the first micro-batch; the
    // mini-batch updates averaged into step 1 move it by ~1e-3, a noisy estimator by ~1e-2;
    // a reference that is another checkpoint starts far above.
    (
        "first_update.kl",
        0.05,
        "KL to the reference at the run's first step above this",
    ),
    (
        "kl_zero.min_steps",
        10.0,
        "consecutive logged steps with kl exactly 0",
    ),
    (
        "stages.growth_factor",
        1.5,
        "a stage's last-quarter mean above factor x its first-quarter mean grows",
    ),
    (
        "preference.min_points",
        5.0,
        "logged points a preference metric needs before it is judged",
    ),
    (
        "preference.stuck_share",
        0.8,
        "share of steps with accuracies exactly 1.0 / 0.5 that makes them stuck",
    ),
    // -log sigmoid(3) = 0.049: the preference loss is flat from a margin of ~3 on.
    (
        "preference.saturated_loss",
        0.05,
        "mean loss over the last quarter at or below this (with rising margins) is saturated",
    ),
    (
        "preference.saturated_margin",
        5.0,
        "mean reward margin over the last quarter at or above this is saturated",
    ),
    (
        "preference.logp_drop",
        0.05,
        "chosen and rejected log-probs both falling by more than this share of |chosen|",
    ),
];

/// Threshold values: the defaults of [`THRESHOLDS`] with user overrides.
#[derive(Debug, Clone)]
pub struct Thresholds {
    values: BTreeMap<&'static str, f64>,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            values: THRESHOLDS.iter().map(|(k, v, _)| (*k, *v)).collect(),
        }
    }
}

impl Thresholds {
    /// Override from `name=value` strings; unknown names are a usage error.
    pub fn with_overrides(overrides: &[String]) -> Result<Thresholds> {
        let mut t = Thresholds::default();
        for o in overrides {
            let (k, v) = o
                .split_once('=')
                .ok_or_else(|| Error::Usage(format!("--threshold {o}: expected name=value")))?;
            let key = THRESHOLDS
                .iter()
                .map(|(n, _, _)| *n)
                .find(|n| *n == k.trim())
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "--threshold {o}: unknown threshold {k:?} (see logscan --help)"
                    ))
                })?;
            let v: f64 = v
                .trim()
                .parse()
                .map_err(|_| Error::Usage(format!("--threshold {o}: {v:?} is not a number")))?;
            t.values.insert(key, v);
        }
        Ok(t)
    }

    /// The value of threshold `name` (0 for a name not in [`THRESHOLDS`], a programming error
    /// caught by the unit test `every_threshold_used_is_declared`).
    pub fn get(&self, name: &str) -> f64 {
        self.values.get(name).copied().unwrap_or(0.0)
    }
}

/// What a detector sees.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The normalised frame.
    pub frame: &'a LogFrame,
    /// Discrete events (warnings, NaN gradients, empty completions).
    pub events: &'a [LogEvent],
    /// Thresholds.
    pub th: &'a Thresholds,
}

/// A failure-signature detector.
pub trait Detector: Sync {
    /// Flag name without `--` (`zero-loss`).
    fn name(&self) -> &'static str;
    /// One-line description for `--help`.
    fn summary(&self) -> &'static str;
    /// Canonical metrics it reads: a scan running only some detectors keeps only these
    /// columns (tests compare each detector alone with all of them).
    fn metrics(&self) -> &'static [&'static str];
    /// True when it reads the per-row timestamps.
    fn uses_timestamps(&self) -> bool {
        false
    }
    /// Findings over the frame and events.
    fn detect(&self, ctx: &Context) -> Vec<Finding>;
}

/// Every detector, in report order.
pub fn all_detectors() -> Vec<Box<dyn Detector>> {
    vec![
        Box::new(numeric::NanGrad),
        Box::new(loss::ZeroLoss),
        Box::new(completions::DeadGroups),
        Box::new(numeric::GradSpike),
        Box::new(numeric::ZeroGrad),
        Box::new(kl::KlExplosion),
        Box::new(kl::KlNegative),
        Box::new(kl::EntropyCollapse),
        Box::new(completions::Truncation),
        Box::new(completions::EmptyCompletions),
        Box::new(numeric::AdvExplosion),
        Box::new(perf::Slowdown),
        Box::new(perf::MemGrowth),
        Box::new(kl::LogprobMismatch),
        Box::new(loss::Plateau),
        Box::new(numeric::GradNotFlowing),
        Box::new(completions::ClipHigh),
        Box::new(loss::RewardConstant),
        Box::new(bounds::Bounds),
        Box::new(bounds::FirstUpdate),
        Box::new(bounds::KlZero),
        Box::new(preference::Preference),
        Box::new(stages::Stages),
        Box::new(crash::Crash),
    ]
}

/// Run the detectors named in `only` (all when empty) and sort findings by severity
/// (worst first), then first step.
pub fn run_detectors(ctx: &Context, only: &[String]) -> Vec<Finding> {
    // Detectors run in parallel; their findings are joined in detector order.
    use rayon::prelude::*;
    let mut out: Vec<Finding> = all_detectors()
        .par_iter()
        .filter(|d| only.is_empty() || only.iter().any(|o| o == d.name()))
        .flat_map_iter(|d| d.detect(ctx))
        .collect();
    out.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(a.first_step.cmp(&b.first_step))
    });
    // With every detector run, "did not fire" is known; with a selection it is not.
    if only.is_empty() {
        cite_only_fired(&mut out);
    }
    out
}

/// A cause that points at other detectors (`… (see zero-loss, dead-groups)`) names only
/// those that fired: a cause must not cite evidence the report does not hold.
pub(crate) fn cite_only_fired(findings: &mut [Finding]) {
    let fired: Vec<String> = findings.iter().map(|f| f.detector.clone()).collect();
    for f in findings.iter_mut() {
        for cause in &mut f.likely_causes {
            let Some(open) = cause.find(" (see ") else {
                continue;
            };
            let Some(close) = cause[open..].find(')').map(|c| open + c) else {
                continue;
            };
            let names: Vec<&str> = cause[open + 6..close]
                .split(',')
                .map(str::trim)
                .filter(|n| fired.iter().any(|d| d == n))
                .collect();
            let rest = cause[close + 1..].to_string();
            let head = cause[..open].to_string();
            *cause = if names.is_empty() {
                format!("{head}{rest}")
            } else {
                format!("{head} (see {}){rest}", names.join(", "))
            };
        }
    }
}

/// Runs of consecutive flagged positions: `[(start, end_inclusive)]` over indices 0..n.
pub(crate) fn runs(flags: &[bool]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, f) in flags.iter().enumerate() {
        match (f, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i - 1));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, flags.len() - 1));
    }
    out
}

/// `a` then `b` as one array of `N = a.len() + b.len()` names, at compile time: a
/// detector's metric list built from shared ones (the preference markers) instead of a
/// hand-kept copy. A wrong `N` fails the build.
pub(crate) const fn metric_list<const N: usize>(
    a: &[&'static str],
    b: &[&'static str],
) -> [&'static str; N] {
    assert!(
        a.len() + b.len() == N,
        "metric_list: N is not a.len() + b.len()"
    );
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = if i < a.len() { a[i] } else { b[i - a.len()] };
        i += 1;
    }
    out
}

/// Smallest and largest value of `(step, value)` points (`(inf, -inf)` when empty).
pub(crate) fn value_range(points: &[(i64, f64)]) -> (f64, f64) {
    points
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (_, v)| {
            (lo.min(*v), hi.max(*v))
        })
}

/// Mean value of `(step, value)` points (0 when empty).
pub(crate) fn value_mean(points: &[(i64, f64)]) -> f64 {
    points.iter().map(|(_, v)| v).sum::<f64>() / points.len().max(1) as f64
}

/// Median of a slice (NaN-free input assumed; NaNs sort last).
///
/// The middle value(s) are selected (`select_nth_unstable_by`, O(n)) instead of sorting
/// the copy: under `total_cmp`, a total order on the bits, the value at a sorted position
/// is the same whichever way it is found.
pub(crate) fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    median_in_place(&mut xs.to_vec())
}

/// [`median`] of values the caller no longer needs in their order: selected in place,
/// without the copy (a long log's copy is fresh pages the kernel clears).
pub(crate) fn median_in_place(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let n = v.len();
    let (below, mid, _) = v.select_nth_unstable_by(n / 2, |a, b| a.total_cmp(b));
    let mid = *mid;
    if n % 2 == 1 {
        return Some(mid);
    }
    // The element just below the middle: the largest of the lower part.
    let lower = below.iter().copied().max_by(|a, b| a.total_cmp(b))?;
    Some((lower + mid) / 2.0)
}

/// The value at position `k` of `xs` sorted by `total_cmp` (a selection, O(n)); `None`
/// when `k` is out of range.
pub(crate) fn nth_sorted(xs: &mut [f64], k: usize) -> Option<f64> {
    if k >= xs.len() {
        return None;
    }
    let (_, v, _) = xs.select_nth_unstable_by(k, |a, b| a.total_cmp(b));
    Some(*v)
}

/// `%g`-style number for messages: 4 significant digits, scientific when tiny or huge.
pub(crate) struct G(pub f64);

impl std::fmt::Display for G {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let x = self.0;
        if !x.is_finite() || x == 0.0 {
            return write!(f, "{x}");
        }
        let e = x.abs().log10().floor() as i32;
        if !(-4..6).contains(&e) {
            write!(f, "{x:.3e}")
        } else {
            let decimals = (3 - e).max(0) as usize;
            write!(f, "{x:.decimals$}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_found() {
        assert_eq!(
            runs(&[true, true, false, true, false, true, true, true]),
            vec![(0, 1), (3, 3), (5, 7)]
        );
        assert_eq!(runs(&[]), vec![]);
    }

    #[test]
    fn median_and_nth_match_a_full_sort() {
        // Ties, signed zeros, odd and even lengths: the selected values equal the sorted
        // copy's, bit for bit (-0.0 sorts before 0.0 under total_cmp).
        let xs: [f64; 14] = [
            3.0, -0.0, 1.0, 0.0, 1.0, -2.5, 7.0, 1.0, 0.5, -0.0, 9.0, 2.0, 1e300, -1e-300,
        ];
        for n in 1..=xs.len() {
            let mut sorted = xs[..n].to_vec();
            sorted.sort_by(|a, b| a.total_cmp(b));
            let want = if n % 2 == 1 {
                sorted[n / 2]
            } else {
                (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
            };
            assert_eq!(
                median(&xs[..n]).map(f64::to_bits),
                Some(want.to_bits()),
                "n {n}"
            );
            let mut reversed: Vec<f64> = xs[..n].iter().rev().copied().collect();
            assert_eq!(
                median_in_place(&mut reversed).map(f64::to_bits),
                Some(want.to_bits()),
                "n {n}"
            );
            for (k, want) in sorted.iter().enumerate() {
                let mut v = xs[..n].to_vec();
                assert_eq!(
                    nth_sorted(&mut v, k).map(f64::to_bits),
                    Some(want.to_bits())
                );
            }
            assert_eq!(nth_sorted(&mut xs[..n].to_vec(), n), None);
        }
        assert_eq!(median(&[]), None);
        // Two signed zeros: their mean is 0.0 as the sorted pair gives it.
        assert_eq!(
            median(&[0.0, -0.0]).map(f64::to_bits),
            Some(0.0f64.to_bits())
        );
    }

    #[test]
    fn overrides_parse_and_unknown_names_fail() {
        let t = Thresholds::with_overrides(&["grad_spike.factor=4".to_string()]).unwrap();
        assert_eq!(t.get("grad_spike.factor"), 4.0);
        assert!(Thresholds::with_overrides(&["nope=1".to_string()]).is_err());
    }

    #[test]
    fn every_threshold_used_is_declared() {
        let src = [
            include_str!("loss.rs"),
            include_str!("numeric.rs"),
            include_str!("kl.rs"),
            include_str!("completions.rs"),
            include_str!("perf.rs"),
            include_str!("bounds.rs"),
            include_str!("preference.rs"),
            include_str!("stages.rs"),
        ]
        .concat();
        for part in src.split("th.get(\"").skip(1) {
            let name = &part[..part.find('"').unwrap()];
            assert!(
                THRESHOLDS.iter().any(|(n, _, _)| *n == name),
                "threshold {name} used but not declared"
            );
        }
    }
}

//! Loss-shaped signatures: a loss stuck at exactly zero (no learning signal) and a reward
//! that does not improve.

use super::{Context, Detector, Finding, Severity, G};
use crate::frames::log::series::Series;

/// `--zero-loss`: loss ≈ 0 together with zero reward std / zero advantages / zero grad.
pub struct ZeroLoss;

impl Detector for ZeroLoss {
    fn name(&self) -> &'static str {
        "zero-loss"
    }
    fn summary(&self) -> &'static str {
        "loss ~ 0 with zero reward std / advantages / grad norm, sustained"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &[
            "loss",
            "grad_norm",
            "reward_std",
            "kl",
            "adv_max",
            "adv_min",
            "frac_reward_zero_std",
            "reward_mean",
        ]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        let eps = ctx.th.get("zero_loss.eps");
        let std_eps = ctx.th.get("zero_loss.std_eps");
        let min_steps = ctx.th.get("zero_loss.min_steps").max(1.0) as usize;
        let Some(loss) = f.col("loss") else {
            return vec![];
        };
        // Runs of consecutive rows with a loss that are zero-loss rows, long enough.
        let grad = f.col("grad_norm");
        let mut zero_runs: Vec<Vec<usize>> = Vec::new();
        let mut run: Vec<usize> = Vec::new();
        let std_eps0 = ctx.th.get("zero_loss.std_eps");
        let grad_pos = |i: usize| {
            grad.and_then(|g| g.get(i))
                .is_some_and(|g| g.is_finite() && g.abs() > std_eps0)
        };
        for (i, l) in loss.present() {
            let grad_nan = grad.and_then(|g| g.get(i)).is_some_and(|g| !g.is_finite());
            // A span is steps of one kind: a step whose gradient flows does not join a
            // span whose gradient is zero, nor the other way round.
            if run.last().is_some_and(|&j| grad_pos(j) != grad_pos(i)) {
                if run.len() >= min_steps {
                    zero_runs.push(std::mem::take(&mut run));
                } else {
                    run.clear();
                }
            }
            if l.is_finite() && l.abs() <= eps && !grad_nan {
                run.push(i);
            } else if run.len() >= min_steps {
                zero_runs.push(std::mem::take(&mut run));
            } else {
                run.clear();
            }
        }
        if run.len() >= min_steps {
            zero_runs.push(run);
        }
        let first_logged_loss = loss.present().next().map(|(_, l)| l);
        let adv_zero_steps: Vec<i64> = ctx
            .events
            .iter()
            .filter(|e| e.kind == "advantages_near_zero")
            .filter_map(|e| e.step)
            .collect();
        let mut out = Vec::new();
        // kl = 0 is evidence of no signal only where the loss is a KL with no reward in the
        // log (distillation, SFT against a teacher): in GRPO kl is 0 at the first steps
        // whatever the groups hold.
        let has_reward = ["reward_std", "reward_mean", "frac_reward_zero_std"]
            .iter()
            .any(|m| f.col(m).is_some_and(|c| c.any()));
        let zero = |name: &str, i: usize| f.at(name, i).is_some_and(|v| v.abs() <= std_eps);
        let positive = |name: &str, i: usize| {
            f.at(name, i)
                .is_some_and(|v| v.is_finite() && v.abs() > std_eps)
        };
        for idx in zero_runs {
            let steps: Vec<i64> = idx.iter().map(|&i| f.step(i)).collect();
            let n = steps.len();
            let mut companions: Vec<&str> = Vec::new();
            let count = |pred: &dyn Fn(usize) -> bool| idx.iter().filter(|&&i| pred(i)).count();
            let n_std = count(&|i| zero("reward_std", i));
            let n_grad = count(&|i| zero("grad_norm", i));
            let n_kl = count(&|i| zero("kl", i));
            let adv_zero = |i: usize| zero("adv_max", i) && zero("adv_min", i);
            let n_adv = count(&adv_zero);
            let n_adv_warn = steps.iter().filter(|s| adv_zero_steps.contains(s)).count();
            let dead = |i: usize| f.at("frac_reward_zero_std", i).is_some_and(|v| v >= 0.999);
            let n_dead = count(&dead);
            // Per step: no learning signal, or a signal the zero loss only hides.
            let no_signal = |i: usize| {
                zero("reward_std", i)
                    || dead(i)
                    || zero("grad_norm", i)
                    || adv_zero(i)
                    || adv_zero_steps.contains(&f.step(i))
                    || (!has_reward && zero("kl", i))
            };
            let n_none = count(&no_signal);
            let n_sig = count(&|i| {
                !no_signal(i) && (positive("reward_std", i) || positive("grad_norm", i))
            });
            if n_std > 0 {
                companions.push("reward_std = 0");
            }
            if n_adv > 0 || n_adv_warn > 0 {
                companions.push("advantages = 0");
            }
            if n_grad > 0 {
                companions.push("grad_norm = 0");
            }
            if n_kl > 0 {
                companions.push("kl = 0");
            }
            if n_dead > 0 {
                companions.push("frac_reward_zero_std = 1");
            }
            let max_abs = idx
                .iter()
                .filter_map(|&i| loss.get(i))
                .fold(0.0f64, |m, v| m.max(v.abs()));
            let per_step = |parts: &[(usize, &str)]| -> String {
                parts
                    .iter()
                    .filter(|(k, _)| *k > 0)
                    .map(|(k, what)| format!("{what} on {k} of {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let evidence = per_step(&[
                (n_std, "reward_std 0"),
                (n_dead, "frac_reward_zero_std 1"),
                (n_grad, "grad_norm 0"),
                (n_adv.max(n_adv_warn), "advantages 0"),
                (if has_reward { 0 } else { n_kl }, "kl 0"),
            ]);
            let (severity, explanation) = if n_none * 2 >= n && n_none > 0 {
                (
                    Severity::Error,
                    format!(
                        "loss is zero on {n} consecutive logged steps with no learning signal: {evidence}"
                    ),
                )
            } else if n_sig > 0 {
                let mut e = format!(
                    "loss logged as 0.0 on {n} consecutive steps while grad_norm > 0 or reward_std > 0 on {n_sig} of them: the usual GRPO display (ratio 1 on the first update of a batch, advantages of mean zero, tiny beta*KL; trl#2703, trl#3452), not a failure"
                );
                if n_none > 0 {
                    e.push_str(&format!("; no signal on some steps: {evidence}"));
                }
                (Severity::Info, e)
            } else {
                (
                    Severity::Warning,
                    format!(
                        "loss is zero on {n} consecutive logged steps (no reward/advantage/grad metrics to confirm why)"
                    ),
                )
            };
            // The GRPO display is not a failure: its cause says why the number is 0, not
            // what broke.
            let causes: &[&str] = if severity == Severity::Info {
                &[
                    "GRPO's loss is ~0 by construction: on the first update of a batch the ratio is 1 and the group-normalised advantages average 0, leaving beta*KL, tiny early on (nothing to fix; watch reward and grad_norm instead)",
                ]
            } else {
                &[
                    "all rewards in each group identical (judge/reward function gives one score) -> advantages 0 -> pg_loss 0",
                    "empty or degenerate completions: nothing to score, nothing to train on",
                    "sequence log-probs zero: no masked positions in the batch or broken gather",
                    "loss scaled away by gradient accumulation or a zero loss mask",
                ]
            };
            let mut finding = Finding::new(self.name(), severity, steps, explanation, causes)
                .num("max_abs_loss", max_abs)
                .with("companions", companions.clone())
                .with("steps_reward_std_zero", n_std)
                .with("steps_kl_zero", n_kl)
                .with("steps_grad_norm_zero", n_grad)
                .with("steps_advantages_zero", n_adv.max(n_adv_warn))
                .with("steps_without_signal", n_none)
                .with("steps_with_signal", n_sig);
            if let Some(l) = first_logged_loss {
                finding = finding.num("first_logged_loss", l);
            }
            out.push(finding);
        }
        out
    }
}

/// `--plateau`: the reward does not improve from the first to the last quarter of the run.
pub struct Plateau;

impl Detector for Plateau {
    fn name(&self) -> &'static str {
        "plateau"
    }
    fn summary(&self) -> &'static str {
        "reward mean not improving between the first and last quarter of the run"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &PLATEAU_READS
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let s = ctx.frame.view_where("reward_mean", f64::is_finite);
        if s.is_empty() {
            return frozen_supervised_loss(self.name(), ctx)
                .into_iter()
                .collect();
        }
        if let Some(f) = collapsed_to_zero(self.name(), &s, ctx) {
            return vec![f];
        }
        let min_points = ctx.th.get("plateau.min_points").max(2.0) as usize;
        if s.len() < min_points {
            return flat_over_long_horizon(self.name(), &s.to_vec(), ctx);
        }
        let q = (s.len() / 4).max(1);
        let mean = |a: usize, b: usize| s.range(a, b).map(|(_, v)| v).sum::<f64>() / (b - a) as f64;
        let first = mean(0, q);
        let last = mean(s.len() - q, s.len());
        let gain = last - first;
        if gain >= ctx.th.get("plateau.min_gain") {
            return vec![];
        }
        let max = s.values().fold(f64::NEG_INFINITY, f64::max);
        let step = |i: usize| s.get(i).map_or(i64::MIN, |p| p.0);
        let steps = vec![step(0), step(s.len() - 1)];
        let mut f = Finding::new(
            self.name(),
            Severity::Warning,
            steps,
            format!(
                "reward mean {first:.4} over the first {q} logged steps vs {last:.4} over the last {q}: no improvement"
            ),
            &[
                "no learning signal: zero-std groups / zero advantages (see zero-loss, dead-groups)",
                "learning rate too low or LoRA adapter not updated/synchronised with the rollout policy",
                "reward function too sparse for the model's current ability",
                "training on the wrong tokens (loss mask) or truncated contexts",
            ],
        )
        .num("first_quarter_mean", first)
        .num("last_quarter_mean", last)
        .num("gain", gain)
        .num("max_reward_mean", max)
        .with("points", s.len());
        f.count = s.len();
        vec![f]
    }
}

/// What `--plateau` reads: the reward, and for a log without one the loss and what says
/// the log is an RL one after all.
const PLATEAU_READS: [&str; 9] = super::metric_list(&["loss"], &super::bounds::RL_MARKERS);

/// A log with no reward and no RL metric whose loss is the same on every logged step
/// (within [`plateau.frozen_loss_band`] of its mean, at least `plateau.frozen_loss_points`
/// steps): batches differ, so a loss that does not is a model whose output ignores them.
fn frozen_supervised_loss(name: &str, ctx: &Context) -> Option<Finding> {
    let f = ctx.frame;
    let rl = super::bounds::RL_MARKERS
        .iter()
        .any(|m| f.col(m).is_some_and(|c| c.any()));
    if rl {
        return None;
    }
    let s: Vec<(i64, f64)> = f.points("loss").filter(|(_, v)| v.is_finite()).collect();
    if s.len() < ctx.th.get("plateau.frozen_loss_points").max(3.0) as usize {
        return None;
    }
    let (lo, hi) = super::value_range(&s);
    let mean = super::value_mean(&s);
    if mean.abs() < 0.05 || hi - lo > ctx.th.get("plateau.frozen_loss_band") * mean.abs() {
        return None;
    }
    let (first, last) = (s[0].0, s[s.len() - 1].0);
    let mut finding = Finding::new(
        name,
        Severity::Warning,
        vec![first, last],
        format!(
            "the loss stays between {} and {} on all {} logged steps ({first}–{last}), within {:.2}% of its mean: different batches, the same loss — the model is not learning",
            G(lo),
            G(hi),
            s.len(),
            (hi - lo) / mean.abs() * 100.0
        ),
        &[
            "the model's output ignores its input: weights frozen or detached (requires_grad off, the optimizer given other parameters), or a learning rate of 0",
            "a head predicting only the prior: a loss at ln(vocabulary) or ln(classes) (ln 2 = 0.693 for a binary head) is chance level",
            "every label masked or the same batch fed again and again",
        ],
    )
    .num("min_loss", lo)
    .num("max_loss", hi)
    .num("mean_loss", mean)
    .with("points", s.len());
    finding.count = s.len();
    Some(finding)
}

/// Few logged points far apart (a paste of a log's head and tail, `logging_steps` 10 over
/// a thousand steps): the reward is flat when it stays in a narrow band over a long span.
fn flat_over_long_horizon(name: &str, s: &[(i64, f64)], ctx: &Context) -> Vec<Finding> {
    let min_points = ctx.th.get("plateau.flat_min_points").max(2.0) as usize;
    let (Some(first), Some(last)) = (s.first(), s.last()) else {
        return vec![];
    };
    let span = last.0.saturating_sub(first.0);
    if s.len() < min_points || (span as f64) < ctx.th.get("plateau.flat_min_span") {
        return stuck_reward(name, s, ctx);
    }
    let (lo, hi) = super::value_range(s);
    let mean = super::value_mean(s);
    let band = ctx.th.get("plateau.flat_band");
    let flat = hi - lo <= band * mean.abs().max(1e-12);
    if !flat || last.1 - first.1 >= ctx.th.get("plateau.min_gain") {
        return vec![];
    }
    let mut f = Finding::new(
        name,
        Severity::Warning,
        vec![first.0, last.0],
        format!(
            "reward stays between {lo:.4} and {hi:.4} from step {} to {} ({span} steps, {} logged points): {:.4} at the start, {:.4} at the end, no improvement",
            first.0,
            last.0,
            s.len(),
            first.1,
            last.1
        ),
        &[
            "no learning signal: reward too sparse, zero advantages, or the policy not updated",
            "learning rate too low or decayed to nothing",
            "the reward model scores something the policy cannot change",
        ],
    )
    .num("min_reward", lo)
    .num("max_reward", hi)
    .num("mean_reward", mean)
    .with("span_steps", span)
    .with("points", s.len());
    f.count = s.len();
    vec![f]
}

/// A reward that was earned and then is exactly 0 on every logged step to the end, at
/// least `plateau.collapse_min_steps` of them (OpenRLHF#1120, verl#747: the policy
/// degenerates into `!!!!!!` and nothing scores again): a collapse, whatever the run's
/// length.
fn collapsed_to_zero(name: &str, s: &Series, ctx: &Context) -> Option<Finding> {
    let need = ctx.th.get("plateau.collapse_min_steps").max(2.0) as usize;
    // The zeros at the end: counted forwards (the points are read in place, in order).
    let zeros = s.values().fold(0, |z, v| if v == 0.0 { z + 1 } else { 0 });
    if zeros < need || zeros == s.len() {
        return None;
    }
    let cut = s.len() - zeros;
    let (last_step, last) = s.get(cut.checked_sub(1)?)?;
    let earned = s.range(0, cut).any(|(_, v)| v > 0.0);
    if !earned {
        return None;
    }
    let tail: Vec<i64> = s.range(cut, s.len()).map(|(st, _)| st).collect();
    let first_zero = tail[0];
    let (lo, hi) = s
        .range(0, cut)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (_, v)| {
            (lo.min(v), hi.max(v))
        });
    let mut f = Finding::new(
        name,
        Severity::Warning,
        tail,
        format!(
            "reward falls to exactly 0 at step {} and stays 0 on all {zeros} logged steps to the end (before: {}–{}, {} at step {last_step}): the run stopped earning any reward",
            first_zero,
            G(lo),
            G(hi),
            G(last),
        ),
        &[
            "the policy degenerated (repeated or garbage tokens, e.g. '!!!!!!' after a NaN update): read the completions of those steps",
            "the reward function or service started failing and returns its default 0 (timeouts, a parse error)",
            "a broken update just before (see nan-grad, grad-spike at that step)",
        ],
    )
    .num("reward_before", last)
    .with("zero_steps", zeros)
    .with("first_zero_step", first_zero);
    f.count = zeros;
    Some(f)
}

/// A short log whose reward hardly moves: at least `plateau.stuck_min_points` points within
/// `plateau.stuck_band` of their mean (DeepSpeed-Chat's `average reward score` 0.2056 to
/// 0.2065 over six steps while the actor loss swings ±0.19): a batch-mean score that does
/// not move by 1 % has stopped responding to the policy.
fn stuck_reward(name: &str, s: &[(i64, f64)], ctx: &Context) -> Vec<Finding> {
    let need = ctx.th.get("plateau.stuck_min_points").max(2.0) as usize;
    let (Some(first), Some(last)) = (s.first(), s.last()) else {
        return vec![];
    };
    if s.len() < need {
        return vec![];
    }
    let (lo, hi) = super::value_range(s);
    let mean = super::value_mean(s);
    // A reward identical at every step is a saturated or never-matching reward function
    // (reward-constant's and dead-groups' findings), not a policy that stopped moving it.
    if hi == lo || hi - lo > ctx.th.get("plateau.stuck_band") * mean.abs() {
        return vec![];
    }
    let mut f = Finding::new(
        name,
        Severity::Warning,
        vec![first.0, last.0],
        format!(
            "reward stays between {} and {} on all {} logged steps ({}–{}), within {:.2}% of its mean: stuck, not learning",
            G(lo),
            G(hi),
            s.len(),
            first.0,
            last.0,
            (hi - lo) / mean.abs() * 100.0
        ),
        &[
            "the policy collapsed onto one kind of answer the reward model scores the same (read the completions)",
            "the reward model's score saturated: it no longer separates better from worse answers",
            "the policy is not updated (learning rate ~0, adapter not synchronised with the rollout engine)",
        ],
    )
    .num("min_reward", lo)
    .num("max_reward", hi)
    .num("mean_reward", mean)
    .with("points", s.len());
    f.count = s.len();
    vec![f]
}

/// `--reward-constant`: a reward component (one reward function) that returns the same
/// value at every logged step: it never fires, or it is broken.
pub struct RewardConstant;

impl Detector for RewardConstant {
    fn name(&self) -> &'static str {
        "reward-constant"
    }
    fn summary(&self) -> &'static str {
        "a reward component identical at every logged step (a reward function that never changes)"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &[crate::logs::aliases::REWARD_COMPONENTS]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let min_points = ctx.th.get("reward_constant.min_points").max(2.0) as usize;
        let zero_min = ctx.th.get("reward_constant.zero_min_points").max(2.0) as usize;
        let mut out = Vec::new();
        for m in ctx.frame.metrics() {
            let Some(component) = m.strip_prefix(crate::logs::aliases::REWARD_COMPONENT_PREFIX)
            else {
                continue;
            };
            let s: Vec<(i64, f64)> = ctx.frame.points(m).filter(|(_, v)| v.is_finite()).collect();
            let v0 = s.first().map_or(f64::NAN, |p| p.1);
            let need = if v0 == 0.0 { zero_min } else { min_points };
            if s.len() < need || s.iter().any(|(_, v)| *v != v0) {
                continue;
            }
            let steps: Vec<i64> = s.iter().map(|(st, _)| *st).collect();
            // The value says which way: 0 never matches; 1 (a pass/fail reward's maximum)
            // always matches; either way every group ties on it and it carries no signal.
            let (what, causes): (&str, &[&str]) = if v0 == 0.0 {
                (
                    "it never matches, so it carries no signal",
                    &[
                        "the reward function never matches (format regex too strict, wrong answer tag)",
                        "the reward function crashed into a default value",
                    ],
                )
            } else if v0 == 1.0 {
                (
                    "every completion earns it (it always matches), so it carries no signal: its advantage is 0 in every group",
                    &[
                        "the check is already met by the starting model (a format the SFT model always follows): drop it or make it harder",
                        "the reward function returns its maximum by default (an exception or empty answer scored as a pass)",
                    ],
                )
            } else {
                (
                    "that reward function never changes, so it carries no signal",
                    &[
                        "the reward function crashed into a default value",
                        "the reward is saturated (every completion gets the same score)",
                        "the reward function never matches (format regex too strict, wrong answer tag)",
                    ],
                )
            };
            out.push(
                Finding::new(
                    self.name(),
                    Severity::Warning,
                    steps,
                    format!(
                        "reward component {component} is {} at every one of {} logged steps: {what}",
                        G(v0),
                        s.len()
                    ),
                    causes,
                )
                .num("value", v0)
                .with("component", component)
                .with("points", s.len()),
            );
        }
        out
    }
}

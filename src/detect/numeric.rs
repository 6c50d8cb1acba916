//! Gradient and advantage numerics: NaN/inf anywhere, gradient spikes, zero gradients,
//! advantages blown up by a tiny reward std.

use super::preference::PREF_MARKERS;
use super::{metric_list, runs, spikes, Context, Detector, Finding, Severity, G};
use crate::frames::log::column::Column;

/// What `--nan-grad` reads: [`FINITE_METRICS`] and, last, `grad_nan_count`.
const NAN_GRAD_METRICS: &[&str] = &[
    "grad_norm",
    "loss",
    "kl",
    "reward_mean",
    "reward_std",
    "entropy",
    "ppo_kl",
    "adv_max",
    "adv_min",
    "critic_loss",
    "critic_grad_norm",
    "aux_loss",
    "aux_grad_norm",
    "grad_nan_count",
];

/// All `--nan-grad` asks the frame for: [`NAN_GRAD_METRICS`], Megatron's unprinted loss
/// and the preference markers that name the algorithm (its causes speak ORPO's or DPO's
/// words; alone or among all, the same).
const NAN_GRAD_READS: [&str; 22] = metric_list(
    &metric_list::<15>(NAN_GRAD_METRICS, &["loss_unprinted"]),
    &PREF_MARKERS,
);

/// Metrics whose non-finite values mean the numbers are broken: all `--nan-grad` reads
/// but the `grad_nan_count` it ends with.
const FINITE_METRICS: &[&str] = match NAN_GRAD_METRICS.split_last() {
    Some((_, finite)) => finite,
    None => &[],
};

/// `--nan-grad`: any non-finite gradient/loss/kl/reward, NaN gradient events,
/// `grad_nan_count > 0`, and a NaN hidden as loss 0.0 next to a NaN grad norm.
pub struct NanGrad;

impl Detector for NanGrad {
    fn name(&self) -> &'static str {
        "nan-grad"
    }
    fn summary(&self) -> &'static str {
        "non-finite grad_norm/loss/kl/reward, nan_gradient events, grad_nan_count > 0"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &NAN_GRAD_READS
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        let mut steps = Vec::new();
        let mut f_out = Vec::new();
        let mut per_metric = serde_json::Map::new();
        for name in FINITE_METRICS {
            let before = steps.len();
            steps.extend(
                f.points(name)
                    .filter(|(_, v)| !v.is_finite())
                    .map(|(s, _)| s),
            );
            let bad = steps.len() - before;
            if bad > 0 {
                per_metric.insert(name.to_string(), bad.into());
            }
        }
        let nan_count: Vec<(i64, f64)> = f
            .points("grad_nan_count")
            .filter(|(_, v)| *v > 0.0 || v.is_nan())
            .collect();
        steps.extend(nan_count.iter().map(|(s, _)| *s));
        let hidden: Vec<i64> = match (f.col("loss"), f.col("grad_norm")) {
            (Some(loss), Some(grad)) => grad
                .present()
                .filter(|(i, g)| !g.is_finite() && loss.get(*i) == Some(0.0))
                .map(|(i, _)| f.step(i))
                .collect(),
            _ => Vec::new(),
        };
        let events: Vec<i64> = ctx
            .events
            .iter()
            .filter(|e| e.kind == "nan_gradient")
            .filter_map(|e| e.step)
            .collect();
        steps.extend(events.iter().copied());
        if steps.is_empty() {
            return vec![];
        }
        // Only the KL non-finite while the loss stays finite: the KL never entered the
        // update (β = 0) or was measured without reference log-probs; not a divergence.
        let loss_finite = f.col("loss").is_some_and(|c| c.any())
            && !per_metric.contains_key("loss")
            && !per_metric.contains_key("grad_norm");
        let kl_only = loss_finite
            && events.is_empty()
            && nan_count.is_empty()
            && per_metric.keys().all(|k| k == "kl");
        let mut explanation = if kl_only {
            format!(
                "kl is non-finite on {} logged step(s) while the loss stays finite: a broken KL measurement, not a diverged update",
                steps.len()
            )
        } else {
            "non-finite values in the training numbers".to_string()
        };
        let unprinted: Vec<i64> = f
            .points("loss_unprinted")
            .filter(|(_, v)| *v > 0.0)
            .map(|(s, _)| s)
            .collect();
        if !unprinted.is_empty() {
            explanation.push_str(&format!(
                "; the loss is missing from the iteration line at {} step(s) (first {}) where the keys after it are printed: Megatron prints a loss only if it is > 0, so it was NaN (or every update of the interval was skipped)",
                unprinted.len(),
                unprinted[0]
            ));
        }
        if !hidden.is_empty() {
            explanation.push_str(&format!(
                "; loss logged as 0.0 while grad_norm is NaN at {} step(s): the NaN is hidden as a zero loss",
                hidden.len()
            ));
        }
        // Group-normalised advantages (GRPO: a group reward std in the log) can divide by a
        // zero std; a run with a critic or a single reward cannot.
        let grouped = f.col("reward_std").is_some_and(|c| c.any());
        let preference = super::preference::algorithm(f);
        let causes: &[&str] = if kl_only {
            &[
                "the KL is logged but not computed against a reference: no reference model loaded (β = 0 or ref_model None), or a mean over zero tokens",
                "reference and policy log-probs over different masks (a reference forward that returned nothing for these tokens)",
            ]
        } else if preference == super::preference::Algorithm::Orpo {
            &[
                "ORPO's odds ratio: log(1 - exp(logp)) cancels to -inf/NaN when a completion's mean log-prob is ~0 (trl#1473; log1mexp in float32 fixes it)",
                "prompt at or beyond max_length: the completion is truncated away and its log-prob is a mean over zero tokens",
                "learning rate too high or fp16/bf16 overflow; missing gradient clipping",
            ]
        } else if preference != super::preference::Algorithm::Rl {
            &[
                "a pair whose completion is truncated away (prompt at or beyond max_length): a log-prob over zero tokens",
                "learning rate too high or fp16/bf16 overflow; missing gradient clipping",
                "a reference model in a different dtype or with different weights than the policy's start",
            ]
        } else if grouped {
            &[
                "division by a zero/tiny reward std in advantage normalisation",
                "log of zero / empty completion slices (logsumexp over an empty array)",
                "learning rate too high or fp16/bf16 overflow; missing gradient clipping",
                "exp() of large log-ratio without clamping",
            ]
        } else {
            &[
                "learning rate too high or fp16/bf16 overflow; missing gradient clipping",
                "exp() of large log-ratio without clamping",
                "log of zero / empty completion slices (logsumexp over an empty array)",
                "reward or value whitening of a batch with no spread (a division by a zero std)",
            ]
        };
        let first_step = steps.iter().min().copied();
        let mut finding = Finding::new(
            self.name(),
            if kl_only {
                Severity::Error
            } else {
                Severity::Critical
            },
            steps,
            explanation,
            causes,
        )
        .with(
            "non_finite_by_metric",
            serde_json::Value::Object(per_metric),
        )
        .with("grad_nan_count_steps", nan_count.len())
        .with("nan_gradient_events", events.len())
        .with("loss_zero_with_nan_grad_steps", hidden);
        if let Some(max) = nan_count.iter().map(|(_, v)| *v).reduce(f64::max) {
            finding = finding.num("max_grad_nan_count", max);
        }
        if let Some(s) = first_step {
            finding = finding.with("first_bad_step", s);
        }
        f_out.push(finding);
        f_out
    }
}

/// `--grad-spike`: grad_norm far above its recent median.
pub struct GradSpike;

impl Detector for GradSpike {
    fn name(&self) -> &'static str {
        "grad-spike"
    }
    fn summary(&self) -> &'static str {
        "grad_norm above factor x median of the previous window"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &GRAD_SPIKE_READS
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let s = ctx.frame.view("grad_norm");
        let hits = spikes(
            &s,
            ctx.th.get("grad_spike.factor"),
            ctx.th.get("grad_spike.window") as usize,
            ctx.th.get("grad_spike.min_history") as usize,
            0.0,
        );
        // Against a median of 0 there is no ratio: a gradient coming back after zero steps
        // is zero-grad's finding, not a spike of 1e300x.
        let hits: Vec<(usize, f64, f64)> = hits
            .into_iter()
            .filter(|h| h.2 > ctx.th.get("zero_grad.eps"))
            .collect();
        if hits.is_empty() {
            return vec![];
        }
        let (wi, wv, wm) = hits
            .iter()
            .copied()
            .fold((0usize, f64::MIN, 1.0f64), |a, h| {
                if h.1 / h.2.max(1e-300) > a.1 / a.2.max(1e-300) {
                    h
                } else {
                    a
                }
            });
        let step = |i: usize| s.get(i).map_or(i64::MIN, |p| p.0);
        let steps: Vec<i64> = hits.iter().map(|(i, _, _)| step(*i)).collect();
        vec![Finding::new(
            self.name(),
            Severity::Warning,
            steps,
            format!(
                "grad_norm spikes to {} at step {} ({:.1}x the recent median {})",
                G(wv),
                step(wi),
                wv / wm.max(1e-300),
                G(wm)
            ),
            spike_causes(ctx.frame),
        )
        .num("max_grad_norm", wv)
        .num("median_before", wm)
        .num("ratio", wv / wm.max(1e-300))
        .with("worst_step", step(wi))]
    }
}

/// What `--grad-spike` reads: the norm, and what says which objective it is the gradient of.
const GRAD_SPIKE_READS: [&str; 16] = metric_list(
    &metric_list::<9>(&["grad_norm"], &super::bounds::RL_MARKERS),
    &PREF_MARKERS,
);

/// A spike's causes in the words of the objective the log shows: advantages and importance
/// ratios only where there are rewards; a preference pair or a supervised batch otherwise.
fn spike_causes(f: &crate::frames::log::frame::LogFrame) -> &'static [&'static str] {
    let rl = super::bounds::RL_MARKERS
        .iter()
        .any(|m| f.col(m).is_some_and(|c| c.any()));
    if rl {
        &[
            "advantages blown up by a tiny reward std (see adv-explosion)",
            "a batch with extreme importance ratios (stale old log-probs, off-policy data)",
            "learning rate too high or warm-up too short",
        ]
    } else if super::preference::is_preference(f) {
        &[
            "a preference pair far from the reference model (very long or out-of-distribution completions): its log-ratio gradient is an outlier",
            "learning rate too high or beta too small for the pairs",
            "bf16/fp16 numerics in the output layer on that batch",
        ]
    } else {
        &[
            "one batch far from the rest (an unusually long or rare sequence, a corrupted or mislabelled sample): its gradient is an outlier; clipping bounds the update, not the logged pre-clip norm",
            "learning rate too high or warm-up too short",
            "bf16/fp16 numerics in one layer on that batch (attention logits, a norm layer's scale)",
        ]
    }
}

/// `--zero-grad`: grad_norm exactly (or nearly) zero on consecutive steps.
pub struct ZeroGrad;

impl Detector for ZeroGrad {
    fn name(&self) -> &'static str {
        "zero-grad"
    }
    fn summary(&self) -> &'static str {
        "grad_norm ~ 0 on consecutive steps (a single step on DPO/KTO): nothing is updated"
    }
    fn metrics(&self) -> &'static [&'static str] {
        const READS: [&str; 8] = metric_list(&["grad_norm"], &PREF_MARKERS);
        &READS
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let s = ctx.frame.view("grad_norm");
        let eps = ctx.th.get("zero_grad.eps");
        // A preference loss (DPO: -log σ(β·margin)) always has a gradient: one zero step is
        // already a broken update (frozen weights, a detached loss, an empty batch).
        let min = if super::preference::is_preference(ctx.frame) {
            1
        } else {
            ctx.th.get("zero_grad.min_steps").max(1.0) as usize
        };
        let flags: Vec<bool> = s
            .values()
            .map(|v| v.is_finite() && v.abs() <= eps)
            .collect();
        runs(&flags)
            .into_iter()
            .filter(|(a, b)| b + 1 - a >= min)
            .map(|(a, b)| {
                let steps: Vec<i64> = s.range(a, b + 1).map(|(st, _)| st).collect();
                Finding::new(
                    self.name(),
                    Severity::Error,
                    steps,
                    format!(
                        "grad_norm is zero on {} consecutive logged steps",
                        b + 1 - a
                    ),
                    &[
                        "zero advantages (identical rewards per group) give zero policy gradient",
                        "parameters frozen / LoRA adapter not attached to the optimised model",
                        "loss mask all zero or loss detached from the graph",
                    ],
                )
                .num(
                    "max_grad_norm",
                    s.range(a, b + 1).map(|(_, v)| v).fold(0.0, f64::max),
                )
            })
            .collect()
    }
}

/// `--adv-explosion`: a tiny but non-zero reward std divides the advantages up.
pub struct AdvExplosion;

impl Detector for AdvExplosion {
    fn name(&self) -> &'static str {
        "adv-explosion"
    }
    fn summary(&self) -> &'static str {
        "0 < reward std < 1e-3 or |advantage| > 10: advantages blown up"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &["reward_std", "adv_max", "adv_min"]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        let std_max = ctx.th.get("adv_explosion.std_max");
        let abs = ctx.th.get("adv_explosion.abs");
        let mut steps = Vec::new();
        let mut min_std = f64::INFINITY;
        let mut max_adv: f64 = 0.0;
        let (std, adv_max, adv_min) = (f.col("reward_std"), f.col("adv_max"), f.col("adv_min"));
        let at = |c: Option<&Column>, i: usize| c.and_then(|c| c.get(i));
        for i in 0..f.len() {
            let tiny = at(std, i).is_some_and(|s| s.is_finite() && s > 0.0 && s < std_max);
            let adv = at(adv_max, i)
                .into_iter()
                .chain(at(adv_min, i))
                .filter(|v| v.is_finite())
                .fold(0.0f64, |m, v| m.max(v.abs()));
            if tiny {
                min_std = min_std.min(at(std, i).unwrap_or(f64::INFINITY));
            }
            max_adv = max_adv.max(adv);
            if tiny || adv > abs {
                steps.push(f.step(i));
            }
        }
        if steps.is_empty() {
            return vec![];
        }
        let mut finding = Finding::new(
            self.name(),
            Severity::Warning,
            steps,
            "reward std tiny but non-zero (or |advantage| large): (r - mean)/(std + eps) turns rounding noise into huge advantages",
            &[
                "group-normalised advantages with a small eps (verl 1e-6) on near-identical rewards",
                "reward function returning values that differ only by float rounding",
                "consider batch-std scaling, Dr. GRPO (no std scaling) or a larger eps",
            ],
        );
        if min_std.is_finite() {
            finding = finding
                .num("min_reward_std", min_std)
                .num("advantage_scale_1_over_std", 1.0 / min_std);
        }
        if max_adv > 0.0 {
            finding = finding.num("max_abs_advantage", max_adv);
        }
        vec![finding]
    }
}

/// `--grad-not-flowing`: grad_norm exactly 0 on a step whose groups do hold a reward
/// signal (reward_std > 0, not every group dead): a gradient should exist but none reached
/// the parameters.
pub struct GradNotFlowing;

impl Detector for GradNotFlowing {
    fn name(&self) -> &'static str {
        "grad-not-flowing"
    }
    fn summary(&self) -> &'static str {
        "grad_norm exactly 0 while reward_std > 0: a signal exists but no gradient reaches the weights"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &["grad_norm", "reward_std", "frac_reward_zero_std", "kl"]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        let eps = ctx.th.get("zero_grad.eps");
        let (Some(grad), Some(std)) = (f.col("grad_norm"), f.col("reward_std")) else {
            return vec![];
        };
        let logged = grad.present().count();
        let mut hits: Vec<(i64, f64)> = Vec::new();
        for (i, g) in grad.present() {
            let Some(sd) = std.get(i) else { continue };
            let all_dead = f.at("frac_reward_zero_std", i).is_some_and(|v| v >= 0.999);
            if g.is_finite() && g.abs() <= eps && sd.is_finite() && sd > 0.0 && !all_dead {
                hits.push((f.step(i), sd));
            }
        }
        if hits.is_empty() {
            return vec![];
        }
        let (lo, hi) = super::value_range(&hits);
        let kl_zero = hits
            .iter()
            .filter(|(s, _)| {
                f.steps()
                    .position(*s)
                    .and_then(|i| f.at("kl", i))
                    .is_some_and(|k| k == 0.0)
            })
            .count();
        let range = if lo == hi {
            G(lo).to_string()
        } else {
            format!("{}–{}", G(lo), G(hi))
        };
        let mut e = format!(
            "grad_norm is exactly 0 on {} of {logged} logged steps although reward_std is {range} there: the groups carry a signal but no gradient reached the weights",
            hits.len(),
        );
        if kl_zero > 0 {
            e.push_str(&format!(
                "; kl is 0 on {kl_zero} of them too (the policy never moved)"
            ));
        }
        vec![Finding::new(
            self.name(),
            Severity::Error,
            hits.iter().map(|(s, _)| *s).collect(),
            e,
            &[
                "LoRA adapter not attached to the optimised model / parameters frozen (requires_grad False)",
                "loss detached from the graph or multiplied by a zero mask",
                "optimizer step skipped (inf/NaN in fp16 loss scaling, gradient offload bug)",
            ],
        )
        .num("min_reward_std", lo)
        .num("max_reward_std", hi)
        .with("steps_kl_zero", kl_zero)
        .with("logged_steps", logged)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_grad_reads_its_metrics_then_the_preference_markers() {
        let n = NAN_GRAD_METRICS.len();
        assert_eq!(&NAN_GRAD_READS[..n], NAN_GRAD_METRICS);
        assert_eq!(NAN_GRAD_READS[n], "loss_unprinted");
        assert_eq!(&NAN_GRAD_READS[n + 1..], &PREF_MARKERS[..]);
        assert_eq!(NAN_GRAD_READS.last(), Some(&"pref_log_odds_ratio"));
    }
}

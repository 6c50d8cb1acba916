//! Policy-divergence signatures: KL explosion, negative k3 KL (a sign bug), entropy
//! collapse, and trainer/rollout log-prob mismatch.

use super::{median, median_in_place, runs, spikes, Context, Detector, Finding, Severity, G};

/// `--kl-explosion`: kl above an absolute bound or far above its recent median.
pub struct KlExplosion;

impl Detector for KlExplosion {
    fn name(&self) -> &'static str {
        "kl-explosion"
    }
    fn summary(&self) -> &'static str {
        "kl above 1.0, or above 10x its recent median"
    }
    fn metrics(&self) -> &'static [&'static str] {
        const READS: [&str; 9] =
            super::metric_list(&["kl", "kl_seq"], &super::preference::PREF_MARKERS);
        &READS
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        // KTO's `kl` is a batch estimate of KL(π‖π_ref) over mismatched pairs (a reference
        // point of its loss), not GRPO's per-token penalty: its own bound does not apply.
        if super::preference::is_preference(ctx.frame) {
            return vec![];
        }
        // A per-sequence KL sum (TRL PPO `objective/kl`, 10 nats is ordinary) is judged
        // only against its own history, never against the per-token bound.
        let (s, abs) = match ctx.frame.view("kl") {
            s if !s.is_empty() => (s, ctx.th.get("kl_explosion.abs")),
            _ => (ctx.frame.view("kl_seq"), f64::INFINITY),
        };
        let step = |i: usize| s.get(i).map_or(i64::MIN, |p| p.0);
        let mut steps: Vec<i64> = s
            .iter()
            .filter(|(_, v)| v.is_finite() && *v > abs)
            .map(|(st, _)| st)
            .collect();
        let n_abs = steps.len();
        let rel = spikes(
            &s,
            ctx.th.get("kl_explosion.factor"),
            20,
            5,
            ctx.th.get("kl_explosion.floor"),
        );
        steps.extend(rel.iter().map(|(i, _, _)| step(*i)));
        if steps.is_empty() {
            return vec![];
        }
        let max = s
            .values()
            .filter(|v| v.is_finite())
            .fold(f64::MIN, f64::max);
        let med = median_in_place(&mut s.values().filter(|v| v.is_finite()).collect::<Vec<_>>())
            .unwrap_or(f64::NAN);
        // Above the absolute bound the run is off; a spike that comes back is a warning.
        let severity = if n_abs > 0 {
            Severity::Error
        } else {
            Severity::Warning
        };
        vec![Finding::new(
            self.name(),
            severity,
            steps,
            if n_abs > 0 {
                format!(
                    "kl above {abs} on {n_abs} of {} logged steps, up to {} (run median {}): the policy is running away from the reference",
                    s.len(),
                    G(max),
                    G(med)
                )
            } else {
                let (i, v, m) = rel
                    .iter()
                    .copied()
                    .fold(rel[0], |a, h| if h.1 / h.2 > a.1 / a.2 { h } else { a });
                format!(
                    "kl spikes on {} of {} logged steps, up to {} at step {} ({:.0}x the median {} of the steps before; run median {})",
                    rel.len(),
                    s.len(),
                    G(v),
                    step(i),
                    v / m.max(1e-300),
                    G(m),
                    G(med)
                )
            },
            &[
                "learning rate too high or too many PPO epochs per batch",
                "KL coefficient (beta) too small or KL term sign/estimator bug",
                "reference model/adapter not the one the policy started from",
            ],
        )
        .num("max_kl", max)
        .num("median_kl", med)]
    }
}

/// `--kl-negative`: k3 / low-variance KL estimates cannot be negative.
pub struct KlNegative;

impl Detector for KlNegative {
    fn name(&self) -> &'static str {
        "kl-negative"
    }
    fn summary(&self) -> &'static str {
        "kl < 0: k3 estimators cannot be negative (sign bug)"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &["kl"]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let eps = ctx.th.get("kl_negative.eps");
        let neg: Vec<(i64, f64)> = ctx.frame.points("kl").filter(|(_, v)| *v < -eps).collect();
        if neg.is_empty() {
            return vec![];
        }
        let min = neg.iter().map(|(_, v)| *v).fold(f64::INFINITY, f64::min);
        vec![Finding::new(
            self.name(),
            Severity::Error,
            neg.iter().map(|(s, _)| *s).collect(),
            format!(
                "kl is negative on {} step(s) (min {}); k3 = exp(r) - 1 - r >= 0",
                neg.len(),
                G(min)
            ),
            &[
                "log-ratio computed as ref - policy with the wrong sign (backwards KL formula)",
                "k1 estimator (log-ratio mean) logged as kl: can be negative, use k3/low_var_kl",
                "KL averaged over padding with a wrong mask",
            ],
        )
        .num("min_kl", min)]
    }
}

/// `--entropy-collapse`: entropy falls near zero or to a small share of its start.
pub struct EntropyCollapse;

impl Detector for EntropyCollapse {
    fn name(&self) -> &'static str {
        "entropy-collapse"
    }
    fn summary(&self) -> &'static str {
        "entropy < 0.05 or < 10% of its initial value, sustained"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &["entropy"]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let s = ctx.frame.view_where("entropy", f64::is_finite);
        if s.is_empty() {
            return vec![];
        }
        let initial = median(&s.values().take(5).collect::<Vec<_>>()).unwrap_or(0.0);
        let abs = ctx.th.get("entropy_collapse.abs");
        let ratio = ctx.th.get("entropy_collapse.ratio");
        let min = ctx.th.get("entropy_collapse.min_steps").max(1.0) as usize;
        let flags: Vec<bool> = s.values().map(|v| v < abs || v < ratio * initial).collect();
        let Some((a, b)) = runs(&flags).into_iter().find(|(a, b)| b + 1 - a >= min) else {
            return vec![];
        };
        let steps: Vec<i64> = flags
            .iter()
            .zip(s.iter())
            .filter(|(f, _)| **f)
            .map(|(_, (st, _))| st)
            .collect();
        let lowest = s.values().fold(f64::INFINITY, f64::min);
        let step = |i: usize| s.get(i).map_or(i64::MIN, |p| p.0);
        vec![Finding::new(
            self.name(),
            Severity::Warning,
            steps,
            format!(
                "entropy falls from {} to {}, collapsed from step {} on",
                G(initial),
                G(lowest),
                step(a)
            ),
            &[
                "policy converging to deterministic outputs (reward hacking a format)",
                "no entropy bonus and a high learning rate",
                "sampling temperature mismatch between rollout and training",
            ],
        )
        .num("initial_entropy", initial)
        .num("min_entropy", lowest)
        .with("collapse_from_step", step(a))
        .with("first_run_end_step", step(b))]
    }
}

/// `--logprob-mismatch`: trainer and rollout disagree on the sampled tokens'
/// probabilities, judged on the means the stacks log (a single token's max is noise):
/// verl `training/rollout_probs_diff_mean` and `rollout_corr/{kl,k3_kl,log_ppl_abs_diff}`,
/// TRL `sampling/sampling_logp_difference/mean` and `sampling/importance_sampling_ratio/mean`,
/// OpenRLHF `vllm_kl`.
pub struct LogprobMismatch;

impl Detector for LogprobMismatch {
    fn name(&self) -> &'static str {
        "logprob-mismatch"
    }
    fn summary(&self) -> &'static str {
        "rollout vs trainer log-probs apart on average (prob diff, |logp diff|, rollout KL, ratio), or all zero"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &[
            "logprob_diff_mean",
            "logprob_diff_max",
            "logp_abs_diff_mean",
            "rollout_kl",
            "ratio_mean",
        ]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        // (canonical, threshold, what it is)
        let rules = [
            (
                "logprob_diff_mean",
                ctx.th.get("logprob_mismatch.diff_mean"),
                "mean |p_trainer - p_rollout|",
            ),
            (
                "logp_abs_diff_mean",
                ctx.th.get("logprob_mismatch.logp_diff_mean"),
                "mean |logp_trainer - logp_rollout|",
            ),
            (
                "rollout_kl",
                ctx.th.get("logprob_mismatch.kl"),
                "rollout-to-trainer KL",
            ),
        ];
        let rd = ctx.th.get("logprob_mismatch.ratio_dev");
        let mut steps = Vec::new();
        let mut parts = Vec::new();
        let mut worst = serde_json::Map::new();
        for (name, th, what) in rules {
            let hits: Vec<(i64, f64)> = f
                .points(name)
                .filter(|(_, v)| v.is_finite() && v.abs() > th)
                .collect();
            if hits.is_empty() {
                continue;
            }
            let max = hits.iter().map(|(_, v)| v.abs()).fold(0.0, f64::max);
            parts.push(format!(
                "{what} above {th} on {} step(s) (max {})",
                hits.len(),
                G(max)
            ));
            worst.insert(format!("max_{name}"), super::json_num(max));
            steps.extend(hits.iter().map(|(s, _)| *s));
        }
        let ratio_hits: Vec<(i64, f64)> = f
            .points("ratio_mean")
            .filter(|(_, v)| v.is_finite() && (v - 1.0).abs() > rd)
            .collect();
        if !ratio_hits.is_empty() {
            let dev = ratio_hits
                .iter()
                .map(|(_, v)| (v - 1.0).abs())
                .fold(0.0, f64::max);
            parts.push(format!(
                "mean importance ratio off 1 by more than {rd} on {} step(s) (max {})",
                ratio_hits.len(),
                G(dev)
            ));
            worst.insert("max_ratio_deviation".into(), super::json_num(dev));
            steps.extend(ratio_hits.iter().map(|(s, _)| *s));
        }
        let zero_lp: Vec<i64> = ctx
            .events
            .iter()
            .filter(|e| e.kind == "logprobs_near_zero")
            .filter_map(|e| e.step)
            .collect();
        if !zero_lp.is_empty() {
            parts.push(format!(
                "\"All sequence_log_probs are near zero\" on {} step(s)",
                zero_lp.len()
            ));
        }
        steps.extend(zero_lp.iter().copied());
        if steps.is_empty() {
            return vec![];
        }
        let max_single = f
            .points("logprob_diff_max")
            .map(|(_, v)| v)
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max);
        let mut finding = Finding::new(
            self.name(),
            Severity::Error,
            steps,
            format!(
                "the trainer's log-probs disagree with the rollout's: {}",
                parts.join("; ")
            ),
            &[
                "rollout engine and trainer use different weights (LoRA not synced to the sampler)",
                "different chat template / tokenisation between sampling and training",
                "precision or kernel differences (bf16 sampler vs fp32 trainer), temperature not applied",
                "no masked positions: sequence log-probs sum over nothing",
            ],
        )
        .num("max_single_token_prob_diff", max_single)
        .with("logprobs_near_zero_warnings", zero_lp.len());
        for (k, v) in worst {
            finding = finding.with(&k, v);
        }
        vec![finding]
    }
}

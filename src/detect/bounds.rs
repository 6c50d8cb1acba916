//! Absolute sanity bounds next to the relative rules (a run broken from its first step has
//! no "normal" history to spike against), the first-update checks of an on-policy step, and
//! a KL that is exactly zero for many steps.

use super::preference::{is_preference, PREF_MARKERS};
use super::{metric_list, runs, Context, Detector, Finding, Severity, G};

/// `ln(262144)`: the per-token entropy of a uniform distribution over the largest common
/// vocabulary (Gemma 3's 262,144 tokens). A mean per-token entropy above it is impossible.
pub const MAX_ENTROPY_NATS: f64 = 12.476_649_250_079_01;

/// `--bounds`: values no healthy run reaches, whatever its history.
pub struct Bounds;

impl Detector for Bounds {
    fn name(&self) -> &'static str {
        "bounds"
    }
    fn summary(&self) -> &'static str {
        "grad norm, loss or entropy beyond what any healthy run reaches (absolute, from the first step)"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &BOUNDS_METRICS
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        let first_step = f.steps().first();
        let mut out = Vec::new();
        const LOGIT_CAUSES: &[&str] = &[
            "broken numerics in the output head: logits in fp16/bf16 overflowing, or a head (lm_head, value head) loaded with the wrong weights or not tied to the embedding it was trained with",
            "a logit soft-cap or temperature missing where the model needs it (Gemma-style final_logit_softcapping)",
            "the logged tensor is not the logits (a sum over the vocabulary instead of a mean)",
        ];
        let checks: [(&str, f64, Severity, &str, &[&str]); 7] = [
            (
                "grad_norm",
                ctx.th.get("bounds.grad_norm"),
                Severity::Error,
                "gradient norm",
                &[
                    "loss summed over tokens or sequences instead of averaged (a scale of the batch's token count)",
                    "fp16 without loss scaling, or a broken initialisation / dtype cast of the weights",
                    "rewards or advantages on a huge scale (unnormalised reward model scores)",
                ],
            ),
            (
                "critic_grad_norm",
                ctx.th.get("bounds.grad_norm"),
                Severity::Error,
                "critic gradient norm",
                &[
                    "value targets on a huge scale (returns not normalised)",
                    "critic learning rate too high or value head initialised badly",
                ],
            ),
            (
                "aux_grad_norm",
                ctx.th.get("bounds.grad_norm"),
                Severity::Error,
                "gradient norm of another part of the model (a world model, an auxiliary head)",
                &[
                    "that part diverging: its own loss on a huge scale or a learning rate too high for it",
                    "fp16 without loss scaling for that part, or a norm summed over its shards",
                ],
            ),
            (
                "loss",
                ctx.th.get("bounds.loss"),
                Severity::Warning,
                "|loss|",
                &[
                    "loss summed instead of averaged",
                    "importance ratio exp(logp - old_logp) overflowing (stale or mismatched log-probs)",
                ],
            ),
            (
                "entropy",
                MAX_ENTROPY_NATS,
                Severity::Error,
                "entropy (nats per token) above ln(262144), the most any vocabulary allows",
                &[
                    "entropy summed over tokens or sequences instead of averaged per token",
                    "logits divided by a tiny temperature or not the model's (a wrong tensor logged)",
                ],
            ),
            (
                "pref_logits_chosen",
                ctx.th.get("bounds.logits"),
                Severity::Error,
                "mean logit of the chosen completions (logits/chosen; logits/rejected alike when both are)",
                LOGIT_CAUSES,
            ),
            (
                "pref_logits_rejected",
                ctx.th.get("bounds.logits"),
                Severity::Error,
                "mean logit of the rejected completions",
                LOGIT_CAUSES,
            ),
        ];
        for (metric, bound, severity, what, causes) in checks {
            let over: Vec<(i64, f64)> = f
                .points(metric)
                .filter(|(_, v)| v.is_finite() && v.abs() > bound)
                .collect();
            if over.is_empty() {
                continue;
            }
            let n = f.points(metric).filter(|(_, v)| v.is_finite()).count();
            let max = over.iter().map(|(_, v)| v.abs()).fold(0.0f64, f64::max);
            let from_start = over.first().map(|(s, _)| *s) == first_step;
            // One gradient-norm excursion in a history of ordinary steps (unsloth#5207: 8,
            // 9, …, then 11140 once) is judged against that history by grad-spike; the
            // absolute bound is for a norm broken from the start or for good.
            if metric.ends_with("grad_norm") && over.len() == 1 && !from_start && n >= 5 {
                continue;
            }
            // The rejected completions' logits broken with the chosen ones: one finding.
            if metric == "pref_logits_rejected"
                && out
                    .iter()
                    .any(|o: &Finding| o.evidence["metric"] == "pref_logits_chosen")
            {
                continue;
            }
            let steps: Vec<i64> = over.iter().map(|(s, _)| *s).collect();
            // A huge gradient beside an ordinary loss is no summed loss: the norm itself or a
            // few parameters are at fault.
            let mut sorted = steps.clone();
            sorted.sort_unstable();
            let loss_there = f
                .points("loss")
                .filter(|(s, v)| v.is_finite() && sorted.binary_search(s).is_ok())
                .map(|(_, v)| v.abs())
                .reduce(f64::max);
            let ordinary_loss =
                metric == "grad_norm" && loss_there.is_some_and(|l| l < ORDINARY_LOSS);
            let causes: &[&str] = if ordinary_loss {
                &[
                    "the reported norm, not the update: a norm summed over parallel ranks or shards, or taken before the fp16/bf16 loss scale is divided out (the loss itself is ordinary here)",
                    "a few parameters with huge gradients (an embedding row of unused tokens, a layer unfrozen late); clipping bounds the update, not the logged norm",
                    "rewards or advantages on a huge scale (unnormalised reward model scores)",
                ]
            } else {
                causes
            };
            let mut finding = Finding::new(
                    self.name(),
                    severity,
                    steps,
                    format!(
                        "{what} {} on {} of {n} logged steps (up to {}){}: beyond the absolute bound {}, whatever the run's own history",
                        if metric == "entropy" { "" } else { "above the bound" },
                        over.len(),
                        G(max),
                        if from_start { ", from the first logged step" } else { "" },
                        G(bound)
                    ),
                    causes,
                )
            .with("metric", metric)
            .num("max", max)
            .num("bound", bound)
            .with("from_first_step", from_start);
            if let (true, Some(l)) = (metric == "grad_norm", loss_there) {
                finding = finding.num("max_abs_loss_there", l);
            }
            out.push(finding);
        }
        out.extend(supervised_zero_loss(f));
        out
    }
}

/// What `--bounds` reads: the bounded metrics, and what says a loss is an RL or preference
/// objective (which may be 0) rather than a supervised one (which never is).
const BOUNDS_METRICS: [&str; 22] = metric_list(
    &metric_list::<15>(
        &[
            "grad_norm",
            "critic_grad_norm",
            "loss",
            "entropy",
            "aux_grad_norm",
            "pref_logits_chosen",
            "pref_logits_rejected",
        ],
        &RL_MARKERS,
    ),
    &PREF_MARKERS,
);

/// The metrics of [`BOUNDS_METRICS`] only an RL objective logs.
pub(crate) const RL_MARKERS: [&str; 8] = [
    "reward_mean",
    "reward_std",
    "frac_reward_zero_std",
    "kl",
    "ppo_kl",
    "adv_max",
    "adv_min",
    "critic_loss",
];

/// A supervised (next-token) loss printed as exactly 0 right after an ordinary one, with the
/// gradient flowing: no target token was scored (every label masked), or the loss was not
/// reduced over the tokens. An RL or preference objective can be 0; this one cannot.
fn supervised_zero_loss(f: &crate::frames::log::frame::LogFrame) -> Option<Finding> {
    let rl = RL_MARKERS.iter().any(|m| f.col(m).is_some_and(|c| c.any()));
    if rl || is_preference(f) {
        return None;
    }
    let grad = |s: i64| f.points("grad_norm").find(|(g, _)| *g == s).map(|(_, v)| v);
    let loss: Vec<(i64, f64)> = f.points("loss").filter(|(_, v)| v.is_finite()).collect();
    let at: Vec<(i64, f64)> = loss
        .windows(2)
        .filter(|w| w[0].1 >= 0.1 && w[1].1 == 0.0)
        .filter_map(|w| {
            grad(w[1].0)
                .filter(|g| g.is_finite() && *g > 0.0)
                .map(|g| (w[1].0, g))
        })
        .collect();
    let (first, g) = *at.first()?;
    Some(
        Finding::new(
            "bounds",
            Severity::Warning,
            at.iter().map(|(s, _)| *s).collect(),
            format!(
                "the loss is exactly 0 at {} logged step(s) (first {first}, grad norm {}) right after an ordinary loss, in a log with no RL or preference metric: a supervised next-token loss is never 0",
                at.len(),
                G(g)
            ),
            &[
                "no target token in the batch: every label masked (-100), e.g. the answer truncated away or a template that masks the completion",
                "the loss divided by a token count that is wrong (gradient accumulation's num_items_in_batch), or not reduced over tokens",
                "a logging bug: the printed loss is not the one the optimiser used (compare grad_norm, which is not 0)",
            ],
        )
        .with("metric", "loss")
        .num("grad_norm_there", g),
    )
}

/// |loss| below this beside a gradient norm over its bound: an ordinary loss, not a sum.
const ORDINARY_LOSS: f64 = 10.0;

/// `--first-update`: on the first update of an on-policy run the sampling policy, the
/// trained policy and the reference are the same weights, so the PPO KL, the clip
/// fraction, |ratio − 1| and the KL to the reference must all be ≈ 0 there.
pub struct FirstUpdate;

/// What `--first-update` reads (the preference markers keep it quiet on DPO/KTO runs).
const FIRST_UPDATE_METRICS: [&str; 11] =
    metric_list(&["ppo_kl", "clip_ratio", "ratio_mean", "kl"], &PREF_MARKERS);

impl Detector for FirstUpdate {
    fn name(&self) -> &'static str {
        "first-update"
    }
    fn summary(&self) -> &'static str {
        "ppo_kl, clip fraction, |ratio - 1| or KL to the reference not ~0 at the run's first step"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &FIRST_UPDATE_METRICS
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        // Only a run's real start: an explicit step 0 or 1 (TRL's stdout dicts carry no
        // step; numbered in order, their first record need not be the run's first).
        let Some(first) = f.steps().first() else {
            return vec![];
        };
        if first > 1 || f.source(0).contains("trl_dict") || is_preference(f) {
            return vec![];
        }
        let at_first = |m: &str| f.at(m, 0).filter(|v| v.is_finite());
        let mut bad: Vec<String> = Vec::new();
        let mut finding_nums: Vec<(&str, f64)> = Vec::new();
        if let Some(v) = at_first("ppo_kl") {
            if v.abs() > ctx.th.get("first_update.ppo_kl") {
                bad.push(format!("ppo_kl {}", G(v)));
                finding_nums.push(("ppo_kl", v));
            }
        }
        if let Some(v) = at_first("clip_ratio") {
            if v > ctx.th.get("first_update.clip") {
                bad.push(format!("clip fraction {}", G(v)));
                finding_nums.push(("clip_ratio", v));
            }
        }
        if let Some(v) = at_first("ratio_mean") {
            if (v - 1.0).abs() > ctx.th.get("first_update.ratio") {
                bad.push(format!("ratio mean {}", G(v)));
                finding_nums.push(("ratio_mean", v));
            }
        }
        if let Some(v) = at_first("kl") {
            if v.abs() > ctx.th.get("first_update.kl") {
                bad.push(format!("KL to the reference {}", G(v)));
                finding_nums.push(("kl", v));
            }
        }
        if bad.is_empty() {
            return vec![];
        }
        let mut finding = Finding::new(
            self.name(),
            Severity::Warning,
            vec![first],
            format!(
                "at step {first}, the run's first update, {}: there the sampling policy, the trained policy and the reference are the same weights, so these must be ~0",
                bad.join(", ")
            ),
            &[
                "the rollout engine's log-probs are not the trainer's (weights not synced, different dtype/kernels, temperature or top-p not applied to the trainer's logits)",
                "the reference model is not the initial policy (a different checkpoint, or LoRA reference with the adapter enabled)",
                "several mini-batch updates averaged into the first step's numbers (then only the first mini-batch must be ~0)",
            ],
        );
        for (k, v) in finding_nums {
            finding = finding.num(k, v);
        }
        vec![finding]
    }
}

/// `--kl-zero`: the KL to the reference exactly 0 on many consecutive steps.
pub struct KlZero;

/// What `--kl-zero` reads.
const KL_ZERO_METRICS: [&str; 10] =
    metric_list(&["kl", "reward_mean", "reward_std"], &PREF_MARKERS);

impl Detector for KlZero {
    fn name(&self) -> &'static str {
        "kl-zero"
    }
    fn summary(&self) -> &'static str {
        "kl exactly 0 on many consecutive steps: beta = 0 or the reference is the policy"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &KL_ZERO_METRICS
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        // KTO's batch KL is clamped at 0 by design; with no reward in the log the KL is the
        // objective itself (distillation), and a zero there is zero-loss's finding.
        let has_reward = ["reward_mean", "reward_std"]
            .iter()
            .any(|m| f.col(m).is_some_and(|c| c.any()));
        if is_preference(f) || !has_reward {
            return vec![];
        }
        let s = f.view("kl");
        let min = ctx.th.get("kl_zero.min_steps").max(2.0) as usize;
        let flags: Vec<bool> = s.values().map(|v| v == 0.0).collect();
        let mut out = Vec::new();
        for (a, b) in runs(&flags) {
            if b + 1 - a < min {
                continue;
            }
            let steps: Vec<i64> = s.range(a, b + 1).map(|(st, _)| st).collect();
            let n = steps.len();
            let (first, last) = (steps[0], steps[n - 1]);
            out.push(
                Finding::new(
                    self.name(),
                    Severity::Warning,
                    steps,
                    format!(
                        "kl is exactly 0 on {n} consecutive logged steps ({first}–{last}): the policy is never pulled back to a reference"
                    ),
                    &[
                        "β = 0: the KL term is not computed (intended in DAPO/Dr. GRPO recipes; then say so)",
                        "the reference model is the policy itself (ref_model = model, or a LoRA reference computed with the adapter on)",
                        "the policy is not updated at all (see zero-grad / grad-not-flowing)",
                    ],
                )
                .with("zero_steps", n),
            );
        }
        out
    }
}

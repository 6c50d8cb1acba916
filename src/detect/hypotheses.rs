//! A verdict per hypothesis for a run that does not improve (seed 003's table): H01
//! advantage scaling, H02 token masking, H03 KL term, H04 context truncation, H05 reward
//! signal, H06 LoRA / weight sync. Each is *supported*, *not supported* or *cannot tell*
//! from the metrics and the findings that fired (so a verdict never cites a detector that
//! did not fire), with its evidence (metrics, steps) and, when it cannot be told, what to
//! log or run to decide it.

use super::{Finding, G};
use crate::frames::log::frame::LogFrame;

/// What the logs say about one hypothesis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The logs show the signature.
    Supported,
    /// The logged metrics rule it out.
    NotSupported,
    /// Nothing logged decides it.
    CannotTell,
}

impl Verdict {
    /// Words for tables.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Supported => "supported",
            Verdict::NotSupported => "not supported",
            Verdict::CannotTell => "cannot tell",
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Hypothesis {
    /// `H01` … `H06`.
    pub id: &'static str,
    /// What it claims.
    pub name: &'static str,
    /// The verdict.
    pub verdict: Verdict,
    /// Why: metrics, steps, findings.
    pub evidence: String,
    /// What to log or run to decide it (cannot tell), or to confirm it (supported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to_decide: Option<String>,
}

/// The table and the run's reward trend it answers for.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HypothesisTable {
    /// Reward mean of the first and last quarter of logged steps (when logged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reward_first_last: Option<(f64, f64)>,
    /// The plateau detector fired (the run does not improve).
    pub plateau: bool,
    /// H01–H06.
    pub rows: Vec<Hypothesis>,
}

/// The hypotheses' ids and names, in the table's order.
const NAMES: [(&str, &str); 6] = [
    (
        "H01",
        "advantage scaling (tiny reward std blows advantages up)",
    ),
    ("H02", "token masking (loss on the wrong tokens)"),
    ("H03", "KL term (wrong sign/estimator, or too strong)"),
    (
        "H04",
        "context truncation (prompt or completion cut at a length limit)",
    ),
    (
        "H05",
        "reward signal (no variance within groups, constant components)",
    ),
    (
        "H06",
        "LoRA / weight sync (updates never reach the policy that samples)",
    ),
];

/// Canonical metrics the table reads.
pub const TABLE_METRICS: [&str; 11] = [
    "reward_mean",
    "reward_std",
    "frac_reward_zero_std",
    "adv_max",
    "adv_min",
    "kl",
    "grad_norm",
    "truncation_ratio",
    "logp_abs_diff_mean",
    "rollout_kl",
    "logprob_diff_mean",
];

/// Finite values of a metric.
fn pts(f: &LogFrame, m: &str) -> Vec<(i64, f64)> {
    f.points(m).filter(|(_, v)| v.is_finite()).collect()
}

fn span(p: &[(i64, f64)]) -> String {
    match (p.first(), p.last()) {
        (Some(a), Some(b)) if a.0 != b.0 => format!("steps {}–{}", a.0, b.0),
        (Some(a), _) => format!("step {}", a.0),
        _ => String::new(),
    }
}

fn fired<'a>(findings: &'a [Finding], names: &[&str]) -> Vec<&'a Finding> {
    findings
        .iter()
        .filter(|f| names.contains(&f.detector.as_str()))
        .collect()
}

/// `name (steps a–b)` of each finding.
fn cite(fs: &[&Finding]) -> String {
    fs.iter()
        .map(|f| format!("{} (steps {})", f.detector, f.step_range()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn row(
    id: &'static str,
    name: &'static str,
    verdict: Verdict,
    evidence: String,
    to_decide: Option<&str>,
) -> Hypothesis {
    Hypothesis {
        id,
        name,
        verdict,
        evidence,
        to_decide: to_decide.map(str::to_string),
    }
}

/// Mean of the first and last quarter of a series (at least 4 points).
fn quarters(p: &[(i64, f64)]) -> Option<(f64, f64)> {
    if p.len() < 4 {
        return None;
    }
    let q = p.len() / 4;
    let mean = |s: &[(i64, f64)]| s.iter().map(|(_, v)| v).sum::<f64>() / s.len() as f64;
    Some((mean(&p[..q]), mean(&p[p.len() - q..])))
}

/// The table for the run of `frame`, consistent with `findings` (those of the same scan).
pub fn verdicts(frame: &LogFrame, findings: &[Finding]) -> HypothesisTable {
    let reward = pts(frame, "reward_mean");
    // A log with no RL quantity at all (a supervised loss and its gradient: dllogger's BERT,
    // a Megatron pretraining console) gives the RL hypotheses nothing to stand on: say so
    // once per row instead of six unrelated "log reward_std" requests.
    let rl = TABLE_METRICS
        .iter()
        .filter(|m| **m != "grad_norm")
        .any(|m| !pts(frame, m).is_empty())
        || findings
            .iter()
            .any(|f| f.detector.starts_with("completions"));
    if !rl {
        return HypothesisTable {
            reward_first_last: None,
            plateau: !fired(findings, &["plateau"]).is_empty(),
            rows: NAMES
                .iter()
                .map(|(id, name)| {
                    row(
                        id,
                        name,
                        Verdict::CannotTell,
                        "no reward, KL, advantage or rollout metric in this log (a supervised loss only): the RL hypotheses do not apply to it".into(),
                        Some("scan the RL run's own log (its rewards, KL and advantages), not this one"),
                    )
                })
                .collect(),
        };
    }
    HypothesisTable {
        reward_first_last: quarters(&reward),
        plateau: !fired(findings, &["plateau"]).is_empty(),
        rows: vec![
            h01(frame, findings),
            h02(findings),
            h03(frame, findings),
            h04(frame, findings),
            h05(frame, findings),
            h06(frame, findings),
        ],
    }
}

fn h01(f: &LogFrame, findings: &[Finding]) -> Hypothesis {
    const NAME: &str = NAMES[0].1;
    let adv = fired(findings, &["adv-explosion"]);
    if !adv.is_empty() {
        return row("H01", NAME, Verdict::Supported, format!("fired: {}", cite(&adv)),
            Some("confirm with scale_rewards=false (TRL) / norm_adv_by_std_in_grpo=false (verl) and logscan --compare scaled unscaled"));
    }
    let std = pts(f, "reward_std");
    let adv_max: Vec<(i64, f64)> = pts(f, "adv_max")
        .into_iter()
        .chain(pts(f, "adv_min").into_iter().map(|(s, v)| (s, -v)))
        .collect();
    let nonzero: Vec<f64> = std.iter().map(|(_, v)| *v).filter(|v| *v > 0.0).collect();
    if nonzero.is_empty() && adv_max.is_empty() {
        return row("H01", NAME, Verdict::CannotTell,
            "neither reward_std (non-zero) nor advantage extremes are logged".into(),
            Some("log reward_std per step and max |advantage| (e.g. debug/advantage_max), or run scale_rewards=false and logscan --compare scaled unscaled"));
    }
    let min_std = nonzero.iter().copied().fold(f64::INFINITY, f64::min);
    let max_adv = adv_max.iter().map(|(_, v)| v.abs()).fold(0.0, f64::max);
    let mut ev = Vec::new();
    if !nonzero.is_empty() {
        ev.push(format!(
            "smallest non-zero reward_std {} (non-zero on {} of {} logged steps, {})",
            G(min_std),
            nonzero.len(),
            std.len(),
            span(&std)
        ));
    }
    if !adv_max.is_empty() {
        ev.push(format!("max |advantage| {}", G(max_adv)));
    }
    row(
        "H01",
        NAME,
        Verdict::NotSupported,
        format!(
            "{}; adv-explosion did not fire (std ≥ 1e-3, |adv| ≤ 10)",
            ev.join(", ")
        ),
        None,
    )
}

fn h02(findings: &[Finding]) -> Hypothesis {
    const NAME: &str = NAMES[1].1;
    let leak = fired(findings, &["completions-template-leak"]);
    if !leak.is_empty() {
        return row("H02", NAME, Verdict::Supported,
            format!("fired: {}: the completion text trained on holds template/next-turn tokens", cite(&leak)),
            Some("decode one batch where the loss mask is 1 and check that only the assistant's answer is kept"));
    }
    row("H02", NAME, Verdict::CannotTell,
        "no metric logs which tokens the loss covers".into(),
        Some("log the masked token count per step next to the completion lengths (they must be equal), or dump one batch (input_ids, response_mask) and read it with dumpdiff"))
}

fn h03(f: &LogFrame, findings: &[Finding]) -> Hypothesis {
    const NAME: &str = NAMES[2].1;
    let bad = fired(findings, &["kl-explosion", "kl-negative"]);
    if !bad.is_empty() {
        return row(
            "H03",
            NAME,
            Verdict::Supported,
            format!("fired: {}", cite(&bad)),
            Some("compare β = 0 with the run (logscan --compare beta0 run)"),
        );
    }
    let kl = pts(f, "kl");
    if kl.is_empty() {
        return row("H03", NAME, Verdict::CannotTell,
            "kl is not logged (TRL logs none when β = 0; a PPO loop may fold it into the reward unlogged)".into(),
            Some("log the KL and β; a run with β = 0 compared to this one (logscan --compare beta0 run) decides it"));
    }
    if kl.iter().all(|(_, v)| *v == 0.0) {
        return row("H03", NAME, Verdict::NotSupported,
            format!("kl is exactly 0 on all {} logged steps ({}): the KL term adds nothing to the loss, so it cannot hold the policy back (β = 0, or reference = policy: see H06)", kl.len(), span(&kl)),
            None);
    }
    let max = kl.iter().map(|(_, v)| *v).fold(f64::NEG_INFINITY, f64::max);
    row(
        "H03",
        NAME,
        Verdict::NotSupported,
        format!(
            "kl logged on {} steps ({}), max {}, never negative or exploding",
            kl.len(),
            span(&kl),
            G(max)
        ),
        None,
    )
}

fn h04(f: &LogFrame, findings: &[Finding]) -> Hypothesis {
    const NAME: &str = NAMES[3].1;
    let cut = fired(
        findings,
        &[
            "truncation",
            "completions-unterminated",
            "completions-identical",
        ],
    );
    // A truncation finding whose cause the completions moved elsewhere (garbage, loops)
    // is not a length limit.
    let by_text = findings
        .iter()
        .find(|x| x.detector == "completions-unterminated")
        .and_then(|x| x.evidence.get("likely_cause"))
        .and_then(|v| v.as_str())
        .filter(|c| *c != "max completion length");
    if let (false, None) = (cut.is_empty(), by_text) {
        return row(
            "H04",
            NAME,
            Verdict::Supported,
            format!("fired: {}", cite(&cut)),
            Some(
                "raise max_prompt_length / max_completion_length and log the share of prompts cut",
            ),
        );
    }
    let ratio = pts(f, "truncation_ratio");
    let ev = match (by_text, ratio.is_empty()) {
        (Some(c), _) => format!("completions hit the cap but the text shows why ({c}), not the limit"),
        (None, false) => format!(
            "completions: truncation ratio at most {} ({}); prompts: no prompt-length metric logged",
            G(ratio.iter().map(|(_, v)| *v).fold(0.0, f64::max)),
            span(&ratio)
        ),
        (None, true) => "no truncation ratio or prompt length logged".into(),
    };
    row("H04", NAME, Verdict::CannotTell, ev,
        Some("log prompt length (mean/max) and the share of prompts cut at max_prompt_length; rerun with a larger limit and logscan --compare short long"))
}

fn h05(f: &LogFrame, findings: &[Finding]) -> Hypothesis {
    const NAME: &str = NAMES[4].1;
    let weak = fired(
        findings,
        &[
            "dead-groups",
            "reward-constant",
            "zero-loss",
            "completions-blank",
            "completions-identical",
            "plateau",
        ],
    );
    // A plateau alone is the symptom, not this cause.
    if weak.iter().any(|x| x.detector != "plateau") {
        let signal: Vec<&Finding> = weak
            .into_iter()
            .filter(|x| x.detector != "plateau")
            .collect();
        return row("H05", NAME, Verdict::Supported, format!("fired: {}", cite(&signal)),
            Some("log each reward component's mean/std per step; a component at the same value on every step carries no signal"));
    }
    let std = pts(f, "reward_std");
    let zero = pts(f, "frac_reward_zero_std");
    if std.is_empty() && zero.is_empty() {
        return row(
            "H05",
            NAME,
            Verdict::CannotTell,
            "neither reward_std nor frac_reward_zero_std is logged".into(),
            Some("log reward_std and frac_reward_zero_std per step"),
        );
    }
    let pos = std.iter().filter(|(_, v)| *v > 0.0).count();
    row("H05", NAME, Verdict::NotSupported,
        format!("reward_std > 0 on {pos} of {} logged steps; dead-groups and reward-constant did not fire", std.len()), None)
}

fn h06(f: &LogFrame, findings: &[Finding]) -> Hypothesis {
    const NAME: &str = NAMES[5].1;
    let sync = fired(findings, &["logprob-mismatch", "grad-not-flowing"]);
    if !sync.is_empty() {
        return row(
            "H06",
            NAME,
            Verdict::Supported,
            format!("fired: {}", cite(&sync)),
            Some("logscan --compare lora full (a --no-peft run with the same seed)"),
        );
    }
    // KL exactly 0 after the first update while gradients flow: the policy still equals
    // the reference (LoRA adapter not applied / not synced).
    let kl = pts(f, "kl");
    let grad = pts(f, "grad_norm");
    let later: Vec<(i64, f64)> = kl.iter().skip(1).copied().collect();
    let flowing = grad.iter().filter(|(_, g)| *g > 0.0).count();
    if later.len() >= 5
        && later.iter().all(|(_, v)| *v == 0.0)
        && flowing * 2 >= grad.len()
        && flowing > 0
    {
        return row("H06", NAME, Verdict::Supported,
            format!("kl exactly 0 on all {} logged steps after the first ({}) while grad_norm > 0 on {flowing} of {}: the policy never moves away from the reference", later.len(), span(&later), grad.len()),
            Some("logscan --compare lora full (a --no-peft run with the same seed); check the adapter is enabled in the policy and merged/synced into the sampler"));
    }
    let diff: Vec<(i64, f64)> = ["logp_abs_diff_mean", "rollout_kl", "logprob_diff_mean"]
        .iter()
        .flat_map(|m| pts(f, m))
        .collect();
    if !diff.is_empty() {
        let max = diff.iter().map(|(_, v)| v.abs()).fold(0.0, f64::max);
        return row("H06", NAME, Verdict::NotSupported,
            format!("trainer-vs-sampler log-prob difference at most {} ({}): the sampler has the trainer's weights; logprob-mismatch did not fire", G(max), span(&diff)),
            None);
    }
    row("H06", NAME, Verdict::CannotTell,
        "no trainer-vs-sampler log-prob difference logged, and KL does not show the policy stuck at the reference".into(),
        Some("logscan --compare lora full (the same run with --no-peft); or log TRL sampling/sampling_logp_difference/mean or verl rollout_corr/kl"))
}

//! Completion and group signatures: dead groups (zero reward std), truncation, empty
//! completions.

use super::{median_in_place, Context, Detector, Finding, Severity};
use crate::frames::log::frame::LogFrame;
use crate::frames::log::series::Series;

/// `--dead-groups`: many groups with identical rewards (zero std) give no signal.
pub struct DeadGroups;

impl Detector for DeadGroups {
    fn name(&self) -> &'static str {
        "dead-groups"
    }
    fn summary(&self) -> &'static str {
        "frac_reward_zero_std high (groups with identical rewards give no gradient)"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &[
            "frac_reward_zero_std",
            "reward_std",
            "grad_norm",
            "adv_max",
            "adv_min",
            "loss",
            "truncation_ratio",
        ]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        after_a_broken_update(ctx, after_truncation(ctx, self.find(ctx)))
    }
}

/// Groups tied on steps where every completion was cut at the length limit (autocontext#1067:
/// `completions/clipped_ratio: 1`, `reward: 0`, `frac_reward_zero_std: 1`): the verifier
/// never saw an answer, so the cut is their first cause, not the task's difficulty.
fn after_truncation(ctx: &Context, mut findings: Vec<Finding>) -> Vec<Finding> {
    let cut: Vec<i64> = ctx
        .frame
        .points("truncation_ratio")
        .filter(|(_, v)| *v >= 0.99)
        .map(|(s, _)| s)
        .collect();
    for finding in &mut findings {
        let on_cut = finding.steps.iter().filter(|s| cut.contains(s)).count();
        if on_cut > 0 && on_cut * 2 >= finding.steps.len() {
            finding.likely_causes.insert(
                0,
                format!("every completion cut at the length limit on {on_cut} of these steps (see truncation): cut before their answers, all score alike; raise the max completion length or stop the rambling first"),
            );
        }
    }
    findings
}

impl DeadGroups {
    /// The findings before [`after_a_broken_update`].
    fn find(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        let (series, source) = dead_series(f);
        let derived = source != DeadSource::Frac;
        if series.is_empty() {
            return vec![];
        }
        let th = ctx.th.get("dead_groups.frac");
        // Lists of a long log are sized up front (grown by doubling, they were copied
        // into fresh pages ~20 times); the dead steps are one list, read below and then
        // handed to the finding.
        let mut dead: Vec<i64> = Vec::with_capacity(series.len());
        dead.extend(series.iter().filter(|(_, v)| *v >= th).map(|(s, _)| s));
        let share = dead.len() as f64 / series.len() as f64;
        // A step whose reward_std (the mean of the group stds, TRL/DebugTrainer) is exactly
        // 0 had no group with any reward variance: the whole step is wasted, so a few such
        // steps are worth a warning even when they are a small share.
        let wasted_steps = derived
            && dead.len() >= ctx.th.get("dead_groups.min_steps") as usize
            && share >= ctx.th.get("dead_groups.min_wasted_share");
        if dead.is_empty() {
            return vec![];
        }
        if share < ctx.th.get("dead_groups.min_share") && !wasted_steps {
            return sustained_dead_run(self, ctx, &series, derived)
                .into_iter()
                .collect();
        }
        let severity = if share >= ctx.th.get("dead_groups.error_share") {
            Severity::Error
        } else {
            Severity::Warning
        };
        let mean_frac = series.values().sum::<f64>() / series.len() as f64;
        let how = match source {
            DeadSource::Frac => "frac_reward_zero_std is high",
            DeadSource::RewardStd => "group reward std is exactly 0",
            DeadSource::Advantages => "every advantage is exactly 0 (max = min = 0)",
        };
        let explanation = format!(
            "{how} on {} of {} logged steps ({:.0}%{}): those groups contribute no gradient",
            dead.len(),
            series.len(),
            share * 100.0,
            if dead.len() <= 8 {
                format!(
                    ", steps {}",
                    dead.iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                String::new()
            }
        );
        let medians = grad_medians(f, &dead);
        let mut finding = Finding::new(
            self.name(),
            severity,
            dead,
            explanation,
            &[
                "task too hard (all completions score 0) or too easy (all score 1) for the model",
                "group size too small to see reward variance (group_size 2)",
                "judge/reward function returning a constant",
                "empty or identical completions within a group",
            ],
        )
        .num("dead_step_share", share)
        .num("mean_frac_zero_std", mean_frac)
        .with("derived_from_reward_std", source == DeadSource::RewardStd)
        .with("logged_steps", series.len());
        if source == DeadSource::Advantages {
            finding = finding.with("derived_from_advantages", true);
        }
        if let Some((a, b)) = medians {
            finding = finding
                .num("median_grad_norm_on_dead_steps", a)
                .num("median_grad_norm_on_other_steps", b);
        }
        vec![finding]
    }
}

/// What the gradient did on the dead steps: the median grad_norm on `dead_steps` vs the
/// others (a whole-step dead batch should leave only the KL term's gradient).
fn grad_medians(f: &LogFrame, dead_steps: &[i64]) -> Option<(f64, f64)> {
    let (mut on_dead, mut on_rest) = (Vec::with_capacity(f.len()), Vec::with_capacity(f.len()));
    // `dead_steps` ascends; so do the grad_norm steps of one run's frame, which are
    // then matched by a forward walk (a binary search where a step goes back).
    let (mut j, mut last) = (0usize, i64::MIN);
    for (s, g) in f.points("grad_norm").filter(|(_, g)| g.is_finite()) {
        let dead = if s >= last {
            while dead_steps.get(j).is_some_and(|&d| d < s) {
                j += 1;
            }
            dead_steps.get(j) == Some(&s)
        } else {
            dead_steps.binary_search(&s).is_ok()
        };
        last = s;
        if dead {
            on_dead.push(g);
        } else {
            on_rest.push(g);
        }
    }
    match (median_in_place(&mut on_dead), median_in_place(&mut on_rest)) {
        (Some(a), Some(b)) => Some((a, b)),
        _ => None,
    }
}

/// Truncated or tied completions from a step whose loss or gradient norm is non-finite come
/// from weights the NaN broke (Agent-R1#30: every actor metric nan, every response at the
/// length cap, every score −1): that is their first cause, not the length limit or the
/// task's difficulty.
fn after_a_broken_update(ctx: &Context, mut findings: Vec<Finding>) -> Vec<Finding> {
    let f = ctx.frame;
    let broken: Vec<i64> = ["loss", "grad_norm"]
        .iter()
        .flat_map(|m| f.points(m).filter(|(_, v)| !v.is_finite()).map(|(s, _)| s))
        .collect();
    for finding in &mut findings {
        // The finding starts at the broken step: before it, the NaN explains nothing.
        if let Some(s) = finding.first_step.filter(|s| broken.contains(s)) {
            finding.likely_causes.insert(
                0,
                format!("weights broken by the non-finite update at step {s} (see nan-grad): a broken policy writes garbage to the length cap and earns nothing"),
            );
        }
    }
    findings
}

/// Where a step's dead-group share comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeadSource {
    /// `frac_reward_zero_std` as logged.
    Frac,
    /// The group reward std exactly 0 (every group dead) or not.
    RewardStd,
    /// The batch's advantages all exactly 0 (verl `critic/advantages/max` and `/min` 0: no
    /// group had a reward spread, so no sample carries a policy-gradient signal).
    Advantages,
}

/// Per logged step, the share of dead groups (1 or 0 when derived), from the best source
/// the log has: `frac_reward_zero_std`, else the group reward std, else the advantages'
/// range.
fn dead_series(f: &LogFrame) -> (Series<'_>, DeadSource) {
    let s = f.view("frac_reward_zero_std");
    if !s.is_empty() {
        return (s, DeadSource::Frac);
    }
    let mut s = f.series_where("reward_std", f64::is_finite);
    if !s.is_empty() {
        for p in &mut s {
            p.1 = if p.1 == 0.0 { 1.0 } else { 0.0 };
        }
        return (Series::owned(s), DeadSource::RewardStd);
    }
    let s = (0..f.len())
        .filter_map(|i| {
            let (hi, lo) = (f.at("adv_max", i)?, f.at("adv_min", i)?);
            (hi.is_finite() && lo.is_finite())
                .then(|| (f.step(i), if hi == 0.0 && lo == 0.0 { 1.0 } else { 0.0 }))
        })
        .collect();
    (Series::owned(s), DeadSource::Advantages)
}

/// The longest stretch of consecutive logged steps on which every group was dead
/// (frac_reward_zero_std ≥ 0.999, or reward std exactly 0 when derived), reported when it
/// reaches `dead_groups.sustained_steps`: ten wasted steps in a row are a collapse of the
/// learning signal even when they are a small share of a long run.
fn sustained_dead_run(
    d: &DeadGroups,
    ctx: &Context,
    series: &Series,
    derived: bool,
) -> Option<Finding> {
    let need = ctx.th.get("dead_groups.sustained_steps").max(1.0) as usize;
    let (mut best, mut cur) = ((0usize, 0usize), (0usize, 0usize));
    for (i, v) in series.values().enumerate() {
        if v >= FULLY_DEAD {
            if cur.1 == 0 {
                cur.0 = i;
            }
            cur.1 += 1;
            if cur.1 > best.1 {
                best = cur;
            }
        } else {
            cur = (i + 1, 0);
        }
    }
    let (start, len) = best;
    if len < need {
        return None;
    }
    let stretch: Vec<i64> = series.range(start, start + len).map(|(s, _)| s).collect();
    let (first, last) = (stretch[0], stretch[len - 1]);
    let share = len as f64 / series.len() as f64;
    Some(
        Finding::new(
            d.name(),
            Severity::Warning,
            stretch,
            format!(
                "every group dead for {len} logged steps in a row (steps {first}–{last}, {:.0}% of {} logged): no learning signal for that stretch",
                share * 100.0,
                series.len()
            ),
            &[
                "the policy collapsed onto one answer per prompt (all completions score the same)",
                "a data shard of prompts too hard or too easy for the model",
                "judge/reward function returning a constant for a while (service down, timeout default)",
            ],
        )
        .with("sustained_dead_steps", len)
        .with("first_dead_step", first)
        .with("last_dead_step", last)
        .num("dead_step_share", share)
        .with("derived_from_reward_std", derived)
        .with("logged_steps", series.len()),
    )
}

/// frac_reward_zero_std at or above this means every group of the step was dead.
const FULLY_DEAD: f64 = 0.999;

/// `--truncation`: too many completions hit the max length: a clipped/truncated ratio at
/// or above the threshold, no response ending with EOS (TRL PPO `val/num_eos_tokens` 0),
/// or every completion of a step exactly as long as the longest (mean = max: the limit).
pub struct Truncation;

impl Detector for Truncation {
    fn name(&self) -> &'static str {
        "truncation"
    }
    fn summary(&self) -> &'static str {
        "completions hitting the length limit: clip ratio >= 0.2, no EOS at all, mean = max length"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &[
            "truncation_ratio",
            "num_eos_tokens",
            "completion_len_mean",
            "completion_len_max",
            "loss",
            "grad_norm",
        ]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        after_a_broken_update(ctx, self.find(ctx))
    }
}

impl Truncation {
    /// The findings before [`after_a_broken_update`].
    fn find(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        let mut out = Vec::new();
        let th = ctx.th.get("truncation.ratio");
        let ratio: Vec<(i64, f64)> = f
            .points("truncation_ratio")
            .filter(|(_, v)| v.is_finite())
            .collect();
        let hits: Vec<(i64, f64)> = ratio.iter().copied().filter(|(_, v)| *v >= th).collect();
        // One step over the bar in a long run is a batch of long answers, not truncation.
        if !hits.is_empty() && (hits.len() >= 2 || hits.len() == ratio.len()) {
            let (worst_step, max) =
                hits.iter()
                    .copied()
                    .fold(hits[0], |a, b| if b.1 > a.1 { b } else { a });
            let all = hits.iter().filter(|(_, v)| *v >= 1.0).count();
            let severity = if max >= ctx.th.get("truncation.error_ratio") {
                Severity::Error
            } else {
                Severity::Warning
            };
            let mut e = format!(
                "truncation ratio at or above {:.0}% on {} of {} logged steps, up to {:.0}% at step {worst_step}",
                th * 100.0,
                hits.len(),
                ratio.len(),
                max * 100.0
            );
            if all > 0 {
                e.push_str(&format!("; every completion truncated on {all} step(s)"));
            }
            out.push(
                Finding::new(
                    self.name(),
                    severity,
                    hits.iter().map(|(s, _)| *s).collect(),
                    e,
                    &[
                        "max completion length too small for the task",
                        "model looping / not emitting EOS (repetition)",
                        "EOS token id mismatch between tokenizer and sampler",
                    ],
                )
                .num("max_truncation_ratio", max)
                .with("steps_all_truncated", all)
                .with("logged_steps", ratio.len()),
            );
        }
        let eos: Vec<(i64, f64)> = f
            .points("num_eos_tokens")
            .filter(|(_, v)| v.is_finite())
            .collect();
        let no_eos: Vec<i64> = eos
            .iter()
            .filter(|(_, v)| *v == 0.0)
            .map(|(s, _)| *s)
            .collect();
        if !no_eos.is_empty() && no_eos.len() * 2 >= eos.len() {
            out.push(
                Finding::new(
                    self.name(),
                    Severity::Error,
                    no_eos.clone(),
                    format!(
                        "num_eos_tokens is 0 on {} of {} logged steps: no response ended with EOS, every one ran to the length limit",
                        no_eos.len(),
                        eos.len()
                    ),
                    &[
                        "response_length / max_new_tokens too small for the task",
                        "EOS token id mismatch (stop_token_id) between tokenizer and generation",
                        "the model never learned to stop (no EOS in the SFT data)",
                    ],
                )
                .with("steps_without_eos", no_eos.len())
                .with("logged_steps", eos.len()),
            );
        }
        // Every completion as long as the longest: mean = max (all at the cap). Not when
        // that length is 1 (the EOS token alone: EOS first, `eos_first`), nor on a step
        // whose logged truncation ratio is below the bar (one identical short answer).
        let ratio_at = |s: i64| ratio.iter().find(|(st, _)| *st == s).map(|(_, v)| *v);
        let capped: Vec<(i64, f64)> =
            match (f.col("completion_len_max"), f.col("completion_len_mean")) {
                (Some(mx), Some(mean)) => mx
                    .present()
                    .filter_map(|(i, m)| {
                        let me = mean.get(i)?;
                        let st = f.step(i);
                        (m.is_finite()
                            && m > 1.0
                            && me >= m
                            && ratio_at(st).is_none_or(|r| r >= th))
                        .then_some((st, m))
                    })
                    .collect(),
                _ => Vec::new(),
            };
        if !capped.is_empty() && hits.is_empty() {
            out.push(
                Finding::new(
                    self.name(),
                    Severity::Error,
                    capped.iter().map(|(s, _)| *s).collect(),
                    format!(
                        "mean completion length equals the maximum ({}) on {} step(s): every completion has the same length, the limit",
                        capped[0].1,
                        capped.len()
                    ),
                    &[
                        "max completion length too small for the task",
                        "model looping / not emitting EOS",
                    ],
                )
                .num("length", capped[0].1),
            );
        }
        out
    }
}

/// Every completion at most one token long (the longest completion of the step is ≤ 1:
/// TRL counts the EOS token) on at least half of the logged steps: EOS is generated
/// first, a chat template or EOS-token mismatch, not a length cap.
fn eos_first(f: &crate::frames::log::frame::LogFrame) -> Option<Finding> {
    let lens: Vec<(i64, f64)> = f
        .points("completion_len_max")
        .filter(|(_, v)| v.is_finite())
        .collect();
    let one: Vec<i64> = lens
        .iter()
        .filter(|(_, v)| *v <= 1.0)
        .map(|(s, _)| *s)
        .collect();
    if one.is_empty() || one.len() * 2 < lens.len() {
        return None;
    }
    Some(
        Finding::new(
            "empty-completions",
            Severity::Error,
            one.clone(),
            format!(
                "every completion is at most 1 token long on {} of {} logged steps: EOS is the first token generated (blank completions), not a length cap",
                one.len(),
                lens.len()
            ),
            &[
                "chat template: generation prompt missing or the prompt templated twice, so end-of-turn is the likeliest first token",
                "EOS token: the sampler's eos/stop id (or pad = eos) is a token the model emits at once",
                "generation config: stop strings matching at position 0, max_new_tokens 1, every token but EOS suppressed",
            ],
        )
        .with("steps_eos_first", one.len())
        .with("logged_steps", lens.len())
        .with("likely_cause", "EOS first: chat template / EOS token"),
    )
}

/// `--clip-high`: a large share of the update clipped away by the PPO/GRPO trust region
/// (`clip_ratio*`, `pg_clipfrac`, `train_clip_ratio_total`) on most logged steps.
pub struct ClipHigh;

impl Detector for ClipHigh {
    fn name(&self) -> &'static str {
        "clip-high"
    }
    fn summary(&self) -> &'static str {
        "clip ratio / clipfrac at or above 0.2 on most steps: updates mostly clipped away"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &["clip_ratio"]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let s: Vec<(i64, f64)> = ctx
            .frame
            .points("clip_ratio")
            .filter(|(_, v)| v.is_finite())
            .collect();
        let th = ctx.th.get("clip_high.ratio");
        let hits: Vec<(i64, f64)> = s.iter().copied().filter(|(_, v)| *v >= th).collect();
        if hits.is_empty() || hits.len() * 2 < s.len() {
            return vec![];
        }
        let (lo, hi) = super::value_range(&hits);
        let severity = if hi >= ctx.th.get("clip_high.error_ratio") {
            Severity::Error
        } else {
            Severity::Warning
        };
        vec![Finding::new(
            self.name(),
            severity,
            hits.iter().map(|(st, _)| *st).collect(),
            format!(
                "clip ratio {:.2}–{:.2} on {} of {} logged steps (at or above {th}): most of each update is clipped away",
                lo,
                hi,
                hits.len(),
                s.len()
            ),
            &[
                "clip epsilon too small (e.g. 1e-4 instead of 0.2): every ratio leaves the trust region",
                "learning rate too high or too many inner epochs per batch",
                "stale old log-probs (off-policy data, rollout/trainer mismatch)",
            ],
        )
        .num("min_clip_ratio", lo)
        .num("max_clip_ratio", hi)
        .with("logged_steps", s.len())]
    }
}

/// `--empty-completions`: completions with zero tokens.
pub struct EmptyCompletions;

impl Detector for EmptyCompletions {
    fn name(&self) -> &'static str {
        "empty-completions"
    }
    fn summary(&self) -> &'static str {
        "completion length 0: min length 0, empty_count > 0, empty_completion_tokens events"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &["empty_count", "completion_len_min", "completion_len_max"]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        if let Some(e) = eos_first(f) {
            return vec![e];
        }
        let mut steps = Vec::new();
        let mut row_empty = 0.0;
        let (empty, min_len) = (f.col("empty_count"), f.col("completion_len_min"));
        for i in 0..f.len() {
            let ec = empty
                .and_then(|c| c.get(i))
                .filter(|v| v.is_finite())
                .unwrap_or(0.0);
            let min0 = min_len.and_then(|c| c.get(i)) == Some(0.0);
            if ec > 0.0 || min0 {
                steps.push(f.step(i));
                row_empty += ec.max(if min0 { 1.0 } else { 0.0 });
            }
        }
        let evs: Vec<_> = ctx
            .events
            .iter()
            .filter(|e| e.kind == "empty_completion_tokens")
            .collect();
        let mut ev_empty = 0usize;
        let mut ev_total = 0usize;
        let mut stale = 0usize;
        for e in &evs {
            if let Some(s) = e.step {
                steps.push(s);
            }
            if e.step_inferred {
                stale += 1;
            }
            if let Some(tc) = e.list("token_counts") {
                ev_empty += tc.iter().filter(|v| **v == 0.0).count();
                ev_total += tc.len();
            } else if let Some(ix) = e.list("indices") {
                ev_empty += ix.len();
            }
        }
        if steps.is_empty() {
            return vec![];
        }
        let frac = if ev_total > 0 {
            ev_empty as f64 / ev_total as f64
        } else {
            0.0
        };
        let severity = if frac >= ctx.th.get("empty.error_frac") {
            Severity::Error
        } else {
            Severity::Warning
        };
        let mut explanation = if evs.is_empty() {
            format!("completions with zero tokens on {} step(s)", steps.len())
        } else {
            format!(
                "{} empty_completion_tokens events: {ev_empty} of {ev_total} completions in those batches are empty ({:.0}%)",
                evs.len(),
                frac * 100.0
            )
        };
        if stale > 0 {
            explanation.push_str(&format!(
                "; {stale} events carry a stale step field and were placed after the last reported iteration"
            ));
        }
        let mut finding = Finding::new(
            self.name(),
            severity,
            steps,
            explanation,
            &[
                "the model emits EOS immediately (chat template / generation prompt missing)",
                "min_new_tokens not enforced in the sampler; stop strings matching at position 0",
                "empty token slices crash log-prob code (logsumexp over an empty array) or zero the loss",
            ],
        )
        .with("events", evs.len())
        .with("empty_completions_in_events", ev_empty)
        .with("completions_in_event_batches", ev_total)
        .num("empty_frac_in_event_batches", frac)
        .with("events_with_stale_step", stale);
        if row_empty > 0.0 {
            finding = finding.num("empty_count_in_step_records", row_empty);
        }
        vec![finding]
    }
}

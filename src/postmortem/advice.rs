//! What the report says first: the run-level diagnoses, what to do, and the one-sentence
//! headline.

use super::{CrashSummary, RunInfo};
use crate::detect::classify::{self, Classification};
use crate::detect::{Finding, Severity};
use crate::frames::log::frame::LogFrame;
use crate::model::log::LogEvent;

/// Blank completions from the first step on, in at least half of the logged steps.
pub(super) fn chat_template_diagnosis(
    frame: &LogFrame,
    events: &[LogEvent],
) -> Option<Classification> {
    let empty: Vec<&LogEvent> = events
        .iter()
        .filter(|e| e.kind == "empty_completion_tokens")
        .collect();
    let first_event = empty.iter().filter_map(|e| e.step).min()?;
    let first_step = frame.steps().first().unwrap_or(first_event);
    if first_event > first_step.max(1) {
        return None;
    }
    let with_empty: std::collections::BTreeSet<i64> = empty.iter().filter_map(|e| e.step).collect();
    let covered = frame
        .steps()
        .iter()
        .filter(|s| with_empty.contains(s))
        .count();
    if frame.is_empty() || (covered as f64) < 0.5 * frame.len() as f64 {
        return None;
    }
    let (mut n_empty, mut n_all) = (0usize, 0usize);
    for e in &empty {
        if let Some(tc) = e.list("token_counts") {
            n_all += tc.len();
            n_empty += tc.iter().filter(|c| **c == 0.0).count();
        }
    }
    let share = if n_all > 0 {
        format!(
            "; {:.0}% of the completions in those batches had no token",
            100.0 * n_empty as f64 / n_all as f64
        )
    } else {
        String::new()
    };
    Some(classify::chat_template_garbage(format!(
        "{covered} of {} logged steps had empty completions, the first at step {first_event}{share}",
        frame.len()
    )))
}

pub(super) fn recommendations(
    crash: Option<&CrashSummary>,
    diagnoses: &[Classification],
    findings: &[Finding],
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Some(c) = crash {
        out.extend(c.classification.fixes.iter().map(|s| s.to_string()));
        if c.classification.id == "unknown" {
            match &c.trainer_frame {
                Some(f) => out.push(format!(
                    "Start from the trainer's last frame: {}:{} in {}.",
                    f.file,
                    f.line.map_or("?".to_string(), |l| l.to_string()),
                    f.function
                )),
                None => out.push("Read the traceback from its last line up.".to_string()),
            }
        }
    }
    for d in diagnoses {
        out.extend(d.fixes.iter().map(|s| s.to_string()));
    }
    for f in findings.iter().filter(|f| f.severity >= Severity::Error) {
        if let Some(c) = f.likely_causes.first() {
            out.push(format!(
                "{} (steps {}): check {}",
                f.detector,
                f.step_range(),
                c
            ));
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|s| seen.insert(s.clone()));
    out
}

pub(super) fn headline(
    status: &str,
    run: &RunInfo,
    crash: Option<&CrashSummary>,
    diagnoses: &[Classification],
    findings: &[Finding],
    frame: &LogFrame,
) -> String {
    let worst = findings
        .iter()
        .map(|f| f.severity)
        .max()
        .map_or(String::new(), |w| format!(" (worst: {})", w.name()));
    let nf = format!("{} finding(s){worst}", findings.len());
    match crash {
        Some(c) => {
            let at = c
                .step
                .map_or("an unknown step".to_string(), |s| format!("step {s}"));
            let what = if c.classification.id == "unknown" {
                format!("{}: {}", c.exception_type, first_line(&c.message))
            } else {
                format!(
                    "{} ({}: {})",
                    c.classification.title,
                    c.exception_type,
                    first_line(&c.message)
                )
            };
            format!("Crashed at {at}: {what}. {nf} over the run.")
        }
        None => {
            let last = frame
                .steps()
                .last()
                .map_or("-".to_string(), |s| s.to_string());
            let plan = run.iters.map_or(String::new(), |n| format!(" of {n}"));
            let diag = diagnoses
                .first()
                .map_or(String::new(), |d| format!(" {}.", d.title));
            let what = match status {
                "completed" => format!("No crash: ran to step {last}{plan}."),
                "incomplete" => format!("No crash record, but stopped at step {last}{plan}."),
                _ => format!("No crash record; last logged step {last}."),
            };
            format!("{what}{diag} {nf}.")
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

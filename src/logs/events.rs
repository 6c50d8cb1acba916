//! DebugTrainer `events.jsonl`: `{timestamp, event, level, …payload}`.
//!
//! `train_report`/`val_report` carry the metrics when `steps.jsonl` is empty (as in the
//! real corpus) and become step records; `nan_gradient` becomes both a record and an event;
//! every other event type is kept as an event for the detectors.

use crate::logs::steps::{flatten_numbers, scalar_number, step_of, timestamp_of, LineQuality};
use crate::model::log::{LogEvent, LogRecord, SourceKind};
use crate::value::Value;

/// Event types whose payload is a step's metrics.
pub const REPORT_EVENTS: &[&str] = &["train_report", "val_report"];

/// What one event line yields.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventLine {
    /// Metrics for the frame (reports, `nan_gradient`).
    pub record: Option<LogRecord>,
    /// The event itself (everything but reports).
    pub event: Option<LogEvent>,
}

/// True when a JSON line is an event (has a string `event` field).
/// Every parseable dict line of an events file, as JSON (NaN/inf as strings): for a
/// report that quotes an event's payload (bad lines are logscan's to report: its scan of
/// the same file counts them); an unreadable file is an error.
pub fn read_raw(path: &std::path::Path) -> crate::error::Result<Vec<serde_json::Value>> {
    let bytes = std::fs::read(path).map_err(|e| crate::error::Error::io(path, e))?;
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|l| crate::json::parse_value(l.trim()).ok())
        .filter(|v| v.as_dict().is_some())
        .map(|v| crate::json::to_serde(&v))
        .collect())
}

pub fn is_event(v: &Value) -> bool {
    matches!(v.get("event"), Some(Value::Str(_)))
}

/// Turn one event object into a record and/or an event.
pub fn parse_event(v: &Value, file: usize, line: u64, q: &mut LineQuality) -> EventLine {
    let kind = v.get("event").and_then(Value::as_str).unwrap_or("unknown");
    let step = step_of(v);
    let timestamp = timestamp_of(v);
    const META: &[&str] = &["timestamp", "event", "level", "iteration", "step"];
    if REPORT_EVENTS.contains(&kind) {
        let mut fields = Vec::new();
        flatten_numbers(v, "", META, false, &mut fields, q);
        return EventLine {
            record: Some(LogRecord {
                step,
                timestamp,
                source: SourceKind::Events,
                file,
                line,
                fields,
            }),
            event: None,
        };
    }
    let mut ev = LogEvent::new(kind, file, line);
    ev.step = step;
    ev.reported_step = step;
    ev.timestamp = timestamp;
    ev.level = v.get("level").and_then(Value::as_str).map(str::to_string);
    if let Some(items) = v.as_dict() {
        for (k, val) in items {
            let Some(k) = k.as_str() else { continue };
            if META.contains(&k) {
                continue;
            }
            match val {
                Value::List(xs) | Value::Tuple(xs) => {
                    let nums: Vec<f64> = xs.iter().filter_map(Value::as_f64).collect();
                    if nums.len() == xs.len() {
                        ev.lists.push((k.to_string(), nums));
                    }
                }
                Value::Str(s) if k == "message" || k == "error" || k == "reason" => {
                    ev.text = Some(s.chars().take(300).collect());
                }
                Value::None => q.nulls += 1,
                other => {
                    if let Some((f, _)) = scalar_number(other) {
                        if !f.is_finite() {
                            q.non_finite += 1;
                        }
                        ev.numbers.push((k.to_string(), f));
                    }
                }
            }
        }
    }
    let record = if kind == "nan_gradient" {
        let mut fields = Vec::new();
        if let Some(n) = ev.number("nan_count") {
            fields.push(("grad_nan_count".to_string(), n));
        }
        if let Some(g) = ev.number("grad_norm") {
            fields.push(("grad_norm".to_string(), g));
        }
        Some(LogRecord {
            step,
            timestamp,
            source: SourceKind::Events,
            file,
            line,
            fields,
        })
    } else {
        None
    };
    EventLine {
        record,
        event: Some(ev),
    }
}

/// True when two events are the same payload written twice (the DebugTrainer logs each
/// `empty_completion_tokens` twice, ~20 ms apart).
pub fn is_duplicate(prev: &LogEvent, ev: &LogEvent) -> bool {
    let close = match (prev.timestamp, ev.timestamp) {
        (Some(a), Some(b)) => (b - a).abs() < 1.0,
        _ => false,
    };
    close
        && prev.kind == ev.kind
        && prev.reported_step == ev.reported_step
        && prev.numbers == ev.numbers
        && prev.lists == ev.lists
        && prev.text == ev.text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn train_report_becomes_record_at_iteration() {
        let v = crate::json::parse_value(
            r#"{"timestamp": 1.5, "event": "train_report", "level": "info", "iteration": 10, "train_loss": 0.0, "train_kl": 0.0}"#,
        )
        .unwrap();
        let out = parse_event(&v, 0, 9, &mut LineQuality::default());
        let r = out.record.unwrap();
        assert_eq!(r.step, Some(10));
        assert_eq!(
            r.fields,
            vec![
                ("train_loss".to_string(), 0.0),
                ("train_kl".to_string(), 0.0)
            ]
        );
        assert!(out.event.is_none());
    }

    #[test]
    fn empty_completion_event_keeps_lists() {
        let v = crate::json::parse_value(
            r#"{"timestamp": 2.0, "event": "empty_completion_tokens", "level": "warning", "step": 0, "indices": [2, 3], "token_counts": [8, 8, 0, 0], "prompt_preview": null}"#,
        )
        .unwrap();
        let out = parse_event(&v, 0, 1, &mut LineQuality::default());
        let ev = out.event.unwrap();
        assert_eq!(ev.step, Some(0));
        assert_eq!(ev.list("token_counts"), Some(&[8.0, 8.0, 0.0, 0.0][..]));
        assert_eq!(ev.list("indices"), Some(&[2.0, 3.0][..]));
    }
}

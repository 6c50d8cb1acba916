//! JSON-line step records: DebugTrainer `steps.jsonl` (nested `metrics` and
//! `token_count_summary` flattened), verl file-logger lines `{"step", "data"}`, flat JSONL
//! of other producers, and Hugging Face `trainer_state.json` (`log_history[]`).

use std::path::Path;

use crate::error::{Error, Position, Result};
use crate::model::log::{FileStats, LogRecord, SourceKind};
use crate::value::Value;

/// Counts gathered while flattening one JSON line: nulls, NaN/inf, and keys whose value is
/// not a number (for type-change tracking).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LineQuality {
    /// Fields that were `null`.
    pub nulls: u32,
    /// NaN/±inf numbers.
    pub non_finite: u32,
    /// `(key, type)` for every leaf that is not a plain number (strings, bools, lists).
    pub types: Vec<(String, &'static str)>,
}

/// Keys naming the step, in priority order.
pub const STEP_KEYS: &[&str] = &["step", "iteration", "global_step", "iter", "_step"];
/// A step key read after [`STEP_KEYS`] and kept as a metric too: LLaMA-Factory's
/// `trainer_log.jsonl` counts optimizer steps in `current_steps` (of `total_steps`).
pub const EXTRA_STEP_KEY: &str = "current_steps";
/// Keys naming the wall-clock time.
pub const TIME_KEYS: &[&str] = &["timestamp", "_timestamp", "wall_time"];

/// A JSON scalar as a number: numbers, bools, and strings that spell a number
/// (`"nan"`, `"1e-3"`), the latter flagged as strings for type tracking.
pub fn scalar_number(v: &Value) -> Option<(f64, &'static str)> {
    match v {
        Value::Float(f) => Some((*f, "number")),
        Value::Int(i) => Some((*i as f64, "number")),
        Value::Bool(b) => Some((*b as u8 as f64, "bool")),
        Value::BigInt(s) => s.parse::<f64>().ok().map(|f| (f, "number")),
        Value::Str(s) => parse_number_text(s).map(|f| (f, "str")),
        _ => None,
    }
}

/// A number written as text, accepting Python spellings (`nan`, `inf`, `-Infinity`).
pub fn parse_number_text(s: &str) -> Option<f64> {
    let t = s.trim();
    match t {
        "nan" | "NaN" | "NAN" => return Some(f64::NAN),
        "inf" | "Infinity" | "+inf" => return Some(f64::INFINITY),
        "-inf" | "-Infinity" => return Some(f64::NEG_INFINITY),
        _ => {}
    }
    let first = t.as_bytes().first()?;
    if !(first.is_ascii_digit() || *first == b'-' || *first == b'+' || *first == b'.') {
        return None;
    }
    t.parse::<f64>().ok()
}

/// Flatten a JSON object's numeric leaves into `out` with keys joined by `.`.
/// `null_is_nan` is for verl, which writes NaN as null.
pub fn flatten_numbers(
    v: &Value,
    prefix: &str,
    skip: &[&str],
    null_is_nan: bool,
    out: &mut Vec<(String, f64)>,
    q: &mut LineQuality,
) {
    let Some(items) = v.as_dict() else { return };
    for (k, val) in items {
        let Some(k) = k.as_str() else { continue };
        if prefix.is_empty() && skip.contains(&k) {
            continue;
        }
        let key = if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        };
        match val {
            Value::Dict(_) => flatten_numbers(val, &key, &[], null_is_nan, out, q),
            Value::None => {
                q.nulls += 1;
                if null_is_nan {
                    q.non_finite += 1;
                    out.push((key, f64::NAN));
                }
            }
            Value::List(_) | Value::Tuple(_) => q.types.push((key, "list")),
            other => match scalar_number(other) {
                Some((f, ty)) => {
                    if !f.is_finite() {
                        q.non_finite += 1;
                    }
                    if ty != "number" {
                        q.types.push((key.clone(), ty));
                    }
                    out.push((key, f));
                }
                None => q.types.push((key, other.type_name())),
            },
        }
    }
}

/// The step of a JSON object: the first of [`STEP_KEYS`] that is an integer-valued number.
pub fn step_of(v: &Value) -> Option<i64> {
    STEP_KEYS
        .iter()
        .chain([&EXTRA_STEP_KEY, &PROGRESS_STEP_KEY])
        .find_map(|k| {
            let x = v.get(k)?;
            match x {
                Value::Int(i) => Some(*i),
                Value::Float(f) if f.is_finite() && f.fract() == 0.0 => Some(*f as i64),
                Value::Str(s) => progress_step(s),
                _ => None,
            }
        })
}

/// The value of metric `key` in the last JSON-line record of `step` in a log file, with its
/// 1-based line: flat records and verl's file-logger lines (`{"step", "data"}`), the step
/// read as [`step_of`] does (slime's `train/step` too), NaN/±inf as Python's `json` writes
/// them. Blank lines are skipped.
///
/// Errors: the file unreadable; a line that is not JSON (named with its line).
pub fn metric_at_step(path: &Path, step: i64, key: &str) -> Result<Option<(usize, f64)>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut found = None;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v = crate::json::parse_value(line.trim()).map_err(|e| {
            Error::format(
                path,
                Position::Line(i as u64 + 1),
                format!("not a JSON record: {e}"),
            )
        })?;
        let s = step_of(&v).or_else(|| v.get("train/step").and_then(Value::as_i64));
        if s != Some(step) {
            continue;
        }
        let record = if is_verl_line(&v) {
            v.get("data")
        } else {
            Some(&v)
        };
        if let Some(x) = record.and_then(|r| r.get(key)).and_then(Value::as_f64) {
            found = Some((i + 1, x));
        }
    }
    Ok(found)
}

/// ms-swift's `logging.jsonl` step key, a string `"5/3766"` (step of max steps).
pub const PROGRESS_STEP_KEY: &str = "global_step/max_steps";

/// A step written as text: `"12"`, or ms-swift's `"5/3766"` (the part before `/`).
pub fn progress_step(s: &str) -> Option<i64> {
    s.split('/').next()?.trim().parse::<i64>().ok()
}

/// The timestamp of a JSON object, if any of [`TIME_KEYS`] is a number.
pub fn timestamp_of(v: &Value) -> Option<f64> {
    TIME_KEYS.iter().find_map(|k| v.get(k)?.as_f64())
}

/// True for a verl file-logger line: `{"step": N, "data": {…}}`.
pub fn is_verl_line(v: &Value) -> bool {
    matches!(v.get("data"), Some(Value::Dict(_))) && v.get("step").is_some()
}

/// One DebugTrainer/flat step line → a record (`source` tells the producer).
pub fn parse_step_object(
    v: &Value,
    source: SourceKind,
    file: usize,
    line: u64,
    q: &mut LineQuality,
) -> LogRecord {
    let mut fields = Vec::new();
    let mut skip: Vec<&str> = STEP_KEYS.to_vec();
    skip.extend_from_slice(TIME_KEYS);
    flatten_numbers(v, "", &skip, false, &mut fields, q);
    LogRecord {
        step: step_of(v),
        timestamp: timestamp_of(v),
        source,
        file,
        line,
        fields,
    }
}

/// One verl file-logger line → a record (null in `data` means NaN).
pub fn parse_verl_object(v: &Value, file: usize, line: u64, q: &mut LineQuality) -> LogRecord {
    let mut fields = Vec::new();
    if let Some(data) = v.get("data") {
        flatten_numbers(data, "", &[], true, &mut fields, q);
    }
    LogRecord {
        step: step_of(v),
        timestamp: timestamp_of(v).or_else(|| v.get("data").and_then(timestamp_of)),
        source: SourceKind::VerlJsonl,
        file,
        line,
        fields,
    }
}

/// Read a Hugging Face `trainer_state.json`: one record per `log_history` entry.
pub fn read_trainer_state(path: &Path, file: usize) -> Result<(Vec<LogRecord>, FileStats)> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    parse_trainer_state(path, &text, file)
}

/// [`read_trainer_state`] on the text already read from `path` (named in errors).
pub fn parse_trainer_state(
    path: &Path,
    text: &str,
    file: usize,
) -> Result<(Vec<LogRecord>, FileStats)> {
    let mut stats = FileStats {
        path: path.to_path_buf(),
        format: SourceKind::HfTrainerState.name().to_string(),
        bytes: text.len() as u64,
        lines: text.lines().count() as u64,
        ..FileStats::default()
    };
    let v = crate::json::parse_value(text).map_err(|e| e.in_file(path))?;
    let history = v
        .get("log_history")
        .and_then(Value::as_seq)
        .ok_or_else(|| {
            Error::format(
                path,
                Position::Key("log_history".into()),
                "trainer_state.json has no log_history list",
            )
        })?;
    let mut out = Vec::with_capacity(history.len());
    for (i, entry) in history.iter().enumerate() {
        let mut q = LineQuality::default();
        // trainer_state.json is one document: records are numbered by entry, not line.
        let rec = parse_step_object(
            entry,
            SourceKind::HfTrainerState,
            file,
            i as u64 + 1,
            &mut q,
        );
        stats.nulls += q.nulls as u64;
        stats.non_finite += q.non_finite as u64;
        // The closing summary entry (`train_runtime`, `train_loss` = the run's mean loss,
        // `total_flos`) is not a step: its `train_loss` would stand in for the last loss.
        if entry.get("train_runtime").is_some() || entry.get("total_flos").is_some() {
            continue;
        }
        let mut rec = rec;
        // Evaluation entries (`eval_loss`, `eval_runtime`, …) are not training steps.
        if rec.fields.iter().any(|(k, _)| k.starts_with("eval_"))
            && !rec
                .fields
                .iter()
                .any(|(k, _)| k == "loss" || k == "grad_norm")
        {
            rec.fields
                .push((crate::model::log::EVAL_MARK.to_string(), 1.0));
            stats.eval_records += 1;
        }
        if rec.step.is_none() {
            stats.bad_line(
                i as u64 + 1,
                format!("log_history[{i}] has no step; entry skipped"),
            );
            continue;
        }
        out.push(rec);
    }
    stats.records = out.len() as u64;
    Ok((out, stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_is_found_at_its_step_in_flat_verl_and_slime_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("steps.jsonl");
        std::fs::write(
            &path,
            concat!(
                "{\"step\": 2, \"actor/pg_loss\": 0.5}\n",
                "\n",
                "{\"step\": 3, \"data\": {\"actor/pg_loss\": 0.25}}\n",
                "{\"train/step\": 4, \"train/pg_loss\": NaN}\n",
            ),
        )
        .unwrap();
        assert_eq!(
            metric_at_step(&path, 2, "actor/pg_loss").unwrap(),
            Some((1, 0.5))
        );
        assert_eq!(
            metric_at_step(&path, 3, "actor/pg_loss").unwrap(),
            Some((3, 0.25))
        );
        let (line, x) = metric_at_step(&path, 4, "train/pg_loss").unwrap().unwrap();
        assert_eq!(line, 4);
        assert!(x.is_nan());
        assert_eq!(metric_at_step(&path, 5, "actor/pg_loss").unwrap(), None);
        std::fs::write(&path, "{\"step\": 1}\n{\"step\": \n").unwrap();
        let err = metric_at_step(&path, 1, "x").unwrap_err().to_string();
        assert!(
            err.contains("steps.jsonl") && err.contains("line 2"),
            "{err}"
        );
    }

    #[test]
    fn nested_metrics_are_flattened_and_nan_counted() {
        let v = crate::json::parse_value(
            r#"{"step": 3, "train_loss": NaN, "grad_norm": null, "metrics": {"kl": 0.5, "tag": "x"}, "token_count_summary": {"min": 0, "empty_count": 2}, "timestamp": 12.5}"#,
        )
        .unwrap();
        let mut q = LineQuality::default();
        let r = parse_step_object(&v, SourceKind::Steps, 0, 7, &mut q);
        assert_eq!(r.step, Some(3));
        assert_eq!(r.timestamp, Some(12.5));
        let keys: Vec<&str> = r.fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "train_loss",
                "metrics.kl",
                "token_count_summary.min",
                "token_count_summary.empty_count"
            ]
        );
        assert!(r.fields[0].1.is_nan());
        assert_eq!(q.nulls, 1);
        assert_eq!(q.non_finite, 1);
    }

    #[test]
    fn verl_null_is_nan() {
        let v = crate::json::parse_value(
            r#"{"step": 5, "data": {"actor/pg_loss": null, "actor/grad_norm": 0.2}}"#,
        )
        .unwrap();
        let mut q = LineQuality::default();
        let r = parse_verl_object(&v, 0, 1, &mut q);
        assert_eq!(r.step, Some(5));
        assert!(r.fields[0].1.is_nan());
        assert_eq!(r.fields[1], ("actor/grad_norm".to_string(), 0.2));
    }
}

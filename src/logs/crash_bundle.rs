//! DebugTrainer crash bundles: `failures/<YYYYmmdd-HHMMSS>-step-NNNN/` holding
//! `exception.txt` (a Python traceback), `context.json` (the offending batch),
//! `recent_steps.jsonl` (the last step records) and `extra.json` (optional).
//!
//! A bundle is written while the process dies, so any file may be missing and the last
//! line of `recent_steps.jsonl` may be cut in half: those are notes, not errors. A file
//! that is present but not what its format promises (invalid JSON in `context.json`) is an
//! error naming the file and the position.

use std::path::{Path, PathBuf};

use crate::error::{Error, Position, Result};
use crate::value::Value;

/// The files a bundle may hold.
pub const BUNDLE_FILES: &[&str] = &[
    "exception.txt",
    "context.json",
    "recent_steps.jsonl",
    "extra.json",
];

/// `context.json`: the batch the trainer was working on when it died.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct CrashContext {
    /// The step being trained (`current_step`).
    pub current_step: Option<i64>,
    /// Completion token count of each row of the batch.
    pub token_counts: Vec<i64>,
    /// Rows whose completion had no token.
    pub empty_indices: Vec<i64>,
    /// For each completion, the prompt of the batch it belongs to.
    pub batch_indices: Vec<i64>,
    /// The batch's prompts, cut to 200 characters by the trainer.
    pub prompts_preview: Vec<String>,
    /// The batch's reference answers, cut to 200 characters.
    pub answers_preview: Vec<String>,
    /// Step metrics the loss returned (NaN kept as NaN).
    #[serde(serialize_with = "ser_pairs")]
    pub metrics: Vec<(String, f64)>,
    /// The step's loss before averaging.
    #[serde(serialize_with = "ser_opt")]
    pub raw_loss: Option<f64>,
    /// Gradient norm of the step.
    #[serde(serialize_with = "ser_opt")]
    pub grad_norm: Option<f64>,
    /// NaN entries in the gradients.
    pub grad_nan_count: Option<i64>,
    /// Learning rate.
    #[serde(serialize_with = "ser_opt")]
    pub learning_rate: Option<f64>,
    /// Validation loss of the step, if it evaluated.
    #[serde(serialize_with = "ser_opt")]
    pub val_loss: Option<f64>,
}

fn ser_opt<S: serde::Serializer>(v: &Option<f64>, s: S) -> std::result::Result<S::Ok, S::Error> {
    use serde::Serialize;
    v.map(crate::json::json_num).serialize(s)
}

fn ser_pairs<S: serde::Serializer>(
    v: &[(String, f64)],
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut m = s.serialize_map(Some(v.len()))?;
    for (k, x) in v {
        m.serialize_entry(k, &crate::json::json_num(*x))?;
    }
    m.end()
}

/// One crash bundle as read from disk.
#[derive(Debug, Clone, Default)]
pub struct CrashBundle {
    /// The bundle folder.
    pub dir: PathBuf,
    /// Folder name (`20251009-091612-step-0023`).
    pub name: String,
    /// The `YYYYmmdd-HHMMSS` part of the name, when it has one.
    pub time: Option<String>,
    /// The step in the folder name (`-step-NNNN`).
    pub name_step: Option<i64>,
    /// `exception.txt` as written.
    pub exception: Option<String>,
    /// `context.json`.
    pub context: Option<CrashContext>,
    /// Path of `recent_steps.jsonl`, when present.
    pub recent_steps_path: Option<PathBuf>,
    /// The records of `recent_steps.jsonl` that parsed, in file order.
    pub recent_steps: Vec<Value>,
    /// `extra.json`, when present, as JSON (NaN/inf as strings, as in every report).
    pub extra: Option<serde_json::Value>,
    /// Bundle files that are absent.
    pub missing: Vec<String>,
    /// What was odd (truncated last line, unreadable lines), one line each.
    pub notes: Vec<String>,
}

impl CrashBundle {
    /// The step of the crash: `context.json`'s `current_step`, else the folder name's.
    pub fn step(&self) -> Option<i64> {
        self.context
            .as_ref()
            .and_then(|c| c.current_step)
            .or(self.name_step)
    }
}

/// True when `dir` looks like a crash bundle (holds `exception.txt` or `context.json`).
pub fn is_bundle(dir: &Path) -> bool {
    dir.join("exception.txt").is_file() || dir.join("context.json").is_file()
}

/// Split a bundle folder name `YYYYmmdd-HHMMSS-step-NNNN` into its time and step.
pub fn parse_bundle_name(name: &str) -> (Option<String>, Option<i64>) {
    let (head, step) = match name.rsplit_once("-step-") {
        Some((h, s)) => (h, s.parse::<i64>().ok()),
        None => (name, None),
    };
    let b = head.as_bytes();
    let time = (b.len() == 15
        && b[8] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 8 || c.is_ascii_digit()))
    .then(|| head.to_string());
    (time, step)
}

/// The bundles under `run_dir/failures/`, oldest first (names sort by time).
pub fn list_bundles(run_dir: &Path) -> Result<Vec<PathBuf>> {
    let failures = run_dir.join("failures");
    if !failures.is_dir() {
        return Ok(Vec::new());
    }
    let mut out: Vec<PathBuf> = std::fs::read_dir(&failures)
        .map_err(|e| Error::io(&failures, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    Ok(out)
}

/// Read the bundle in `dir`. Missing files are noted; malformed JSON is an error.
pub fn read_bundle(dir: &Path) -> Result<CrashBundle> {
    if !dir.is_dir() {
        return Err(Error::Usage(format!(
            "{}: not a crash bundle folder",
            dir.display()
        )));
    }
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (time, name_step) = parse_bundle_name(&name);
    let mut b = CrashBundle {
        dir: dir.to_path_buf(),
        name,
        time,
        name_step,
        ..CrashBundle::default()
    };
    for f in BUNDLE_FILES {
        if !dir.join(f).is_file() {
            b.missing.push((*f).to_string());
        }
    }
    let exc = dir.join("exception.txt");
    if exc.is_file() {
        let bytes = std::fs::read(&exc).map_err(|e| Error::io(&exc, e))?;
        b.exception = Some(String::from_utf8_lossy(&bytes).into_owned());
    }
    let ctx = dir.join("context.json");
    if ctx.is_file() {
        let v = read_json(&ctx)?;
        b.context = Some(parse_context(&v, &ctx)?);
    }
    let extra = dir.join("extra.json");
    if extra.is_file() {
        b.extra = Some(crate::json::to_serde(&read_json(&extra)?));
    }
    let recent = dir.join("recent_steps.jsonl");
    if recent.is_file() {
        let (records, notes) = read_recent_steps(&recent)?;
        b.recent_steps = records;
        b.notes.extend(notes);
        b.recent_steps_path = Some(recent);
    }
    Ok(b)
}

/// Parse a whole-file JSON document (Python's `json.dump`, bare NaN allowed).
pub fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        Error::format(
            path,
            Position::Byte(e.valid_up_to() as u64),
            "not UTF-8 text",
        )
    })?;
    crate::json::parse_value(text).map_err(|e| e.in_file(path))
}

/// [`read_json`] as JSON (NaN/inf as strings, as in every report): a document a report
/// quotes rather than reads numbers from.
pub fn read_json_doc(path: &Path) -> Result<serde_json::Value> {
    Ok(crate::json::to_serde(&read_json(path)?))
}

/// Read `recent_steps.jsonl`: the records that parse, and notes for those that do not.
/// A cut last line is expected after a crash; other bad lines are noted with their number.
pub fn read_recent_steps(path: &Path) -> Result<(Vec<Value>, Vec<String>)> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.split('\n').collect();
    let unterminated = !text.is_empty() && !text.ends_with('\n');
    let mut out = Vec::new();
    let mut notes = Vec::new();
    let n = lines.len();
    for (i, line) in lines.iter().enumerate() {
        let l = line.trim();
        if l.is_empty() {
            continue;
        }
        match crate::json::parse_value(l) {
            Ok(v) if v.as_dict().is_some() => out.push(v),
            Ok(v) => notes.push(format!(
                "{}: line {}: expected a JSON object, found {} (skipped)",
                path.display(),
                i + 1,
                v.type_name()
            )),
            Err(e) => {
                let what = if unterminated && i + 1 == n {
                    "truncated last line (skipped)"
                } else {
                    "unreadable line (skipped)"
                };
                notes.push(format!(
                    "{}: line {}: {what}: {}",
                    path.display(),
                    i + 1,
                    e.msg
                ));
            }
        }
    }
    Ok((out, notes))
}

fn num(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Str(s) => crate::logs::steps::parse_number_text(s),
        other => other.as_f64(),
    }
}

fn int_list(v: Option<&Value>, path: &Path, key: &str) -> Result<Vec<i64>> {
    let Some(v) = v else { return Ok(Vec::new()) };
    if matches!(v, Value::None) {
        return Ok(Vec::new());
    }
    let items = v.as_seq().ok_or_else(|| {
        Error::format(
            path,
            Position::Key(key.to_string()),
            format!("expected a list of integers, found {}", v.type_name()),
        )
    })?;
    items
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let f = x.as_f64().filter(|f| f.is_finite() && f.fract() == 0.0);
            f.map(|f| f as i64).ok_or_else(|| {
                Error::format(
                    path,
                    Position::Key(format!("{key}[{i}]")),
                    format!("expected an integer, found {}", x.type_name()),
                )
            })
        })
        .collect()
}

fn str_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_seq)
        .map(|xs| {
            xs.iter()
                .map(|x| match x {
                    Value::Str(s) => s.clone(),
                    Value::None => String::new(),
                    other => format!("{other:?}"),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Turn `context.json`'s value into a [`CrashContext`]; wrong types name the key.
pub fn parse_context(v: &Value, path: &Path) -> Result<CrashContext> {
    if v.as_dict().is_none() {
        return Err(Error::format(
            path,
            Position::File,
            format!("expected a JSON object, found {}", v.type_name()),
        ));
    }
    let metrics = v
        .get("metrics")
        .and_then(Value::as_dict)
        .map(|items| {
            items
                .iter()
                .filter_map(|(k, x)| Some((k.as_str()?.to_string(), num(Some(x))?)))
                .collect()
        })
        .unwrap_or_default();
    Ok(CrashContext {
        current_step: num(v.get("current_step")).map(|f| f as i64),
        token_counts: int_list(v.get("token_counts"), path, "token_counts")?,
        empty_indices: int_list(v.get("empty_indices"), path, "empty_indices")?,
        batch_indices: int_list(v.get("batch_indices"), path, "batch_indices")?,
        prompts_preview: str_list(v.get("prompts_preview")),
        answers_preview: str_list(v.get("answers_preview")),
        metrics,
        raw_loss: num(v.get("raw_loss")),
        grad_norm: num(v.get("grad_norm")),
        grad_nan_count: num(v.get("grad_nan_count")).map(|f| f as i64),
        learning_rate: num(v.get("learning_rate")).or_else(|| num(v.get("lr"))),
        val_loss: num(v.get("val_loss")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_name_splits_into_time_and_step() {
        assert_eq!(
            parse_bundle_name("20251009-091612-step-0023"),
            (Some("20251009-091612".to_string()), Some(23))
        );
        assert_eq!(parse_bundle_name("odd"), (None, None));
    }

    #[test]
    fn context_with_nan_and_nulls_parses() {
        let v = crate::json::parse_value(
            r#"{"current_step": 41, "token_counts": [3, 0], "empty_indices": [1], "batch_indices": null, "raw_loss": NaN, "grad_norm": null, "grad_nan_count": 7, "metrics": {"kl": NaN}}"#,
        )
        .unwrap();
        let c = parse_context(&v, Path::new("context.json")).unwrap();
        assert_eq!(c.current_step, Some(41));
        assert_eq!(c.empty_indices, vec![1]);
        assert!(c.batch_indices.is_empty());
        assert!(c.raw_loss.is_some_and(f64::is_nan));
        assert_eq!(c.grad_norm, None);
        assert_eq!(c.grad_nan_count, Some(7));
    }

    #[test]
    fn wrong_type_names_the_key() {
        let v = crate::json::parse_value(r#"{"token_counts": [1, "x"]}"#).unwrap();
        let e = parse_context(&v, Path::new("c.json"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("key token_counts[1]"), "{e}");
    }
}

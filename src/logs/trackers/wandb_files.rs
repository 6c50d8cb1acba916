//! The files a synced W&B run keeps beside (or instead of) its transaction log, under
//! `<run>/files/`: `wandb-summary.json`, the last value of each key with `_step` and
//! `_timestamp` (one record at that step; bare `NaN` allowed), and `output.log`, the
//! console text, which logscan reads with the text-log reader like any other console log
//! (`config.yaml` is read by [`super::wandb_config`]).

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Error, Position, Result};
use crate::model::log::{FileStats, LogRecord, SourceKind};
use crate::value::Value;

/// The summary file's name.
pub const SUMMARY: &str = "wandb-summary.json";
/// The console capture's name.
pub const OUTPUT: &str = "output.log";

/// The run folder of a file under `<run>/files/` named `wandb-summary.json` or
/// `output.log`, or `None`.
pub fn run_of(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    if name != SUMMARY && name != OUTPUT {
        return None;
    }
    let files = path.parent()?;
    if files.file_name()? != "files" {
        return None;
    }
    files.parent().map(Path::to_path_buf)
}

/// Read a `wandb-summary.json` into one record at its step (`train/global_step`,
/// `global_step` or `_step`): numeric leaves, nested keys joined with `.`, W&B's own `_`
/// keys left out.
pub fn read_summary(
    path: &Path,
    mut input: impl Read,
    file: usize,
    stats: &mut FileStats,
    push: &mut dyn FnMut(&mut LogRecord),
) -> Result<()> {
    let mut text = String::new();
    input
        .read_to_string(&mut text)
        .map_err(|e| Error::io(path, e))?;
    stats.bytes = text.len() as u64;
    stats.lines = text.lines().count() as u64;
    let v = crate::json::parse_value(&text).map_err(|e| e.in_file(path))?;
    let Some(items) = v.as_dict() else {
        return Err(Error::format(
            path,
            Position::File,
            "W&B summary is not a JSON object",
        ));
    };
    let get = |k: &str| {
        items
            .iter()
            .find(|(key, _)| key.as_str() == Some(k))
            .and_then(|(_, v)| v.as_f64())
    };
    let step = ["train/global_step", "global_step", "_step"]
        .iter()
        .find_map(|k| get(k))
        .ok_or_else(|| {
            Error::format(
                path,
                Position::File,
                "W&B summary has no step (`_step`, `global_step` or `train/global_step`)",
            )
        })?;
    let mut rec = LogRecord {
        step: Some(step as i64),
        timestamp: get("_timestamp"),
        source: SourceKind::WandbSummary,
        file,
        line: 1,
        fields: Vec::new(),
    };
    flatten(&v, "", &mut rec.fields);
    stats.non_finite += rec.fields.iter().filter(|(_, x)| !x.is_finite()).count() as u64;
    stats.records += 1;
    push(&mut rec);
    Ok(())
}

/// Numeric leaves of `v` as `prefix.key → value`, keys starting `_` (W&B's) left out.
fn flatten(v: &Value, prefix: &str, out: &mut Vec<(String, f64)>) {
    let Some(items) = v.as_dict() else {
        if let Some(x) = v.as_f64() {
            out.push((prefix.to_string(), x));
        }
        return;
    };
    for (k, child) in items {
        let Some(k) = k.as_str() else { continue };
        if k.starts_with('_') {
            continue;
        }
        let key = if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        };
        flatten(child, &key, out);
    }
}

//! Parquet metric tables, read with polars: Trackio's export (`<project>.parquet`: `id`,
//! `run_id`, `timestamp`, `run_name`, `step`, then one column per metric, NaN as a float
//! NaN, a step that did not log a key as null) and any table with a step column. Text
//! columns are not metrics; one table must hold one run (`run_name`).

use std::path::Path;

use polars::prelude::{ChunkCompareEq, DataType, ParquetReader, SerReader};

use crate::error::{Error, Position, Result};
use crate::model::log::{FileStats, LogRecord, SourceKind};

/// The first bytes of a Parquet file.
pub const MAGIC: &[u8] = b"PAR1";

/// Column names taken as the step axis, in order of preference.
const STEP_COLUMNS: [&str; 5] = ["step", "global_step", "_step", "iteration", "iter"];

/// Trackio's bookkeeping columns (not metrics even when numeric).
const TRACKIO_COLUMNS: [&str; 4] = ["id", "run_id", "log_id", "space_id"];

/// Read one Parquet table into `push`, one record per row with a step.
pub fn read(
    path: &Path,
    file: usize,
    run: Option<&str>,
    stats: &mut FileStats,
    push: &mut dyn FnMut(&mut LogRecord),
) -> Result<()> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    stats.bytes = f.metadata().map(|m| m.len()).unwrap_or(0);
    let df = ParquetReader::new(f)
        .finish()
        .map_err(|e| Error::format(path, Position::File, format!("Parquet: {e}")))?;
    let names: Vec<String> = df
        .get_column_names()
        .iter()
        .map(|n| n.to_string())
        .collect();
    let trackio = names.iter().any(|n| n == "run_name") && names.iter().any(|n| n == "run_id");
    let source = if trackio {
        SourceKind::Trackio
    } else {
        SourceKind::Parquet
    };
    stats.format = if trackio { "trackio" } else { "parquet" }.to_string();
    let step_name = STEP_COLUMNS
        .iter()
        .find(|s| names.iter().any(|n| n.eq_ignore_ascii_case(s)))
        .and_then(|s| names.iter().find(|n| n.eq_ignore_ascii_case(s)))
        .ok_or_else(|| {
            Error::format(
                path,
                Position::File,
                format!(
                    "Parquet table has no step column (looked for {}); columns: {}",
                    STEP_COLUMNS.join(", "),
                    names.join(", ")
                ),
            )
        })?;
    let bad = |e: polars::error::PolarsError| {
        Error::format(path, Position::File, format!("Parquet: {e}"))
    };
    // Trackio's export holds every run of its project: one is read.
    let mut df = df;
    if let Ok(runs) = df.column("run_name") {
        let names = runs.str().map_err(bad)?.clone();
        let mut distinct: Vec<&str> = Vec::new();
        for i in 0..names.len() {
            if let Some(n) = names.get(i) {
                if !distinct.contains(&n) {
                    distinct.push(n);
                }
            }
        }
        let pick = match (run, distinct.as_slice()) {
            (Some(w), _) if distinct.contains(&w) => Some(w.to_string()),
            (Some(w), _) => {
                return Err(Error::format(
                    path,
                    Position::File,
                    format!("Parquet table has no run named {w:?} (runs: {})", distinct.join(", ")),
                ))
            }
            (None, [_]) | (None, []) => None,
            (None, _) => {
                return Err(Error::format(
                    path,
                    Position::File,
                    format!(
                        "Parquet table holds {} runs (column run_name: {}); logscan reads one run per input: pick one with --run NAME",
                        distinct.len(),
                        distinct.join(", ")
                    ),
                ))
            }
        };
        if let Some(w) = pick {
            let mask = names.equal(w.as_str());
            df = df.filter(&mask).map_err(bad)?;
        }
    }
    let steps = df
        .column(step_name)
        .map_err(bad)?
        .cast(&DataType::Int64)
        .map_err(bad)?;
    let steps = steps.i64().map_err(bad)?;
    let times = match df.column("timestamp") {
        Ok(c) if c.dtype() == &DataType::String => Some(c.str().map_err(bad)?.clone()),
        _ => None,
    };
    let mut metrics: Vec<(String, polars::prelude::Float64Chunked)> = Vec::new();
    for c in df.columns() {
        let name = c.name().to_string();
        if name == *step_name || TRACKIO_COLUMNS.contains(&name.as_str()) {
            continue;
        }
        if !(c.dtype().is_primitive_numeric() || c.dtype() == &DataType::Boolean) {
            continue;
        }
        let f = c.cast(&DataType::Float64).map_err(bad)?;
        metrics.push((name, f.f64().map_err(bad)?.clone()));
    }
    for row in 0..df.height() {
        let line = row as u64 + 2;
        let Some(step) = steps.get(row) else {
            stats.bad_line(line, "row has no step");
            continue;
        };
        let mut rec = LogRecord {
            step: Some(step),
            timestamp: times
                .as_ref()
                .and_then(|t| t.get(row))
                .and_then(super::sqlite::iso8601_seconds),
            source,
            file,
            line,
            fields: Vec::new(),
        };
        for (name, col) in &metrics {
            if let Some(v) = col.get(row) {
                stats.non_finite += (!v.is_finite()) as u64;
                rec.fields.push((name.clone(), v));
            }
        }
        stats.records += 1;
        push(&mut rec);
    }
    stats.lines = df.height() as u64;
    Ok(())
}

//! CSV metric tables: the W&B UI's chart export (`Step`, `<run> - <key>`, and the
//! smoothing band's `<run> - <key>__MIN` / `__MAX`, which are skipped) and plain tables with
//! a step column (`step`, `global_step`, `_step`, `iteration`, …). Empty cells are
//! missing values; `nan`/`NaN`/`inf` are kept as non-finite numbers.

use std::io::Read;
use std::path::Path;

use super::rows::RowWriter;
use crate::error::{Error, Position, Result};
use crate::model::log::{FileStats, SourceKind};

/// Column names taken as the step axis, in order of preference (compared lowercased).
const STEP_COLUMNS: [&str; 7] = [
    "step",
    "global_step",
    "train/global_step",
    "_step",
    "iteration",
    "iter",
    "epoch",
];

/// Column names taken as a Unix timestamp in seconds.
const TIME_COLUMNS: [&str; 4] = ["_timestamp", "timestamp", "wall_time", "time"];

/// What a column holds.
#[derive(Debug, Clone, PartialEq)]
enum Col {
    Step,
    Time,
    Metric(String),
    Skip,
}

/// True when the CSV file at `path` has a step column in its header: a directory scan
/// takes only such CSVs (a data set's CSV beside the logs is not a metric table).
pub fn has_step_column(path: &Path) -> bool {
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let mut rdr = ::csv::ReaderBuilder::new().flexible(true).from_reader(f);
    rdr.headers().is_ok_and(|h| {
        h.iter()
            .any(|n| STEP_COLUMNS.contains(&n.trim().to_ascii_lowercase().as_str()))
    })
}

/// Read one CSV table into `w`, one row per table row. Each column's key is interned
/// once, when a row first hands it on (the order a record-by-record reader interns them,
/// so the frame sees the same keys in the same order), and a row's values go to `w` with
/// their ids: no `String` per cell.
pub fn read(path: &Path, input: impl Read, stats: &mut FileStats, w: &mut RowWriter) -> Result<()> {
    let mut rdr = ::csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .from_reader(input);
    let headers = rdr
        .headers()
        .map_err(|e| Error::format(path, Position::Line(1), format!("CSV header: {e}")))?
        .clone();
    let names: Vec<String> = headers.iter().map(|h| h.trim().to_string()).collect();
    let lower: Vec<String> = names.iter().map(|n| n.to_ascii_lowercase()).collect();
    let step_col = STEP_COLUMNS
        .iter()
        .find_map(|s| lower.iter().position(|n| n == s))
        .ok_or_else(|| {
            Error::format(
                path,
                Position::Line(1),
                format!(
                    "CSV has no step column (looked for {}); header: {}",
                    STEP_COLUMNS.join(", "),
                    names.join(",")
                ),
            )
        })?;
    // A W&B chart export: every other column is `<run> - <key>`.
    let wandb_export = names
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != step_col)
        .all(|(_, n)| n.contains(" - "));
    let mut runs: Vec<&str> = Vec::new();
    let mut cols: Vec<Col> = Vec::with_capacity(names.len());
    for (i, n) in names.iter().enumerate() {
        let l = &lower[i];
        let col = if i == step_col {
            Col::Step
        } else if TIME_COLUMNS.contains(&l.as_str()) {
            Col::Time
        } else if wandb_export {
            match n.split_once(" - ") {
                Some((_, k)) if k.ends_with("__MIN") || k.ends_with("__MAX") => Col::Skip,
                Some((run, k)) => {
                    if !runs.contains(&run) {
                        runs.push(run);
                    }
                    Col::Metric(k.to_string())
                }
                None => Col::Skip,
            }
        } else if n.is_empty() {
            Col::Skip
        } else {
            Col::Metric(n.clone())
        };
        cols.push(col);
    }
    if runs.len() > 1 {
        return Err(Error::format(
            path,
            Position::Line(1),
            format!(
                "W&B export holds {} runs ({}); export one run per file to scan or compare them",
                runs.len(),
                runs.join(", ")
            ),
        ));
    }
    if wandb_export {
        stats.format = "wandb_csv".to_string();
    }
    let mut rec = ::csv::StringRecord::new();
    let mut line: u64 = 1;
    // The row's `(column, value)` pairs, and each column's key id once handed on.
    let mut cells: Vec<(usize, f64)> = Vec::with_capacity(cols.len());
    let mut ids: Vec<Option<u32>> = vec![None; cols.len()];
    let mut fields: Vec<(u32, f64)> = Vec::with_capacity(cols.len());
    loop {
        match rdr.read_record(&mut rec) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                let l = e.position().map_or(line + 1, |p| p.line());
                return Err(Error::format(path, Position::Line(l), e.to_string()));
            }
        }
        line = rec.position().map_or(line + 1, |p| p.line());
        let (mut step, mut timestamp) = (None, None);
        cells.clear();
        for (i, (cell, col)) in rec.iter().zip(&cols).enumerate() {
            let cell = cell.trim();
            if cell.is_empty() {
                continue;
            }
            match col {
                Col::Step => match parse_step(cell) {
                    Some(s) => step = Some(s),
                    None => stats.bad_line(line, format!("step {cell:?} is not an integer")),
                },
                Col::Time => timestamp = cell.parse::<f64>().ok(),
                Col::Metric(_) => match cell.parse::<f64>() {
                    Ok(v) => cells.push((i, v)),
                    Err(_) if cell.eq_ignore_ascii_case("true") => cells.push((i, 1.0)),
                    Err(_) if cell.eq_ignore_ascii_case("false") => cells.push((i, 0.0)),
                    Err(_) => {}
                },
                Col::Skip => {}
            }
        }
        if step.is_some() && !cells.is_empty() {
            stats.records += 1;
            stats.non_finite += cells.iter().filter(|(_, v)| !v.is_finite()).count() as u64;
            fields.clear();
            for &(i, v) in &cells {
                let id = match (ids.get(i).copied().flatten(), cols.get(i)) {
                    (Some(id), _) => id,
                    (None, Some(Col::Metric(k))) => {
                        let id = w.keys.id_str(k);
                        if let Some(slot) = ids.get_mut(i) {
                            *slot = Some(id);
                        }
                        id
                    }
                    (None, _) => continue,
                };
                fields.push((id, v));
            }
            w.uncounted_row(step, timestamp, SourceKind::Csv, line, &fields);
        }
    }
    stats.lines = line;
    stats.bytes = rdr.position().byte();
    Ok(())
}

/// A step cell: an integer, or an integral float (`12.0`, as pandas writes them).
fn parse_step(cell: &str) -> Option<i64> {
    if let Ok(i) = cell.parse::<i64>() {
        return Some(i);
    }
    let f = cell.parse::<f64>().ok()?;
    (f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15).then_some(f as i64)
}

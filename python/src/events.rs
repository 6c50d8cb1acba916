//! The events of a scan as one polars frame, for `rlforensics.read_events`.

use polars::prelude::{Column, DataFrame, NamedFrom, Series};
use rlforensics::model::log::{FileStats, LogEvent};
use rlforensics::{Error, Result};

/// Columns every event has, in this order; a payload number or list whose key is one of
/// these is named `payload.<key>` instead.
const FIXED: [&str; 11] = [
    "kind",
    "step",
    "reported_step",
    "step_inferred",
    "timestamp",
    "level",
    "file",
    "line",
    "run",
    "text",
    "source_format",
];

/// One row per event, in the scan's order (file, then line): `kind`, `step`,
/// `reported_step`, `step_inferred`, `timestamp`, `level`, `file` (the path), `line`,
/// `run`, `text`, `source_format` (the file's detected format), then one Float64 column per
/// payload number (`nan_count`, `grad_norm`, …) and one List(Float64) column per payload
/// list (`token_counts`, …), null where an event does not carry it; payload columns in
/// order of first appearance.
pub fn events_frame(events: &[LogEvent], files: &[FileStats]) -> Result<DataFrame> {
    let n = events.len();
    let mut numbers: Vec<(String, Vec<Option<f64>>)> = Vec::new();
    let mut lists: Vec<(String, Vec<Option<Series>>)> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        for (k, x) in &e.numbers {
            let slot = match numbers.iter().position(|(n2, _)| n2 == k) {
                Some(j) => j,
                None => {
                    numbers.push((k.clone(), vec![None; n]));
                    numbers.len() - 1
                }
            };
            numbers[slot].1[i] = Some(*x);
        }
        for (k, xs) in &e.lists {
            let slot = match lists.iter().position(|(n2, _)| n2 == k) {
                Some(j) => j,
                None => {
                    lists.push((k.clone(), vec![None; n]));
                    lists.len() - 1
                }
            };
            lists[slot].1[i] = Some(Series::new("".into(), xs.as_slice()));
        }
    }
    let path_of = |f: usize| files.get(f).map(|s| s.path.display().to_string());
    let format_of = |f: usize| files.get(f).map(|s| s.format.clone());
    let mut cols = vec![
        Column::new(
            "kind".into(),
            events.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
        ),
        Column::new(
            "step".into(),
            events.iter().map(|e| e.step).collect::<Vec<_>>(),
        ),
        Column::new(
            "reported_step".into(),
            events.iter().map(|e| e.reported_step).collect::<Vec<_>>(),
        ),
        Column::new(
            "step_inferred".into(),
            events.iter().map(|e| e.step_inferred).collect::<Vec<_>>(),
        ),
        Column::new(
            "timestamp".into(),
            events.iter().map(|e| e.timestamp).collect::<Vec<_>>(),
        ),
        Column::new(
            "level".into(),
            events.iter().map(|e| e.level.clone()).collect::<Vec<_>>(),
        ),
        Column::new(
            "file".into(),
            events.iter().map(|e| path_of(e.file)).collect::<Vec<_>>(),
        ),
        Column::new(
            "line".into(),
            events.iter().map(|e| e.line as i64).collect::<Vec<_>>(),
        ),
        Column::new(
            "run".into(),
            events.iter().map(|e| i64::from(e.run)).collect::<Vec<_>>(),
        ),
        Column::new(
            "text".into(),
            events.iter().map(|e| e.text.clone()).collect::<Vec<_>>(),
        ),
        Column::new(
            "source_format".into(),
            events.iter().map(|e| format_of(e.file)).collect::<Vec<_>>(),
        ),
    ];
    let name = |k: &str| {
        if FIXED.contains(&k) {
            format!("payload.{k}")
        } else {
            k.to_string()
        }
    };
    for (k, v) in numbers {
        cols.push(Column::new(name(&k).as_str().into(), v));
    }
    for (k, v) in lists {
        let name = name(&k);
        let name = if cols.iter().any(|c| c.name().as_str() == name) {
            format!("list.{k}")
        } else {
            name
        };
        cols.push(Series::new(name.as_str().into(), v).into());
    }
    DataFrame::new(n, cols).map_err(|e| Error::internal(format!("building the events frame: {e}")))
}

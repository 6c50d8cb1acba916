//! The words and numbers the document's tables share (cells, statuses, rank/micro
//! names), below both the section builders (`build.rs`, `dumps.rs`) so that neither
//! imports the other.

use crate::judge::Status;
use crate::postmortem::StepTable;

/// A table cell: the shared formatter's 4 significant digits, NaN/inf spelled out, `-`
/// when absent.
pub fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_string(), crate::fmt::num)
}

/// The last-steps table's cells, row by row: one notation per column (never `-0.0031`
/// above `6.973e-4`), `-` where a step has no value.
pub fn step_cells(t: &StepTable) -> Vec<Vec<String>> {
    let n = t.columns.len();
    let mut cols: Vec<Vec<String>> = Vec::with_capacity(n);
    for j in 0..n {
        let present: Vec<f64> = t
            .rows
            .iter()
            .filter_map(|(_, c)| c.get(j).copied().flatten())
            .collect();
        // One text per present value, in order: `column` maps each value to one text.
        let mut texts = crate::fmt::column(&present).into_iter();
        cols.push(
            t.rows
                .iter()
                .map(|(_, c)| match c.get(j).copied().flatten() {
                    Some(_) => texts.next().unwrap_or_default(),
                    None => "-".to_string(),
                })
                .collect(),
        );
    }
    (0..t.rows.len())
        .map(|i| cols.iter().map(|c| c[i].clone()).collect())
        .collect()
}

/// `p50/p95/p99/max` of a stats object.
pub fn stats(v: &serde_json::Value) -> String {
    ["p50", "p95", "p99", "max"]
        .iter()
        .map(|k| {
            v.get(k)
                .and_then(|x| x.as_f64())
                .map_or("-".into(), |x| cell(Some(x)))
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// `consistent`, `inconsistent`, `undetermined` or `not recomputed`.
pub fn status_word(s: Option<Status>) -> &'static str {
    match s {
        Some(Status::Consistent) => "consistent",
        Some(Status::Inconsistent) => "inconsistent",
        Some(Status::Undetermined) => "undetermined",
        Some(Status::CannotJudge) => "cannot judge",
        None => "not recomputed",
    }
}

/// `0`, `1`, … or `-` for an absent rank/micro.
pub fn opt_num(n: Option<u32>) -> String {
    n.map_or("-".into(), |n| n.to_string())
}

/// `rank 10 micro 1`, `rank 10` (per-rank files) or `whole batch`.
pub fn at_cell(rank: Option<u32>, micro: Option<u32>) -> String {
    crate::dumpdiff::words::cell_name(rank, micro)
}

/// The legend of the sections × ranks grid.
pub const GRID_LEGEND: &str =
    "one symbol per micro: ✓ pass, ! warn, ✗ fail, – one side only, · not compared";

//! The words a dumpdiff report is said in, wherever it is shown (dumpdiff's renderers,
//! postmortem's dump section): verdicts, cell names, where a finding is.

use super::report::Finding;
use crate::compare::tolerance::Verdict;
use crate::fmt;

/// `PASS`/`WARN`/`FAIL` for the headline.
pub fn verdict_word(v: Verdict) -> &'static str {
    match v {
        Verdict::Pass => "PASS",
        Verdict::Skipped => "NOTHING COMPARED",
        Verdict::Missing => "PASS with files on one side only",
        Verdict::Warn => "WARN",
        Verdict::Fail => "FAIL",
    }
}

/// `rank 3 micro 1`, `rank 3`, or `whole batch`.
pub fn cell_name(rank: Option<u32>, micro: Option<u32>) -> String {
    match (rank, micro) {
        (Some(r), Some(m)) => format!("rank {r} micro {m}"),
        (Some(r), None) => format!("rank {r}"),
        (None, Some(m)) => format!("micro {m}"),
        (None, None) => "whole batch".into(),
    }
}

/// `rank 3 micro 1 row 0 pos 1` (the other side's row when it differs).
pub fn location(f: &Finding) -> String {
    let mut s = cell_name(f.rank, f.micro);
    if let Some(r) = f.row {
        s.push_str(&format!(" row {r}"));
        if let Some(o) = f.other_row.filter(|o| *o != r) {
            s.push_str(&format!(" (other row {o})"));
        }
    }
    if let Some(p) = f.pos {
        s.push_str(&format!(" pos {p}"));
    }
    s
}

/// One line for a finding: where, which tensor, both values (with the digits that show
/// their difference).
pub fn finding_line(f: &Finding) -> String {
    let (a, b) = fmt::pair(f.a, f.b);
    format!(
        "{} at {}: {a} vs {b} (|Δ| {}, {}× tolerance)",
        f.name,
        location(f),
        fmt::num(f.abs_diff),
        fmt::num(f.excess)
    )
}

//! Data-quality notes of a scan, one line per file: what a reader had to skip, drop or
//! guess (truncated last line, bad lines, NaN, type changes, stale steps…).

use super::ScanReport;

/// Data-quality notes per file, one line each (truncated last line, bad lines, NaN…).
pub fn file_notes(report: &ScanReport) -> Vec<String> {
    let mut out = Vec::new();
    for f in &report.files {
        let mut parts = Vec::new();
        if f.truncated_last_line {
            parts.push("truncated last line skipped".to_string());
        }
        if f.bad_line_count > 0 {
            let first = f
                .bad_lines
                .first()
                .map(|b| format!(" (first: line {}: {})", b.line, b.message))
                .unwrap_or_default();
            parts.push(format!("{} unreadable line(s){first}", f.bad_line_count));
        }
        if f.non_finite > 0 {
            parts.push(format!("{} NaN/inf value(s)", f.non_finite));
        }
        if f.nulls > 0 {
            parts.push(format!("{} null(s)", f.nulls));
        }
        for t in &f.type_changes {
            parts.push(format!(
                "{} changes type {}→{} (lines {}, {})",
                t.key, t.from, t.to, t.first_line, t.line
            ));
        }
        if f.duplicate_events > 0 {
            parts.push(format!("{} duplicate event(s) dropped", f.duplicate_events));
        }
        if f.inferred_steps > 0 {
            parts.push(format!(
                "{} event(s) with a stale step field placed by file order",
                f.inferred_steps
            ));
        }
        if f.unrecognised_lines > 0 {
            parts.push(format!(
                "{} unrecognised text line(s)",
                f.unrecognised_lines
            ));
        }
        if f.eval_records > 0 {
            parts.push(format!(
                "{} evaluation record(s) kept apart from training steps",
                f.eval_records
            ));
        }
        if f.runs > 1 {
            parts.push(format!(
                "step restarts: {} appended runs, scanned one by one",
                f.runs
            ));
        }
        out.push(format!(
            "{} [{}]: {} lines, {} records, {} events{}",
            f.path.display(),
            f.format,
            f.lines,
            f.records,
            f.events,
            if parts.is_empty() {
                String::new()
            } else {
                format!("; {}", parts.join("; "))
            }
        ));
    }
    out
}

/// Keys read that no detector uses, said next to "no findings" (a clean report must not
/// hide what it could not judge).
pub fn not_understood_note(report: &ScanReport) -> Option<String> {
    if report.not_understood.is_empty() {
        return None;
    }
    const SHOWN: usize = 20;
    let n = report.not_understood.len();
    let mut keys = report.not_understood[..n.min(SHOWN)].join(", ");
    if n > SHOWN {
        keys.push_str(&format!(" and {} more", n - SHOWN));
    }
    Some(format!(
        "warning: {n} key(s) read but not understood, so not judged: {keys} (map them with --aliases FILE)"
    ))
}

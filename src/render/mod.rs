//! Renderers for `logscan` reports: one per output format behind one trait
//! (terminal table, JSON, markdown) plus the PNG/SVG plot.

pub mod axis;
pub mod html;
pub mod json;
pub mod markdown;
pub mod plot;
pub mod table;

use crate::error::Result;
use crate::logscan::ScanReport;

/// Turns a scan report into bytes of one format.
pub trait Renderer {
    /// Render `report`.
    fn render(&self, report: &ScanReport) -> Result<String>;
}

/// The renderer for a `--format` name (`table`, `json`, `markdown`); the table fits
/// [`terminal_width`].
pub fn renderer(format: &str, color: bool) -> Option<Box<dyn Renderer>> {
    match format {
        "table" => Some(Box::new(table::TableRenderer {
            color,
            width: terminal_width(),
        })),
        "json" => Some(Box::new(json::JsonRenderer)),
        "markdown" | "md" => Some(Box::new(markdown::MarkdownRenderer)),
        _ => None,
    }
}

/// The width tables must fit: `COLUMNS` when set to a number, else the terminal's width
/// when stdout is one, else `None` (a pipe or file gets the full table).
pub fn terminal_width() -> Option<usize> {
    if let Some(c) = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|c| *c > 0)
    {
        return Some(c);
    }
    comfy_table::Table::new().width().map(usize::from)
}

/// The widest line of `text` in characters (every glyph the tables use is one column wide).
pub fn text_width(text: &str) -> usize {
    text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
}

/// Short evidence text `k=v, k=v` for tables.
pub fn evidence_text(f: &crate::detect::Finding, max: usize) -> String {
    f.evidence
        .iter()
        .take(max)
        .map(|(k, v)| match v {
            serde_json::Value::Number(n) => match n.as_f64() {
                Some(x) if n.is_f64() => format!("{k}={}", crate::fmt::num(x)),
                _ => format!("{k}={n}"),
            },
            serde_json::Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

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

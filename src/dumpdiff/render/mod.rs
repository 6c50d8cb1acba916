//! Renderers of a dumpdiff [`Report`]: one trait, one file per format.

pub mod json;
pub mod markdown;
pub mod table;

use crate::dumpdiff::report::{Finding, Report};
use crate::error::Result;

/// Turns a report into text of one format.
pub trait Renderer {
    /// The report rendered in this format.
    fn render(&self, report: &Report) -> Result<String>;
}

/// The renderer for a `--format` name (`table`, `json`, `markdown`).
pub fn by_name(name: &str, color: bool) -> Option<Box<dyn Renderer>> {
    match name {
        "table" => Some(Box::new(table::TableRenderer { color })),
        "json" => Some(Box::new(json::JsonRenderer)),
        "markdown" | "md" => Some(Box::new(markdown::MarkdownRenderer)),
        _ => None,
    }
}

/// `rank 3 micro 1 row 0 pos 1` (the other side's row when it differs).
pub fn location(f: &Finding) -> String {
    let mut s = String::new();
    if let Some(r) = f.rank {
        s.push_str(&format!("rank {r}"));
    }
    if let Some(m) = f.micro {
        s.push_str(&format!(" micro {m}"));
    }
    if let Some(r) = f.row {
        s.push_str(&format!(" row {r}"));
        if f.other_row.is_some_and(|o| o != r) {
            s.push_str(&format!(" (other row {})", f.other_row.unwrap_or(r)));
        }
    }
    if let Some(p) = f.pos {
        s.push_str(&format!(" pos {p}"));
    }
    s.trim().to_string()
}

/// One line for a finding: where, which tensor, both values.
pub fn finding_line(f: &Finding) -> String {
    format!(
        "{} at {}: {} vs {} (|Δ| {:.3e}, {:.1}× tolerance)",
        f.name,
        location(f),
        crate::inspect::fmt_num(f.a),
        crate::inspect::fmt_num(f.b),
        f.abs_diff,
        f.excess
    )
}

//! The terminal table (comfy-table), colour only when asked.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, Color, ContentArrangement, Table};

use crate::error::Result;
use crate::fmt::evidence;
use crate::fmt::{plural, wrap};
use crate::logscan::notes::file_notes;
use crate::logscan::ScanReport;
use crate::model::finding::Severity;
use crate::render::Renderer;

/// Below this width the evidence leaves the table for a line under it.
const EVIDENCE_IN_TABLE_MIN_WIDTH: usize = 120;
/// The table's width when the terminal's is unknown (a pipe or file).
const DEFAULT_WIDTH: usize = 140;

/// Findings as a table, then causes and file notes.
pub struct TableRenderer {
    /// Colour severities (off for NO_COLOR and pipes).
    pub color: bool,
    /// Terminal width to fit (`None`: 140 columns).
    pub width: Option<usize>,
}

impl Renderer<ScanReport> for TableRenderer {
    fn render(&self, r: &ScanReport) -> Result<String> {
        let mut out = String::new();
        out.push_str(&format!(
            "{} step(s) {}..{}, {} metric(s), {} event(s) from {} file(s)\n",
            r.steps,
            r.first_step.map_or("-".into(), |s| s.to_string()),
            r.last_step.map_or("-".into(), |s| s.to_string()),
            r.metrics.len(),
            r.events.len(),
            r.files.len()
        ));
        for n in file_notes(r) {
            out.push_str(&wrap(&n, self.width, "  "));
        }
        if r.findings.is_empty() {
            out.push_str(&format!(
                "no findings ({} detector(s) ran)\n",
                r.detectors_run.len()
            ));
            if let Some(n) = crate::logscan::notes::not_understood_note(r) {
                out.push_str(&wrap(&n, self.width, "  "));
            }
            return Ok(out);
        }
        out.push_str(&format!("{}\n", count_line(r)));
        let width = self.width.unwrap_or(DEFAULT_WIDTH).max(40);
        let evidence_in_table = width >= EVIDENCE_IN_TABLE_MIN_WIDTH;
        let mut t = Table::new();
        let mut header = vec!["severity", "detector", "steps", "n", "finding"];
        if evidence_in_table {
            header.push("evidence");
        }
        t.load_style(UTF8_FULL_CONDENSED)
            .force_no_tty()
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_width(u16::try_from(width).unwrap_or(u16::MAX))
            .set_header(header);
        // Colour is the caller's decision (`color`), not comfy-table's tty check.
        if self.color {
            t.enforce_styling();
        }
        for f in &r.findings {
            let mut sev = Cell::new(f.severity.name());
            if self.color {
                sev = sev.fg(match f.severity {
                    Severity::Critical => Color::Magenta,
                    Severity::Error => Color::Red,
                    Severity::Warning => Color::Yellow,
                    Severity::Info => Color::Cyan,
                });
            }
            let mut row = vec![
                sev,
                Cell::new(&f.detector),
                Cell::new(f.step_range()),
                Cell::new(f.count),
                Cell::new(&f.explanation),
            ];
            if evidence_in_table {
                row.push(Cell::new(evidence(&f.evidence, 4)));
            }
            t.add_row(row);
        }
        out.push_str(&t.to_string());
        out.push('\n');
        if !evidence_in_table {
            for f in &r.findings {
                let e = evidence(&f.evidence, 4);
                if !e.is_empty() {
                    out.push_str(&wrap(
                        &format!("{} evidence: {e}", f.detector),
                        self.width,
                        "",
                    ));
                }
            }
        }
        for f in &r.findings {
            if let Some(c) = f.likely_causes.first() {
                out.push_str(&wrap(
                    &format!("{} likely cause: {c}", f.detector),
                    self.width,
                    "",
                ));
            }
        }
        Ok(out)
    }
}

/// `3 findings: 1 critical, 2 warning` (severities worst first).
pub fn count_line(r: &ScanReport) -> String {
    let mut parts = Vec::new();
    for s in [
        Severity::Critical,
        Severity::Error,
        Severity::Warning,
        Severity::Info,
    ] {
        let n = r.findings.iter().filter(|f| f.severity == s).count();
        if n > 0 {
            parts.push(format!("{n} {}", s.name()));
        }
    }
    format!(
        "{}: {}",
        plural(r.findings.len(), "finding"),
        parts.join(", ")
    )
}

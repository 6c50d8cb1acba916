//! The terminal table (comfy-table), colour only when asked.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, Color, ContentArrangement, Table};

use super::{evidence_text, file_notes, Renderer};
use crate::detect::Severity;
use crate::error::Result;
use crate::logscan::ScanReport;

/// Findings as a table, then causes and file notes.
pub struct TableRenderer {
    /// Colour severities (off for NO_COLOR and pipes).
    pub color: bool,
}

impl Renderer for TableRenderer {
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
            out.push_str(&format!("  {n}\n"));
        }
        if r.findings.is_empty() {
            out.push_str(&format!(
                "no findings ({} detector(s) ran)\n",
                r.detectors_run.len()
            ));
            return Ok(out);
        }
        let mut t = Table::new();
        if self.color {
            // `--color always` colours a pipe too: comfy-table alone checks for a terminal.
            t.enforce_styling();
        }
        t.load_style(UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_width(140)
            .set_header(vec![
                "severity", "detector", "steps", "n", "finding", "evidence",
            ]);
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
            t.add_row(vec![
                sev,
                Cell::new(&f.detector),
                Cell::new(f.step_range()),
                Cell::new(f.count),
                Cell::new(&f.explanation),
                Cell::new(evidence_text(f, 4)),
            ]);
        }
        out.push_str(&t.to_string());
        out.push('\n');
        for f in &r.findings {
            if let Some(c) = f.likely_causes.first() {
                out.push_str(&format!("{} likely cause: {c}\n", f.detector));
            }
        }
        Ok(out)
    }
}

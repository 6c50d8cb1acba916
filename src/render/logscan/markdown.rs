//! Markdown report: a findings table, then each finding's evidence and causes.

use crate::error::Result;
use crate::fmt::evidence;
use crate::logscan::notes::file_notes;
use crate::logscan::ScanReport;
use crate::render::Renderer;

/// GitHub-flavoured markdown.
pub struct MarkdownRenderer;

fn esc(s: &str) -> String {
    s.replace('|', "\\|")
}

impl Renderer<ScanReport> for MarkdownRenderer {
    fn render(&self, r: &ScanReport) -> Result<String> {
        let mut o = String::from("# logscan report\n\n");
        o.push_str(&format!(
            "{} logged step(s) ({}..{}), metrics: {}\n\n## Files\n\n",
            r.steps,
            r.first_step.map_or("-".into(), |s| s.to_string()),
            r.last_step.map_or("-".into(), |s| s.to_string()),
            r.metrics.join(", ")
        ));
        for n in file_notes(r) {
            o.push_str(&format!("- {}\n", esc(&n)));
        }
        o.push_str("\n## Findings\n\n");
        if r.findings.is_empty() {
            o.push_str("No findings.\n");
            if let Some(n) = crate::logscan::notes::not_understood_note(r) {
                o.push_str(&format!("\n{}\n", esc(&n)));
            }
            return Ok(o);
        }
        o.push_str("| severity | detector | steps | n | finding |\n|---|---|---|---|---|\n");
        for f in &r.findings {
            o.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                f.severity.name(),
                f.detector,
                f.step_range(),
                f.count,
                esc(&f.explanation)
            ));
        }
        for f in &r.findings {
            o.push_str(&format!(
                "\n### {} ({}, steps {})\n\n{}\n\nEvidence: {}\n\nLikely causes:\n",
                f.detector,
                f.severity.name(),
                f.step_range(),
                f.explanation,
                evidence(&f.evidence, usize::MAX)
            ));
            for c in &f.likely_causes {
                o.push_str(&format!("- {c}\n"));
            }
        }
        Ok(o)
    }
}

//! Markdown: the summary grid, findings, and one table per section of its non-passing cells.

use super::{finding_line, Renderer};
use crate::compare::tolerance::Verdict;
use crate::dumpdiff::render::table::verdict_word;
use crate::dumpdiff::report::Report;
use crate::error::Result;

/// A markdown document for issues and PRs.
pub struct MarkdownRenderer;

impl Renderer for MarkdownRenderer {
    fn render(&self, report: &Report) -> Result<String> {
        let mut o = format!(
            "# dumpdiff — step {}: {}\n\n",
            report.step,
            verdict_word(report.verdict)
        );
        for s in &report.sides {
            o.push_str(&format!(
                "- **{}**: `{}` ({})\n",
                s.role,
                s.root.display(),
                s.producer
            ));
            for u in &s.not_placed {
                o.push_str(&format!(
                    "  - not read: `{}` ({})\n",
                    u.path.display(),
                    u.reason
                ));
            }
        }
        o.push_str("\n| section | pair | verdict | cells ✓/!/✗/– |\n|---|---|---|---|\n");
        for sec in &report.sections {
            let n = |v: Verdict| sec.cells.iter().filter(|c| c.verdict == v).count();
            o.push_str(&format!(
                "| {} {} | {} | {} | {}/{}/{}/{} |\n",
                sec.id,
                sec.name,
                sec.pair,
                sec.verdict.symbol(),
                n(Verdict::Pass),
                n(Verdict::Warn),
                n(Verdict::Fail),
                n(Verdict::Missing)
            ));
        }
        if let Some(f) = &report.first_divergence {
            o.push_str(&format!("\n**First divergence:** {}\n", finding_line(f)));
        }
        if !report.adjudication.is_empty() {
            o.push_str("\n## Which side is right (losscheck)\n\n");
            for a in &report.adjudication {
                o.push_str(&format!(
                    "- rank {} micro {} (`{}`): **{}**\n",
                    a.rank, a.micro, a.preset, a.conclusion
                ));
                for v in &a.sides {
                    o.push_str(&format!("  - {}: {}\n", v.role, v.detail));
                }
            }
        }
        if !report.coverage.is_empty() {
            o.push_str("\n## Present on one side only\n\n");
            for c in &report.coverage {
                o.push_str(&format!(
                    "- `{}` rank {:?} micro {:?}: on {} only\n",
                    c.kind, c.rank, c.micro, c.present_on
                ));
            }
        }
        for sec in &report.sections {
            let bad: Vec<_> = sec
                .cells
                .iter()
                .filter(|c| c.verdict > Verdict::Pass)
                .collect();
            if bad.is_empty() && sec.notes.is_empty() {
                continue;
            }
            o.push_str(&format!("\n## {} {}\n\n", sec.id, sec.name));
            if !bad.is_empty() {
                o.push_str("| rank | micro | verdict | reason |\n|---|---|---|---|\n");
                for c in bad {
                    o.push_str(&format!(
                        "| {} | {} | {} | {} |\n",
                        c.rank.map_or("-".into(), |r| r.to_string()),
                        c.micro.map_or("-".into(), |m| m.to_string()),
                        c.verdict.symbol(),
                        c.reason.replace('|', "\\|")
                    ));
                }
            }
            for n in &sec.notes {
                o.push_str(&format!("\n> {n}\n"));
            }
        }
        Ok(o)
    }
}

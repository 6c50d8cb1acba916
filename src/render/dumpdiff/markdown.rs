//! Markdown: the count summary, the section table, the full sections × ranks grid (one
//! column per rank, however many), findings with losscheck's diagnosis, the files behind
//! them, the next command, and one table per section of its non-passing cells.

use std::collections::BTreeSet;

use super::{
    cell_name, coverage_lines, finding_line, next_commands, summary_line, verdict_detail,
    verdict_word,
};
use crate::compare::tolerance::Verdict;
use crate::dumpdiff::report::Report;
use crate::error::Result;
use crate::render::Renderer;

/// A markdown document for issues and PRs.
pub struct MarkdownRenderer;

impl Renderer<Report> for MarkdownRenderer {
    fn render(&self, report: &Report) -> Result<String> {
        let mut o = format!(
            "# dumpdiff — step {}: {}\n\n{}\n\n",
            report.step,
            verdict_word(report.verdict),
            summary_line(report)
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
        for l in super::unreadable_lines(report) {
            o.push_str(&format!("- {l}\n"));
        }
        let conv = super::convention_lines(report);
        if !conv.is_empty() {
            o.push('\n');
            for l in conv {
                o.push_str(&format!("- {l}\n"));
            }
        }
        if !report.diagnosis.is_empty() {
            o.push_str("\n**Diagnosis**\n\n");
            for d in &report.diagnosis {
                o.push_str(&format!("- {d}\n"));
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
        grid(report, &mut o);
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
                    o.push_str(&format!("  - {}: {}\n", v.role, verdict_detail(&v.detail)));
                }
            }
        }
        if !report.offending_files.is_empty() {
            o.push_str("\n## Files\n\n| cell | section | side | file |\n|---|---|---|---|\n");
            for f in &report.offending_files {
                o.push_str(&format!(
                    "| {} | {} | {} | `{}` |\n",
                    cell_name(f.rank, f.micro),
                    f.section,
                    f.role,
                    f.path.display()
                ));
            }
        }
        let next = next_commands(report, usize::MAX);
        if !next.is_empty() {
            o.push_str("\n## Next\n\n```sh\n");
            for c in next {
                o.push_str(&format!("{c}\n"));
            }
            o.push_str("```\n");
        }
        if !report.coverage.is_empty() {
            o.push_str("\n## Present on one side only\n\n");
            for l in coverage_lines(report) {
                o.push_str(&format!("- {l}\n"));
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

/// The full sections × ranks grid: one column per rank, one symbol per micro.
fn grid(report: &Report, o: &mut String) {
    let ranks: BTreeSet<u32> = report
        .sections
        .iter()
        .flat_map(|s| s.cells.iter().filter_map(|c| c.rank))
        .collect();
    if ranks.is_empty() {
        return;
    }
    o.push_str("\n| section |");
    for r in &ranks {
        o.push_str(&format!(" r{r} |"));
    }
    o.push_str("\n|---|");
    o.push_str(&"---|".repeat(ranks.len()));
    o.push('\n');
    for sec in &report.sections {
        o.push_str(&format!("| {} {} |", sec.id, sec.name));
        let whole = sec.cells.iter().all(|c| c.rank.is_none());
        for r in &ranks {
            let text: String = if whole {
                sec.verdict.symbol().to_string()
            } else {
                sec.cells
                    .iter()
                    .filter(|c| c.rank == Some(*r))
                    .map(|c| c.verdict.symbol())
                    .collect()
            };
            o.push_str(&format!(" {text} |"));
        }
        o.push('\n');
    }
    o.push_str(
        "\n(one symbol per micro: ✓ pass, ! warn, ✗ fail, – one side only, · not compared)\n",
    );
}

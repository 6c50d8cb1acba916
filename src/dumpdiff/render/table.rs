//! The one-screen terminal summary: sections × ranks grid of ✓/!/✗, coverage gaps, the
//! first divergence and the worst offenders.

use std::collections::BTreeSet;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, Color, Table};

use super::{finding_line, Renderer};
use crate::compare::tolerance::Verdict;
use crate::dumpdiff::report::Report;
use crate::error::Result;

/// Files not read that the terminal summary names (the JSON report lists all).
const NOT_PLACED_SHOWN: usize = 5;

/// The terminal table; `color` off for pipes and `NO_COLOR`.
pub struct TableRenderer {
    /// Colour the verdict symbols.
    pub color: bool,
}

impl TableRenderer {
    fn cell(&self, v: Verdict, text: String) -> Cell {
        let c = Cell::new(text);
        if !self.color {
            return c;
        }
        match v {
            Verdict::Pass => c.fg(Color::Green),
            Verdict::Warn | Verdict::Missing => c.fg(Color::Yellow),
            Verdict::Fail => c.fg(Color::Red),
            Verdict::Skipped => c,
        }
    }
}

impl Renderer for TableRenderer {
    fn render(&self, report: &Report) -> Result<String> {
        let mut out = String::new();
        out.push_str(&format!(
            "dumpdiff step {}: {}\n",
            report.step,
            verdict_word(report.verdict)
        ));
        for s in &report.sides {
            out.push_str(&format!(
                "  {:<12} {} ({}, {} files)\n",
                s.role,
                s.root.display(),
                s.producer,
                s.files
            ));
            for u in s.not_placed.iter().take(NOT_PLACED_SHOWN) {
                out.push_str(&format!(
                    "    not read: {} ({})\n",
                    u.path.display(),
                    u.reason
                ));
            }
            if s.not_placed.len() > NOT_PLACED_SHOWN {
                out.push_str(&format!(
                    "    … and {} more files not read (all in the JSON report)\n",
                    s.not_placed.len() - NOT_PLACED_SHOWN
                ));
            }
        }
        let ranks: BTreeSet<u32> = report
            .sections
            .iter()
            .flat_map(|s| s.cells.iter().filter_map(|c| c.rank))
            .collect();
        let mut table = Table::new();
        if self.color {
            // `--color always` colours a pipe too: comfy-table alone checks for a terminal.
            table.enforce_styling();
        }
        table.load_style(UTF8_FULL_CONDENSED);
        let mut header = vec![Cell::new("section")];
        header.extend(ranks.iter().map(|r| Cell::new(format!("r{r}"))));
        if ranks.is_empty() {
            header.push(Cell::new("batch"));
        }
        table.set_header(header);
        for sec in &report.sections {
            let mut row = vec![self.cell(sec.verdict, format!("{} {}", sec.id, sec.name))];
            if sec.cells.iter().all(|c| c.rank.is_none()) {
                let v = sec.verdict;
                row.push(self.cell(v, v.symbol().to_string()));
            } else {
                for r in &ranks {
                    let cells: Vec<_> = sec.cells.iter().filter(|c| c.rank == Some(*r)).collect();
                    let text: String = cells.iter().map(|c| c.verdict.symbol()).collect();
                    let v = cells
                        .iter()
                        .map(|c| c.verdict)
                        .max()
                        .unwrap_or(Verdict::Skipped);
                    row.push(self.cell(v, if text.is_empty() { " ".into() } else { text }));
                }
            }
            table.add_row(row);
        }
        out.push_str(&table.to_string());
        out.push_str(
            "\n(one symbol per micro: ✓ pass  ! warn  ✗ fail  – one side only  · not compared)\n",
        );
        if !report.coverage.is_empty() {
            let mut by: Vec<String> = Vec::new();
            for c in &report.coverage {
                let line = format!(
                    "rank {} on {} only",
                    c.rank.map_or("-".into(), |r| r.to_string()),
                    c.present_on
                );
                if !by.contains(&line) {
                    by.push(line);
                }
            }
            out.push_str(&format!(
                "one side only ({} files): {}\n",
                report.coverage.len(),
                by.join("; ")
            ));
        }
        match &report.first_divergence {
            Some(f) => out.push_str(&format!(
                "first divergence: {}\n  {}\n",
                finding_line(f),
                f.reason
            )),
            None => out.push_str("no divergence beyond tolerance\n"),
        }
        if report.worst.len() > 1 {
            out.push_str("worst offenders:\n");
            for f in &report.worst {
                out.push_str(&format!("  {}\n", finding_line(f)));
            }
        }
        for a in &report.adjudication {
            out.push_str(&format!(
                "which side is right at rank {} micro {} (losscheck {}): {}\n",
                a.rank, a.micro, a.preset, a.conclusion
            ));
        }
        for sec in &report.sections {
            for n in sec.notes.iter().take(2) {
                out.push_str(&format!("note ({}): {n}\n", sec.name));
            }
        }
        Ok(out)
    }
}

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

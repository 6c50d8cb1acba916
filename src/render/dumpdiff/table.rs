//! The one-screen terminal summary: a count line, the sections × ranks grid of ✓/!/✗ that
//! fits the terminal (full, ranks merged into ranges, or a one-character-per-rank strip),
//! coverage gaps, the first divergence, the worst offenders, the files behind them and the
//! command to run next.

use std::collections::BTreeSet;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, Color, Table};

use super::{
    cell_name, coverage_lines, finding_line, next_commands, plural, ranges, summary_line,
    verdict_detail, verdict_word, wrap,
};
use crate::compare::tolerance::Verdict;
use crate::dumpdiff::report::{Report, Section};
use crate::error::Result;
use crate::render::{text_width, Renderer};

/// Files not read that the terminal summary names (the JSON report lists all).
const NOT_PLACED_SHOWN: usize = 5;
/// Cells whose files the terminal summary lists (the JSON report lists all).
const CELLS_WITH_FILES_SHOWN: usize = 3;
/// Suggested commands shown.
const NEXT_SHOWN: usize = 3;

/// The terminal table; `color` off for pipes and `NO_COLOR`; `width` the columns to fit
/// (`None`: no limit, the full grid).
pub struct TableRenderer {
    /// Colour the verdict symbols.
    pub color: bool,
    /// Terminal width to fit, if known.
    pub width: Option<usize>,
}

/// One grid column: a run of ranks with identical symbols in every section.
struct Column {
    ranks: BTreeSet<u32>,
    /// Per section: symbol text and worst verdict (None: whole-batch section).
    cells: Vec<(String, Verdict)>,
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

    /// The grid with one column per entry of `columns`.
    fn grid(&self, sections: &[Section], columns: &[Column]) -> String {
        let mut table = Table::new();
        table.load_style(UTF8_FULL_CONDENSED);
        // Width and colour are decided by the caller (`width`, `color`), not by comfy-table.
        table.force_no_tty();
        if self.color {
            table.enforce_styling();
        }
        let mut header = vec![Cell::new("section")];
        header.extend(
            columns
                .iter()
                .map(|c| Cell::new(format!("r{}", ranges(&c.ranks)))),
        );
        if columns.is_empty() {
            header.push(Cell::new("batch"));
        }
        table.set_header(header);
        for (i, sec) in sections.iter().enumerate() {
            let mut row = vec![self.cell(sec.verdict, format!("{} {}", sec.id, sec.name))];
            if sec.cells.iter().all(|c| c.rank.is_none()) {
                row.push(self.cell(sec.verdict, sec.verdict.symbol().to_string()));
            } else {
                for col in columns {
                    let (text, v) = &col.cells[i];
                    row.push(self.cell(
                        *v,
                        if text.is_empty() {
                            " ".into()
                        } else {
                            text.clone()
                        },
                    ));
                }
            }
            table.add_row(row);
        }
        table.to_string()
    }

    /// One character per rank (its worst micro), `per` ranks per character when even that
    /// is too wide; a tick line names every tenth position.
    fn strip(&self, report: &Report, ranks: &BTreeSet<u32>) -> String {
        let (Some(&lo), Some(&hi)) = (ranks.first(), ranks.last()) else {
            return String::new();
        };
        let label_w = report
            .sections
            .iter()
            .map(|s| format!("{} {}", s.id, s.name).chars().count())
            .max()
            .unwrap_or(7)
            .max(7)
            + 2;
        let span = (hi - lo + 1) as usize;
        let room = self
            .width
            .unwrap_or(usize::MAX)
            .saturating_sub(label_w)
            .max(10);
        let per = span.div_ceil(room).max(1);
        let n = span.div_ceil(per);
        let mut out = format!(
            "ranks {lo}-{hi}, one column per {} (worst micro of each):\n",
            if per == 1 {
                "rank".to_string()
            } else {
                format!("{per} ranks")
            }
        );
        let mut ticks = vec![' '; n];
        let mut i = 0;
        while i < n {
            let label = (lo as usize + i * per).to_string();
            if i + label.len() <= n {
                for (j, ch) in label.chars().enumerate() {
                    ticks[i + j] = ch;
                }
            }
            i += 10;
        }
        out.push_str(&format!(
            "{:label_w$}{}\n",
            "",
            ticks.iter().collect::<String>().trim_end()
        ));
        for sec in &report.sections {
            let mut line = String::new();
            for k in 0..n {
                let from = lo + (k * per) as u32;
                let to = (from + per as u32 - 1).min(hi);
                let v = sec
                    .cells
                    .iter()
                    .filter(|c| c.rank.is_some_and(|r| (from..=to).contains(&r)))
                    .map(|c| c.verdict)
                    .max();
                let sym = match v {
                    Some(v) => v.symbol().to_string(),
                    None if sec.cells.iter().all(|c| c.rank.is_none()) => {
                        sec.verdict.symbol().to_string()
                    }
                    None => " ".into(),
                };
                line.push_str(&self.paint(v.unwrap_or(sec.verdict), &sym));
            }
            out.push_str(&format!(
                "{:label_w$}{line}\n",
                format!("{} {}", sec.id, sec.name)
            ));
        }
        out
    }

    /// `    weaver       PATH`, or the path relative to the side's root (printed in the
    /// header) when `relative`.
    fn file_line(report: &Report, role: &str, path: &std::path::Path, relative: bool) -> String {
        let rel = report
            .sides
            .iter()
            .find(|s| s.role == role)
            .and_then(|s| path.strip_prefix(&s.root).ok())
            .filter(|_| relative);
        match rel {
            Some(r) => format!("    {role:<12} …/{}\n", r.display()),
            None => format!("    {role:<12} {}\n", path.display()),
        }
    }

    fn paint(&self, v: Verdict, s: &str) -> String {
        if !self.color {
            return s.to_string();
        }
        let code = match v {
            Verdict::Pass => "32",
            Verdict::Warn | Verdict::Missing => "33",
            Verdict::Fail => "31",
            Verdict::Skipped => return s.to_string(),
        };
        format!("\x1b[{code}m{s}\x1b[0m")
    }

    /// The grid that fits: every rank, else ranks with identical columns merged, else the
    /// strip.
    fn fitting_grid(&self, report: &Report) -> String {
        let ranks: BTreeSet<u32> = report
            .sections
            .iter()
            .flat_map(|s| s.cells.iter().filter_map(|c| c.rank))
            .collect();
        let column = |r: u32| Column {
            ranks: [r].into_iter().collect(),
            cells: report
                .sections
                .iter()
                .map(|sec| {
                    let cells: Vec<_> = sec.cells.iter().filter(|c| c.rank == Some(r)).collect();
                    let text: String = cells.iter().map(|c| c.verdict.symbol()).collect();
                    let v = cells
                        .iter()
                        .map(|c| c.verdict)
                        .max()
                        .unwrap_or(Verdict::Skipped);
                    (text, v)
                })
                .collect(),
        };
        let full: Vec<Column> = ranks.iter().map(|&r| column(r)).collect();
        // Widths are measured on the uncoloured grid (escape codes take no column).
        let plain = TableRenderer {
            color: false,
            width: self.width,
        };
        let fits = |cols: &[Column]| {
            self.width
                .is_none_or(|w| text_width(&plain.grid(&report.sections, cols)) <= w)
        };
        if fits(&full) {
            return self.grid(&report.sections, &full);
        }
        let mut merged: Vec<Column> = Vec::new();
        for c in full {
            match merged.last_mut() {
                Some(last)
                    if last.cells == c.cells
                        && last.ranks.last().map(|r| r + 1) == c.ranks.first().copied() =>
                {
                    last.ranks.extend(c.ranks);
                }
                _ => merged.push(c),
            }
        }
        if fits(&merged) {
            let g = self.grid(&report.sections, &merged);
            return format!(
                "{g}\n{}",
                wrap(
                    "(ranks with the same symbols in every section share a column; `--format markdown` has one column per rank)",
                    self.width,
                    ""
                )
                .trim_end()
            );
        }
        self.strip(report, &ranks)
    }
}

impl Renderer<Report> for TableRenderer {
    fn render(&self, report: &Report) -> Result<String> {
        let mut out = String::new();
        out.push_str(&format!(
            "dumpdiff step {}: {} — {}\n",
            report.step,
            verdict_word(report.verdict),
            summary_line(report)
        ));
        for s in &report.sides {
            out.push_str(&format!(
                "  {:<12} {} ({}, {})\n",
                s.role,
                s.root.display(),
                s.producer,
                plural(s.files, "file")
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
        for l in super::unreadable_lines(report) {
            out.push_str(&wrap(&l, self.width, "  "));
        }
        for l in super::convention_lines(report) {
            out.push_str(&wrap(&l, self.width, ""));
        }
        let grid = self.fitting_grid(report);
        out.push_str(grid.trim_end());
        out.push('\n');
        // The strip shows each rank's worst micro; the grids one symbol per micro.
        let legend = if grid.starts_with("ranks ") {
            "(✓ pass  ! warn  ✗ fail  – one side only  · not compared)"
        } else {
            "(one symbol per micro: ✓ pass  ! warn  ✗ fail  – one side only  · not compared)"
        };
        out.push_str(&wrap(legend, self.width, ""));
        let cov = coverage_lines(report);
        if !cov.is_empty() {
            out.push_str(&format!(
                "one side only ({}):\n",
                plural(super::one_sided_files(report), "file")
            ));
            for l in &cov {
                out.push_str(&wrap(l, self.width, "  "));
            }
        }
        match &report.first_divergence {
            Some(f) => {
                out.push_str(&wrap(
                    &format!("first divergence: {}", finding_line(f)),
                    self.width,
                    "",
                ));
                out.push_str(&wrap(&f.reason, self.width, "  "));
            }
            None => out.push_str("no divergence beyond tolerance\n"),
        }
        if !report.diagnosis.is_empty() {
            out.push_str("diagnosis:\n");
            for d in report.diagnosis.iter().take(NEXT_SHOWN) {
                out.push_str(&wrap(d, self.width, "  "));
            }
            if report.diagnosis.len() > NEXT_SHOWN {
                out.push_str(&format!(
                    "  … and {} more (all in the JSON report)\n",
                    plural(report.diagnosis.len() - NEXT_SHOWN, "cell")
                ));
            }
        }
        if report.worst.len() > 1 {
            out.push_str("worst offenders:\n");
            for f in &report.worst {
                out.push_str(&wrap(&finding_line(f), self.width, "  "));
            }
        }
        for a in &report.adjudication {
            out.push_str(&wrap(
                &format!(
                    "which side is right at rank {} micro {} (losscheck {}): {}",
                    a.rank, a.micro, a.preset, a.conclusion
                ),
                self.width,
                "",
            ));
            for v in a.sides.iter().filter(|v| {
                v.status
                    .as_ref()
                    .is_none_or(|s| !matches!(s, crate::losscheck::Status::Consistent))
            }) {
                out.push_str(&wrap(
                    &format!("{}: {}", v.role, verdict_detail(&v.detail)),
                    self.width,
                    "  ",
                ));
            }
        }
        let bad_cells: Vec<(Option<u32>, Option<u32>)> = report
            .offending_files
            .iter()
            .filter(|f| f.section != "coverage")
            .map(|f| (f.rank, f.micro))
            .fold(Vec::new(), |mut v, c| {
                if !v.contains(&c) {
                    v.push(c);
                }
                v
            });
        if !bad_cells.is_empty() {
            // Paths relative to each side's root when a full one would not fit.
            let relative = self.width.is_some_and(|w| {
                report.offending_files.iter().any(|f| {
                    Self::file_line(report, &f.role, &f.path, false)
                        .trim_end()
                        .chars()
                        .count()
                        > w
                })
            });
            out.push_str(if relative {
                "files (…/ = under that side's root above):\n"
            } else {
                "files:\n"
            });
            let side_order = |role: &str| report.sides.iter().position(|s| s.role == role);
            for (rank, micro) in bad_cells.iter().take(CELLS_WITH_FILES_SHOWN) {
                out.push_str(&format!("  {}:\n", cell_name(*rank, *micro)));
                let mut files: Vec<_> = report
                    .offending_files
                    .iter()
                    .filter(|f| f.section != "coverage" && f.rank == *rank && f.micro == *micro)
                    .collect();
                files.sort_by_key(|f| (side_order(&f.role), f.path.clone()));
                for f in files {
                    out.push_str(&Self::file_line(report, &f.role, &f.path, relative));
                }
            }
            if bad_cells.len() > CELLS_WITH_FILES_SHOWN {
                out.push_str(&format!(
                    "  … and {} more (all in the JSON report)\n",
                    plural(bad_cells.len() - CELLS_WITH_FILES_SHOWN, "cell")
                ));
            }
        }
        for sec in &report.sections {
            for n in sec.notes.iter().take(2) {
                out.push_str(&wrap(&format!("note ({}): {n}", sec.name), self.width, ""));
            }
        }
        let next = next_commands(report, NEXT_SHOWN);
        if !next.is_empty() {
            out.push_str("next:\n");
            for c in next {
                out.push_str(&wrap_command(&c, self.width, "  "));
            }
        }
        Ok(out)
    }
}

/// A shell command cut before its ` --flag`s into lines of at most `width` characters,
/// each but the last ending in ` \\` so it still pastes as one command.
pub fn wrap_command(cmd: &str, width: Option<usize>, indent: &str) -> String {
    let Some(width) = width.filter(|w| indent.chars().count() + cmd.chars().count() > *w) else {
        return format!("{indent}{cmd}\n");
    };
    let mut parts: Vec<String> = Vec::new();
    for word in cmd.split(' ') {
        match parts.last_mut() {
            Some(last) if !word.starts_with("--") => {
                last.push(' ');
                last.push_str(word);
            }
            _ => parts.push(word.to_string()),
        }
    }
    let mut lines: Vec<String> = Vec::new();
    let mut line = indent.to_string();
    for p in parts {
        let sep = usize::from(line.trim().is_empty().then_some(0).is_none());
        if line.trim().is_empty() || line.chars().count() + sep + p.chars().count() + 2 <= width {
            if !line.trim().is_empty() {
                line.push(' ');
            }
            line.push_str(&p);
        } else {
            lines.push(line);
            line = format!("{indent}    {p}");
        }
    }
    lines.push(line);
    let mut out = lines.join(" \\\n");
    out.push('\n');
    out
}

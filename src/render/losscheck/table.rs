//! losscheck's terminal text. A dump tree: a count line (`losscheck step 0: FAIL — 2 of 22
//! cells inconsistent …`, like dumpdiff's), the conventions, where the files are, a table of
//! one row per cell (rank, micro, verdict, dumped and recomputed loss) and, for each cell
//! that is not consistent, what differs; every line fits the terminal width when it is known
//! (`COLUMNS`). An `--inputs` file: the loss terms and metrics, one per line, and a one-line
//! gradient summary.

use std::collections::BTreeSet;
use std::path::Path;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, Color, ContentArrangement, Table};

use super::{grad_summary, inputs_rows};
use crate::error::Result;
use crate::fmt::{num, pair, plural, wrap};
use crate::losscheck::report::{Report, TreeReport};
use crate::losscheck::{Status, Verdict};
use crate::render::Renderer;

/// Plain lines and a table for a terminal.
pub struct TableRenderer {
    /// Colour verdicts (a terminal without `NO_COLOR`, or `--color always`).
    pub color: bool,
    /// Terminal width to fit, if known (`None`: a pipe or file gets full lines).
    pub width: Option<usize>,
}

/// The word of a status in the table.
fn status_word(s: Status) -> &'static str {
    match s {
        Status::Consistent => "consistent",
        Status::Inconsistent => "inconsistent",
        Status::Undetermined => "undetermined",
        Status::CannotJudge => "cannot judge",
    }
}

/// `3` or `3, 5` or `3-5, 9`: the ranks as ranges.
fn rank_ranges(ranks: &BTreeSet<u32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut it = ranks.iter().copied().peekable();
    while let Some(lo) = it.next() {
        let mut hi = lo;
        while it.peek() == Some(&(hi + 1)) {
            hi += 1;
            it.next();
        }
        parts.push(if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}-{hi}")
        });
    }
    parts.join(", ")
}

/// The first line: the step, the verdict word (FAIL / WARN / PASS, as dumpdiff's) and the
/// counts behind it.
pub fn count_line(t: &TreeReport) -> String {
    let n = t.verdicts.len();
    let of = |s: Status| t.verdicts.iter().filter(|v| v.status == s).count();
    let (bad, open) = (of(Status::Inconsistent), of(Status::Undetermined));
    let ranks = |s: Status| -> BTreeSet<u32> {
        t.verdicts
            .iter()
            .filter(|v| v.status == s)
            .map(|v| v.rank)
            .collect()
    };
    let steps: BTreeSet<i64> = t.verdicts.iter().map(|v| v.step).collect();
    let head = match steps.len() {
        1 => format!(
            "losscheck step {}",
            steps.iter().next().copied().unwrap_or(0)
        ),
        _ => "losscheck".to_string(),
    };
    let cells = plural(n, "cell");
    let doubt = of(Status::CannotJudge);
    // cells set aside with nothing recomputed (`judge::cannot_judge_verdict`)
    let unplaced = t
        .verdicts
        .iter()
        .filter(|v| v.status == Status::CannotJudge && v.recomputed_loss.is_nan())
        .count();
    let mut s = if bad > 0 {
        let r = ranks(Status::Inconsistent);
        format!(
            "{head}: FAIL — {bad} of {cells} inconsistent with their own inputs, in {} {}",
            if r.len() == 1 { "rank" } else { "ranks" },
            rank_ranges(&r)
        )
    } else if doubt > 0 && doubt == unplaced {
        format!("{head}: WARN — cannot judge {doubt} of {cells}: their rows could not be placed (see each cell)")
    } else if doubt > 0 {
        format!(
            "{head}: WARN — cannot judge {doubt} of {cells}: the conventions found reproduce only {} of this tree's own losses",
            n - doubt - open
        )
    } else if open > 0 {
        format!("{head}: WARN — {open} of {cells} undetermined (what they are judged on is not settled: see each cell)")
    } else {
        let whose = if n == 1 { "its" } else { "their" };
        format!("{head}: PASS — {cells} consistent with {whose} own inputs")
    };
    if bad > 0 && open > 0 {
        s.push_str(&format!(
            "; {open} undetermined (what they are judged on is not settled: see each cell)"
        ));
    }
    if !t.skipped.is_empty() {
        s.push_str(&format!(
            "; {} skipped (no loss file)",
            plural(t.skipped.len(), "cell")
        ));
    }
    if !t.unreadable.is_empty() {
        s.push_str(&format!(
            "; {}",
            super::super::unreadable_count(&t.unreadable)
        ));
    }
    s
}

/// What the cell's line says after `rank R micro M FILE: `.
fn detail(v: &Verdict) -> String {
    let line = v.line();
    let head = format!("rank {} micro {} {}: ", v.rank, v.micro, v.file.display());
    line.strip_prefix(&head).unwrap_or(&line).to_string()
}

impl TableRenderer {
    /// The one-row-per-cell table, fitted to `width` when known.
    fn grid(&self, t: &TreeReport) -> String {
        let mut table = Table::new();
        table.load_style(UTF8_FULL_CONDENSED);
        // Width and colour are decided by the caller, not by comfy-table.
        table.force_no_tty();
        if self.color {
            table.enforce_styling();
        }
        if let Some(w) = self.width {
            table.set_content_arrangement(ContentArrangement::Dynamic);
            table.set_width(u16::try_from(w).unwrap_or(u16::MAX));
        }
        table.set_header(["rank", "micro", "verdict", "dumped loss", "recomputed"]);
        for v in &t.verdicts {
            let (d, r) = match v.status {
                Status::Consistent => (num(v.dumped_loss), num(v.recomputed_loss)),
                _ if v.recomputed_loss.is_nan() => (num(v.dumped_loss), "—".to_string()),
                _ => pair(v.dumped_loss, v.recomputed_loss),
            };
            let mut word = Cell::new(status_word(v.status));
            if self.color {
                word = match v.status {
                    Status::Consistent => word.fg(Color::Green),
                    Status::Inconsistent => word.fg(Color::Red),
                    Status::Undetermined | Status::CannotJudge => word.fg(Color::Yellow),
                };
            }
            table.add_row(vec![
                Cell::new(v.rank),
                Cell::new(v.micro),
                word,
                Cell::new(d),
                Cell::new(r),
            ]);
        }
        table.to_string()
    }

    /// The whole text of a tree report.
    fn tree(&self, t: &TreeReport) -> String {
        let mut s = wrap(&count_line(t), self.width, "");
        if let Some(l) = t.conventions_line() {
            s.push_str(&wrap(&l, self.width, ""));
        }
        let dirs: BTreeSet<&Path> = t.verdicts.iter().filter_map(|v| v.file.parent()).collect();
        if let [dir] = dirs.into_iter().collect::<Vec<_>>()[..] {
            s.push_str(&wrap(&format!("files: {}/", dir.display()), self.width, ""));
        }
        if !t.verdicts.is_empty() {
            s.push_str(&self.grid(t));
            s.push('\n');
        }
        for v in t.verdicts.iter().filter(|v| v.status != Status::Consistent) {
            let name = v.file.file_name().map_or_else(
                || v.file.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            s.push_str(&wrap(
                &format!("rank {} micro {} ({name}): {}", v.rank, v.micro, detail(v)),
                self.width,
                "",
            ));
        }
        for u in &t.unreadable {
            s.push_str(&wrap(&format!("unreadable: {}", u.reason), self.width, ""));
        }
        for k in &t.skipped {
            s.push_str(&wrap(
                &format!("{k}: skipped (forward_data but no loss file)"),
                self.width,
                "",
            ));
        }
        s
    }
}

impl Renderer<Report> for TableRenderer {
    fn render(&self, report: &Report) -> Result<String> {
        Ok(match report {
            Report::Tree(t) => self.tree(t),
            Report::Inputs(r) => {
                let rows = inputs_rows(r)?;
                let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
                let mut s = String::new();
                for (k, x) in rows {
                    s.push_str(&format!("{k:<width$}  {x}\n"));
                }
                s.push_str(&format!("{:<width$}  {}\n", "gradient", grad_summary(r)));
                s
            }
        })
    }
}

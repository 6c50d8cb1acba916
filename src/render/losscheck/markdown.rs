//! losscheck as a Markdown document: a count line and one table row per cell, or the
//! `--inputs` quantities as a two-column table.

use super::{details, grad_summary, inputs_rows, num};
use crate::error::Result;
use crate::losscheck::report::Report;
use crate::losscheck::Status;
use crate::render::Renderer;

/// GitHub-flavoured markdown.
pub struct MarkdownRenderer;

/// `|` and line breaks would end a Markdown table cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

impl Renderer<Report> for MarkdownRenderer {
    fn render(&self, report: &Report) -> Result<String> {
        let mut s = String::from("# losscheck\n\n");
        match report {
            Report::Tree(t) => {
                let bad = t
                    .verdicts
                    .iter()
                    .filter(|v| v.status == Status::Inconsistent)
                    .count();
                let open = t
                    .verdicts
                    .iter()
                    .filter(|v| v.status == Status::Undetermined)
                    .count();
                s.push_str(&format!(
                    "{bad} of {} cell(s) inconsistent with their own inputs.\n\n",
                    t.verdicts.len()
                ));
                if open > 0 {
                    s.push_str(&format!(
                        "{open} cell(s) undetermined: only their total is dumped and nothing states the coefficients of its terms.\n\n"
                    ));
                }
                if let Some(l) = t.conventions_line() {
                    s.push_str(&format!("{l}\n\n"));
                }
                if !t.unreadable.is_empty() {
                    s.push_str(&format!("{}.\n\n", super::table::unreadable_count(t)));
                }
                for u in &t.unreadable {
                    s.push_str(&format!("unreadable: {}\n\n", u.reason));
                }
                for k in &t.skipped {
                    s.push_str(&format!("{k}: skipped (forward_data but no loss file)\n\n"));
                }
                s.push_str(
                    "| rank | micro | verdict | dumped loss | recomputed loss | file | details |\n",
                );
                s.push_str("|---:|---:|---|---:|---:|---|---|\n");
                for v in &t.verdicts {
                    let verdict = match v.status {
                        Status::Consistent => "consistent",
                        Status::Inconsistent => "**inconsistent**",
                        Status::Undetermined => "undetermined",
                        Status::CannotJudge => "cannot judge",
                    };
                    s.push_str(&format!(
                        "| {} | {} | {verdict} | {} | {} | `{}` | {} |\n",
                        v.rank,
                        v.micro,
                        num(v.dumped_loss),
                        num(v.recomputed_loss),
                        cell(&v.file.display().to_string()),
                        cell(&details(v))
                    ));
                }
            }
            Report::Inputs(r) => {
                s.push_str("| quantity | value |\n|---|---:|\n");
                for (k, x) in inputs_rows(r)? {
                    s.push_str(&format!("| {k} | {x} |\n"));
                }
                s.push_str(&format!("| gradient | {} |\n", cell(&grad_summary(r))));
            }
        }
        Ok(s)
    }
}

//! losscheck's terminal text: one line per cell ([`Verdict::line`]), or the loss terms and
//! metrics of an `--inputs` file, one per line, and a one-line gradient summary.

use super::{grad_summary, inputs_rows};
use crate::error::Result;
use crate::losscheck::report::Report;
use crate::losscheck::Verdict;
use crate::render::Renderer;

/// Plain lines for a terminal.
pub struct TableRenderer;

impl Renderer<Report> for TableRenderer {
    fn render(&self, report: &Report) -> Result<String> {
        Ok(match report {
            Report::Tree(t) => {
                let mut s: String = t.conventions_line().map(|l| l + "\n").unwrap_or_default();
                s.extend(t.verdicts.iter().map(|v| Verdict::line(v) + "\n"));
                for k in &t.skipped {
                    s.push_str(&format!("{k}: skipped (forward_data but no loss file)\n"));
                }
                s
            }
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

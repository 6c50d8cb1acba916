//! mismatch's Markdown document: each [`super::Section`] as a heading, its notes and a
//! pipe table.

use super::sections;
use crate::error::Result;
use crate::mismatch::report::Report;
use crate::render::Renderer;

/// A Markdown document, for a PR comment or an issue.
pub struct MarkdownRenderer;

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

impl Renderer<Report> for MarkdownRenderer {
    fn render(&self, report: &Report) -> Result<String> {
        let mut s = String::from("# mismatch report\n\n");
        for sec in sections(report) {
            s.push_str(&format!("## {}\n\n", sec.title));
            for n in &sec.notes {
                s.push_str(&format!("{n}\n\n"));
            }
            if sec.rows.is_empty() {
                continue;
            }
            let row = |cells: &[String]| -> String {
                format!(
                    "| {} |\n",
                    cells
                        .iter()
                        .map(|c| cell(c))
                        .collect::<Vec<_>>()
                        .join(" | ")
                )
            };
            s.push_str(&row(&sec.header));
            s.push_str(&format!("|{}\n", "---|".repeat(sec.header.len())));
            for r in &sec.rows {
                s.push_str(&row(r));
            }
            s.push('\n');
        }
        Ok(s)
    }
}

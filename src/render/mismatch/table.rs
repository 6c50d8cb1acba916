//! mismatch's terminal text: each [`super::Section`] as a title, its notes and aligned
//! columns.

use super::sections;
use crate::error::Result;
use crate::mismatch::report::Report;
use crate::render::Renderer;

/// Aligned plain columns for a terminal.
pub struct TableRenderer;

impl Renderer<Report> for TableRenderer {
    fn render(&self, report: &Report) -> Result<String> {
        let mut s = String::new();
        for sec in sections(report) {
            s.push_str(&sec.title);
            s.push('\n');
            for n in &sec.notes {
                s.push_str(&format!("  {n}\n"));
            }
            if sec.rows.is_empty() {
                s.push('\n');
                continue;
            }
            let mut w: Vec<usize> = sec.header.iter().map(|h| h.chars().count()).collect();
            for r in &sec.rows {
                for (i, c) in r.iter().enumerate() {
                    w[i] = w[i].max(c.chars().count());
                }
            }
            let line = |cells: &[String]| -> String {
                let last = cells.len() - 1;
                let mut l = String::from(" ");
                for (i, c) in cells.iter().enumerate() {
                    let pad = w[i] - c.chars().count();
                    l.push(' ');
                    l.push_str(c);
                    if i < last {
                        l.push_str(&" ".repeat(pad + 1));
                    }
                }
                l.trim_end().to_string() + "\n"
            };
            s.push_str(&line(&sec.header));
            for r in &sec.rows {
                s.push_str(&line(r));
            }
            s.push('\n');
        }
        Ok(s)
    }
}

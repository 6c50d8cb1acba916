//! logscan's per-hypothesis verdicts (`--why`): a table H01–H06 in the terminal and in
//! markdown, after the findings.

use crate::detect::hypotheses::HypothesisTable;

/// The reward trend line over the table.
fn header(t: &HypothesisTable) -> String {
    let trend = match t.reward_first_last {
        Some((a, b)) => format!(
            "reward mean {} in the first quarter of logged steps, {} in the last",
            crate::fmt::num(a),
            crate::fmt::num(b)
        ),
        None => "reward mean not logged on 4 steps or more".to_string(),
    };
    let plateau = if t.plateau {
        "; plateau fired: the run does not improve"
    } else {
        ""
    };
    format!("{trend}{plateau}")
}

/// The terminal section: one block per hypothesis.
pub fn text(t: &HypothesisTable) -> String {
    let mut o = format!("\nWhy (per hypothesis): {}\n", header(t));
    for h in &t.rows {
        o.push_str(&format!(
            "  {} {:<13} {}\n      {}\n",
            h.id,
            h.verdict.name(),
            h.name,
            h.evidence
        ));
        if let Some(d) = &h.to_decide {
            o.push_str(&format!("      to decide: {d}\n"));
        }
    }
    o
}

/// The markdown section: a table.
pub fn markdown(t: &HypothesisTable) -> String {
    let esc = |s: &str| s.replace('|', "\\|");
    let mut o = format!(
        "\n## Why: a verdict per hypothesis\n\n{}\n\n| id | hypothesis | verdict | evidence | to decide |\n|---|---|---|---|---|\n",
        header(t)
    );
    for h in &t.rows {
        o.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            h.id,
            esc(h.name),
            h.verdict.name(),
            esc(&h.evidence),
            esc(h.to_decide.as_deref().unwrap_or("-"))
        ));
    }
    o
}

/// A scan renderer followed by the hypothesis section (when the report has one).
pub struct WithWhy<R> {
    /// The findings renderer.
    pub inner: R,
    /// Markdown (else terminal text).
    pub markdown: bool,
}

impl<R: crate::render::Renderer<crate::logscan::ScanReport>>
    crate::render::Renderer<crate::logscan::ScanReport> for WithWhy<R>
{
    fn render(&self, r: &crate::logscan::ScanReport) -> crate::error::Result<String> {
        let mut o = self.inner.render(r)?;
        if let Some(t) = &r.hypotheses {
            o.push_str(&if self.markdown { markdown(t) } else { text(t) });
        }
        Ok(o)
    }
}

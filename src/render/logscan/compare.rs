//! `logscan --compare`'s [`CompareReport`] in each format (terminal table, JSON,
//! markdown) and its `--plot`: both runs overlaid per shared metric, the divergence marked.

use std::path::Path;

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, Color, ContentArrangement, Table};

use crate::error::Result;
use crate::logscan::compare::{CompareReport, FindingDiff, RunSide};
use crate::logscan::ScanReport;
use crate::model::finding::Severity;
use crate::render::plot::{write_grid, Panel, Series};
use crate::render::{Format, Rendered, Renderer, Style};

impl Rendered for CompareReport {
    fn renderer(format: Format, style: Style) -> Box<dyn Renderer<Self>> {
        match format {
            Format::Table => Box::new(CompareTable { color: style.color }),
            Format::Json => Box::new(CompareJson),
            Format::Markdown => Box::new(CompareMarkdown),
        }
    }
}

/// The terminal table (fixed 140-column metric grid, rows in red where they diverge).
pub struct CompareTable {
    /// Colour divergent rows.
    pub color: bool,
}

/// The JSON report.
pub struct CompareJson;

/// The markdown report.
pub struct CompareMarkdown;

impl Renderer<CompareReport> for CompareTable {
    fn render(&self, r: &CompareReport) -> Result<String> {
        Ok(render_table(r, self.color))
    }
}

impl Renderer<CompareReport> for CompareJson {
    fn render(&self, r: &CompareReport) -> Result<String> {
        render_json(r)
    }
}

impl Renderer<CompareReport> for CompareMarkdown {
    fn render(&self, r: &CompareReport) -> Result<String> {
        Ok(render_markdown(r))
    }
}

pub fn fmt_step(s: Option<i64>) -> String {
    s.map_or("-".into(), |s| s.to_string())
}

fn fmt_num(x: Option<f64>) -> String {
    match x {
        Some(v) if v.is_finite() && (v == 0.0 || (1e-3..1e5).contains(&v.abs())) => {
            format!("{v:.4}")
        }
        Some(v) if v.is_finite() => format!("{v:.3e}"),
        Some(v) => v.to_string(),
        None => "-".into(),
    }
}

/// The report as pretty JSON (non-finite numbers as `null`), with a final newline.
fn render_json(r: &CompareReport) -> Result<String> {
    super::super::pretty_json(r).map(|mut s| {
        s.push('\n');
        s
    })
}

/// One line saying the verdict.
fn headline(r: &CompareReport) -> String {
    match &r.first_divergence {
        Some((m, s)) => format!(
            "runs diverge: {m} first, from step {s} ({} of {} shared metric(s) diverge beyond {}σ)",
            r.metrics
                .iter()
                .filter(|m| m.first_divergent_step.is_some())
                .count(),
            r.metrics.len(),
            r.tolerance
        ),
        None => format!(
            "no divergence beyond {}σ over {} shared metric(s)",
            r.tolerance,
            r.metrics.len()
        ),
    }
}

fn side_line(name: &str, s: &RunSide) -> String {
    format!(
        "{name}: {} [{}] {} step(s) {}..{}, {} finding(s)",
        s.path.display(),
        s.formats.join(", "),
        s.steps,
        fmt_step(s.first_step),
        fmt_step(s.last_step),
        s.findings
    )
}

/// Rows of the metric table.
fn metric_rows(r: &CompareReport) -> Vec<[String; 7]> {
    r.metrics
        .iter()
        .map(|m| {
            [
                m.metric.clone(),
                fmt_step(m.first_divergent_step),
                fmt_num(m.effect_size),
                fmt_num(m.mean_a_after),
                fmt_num(m.mean_b_after),
                format!(
                    "{} / {}",
                    fmt_num(Some(m.noise_a)),
                    fmt_num(Some(m.noise_b))
                ),
                m.aligned_steps.to_string(),
            ]
        })
        .collect()
}

const METRIC_HEAD: [&str; 7] = [
    "metric",
    "diverges at",
    "effect (σ)",
    "mean A after",
    "mean B after",
    "noise A / B",
    "aligned",
];

fn finding_line(f: &FindingDiff) -> String {
    match f.present_in.as_str() {
        "a" => format!(
            "{} only in A (from step {}): {}",
            f.detector,
            fmt_step(f.first_step_a),
            f.explanation
        ),
        "b" => format!(
            "{} only in B (from step {}): {}",
            f.detector,
            fmt_step(f.first_step_b),
            f.explanation
        ),
        _ => format!(
            "{} in both, from step {} in A and {} in B",
            f.detector,
            fmt_step(f.first_step_a),
            fmt_step(f.first_step_b)
        ),
    }
}

/// The terminal table.
fn render_table(r: &CompareReport, color: bool) -> String {
    let mut out = String::new();
    out.push_str(&side_line("A", &r.run_a));
    out.push('\n');
    out.push_str(&side_line("B", &r.run_b));
    out.push('\n');
    out.push_str(&format!("{} aligned step(s)\n", r.aligned_steps));
    out.push_str(&headline(r));
    out.push('\n');
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_width(140)
        .set_header(METRIC_HEAD.to_vec());
    for (row, m) in metric_rows(r).into_iter().zip(&r.metrics) {
        let cells: Vec<Cell> = row
            .into_iter()
            .map(|c| {
                let cell = Cell::new(c);
                if color && m.first_divergent_step.is_some() {
                    cell.fg(Color::Red)
                } else {
                    cell
                }
            })
            .collect();
        t.add_row(cells);
    }
    out.push_str(&t.to_string());
    out.push('\n');
    for (name, ms) in [("A", &r.metrics_only_in_a), ("B", &r.metrics_only_in_b)] {
        if !ms.is_empty() {
            out.push_str(&format!("metrics only in {name}: {}\n", ms.join(", ")));
        }
    }
    for f in &r.findings {
        out.push_str(&format!("finding: {}\n", finding_line(f)));
    }
    match &r.config_differences {
        None => out.push_str("config: not carried by both runs\n"),
        Some(d) if d.is_empty() => out.push_str("config: identical\n"),
        Some(d) => {
            for c in d {
                out.push_str(&format!(
                    "config {}: A {} | B {}\n",
                    c.key,
                    c.a.as_deref().unwrap_or("(unset)"),
                    c.b.as_deref().unwrap_or("(unset)")
                ));
            }
        }
    }
    out
}

/// The markdown report.
fn render_markdown(r: &CompareReport) -> String {
    let mut out = String::from("# Run comparison\n\n");
    out.push_str(&format!(
        "- {}\n- {}\n- {} aligned step(s)\n\n**{}**\n\n",
        side_line("A", &r.run_a),
        side_line("B", &r.run_b),
        r.aligned_steps,
        headline(r)
    ));
    out.push_str(&format!("| {} |\n", METRIC_HEAD.join(" | ")));
    out.push_str(&format!("|{}\n", "---|".repeat(METRIC_HEAD.len())));
    for row in metric_rows(r) {
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    if !r.findings.is_empty() {
        out.push_str("\n## Findings that differ\n\n");
        for f in &r.findings {
            out.push_str(&format!("- {}\n", finding_line(f)));
        }
    }
    out.push_str("\n## Config\n\n");
    match &r.config_differences {
        None => out.push_str("Not carried by both runs.\n"),
        Some(d) if d.is_empty() => out.push_str("Identical.\n"),
        Some(d) => {
            out.push_str("| key | A | B |\n|---|---|---|\n");
            for c in d {
                out.push_str(&format!(
                    "| {} | {} | {} |\n",
                    c.key,
                    c.a.as_deref().unwrap_or("(unset)"),
                    c.b.as_deref().unwrap_or("(unset)")
                ));
            }
        }
    }
    out
}

/// `--plot`: one panel per shared metric, A and B overlaid, the divergence marked.
pub fn write_plot(path: &Path, r: &CompareReport, ra: &ScanReport, rb: &ScanReport) -> Result<()> {
    let panels: Vec<Panel> = r
        .metrics
        .iter()
        .map(|m| Panel {
            key: "compare",
            title: m.metric.clone(),
            series: vec![
                Series {
                    label: "A".into(),
                    points: ra.frame.series(&m.metric),
                },
                Series {
                    label: "B".into(),
                    points: rb.frame.series(&m.metric),
                },
            ],
            band: Vec::new(),
            marks: m
                .first_divergent_step
                .map(|s| {
                    vec![(
                        s,
                        r.run_b.last_step.unwrap_or(s).max(s),
                        Severity::Warning,
                        "diverges".to_string(),
                    )]
                })
                .unwrap_or_default(),
            most_severe: None,
        })
        .collect();
    write_grid(path, &panels, None)
}

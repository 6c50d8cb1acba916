//! losscheck's [`Report`] in each format: a count line and one table row per cell (table),
//! a Markdown table, the JSON report; and the words the table and markdown share.

pub mod json;
pub mod markdown;
pub mod table;

use super::{Format, Rendered, Renderer, Style};
use crate::error::{Error, Result};
use crate::losscheck::report::{InputsReport, Report};
use crate::losscheck::Verdict;

impl Rendered for Report {
    fn renderer(format: Format, style: Style) -> Box<dyn Renderer<Self>> {
        match format {
            Format::Table => Box::new(table::TableRenderer {
                color: style.color,
                width: style.width,
            }),
            Format::Json => Box::new(json::JsonRenderer),
            Format::Markdown => Box::new(markdown::MarkdownRenderer),
        }
    }
}

/// A number with 6 significant digits, in plain notation where that stays short.
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    if x == 0.0 {
        return "0".into();
    }
    let mag = x.abs().log10().floor();
    if (-4.0..6.0).contains(&mag) {
        let decimals = (5.0 - mag).max(0.0) as usize;
        let s = format!("{x:.decimals$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    } else {
        format!("{x:.5e}")
    }
}

/// What is wrong with one cell, in words: the first divergent intermediate, the `loss/`
/// scalars that disagree, the notes.
fn details(v: &Verdict) -> String {
    let mut parts = Vec::new();
    if let Some(d) = &v.first_divergence {
        parts.push(format!(
            "first divergent intermediate: {} at row {} pos {} ({} vs {}; {} positions differ)",
            d.name,
            d.row,
            d.pos,
            num(d.dumped),
            num(d.recomputed),
            d.count
        ));
    }
    for c in v.checks.iter().filter(|c| !c.ok) {
        parts.push(format!(
            "{} {} ≠ recomputed {}",
            c.name,
            num(c.dumped),
            num(c.recomputed)
        ));
    }
    parts.extend(v.notes.iter().cloned());
    parts.join("; ")
}

/// A number as the JSON report shows it: `—` where JSON has `null` (absent or not finite).
fn shown(x: Option<f64>) -> String {
    x.filter(|x| x.is_finite())
        .map_or_else(|| "—".to_string(), num)
}

/// `name value` rows of an `--inputs` report: the loss terms, then each metric (in the
/// JSON report's order and names).
fn inputs_rows(r: &InputsReport) -> Result<Vec<(String, String)>> {
    let mut rows = vec![
        ("loss".to_string(), shown(Some(r.loss))),
        ("pg_loss".to_string(), shown(Some(r.pg_loss))),
        ("kl_loss".to_string(), shown(r.kl_loss)),
        ("entropy_loss".to_string(), shown(r.entropy_loss)),
    ];
    match serde_json::to_value(&r.metrics) {
        Ok(serde_json::Value::Object(m)) => rows.extend(
            m.iter()
                .map(|(k, x)| (format!("metrics.{k}"), shown(x.as_f64()))),
        ),
        other => {
            return Err(Error::internal(format!(
                "the loss metrics are not a JSON object: {other:?}"
            )))
        }
    }
    Ok(rows)
}

/// `[8, 10], L2 norm X, max |g| Y` for the gradient of an `--inputs` report (non-finite
/// elements left out, as the JSON report writes them as `null`).
fn grad_summary(r: &InputsReport) -> String {
    let g = r.grad.iter().filter(|x| x.is_finite());
    let norm = g.clone().map(|x| x * x).sum::<f64>().sqrt();
    let max = g.fold(0.0f64, |m, x| m.max(x.abs()));
    let shape: Vec<String> = r.grad_shape.iter().map(ToString::to_string).collect();
    format!(
        "[{}], L2 norm {}, max |g| {} (every element: --format json)",
        shape.join(", "),
        num(norm),
        num(max)
    )
}

#[cfg(test)]
mod tests {
    use super::num;

    #[test]
    fn num_keeps_six_significant_digits() {
        assert_eq!(num(-0.20841234567), "-0.208412");
        assert_eq!(num(1234.5678), "1234.57");
        assert_eq!(num(2.0), "2");
        assert_eq!(num(1.5509905147383042e-7), "1.55099e-7");
        assert_eq!(num(0.0), "0");
        assert_eq!(num(f64::NAN), "NaN");
    }
}

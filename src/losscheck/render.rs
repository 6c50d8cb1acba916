//! losscheck's stdout in the three `--format`s: the verdicts on a dump tree's cells, or the
//! loss of one `--inputs` file. JSON is also what `--output` writes; table and markdown are
//! rendered from the same JSON-ready data, so the three never disagree.

use serde_json::Value as Json;

use super::{Status, Verdict};
use crate::kernels::loss::LossConfig;

/// The JSON report on a dump tree (`schema_version` 1).
pub fn tree_json(cfg: &LossConfig, verdicts: &[Verdict]) -> Json {
    serde_json::json!({"schema_version": 1, "preset": cfg, "verdicts": verdicts})
}

/// One line per cell ([`Verdict::line`]), as the table format always printed.
pub fn tree_table(verdicts: &[Verdict]) -> String {
    verdicts.iter().map(|v| v.line() + "\n").collect()
}

/// `|` and line breaks would end a Markdown table cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
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

/// A Markdown document: a count line, then one table row per cell.
pub fn tree_markdown(verdicts: &[Verdict]) -> String {
    let bad = verdicts
        .iter()
        .filter(|v| v.status == Status::Inconsistent)
        .count();
    let mut s = String::from("# losscheck\n\n");
    s.push_str(&format!(
        "{bad} of {} cell(s) inconsistent with their own inputs.\n\n",
        verdicts.len()
    ));
    s.push_str("| rank | micro | verdict | dumped loss | recomputed loss | file | details |\n");
    s.push_str("|---:|---:|---|---:|---:|---|---|\n");
    for v in verdicts {
        let verdict = match v.status {
            Status::Consistent => "consistent",
            Status::Inconsistent => "**inconsistent**",
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
    s
}

/// `name value` rows of an `--inputs` report: the loss terms, then each metric.
fn inputs_rows(v: &Json) -> Vec<(String, String)> {
    let show = |x: &Json| x.as_f64().map_or_else(|| "—".to_string(), num);
    let mut rows: Vec<(String, String)> = ["loss", "pg_loss", "kl_loss", "entropy_loss"]
        .iter()
        .map(|k| (k.to_string(), show(&v[*k])))
        .collect();
    if let Some(m) = v["metrics"].as_object() {
        rows.extend(m.iter().map(|(k, x)| (format!("metrics.{k}"), show(x))));
    }
    rows
}

/// `[8, 10], L2 norm X, max |g| Y` for the gradient of an `--inputs` report.
fn grad_summary(v: &Json) -> String {
    let g: Vec<f64> = v["grad"]
        .as_array()
        .map(|a| a.iter().filter_map(Json::as_f64).collect())
        .unwrap_or_default();
    let shape: Vec<String> = v["grad_shape"]
        .as_array()
        .map(|a| a.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    let norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
    let max = g.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    format!(
        "[{}], L2 norm {}, max |g| {} (every element: --format json)",
        shape.join(", "),
        num(norm),
        num(max)
    )
}

/// The loss terms and metrics of an `--inputs` report, one per line, and a one-line
/// gradient summary (the elements themselves are in the JSON).
pub fn inputs_table(v: &Json) -> String {
    let rows = inputs_rows(v);
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut s = String::new();
    for (k, x) in rows {
        s.push_str(&format!("{k:<width$}  {x}\n"));
    }
    s.push_str(&format!("{:<width$}  {}\n", "gradient", grad_summary(v)));
    s
}

/// The `--inputs` report as a Markdown table.
pub fn inputs_markdown(v: &Json) -> String {
    let mut s = String::from("# losscheck\n\n| quantity | value |\n|---|---:|\n");
    for (k, x) in inputs_rows(v) {
        s.push_str(&format!("| {k} | {x} |\n"));
    }
    s.push_str(&format!("| gradient | {} |\n", cell(&grad_summary(v))));
    s
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

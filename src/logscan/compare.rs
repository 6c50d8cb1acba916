//! `logscan --compare RUN_A RUN_B`: why does run B not do what run A did? Both inputs are
//! scanned as any logscan input (any mix of formats), aligned by step, and each shared
//! canonical metric is tested for where the two curves separate beyond their own
//! step-to-step noise. Findings present in one run only and configuration differences
//! (W&B config, `run_metadata.json`) complete the report.
//!
//! Noise of a run's metric is the robust standard deviation of its second differences
//! (`1.4826 · median|x[i+1] − 2x[i] + x[i−1]| / √6`): white noise of σ gives σ, a trend or
//! a steady drift after a divergence does not inflate it. A step diverges when
//! `|A − B| > tolerance · √(σA² + σB²)` (plus a 1e-6 relative floor for rounding, e.g. a
//! TensorBoard float32 against a W&B float64); the divergence starts at the first step
//! from which [`PERSIST`] aligned steps in a row diverge. Effect size is the mean of
//! `B − A` from that step on, in the same noise units.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::detect::Finding;
use crate::logscan::{ScanReport, SCHEMA_VERSION};

/// Aligned steps in a row that must exceed the threshold for a divergence to start.
pub const PERSIST: usize = 3;

/// Relative floor of the threshold (float32 against float64 rounding is ~6e-8).
const REL_FLOOR: f64 = 1e-6;

/// One run as the comparison saw it.
#[derive(Debug, Clone, Serialize)]
pub struct RunSide {
    /// The input path.
    pub path: PathBuf,
    /// Formats of the files read (`tensorboard`, `wandb`, `steps`, …).
    pub formats: Vec<String>,
    /// Logged steps.
    pub steps: usize,
    /// First step.
    pub first_step: Option<i64>,
    /// Last step.
    pub last_step: Option<i64>,
    /// Number of findings of the scan.
    pub findings: usize,
}

/// One shared metric compared.
#[derive(Debug, Clone, Serialize)]
pub struct MetricComparison {
    /// Canonical metric name.
    pub metric: String,
    /// Steps where both runs have a finite value.
    pub aligned_steps: usize,
    /// Step-to-step noise of run A.
    pub noise_a: f64,
    /// Step-to-step noise of run B.
    pub noise_b: f64,
    /// First step of a sustained divergence, if any.
    pub first_divergent_step: Option<i64>,
    /// Mean of B − A from the divergent step on, in noise units (signed).
    pub effect_size: Option<f64>,
    /// Mean of A from the divergent step on.
    pub mean_a_after: Option<f64>,
    /// Mean of B from the divergent step on.
    pub mean_b_after: Option<f64>,
    /// Largest |A − B| over aligned steps.
    pub max_abs_diff: f64,
    /// Step of the largest |A − B|.
    pub max_diff_step: Option<i64>,
}

/// A detector finding seen in one run only, or in both at different steps.
#[derive(Debug, Clone, Serialize)]
pub struct FindingDiff {
    /// Detector name.
    pub detector: String,
    /// `a`, `b` or `both`.
    pub present_in: String,
    /// First step of the finding in A.
    pub first_step_a: Option<i64>,
    /// First step of the finding in B.
    pub first_step_b: Option<i64>,
    /// The finding's explanation (A's when in both).
    pub explanation: String,
}

/// A configuration key whose value differs.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigDiff {
    /// Flattened key.
    pub key: String,
    /// A's value (`None`: A does not set it).
    pub a: Option<String>,
    /// B's value.
    pub b: Option<String>,
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    /// Layout version.
    pub schema_version: u32,
    /// Run A.
    pub run_a: RunSide,
    /// Run B.
    pub run_b: RunSide,
    /// Noise multiple a difference must exceed.
    pub tolerance: f64,
    /// Steps logged by both runs.
    pub aligned_steps: usize,
    /// True when any shared metric diverges.
    pub diverged: bool,
    /// The metric that diverged first and its step (ties: larger effect first).
    pub first_divergence: Option<(String, i64)>,
    /// Shared metrics, diverging ones first in order of their first divergent step.
    pub metrics: Vec<MetricComparison>,
    /// Canonical metrics only A logs.
    pub metrics_only_in_a: Vec<String>,
    /// Canonical metrics only B logs.
    pub metrics_only_in_b: Vec<String>,
    /// Findings in one run only, or at different first steps.
    pub findings: Vec<FindingDiff>,
    /// Configuration differences; `None` when one of the runs carries no configuration.
    pub config_differences: Option<Vec<ConfigDiff>>,
}

/// Robust step-to-step noise of a series (see the module doc); 0 with fewer than 3 points.
pub fn noise(values: &[f64]) -> f64 {
    let mut d2: Vec<f64> = values
        .windows(3)
        .map(|w| (w[2] - 2.0 * w[1] + w[0]).abs())
        .filter(|d| d.is_finite())
        .collect();
    if d2.is_empty() {
        return 0.0;
    }
    d2.sort_by(f64::total_cmp);
    let n = d2.len();
    let med = if n % 2 == 1 {
        d2[n / 2]
    } else {
        (d2[n / 2 - 1] + d2[n / 2]) / 2.0
    };
    1.4826 * med / 6f64.sqrt()
}

/// Compare one metric's two series (`(step, value)`, in step order).
pub fn compare_series(
    metric: &str,
    a: &[(i64, f64)],
    b: &[(i64, f64)],
    tolerance: f64,
) -> MetricComparison {
    let finite = |s: &[(i64, f64)]| -> Vec<f64> {
        s.iter().map(|p| p.1).filter(|v| v.is_finite()).collect()
    };
    let (na, nb) = (noise(&finite(a)), noise(&finite(b)));
    let sigma = (na * na + nb * nb).sqrt();
    // Align: both sorted by step.
    let mut pairs: Vec<(i64, f64, f64)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (sa, va) = a[i];
        let (sb, vb) = b[j];
        if sa < sb {
            i += 1;
        } else if sb < sa {
            j += 1;
        } else {
            if va.is_finite() && vb.is_finite() {
                pairs.push((sa, va, vb));
            }
            i += 1;
            j += 1;
        }
    }
    let over: Vec<bool> = pairs
        .iter()
        .map(|&(_, va, vb)| {
            let thr = tolerance * sigma + REL_FLOOR * va.abs().max(vb.abs()) + 1e-12;
            (va - vb).abs() > thr
        })
        .collect();
    let onset = (0..pairs.len()).find(|&k| {
        let end = (k + PERSIST).min(pairs.len());
        over[k..end].iter().all(|o| *o)
    });
    let (mut max_abs_diff, mut max_diff_step) = (0.0f64, None);
    for &(s, va, vb) in &pairs {
        if (va - vb).abs() > max_abs_diff {
            max_abs_diff = (va - vb).abs();
            max_diff_step = Some(s);
        }
    }
    let mut m = MetricComparison {
        metric: metric.to_string(),
        aligned_steps: pairs.len(),
        noise_a: na,
        noise_b: nb,
        first_divergent_step: None,
        effect_size: None,
        mean_a_after: None,
        mean_b_after: None,
        max_abs_diff,
        max_diff_step,
    };
    if let Some(k) = onset {
        let tail = &pairs[k..];
        let n = tail.len() as f64;
        let ma = tail.iter().map(|p| p.1).sum::<f64>() / n;
        let mb = tail.iter().map(|p| p.2).sum::<f64>() / n;
        m.first_divergent_step = Some(pairs[k].0);
        m.mean_a_after = Some(ma);
        m.mean_b_after = Some(mb);
        m.effect_size = Some(if sigma > 0.0 {
            (mb - ma) / sigma
        } else if mb > ma {
            f64::INFINITY
        } else {
            f64::NEG_INFINITY
        });
    }
    m
}

/// Findings by detector: in one run only, or in both from different first steps.
fn finding_diffs(a: &[Finding], b: &[Finding]) -> Vec<FindingDiff> {
    let first = |fs: &[Finding]| -> BTreeMap<String, (Option<i64>, String)> {
        let mut m: BTreeMap<String, (Option<i64>, String)> = BTreeMap::new();
        for f in fs {
            let e = m
                .entry(f.detector.clone())
                .or_insert((f.first_step, f.explanation.clone()));
            if f.first_step < e.0 && f.first_step.is_some() || e.0.is_none() {
                *e = (f.first_step, f.explanation.clone());
            }
        }
        m
    };
    let (fa, fb) = (first(a), first(b));
    let mut out = Vec::new();
    for (d, (sa, ex)) in &fa {
        match fb.get(d) {
            None => out.push(FindingDiff {
                detector: d.clone(),
                present_in: "a".into(),
                first_step_a: *sa,
                first_step_b: None,
                explanation: ex.clone(),
            }),
            Some((sb, _)) if sb != sa => out.push(FindingDiff {
                detector: d.clone(),
                present_in: "both".into(),
                first_step_a: *sa,
                first_step_b: *sb,
                explanation: ex.clone(),
            }),
            Some(_) => {}
        }
    }
    for (d, (sb, ex)) in &fb {
        if !fa.contains_key(d) {
            out.push(FindingDiff {
                detector: d.clone(),
                present_in: "b".into(),
                first_step_a: None,
                first_step_b: *sb,
                explanation: ex.clone(),
            });
        }
    }
    out
}

/// Two config values mean the same: equal text, equal numbers (`1e-06` from MLflow's params
/// and `0.000001` from W&B's JSON) or the same boolean in any case (`True`, `true`).
fn same_value(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    if let (Ok(x), Ok(y)) = (a.trim().parse::<f64>(), b.trim().parse::<f64>()) {
        return x == y;
    }
    let bool_of = |s: &str| match s.trim().to_ascii_lowercase().as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    };
    bool_of(a).is_some() && bool_of(a) == bool_of(b)
}

/// Keys whose values differ between two flattened configurations (see [`same_value`]).
pub fn config_diffs(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Vec<ConfigDiff> {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| match (a.get(*k), b.get(*k)) {
            (Some(x), Some(y)) => !same_value(x, y),
            _ => true,
        })
        .map(|k| ConfigDiff {
            key: k.clone(),
            a: a.get(k).cloned(),
            b: b.get(k).cloned(),
        })
        .collect()
}

fn side(path: &Path, r: &ScanReport) -> RunSide {
    let mut formats: Vec<String> = Vec::new();
    for f in &r.files {
        if !formats.contains(&f.format) {
            formats.push(f.format.clone());
        }
    }
    RunSide {
        path: path.to_path_buf(),
        formats,
        steps: r.steps,
        first_step: r.first_step,
        last_step: r.last_step,
        findings: r.findings.len(),
    }
}

/// Compare two scanned runs.
pub fn compare_reports(
    (pa, ra): (&Path, &ScanReport),
    (pb, rb): (&Path, &ScanReport),
    tolerance: f64,
    configs: Option<(BTreeMap<String, String>, BTreeMap<String, String>)>,
) -> CompareReport {
    let steps_b: std::collections::HashSet<i64> = rb.frame.steps().iter().collect();
    let aligned_steps = ra
        .frame
        .steps()
        .iter()
        .filter(|s| steps_b.contains(s))
        .count();
    let mut metrics = Vec::new();
    let mut only_a = Vec::new();
    for m in &ra.metrics {
        if rb.metrics.contains(m) {
            let c = compare_series(m, &ra.frame.series(m), &rb.frame.series(m), tolerance);
            if c.aligned_steps > 0 {
                metrics.push(c);
            }
        } else {
            only_a.push(m.clone());
        }
    }
    let only_b: Vec<String> = rb
        .metrics
        .iter()
        .filter(|m| !ra.metrics.contains(m))
        .cloned()
        .collect();
    metrics.sort_by(|x, y| {
        let key = |m: &MetricComparison| (m.first_divergent_step.unwrap_or(i64::MAX),);
        key(x).cmp(&key(y)).then_with(|| {
            let e = |m: &MetricComparison| m.effect_size.map_or(0.0, f64::abs);
            e(y).total_cmp(&e(x))
        })
    });
    let first_divergence = metrics
        .first()
        .and_then(|m| Some((m.metric.clone(), m.first_divergent_step?)));
    let config_differences = configs
        .filter(|(a, b)| !a.is_empty() && !b.is_empty())
        .map(|(a, b)| config_diffs(&a, &b));
    CompareReport {
        schema_version: SCHEMA_VERSION,
        run_a: side(pa, ra),
        run_b: side(pb, rb),
        tolerance,
        aligned_steps,
        diverged: first_divergence.is_some(),
        first_divergence,
        metrics,
        metrics_only_in_a: only_a,
        metrics_only_in_b: only_b,
        findings: finding_diffs(&ra.findings, &rb.findings),
        config_differences,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_of_white_noise_ignores_a_linear_trend() {
        // Alternating ±1 around a line: second differences are ±4, so σ = 1.4826·4/√6.
        let v: Vec<f64> = (0..20)
            .map(|i| 0.5 * i as f64 + if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        let want = 1.4826 * 4.0 / 6f64.sqrt();
        assert!((noise(&v) - want).abs() < 1e-12, "{}", noise(&v));
        assert_eq!(noise(&[1.0, 2.0]), 0.0);
    }

    #[test]
    fn divergence_needs_persist_steps_and_reports_its_onset() {
        let a: Vec<(i64, f64)> = (0..30).map(|s| (s, (s % 3) as f64 * 0.01)).collect();
        let mut b = a.clone();
        // One blip at step 5 is not a divergence; a shift of 1.0 from step 20 is.
        b[5].1 += 1.0;
        for p in b.iter_mut().skip(20) {
            p.1 += 1.0;
        }
        let m = compare_series("kl", &a, &b, 3.0);
        assert_eq!(m.first_divergent_step, Some(20));
        assert_eq!(m.aligned_steps, 30);
        let shift = m.mean_b_after.zip(m.mean_a_after).map(|(b, a)| b - a);
        assert!(shift.is_some_and(|d| (d - 1.0).abs() < 1e-12), "{shift:?}");
        let same = compare_series("kl", &a, &a, 3.0);
        assert_eq!(same.first_divergent_step, None);
        assert_eq!(same.max_abs_diff, 0.0);
    }
}

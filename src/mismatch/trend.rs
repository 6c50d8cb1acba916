//! Mismatch across steps: a metric's series (from several dumped steps, or from a log's
//! frame under the producers' metric names), its least-squares slope, and findings when it
//! grows (with the step where the growth starts) or jumps from one step to the next (the
//! staleness signature of trl#5312: `sampling_logp_difference` 0.015 → 0.201 after the
//! engine woke from sleep mode with stale weights).

use crate::model::finding::{Finding, Severity};

/// Metrics whose "no mismatch" value is 1 (ratios, perplexity ratios): their excess over 1
/// is what grows or jumps.
pub const CENTRED_AT_ONE: &[&str] = &[
    "rollout_corr/ppl_ratio",
    "train/token_mult_prob_error",
    "sampling/importance_sampling_ratio/mean",
    "training/rollout_actor_probs_pearson_corr",
];

/// Thresholds of the trend findings (their meaning is in docs/mismatch.md).
pub mod thresholds {
    /// Points needed before a growth is called.
    pub const GROWTH_MIN_POINTS: usize = 4;
    /// The last third's mean over the first third's mean that calls a growth …
    pub const GROWTH_FACTOR: f64 = 2.0;
    /// … when at least this fraction of step-to-step changes are increases.
    pub const GROWTH_MONOTONE: f64 = 0.6;
    /// A point over the median of the (up to 5) points before it by this factor is a jump …
    pub const JUMP_FACTOR: f64 = 5.0;
    /// … when it also exceeds that median by this much in absolute terms.
    pub const JUMP_MIN_ABS: f64 = 1e-3;
}

/// A metric over steps.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Trend {
    /// The metric (a name of [`super::metrics::ProducerMetrics::named`]).
    pub metric: String,
    /// Where the points came from (`dumps` or the log's path).
    pub source: String,
    /// `(step, value)`, ascending steps.
    pub points: Vec<(i64, f64)>,
    /// Least-squares slope per step of the (excess) value.
    pub slope: f64,
    /// The last third's mean excess over the first third's.
    pub growth: f64,
    /// The step where the growth starts, when one is called.
    pub growth_start: Option<i64>,
    /// Steps that jumped.
    pub jumps: Vec<i64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    }
}

/// Least-squares slope of `y` on `x`.
pub fn slope(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
    }
    sxy / sxx
}

/// The trend of `metric` over `points` and its findings.
pub fn trend(metric: &str, source: &str, mut points: Vec<(i64, f64)>) -> (Trend, Vec<Finding>) {
    use thresholds::*;
    points.retain(|p| p.1.is_finite());
    points.sort_by_key(|p| p.0);
    let centred = CENTRED_AT_ONE.contains(&metric);
    let y: Vec<f64> = points
        .iter()
        .map(|p| {
            if centred {
                (p.1 - 1.0).abs()
            } else {
                p.1.abs()
            }
        })
        .collect();
    let x: Vec<f64> = points.iter().map(|p| p.0 as f64).collect();
    let n = y.len();
    let mut t = Trend {
        metric: metric.to_string(),
        source: source.to_string(),
        points: points.clone(),
        slope: if n >= 2 { slope(&x, &y) } else { f64::NAN },
        growth: f64::NAN,
        growth_start: None,
        jumps: vec![],
    };
    let mut findings = Vec::new();
    for i in 1..n {
        let prev = median(&y[i.saturating_sub(5)..i]);
        // Against the points before and the one just before: a level shift is one jump,
        // not one per point until the median catches up.
        if y[i] >= JUMP_FACTOR * prev
            && y[i] >= JUMP_FACTOR * y[i - 1]
            && y[i] - prev >= JUMP_MIN_ABS
        {
            t.jumps.push(points[i].0);
            let mut f = Finding::new(
                "mismatch-jump",
                Severity::Error,
                vec![points[i].0],
                format!(
                    "{metric} jumps to {:.4} at step {} from {:.4} (median of the steps before): {:.1}x",
                    points[i].1,
                    points[i].0,
                    if centred { prev + 1.0 } else { prev },
                    y[i] / prev
                ),
                &[
                    "the engine generated with stale weights (a weight sync skipped or lost, e.g. after sleep mode: trl#5312)",
                    "a changed engine or trainer configuration at that step (dtype, kernel, micro-batch size: verl#6280)",
                ],
            );
            f.evidence.insert("step".into(), points[i].0.into());
            f.evidence.insert("value".into(), points[i].1.into());
            f.evidence.insert("before".into(), prev.into());
            findings.push(f);
        }
    }
    // A growth is judged after the last jump (a step change is a jump, not a trend).
    let from = t
        .jumps
        .last()
        .and_then(|j| points.iter().position(|p| p.0 == *j))
        .unwrap_or(0);
    let (points, y, x) = (&points[from..], &y[from..], &x[from..]);
    let n = y.len();
    if n >= GROWTH_MIN_POINTS {
        let slope_after = slope(x, y);
        let k = n.div_ceil(3);
        let first = y[..k].iter().sum::<f64>() / k as f64;
        let last = y[n - k..].iter().sum::<f64>() / k as f64;
        t.growth = last / first;
        let ups = (1..n).filter(|&i| y[i] > y[i - 1]).count() as f64 / (n - 1) as f64;
        if slope_after > 0.0 && last >= GROWTH_FACTOR * first && ups >= GROWTH_MONOTONE {
            // Where it starts: the first point after which most points stay above 1.5 × the
            // first third's median.
            let base = median(&y[..k]);
            let start = (0..n)
                .find(|&i| {
                    let above = y[i..].iter().filter(|v| **v > 1.5 * base).count();
                    y[i] > 1.5 * base && above as f64 >= 0.8 * (n - i) as f64
                })
                .map(|i| points[i].0);
            t.growth_start = start;
            let mut f = Finding::new(
                "mismatch-growth",
                Severity::Warning,
                points.iter().map(|p| p.0).collect(),
                format!(
                    "{metric} grows {:.1}x over steps {}..{} (slope {:.3e} per step){}",
                    t.growth,
                    points[0].0,
                    points[n - 1].0,
                    slope_after,
                    start.map(|s| format!(", from step {s}")).unwrap_or_default()
                ),
                &[
                    "the engine and trainer drift apart as training goes (open-instruct#1473: even at lr 0)",
                    "bf16 / fp8 rounding that grows with the policy's sharpness; MoE routing differences",
                ],
            );
            f.evidence.insert("slope".into(), slope_after.into());
            f.evidence.insert("growth".into(), t.growth.into());
            if let Some(s) = start {
                f.evidence.insert("start_step".into(), s.into());
            }
            findings.push(f);
        }
    }
    (t, findings)
}

/// The producers' mismatch metrics a log's frame holds (raw columns under any name
/// [`super::metrics::canonical`] knows), each as `(source, metric, points)`; the log's
/// name as source. Needs a frame built with raw columns kept.
pub fn logged_series(
    frame: &crate::frames::log::frame::LogFrame,
    source: &str,
) -> Vec<super::LoggedSeries> {
    let mut out: Vec<super::LoggedSeries> = Vec::new();
    for name in frame.raw_names() {
        let Some(canon) = super::metrics::canonical(name) else {
            continue;
        };
        let Some(col) = frame.raw(name) else {
            continue;
        };
        let points: Vec<(i64, f64)> = col
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| (frame.step(i), v)))
            .collect();
        if points.is_empty() || out.iter().any(|(_, m, _)| m == canon) {
            continue;
        }
        out.push((source.to_string(), canon.to_string(), points));
    }
    out
}

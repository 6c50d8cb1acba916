//! Throughput and memory: step-time spikes and trends (first-step compile time kept
//! apart) and steady memory growth.

use super::{median, spikes, Context, Detector, Finding, Severity};
use crate::logscan::frame::LogFrame;

/// Seconds per step: `step_time`, else `1 / it_per_sec`, else timestamp deltas.
pub fn step_times(f: &LogFrame) -> (Vec<(i64, f64)>, &'static str) {
    let s: Vec<(i64, f64)> = f
        .points("step_time")
        .filter(|(_, v)| v.is_finite() && *v > 0.0)
        .collect();
    if !s.is_empty() {
        return (s, "step_time");
    }
    let s: Vec<(i64, f64)> = f
        .points("it_per_sec")
        .filter(|(_, v)| v.is_finite() && *v > 0.0)
        .map(|(st, v)| (st, 1.0 / v))
        .collect();
    if !s.is_empty() {
        return (s, "1/it_per_sec");
    }
    let ts: Vec<(i64, f64)> = f
        .timestamps()
        .present()
        .map(|(i, t)| (f.step(i), t))
        .collect();
    let out = ts
        .windows(2)
        .filter(|w| w[1].0 > w[0].0 && w[1].1 >= w[0].1)
        .map(|w| (w[1].0, (w[1].1 - w[0].1) / (w[1].0 - w[0].0) as f64))
        .collect();
    (out, "timestamp deltas")
}

/// `--slowdown`: step-time spikes and trends; a first step dominated by compile time is
/// reported apart (info).
pub struct Slowdown;

impl Detector for Slowdown {
    fn name(&self) -> &'static str {
        "slowdown"
    }
    fn summary(&self) -> &'static str {
        "step-time spikes and upward trend (first-step compile time separated)"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &["step_time", "it_per_sec"]
    }
    fn uses_timestamps(&self) -> bool {
        true
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let (s, how) = step_times(ctx.frame);
        if s.len() < 2 {
            return vec![];
        }
        let mut out = Vec::new();
        let first = s[0];
        let rest = &s[1..];
        let rest_vals: Vec<f64> = rest.iter().map(|(_, v)| *v).collect();
        let med_rest = median(&rest_vals).unwrap_or(f64::NAN);
        let cf = ctx.th.get("slowdown.compile_factor");
        if first.1 > cf * med_rest {
            out.push(
                Finding::new(
                    self.name(),
                    Severity::Info,
                    vec![first.0],
                    format!(
                        "first step took {:.3}s vs median {:.3}s afterwards: compile/warm-up, not a slowdown",
                        first.1, med_rest
                    ),
                    &["torch.compile / graph capture / CUDA context and allocator warm-up"],
                )
                .num("first_step_s", first.1)
                .num("median_after_s", med_rest)
                .with("measured_from", how),
            );
        }
        let slower_than_first: Vec<(i64, f64)> = rest
            .iter()
            .copied()
            .filter(|(_, v)| *v > cf * first.1)
            .collect();
        if !slower_than_first.is_empty() && first.1 <= cf * med_rest {
            let worst =
                slower_than_first
                    .iter()
                    .copied()
                    .fold((0, 0.0), |a, b| if b.1 > a.1 { b } else { a });
            out.push(
                Finding::new(
                    self.name(),
                    Severity::Warning,
                    slower_than_first.iter().map(|(s, _)| *s).collect(),
                    format!(
                        "step {} took {:.3}s, {:.1}x the first step ({:.3}s) which already includes compile time",
                        worst.0,
                        worst.1,
                        worst.1 / first.1,
                        first.1
                    ),
                    &[
                        "recompilation every iteration (dynamic shapes under torch.compile)",
                        "more forward passes per step than expected (sampling + policy + reference, x grad-accumulation)",
                        "host-device transfers or a slow judge/reward model",
                    ],
                )
                .num("first_step_s", first.1)
                .num("slowest_step_s", worst.1)
                .with("slowest_step", worst.0)
                .with("measured_from", how),
            );
        }
        let hits = spikes(
            rest,
            ctx.th.get("slowdown.spike_factor"),
            ctx.th.get("slowdown.window") as usize,
            5,
            0.0,
        );
        if !hits.is_empty() {
            let worst =
                hits.iter()
                    .copied()
                    .fold(hits[0], |a, h| if h.1 / h.2 > a.1 / a.2 { h } else { a });
            out.push(
                Finding::new(
                    self.name(),
                    Severity::Warning,
                    hits.iter().map(|(i, _, _)| rest[*i].0).collect(),
                    format!(
                        "step time spikes to {:.3}s at step {} ({:.1}x the recent median)",
                        worst.1,
                        rest[worst.0].0,
                        worst.1 / worst.2
                    ),
                    &[
                        "checkpoint saving or evaluation inside the step",
                        "a batch of very long completions",
                        "memory pressure / swapping, other jobs on the device",
                    ],
                )
                .num("max_step_s", worst.1)
                .num("median_before_s", worst.2)
                .with("measured_from", how),
            );
        }
        if rest.len() >= 8 {
            let q = rest.len() / 4;
            let a = median(&rest_vals[..q]).unwrap_or(f64::NAN);
            let b = median(&rest_vals[rest.len() - q..]).unwrap_or(f64::NAN);
            if b > ctx.th.get("slowdown.trend_factor") * a {
                out.push(
                    Finding::new(
                        self.name(),
                        Severity::Warning,
                        vec![rest[0].0, rest[rest.len() - 1].0],
                        format!(
                            "steps slow down over the run: median {a:.3}s early vs {b:.3}s late"
                        ),
                        &[
                            "completions getting longer (see truncation)",
                            "memory growth leading to allocator thrash (see mem-growth)",
                            "accumulating state (caches, logging buffers) across steps",
                        ],
                    )
                    .num("early_median_s", a)
                    .num("late_median_s", b)
                    .with("measured_from", how),
                );
            }
        }
        out
    }
}

/// `--mem-growth`: peak memory rises steadily over the run.
pub struct MemGrowth;

impl Detector for MemGrowth {
    fn name(&self) -> &'static str {
        "mem-growth"
    }
    fn summary(&self) -> &'static str {
        "peak memory grows more than 20% over the run, steadily"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &["peak_memory_gb"]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let s: Vec<(i64, f64)> = ctx
            .frame
            .points("peak_memory_gb")
            .filter(|(_, v)| v.is_finite() && *v > 0.0)
            .collect();
        if s.len() < ctx.th.get("mem_growth.min_points").max(2.0) as usize {
            return vec![];
        }
        let (first, last) = (s[0].1, s[s.len() - 1].1);
        let growth = (last - first) / first;
        let rising =
            s.windows(2).filter(|w| w[1].1 >= w[0].1).count() as f64 / (s.len() - 1) as f64;
        if growth <= ctx.th.get("mem_growth.frac") || rising < 0.8 {
            return vec![];
        }
        let span = (s[s.len() - 1].0 - s[0].0).max(1) as f64;
        vec![Finding::new(
            self.name(),
            Severity::Warning,
            vec![s[0].0, s[s.len() - 1].0],
            format!(
                "peak memory grows from {first:.3} GB to {last:.3} GB (+{:.0}%)",
                growth * 100.0
            ),
            &[
                "tensors kept alive across steps (losses/logits appended to a list without .item())",
                "growing KV cache / sampler state never freed",
                "completions getting longer every step",
            ],
        )
        .num("first_gb", first)
        .num("last_gb", last)
        .num("growth_frac", growth)
        .num("gb_per_1000_steps", (last - first) / span * 1000.0)]
    }
}

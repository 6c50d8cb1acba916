//! Throughput and memory: step-time spikes and trends (first-step compile time kept
//! apart) and steady memory growth.

use super::{median_in_place, spikes, Context, Detector, Finding, Severity};
use crate::frames::log::frame::LogFrame;
use crate::frames::log::series::Series;

/// Seconds per step: `step_time`, else `1 / it_per_sec`, else timestamp deltas.
pub fn step_times(f: &LogFrame) -> (Series<'_>, &'static str) {
    let s = f.view_where("step_time", |v| v.is_finite() && v > 0.0);
    if !s.is_empty() {
        return (s, "step_time");
    }
    let mut s = f.series_where("it_per_sec", |v| v.is_finite() && v > 0.0);
    for p in &mut s {
        p.1 = 1.0 / p.1;
    }
    if !s.is_empty() {
        return (Series::owned(s), "1/it_per_sec");
    }
    // Sized up front, as `series_where` does.
    let mut ts: Vec<(i64, f64)> = Vec::with_capacity(f.timestamps().len());
    ts.extend(f.timestamps().present().map(|(i, t)| (f.step(i), t)));
    let mut out = Vec::with_capacity(ts.len());
    out.extend(
        ts.windows(2)
            .filter(|w| w[1].0 > w[0].0 && w[1].1 >= w[0].1)
            .map(|w| (w[1].0, (w[1].1 - w[0].1) / (w[1].0 - w[0].0) as f64)),
    );
    (Series::owned(out), "timestamp deltas")
}

/// The lower quartile of `xs` (the faster steps of a stretch): a trend in it is sustained,
/// while periodic slow windows (eval every N, checkpoint saves) leave it alone.
fn lower_quartile(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = Vec::with_capacity(xs.len());
    v.extend(xs.iter().copied().filter(|x| x.is_finite()));
    lower_quartile_in_place(&mut v)
}

/// [`lower_quartile`] of values the caller no longer needs: its finite ones kept and
/// selected in place, without the copy.
fn lower_quartile_in_place(v: &mut Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    let k = (v.len() - 1) / 4;
    super::nth_sorted(v, k).unwrap_or(f64::NAN)
}

/// Steps at which an evaluation or a checkpoint save happened: evaluation records in the
/// frame (`val_loss`) and `checkpoint` events.
fn eval_or_checkpoint_steps(ctx: &Context) -> Vec<(i64, &'static str)> {
    let mut out: Vec<(i64, &'static str)> = ctx
        .frame
        .points("val_loss")
        .chain(ctx.frame.points("eval_activity"))
        .map(|(s, _)| (s, "evaluation"))
        .collect();
    out.extend(
        ctx.events
            .iter()
            .filter(|e| e.kind == "checkpoint")
            .filter_map(|e| e.step.map(|s| (s, "checkpoint save"))),
    );
    out
}

/// `--slowdown`: a sustained rise in step time. Spikes that an evaluation or checkpoint
/// inside the step explains, or that recur with a fixed period, are excluded and named
/// (info); a first step dominated by compile time is reported apart (info).
pub struct Slowdown;

impl Detector for Slowdown {
    fn name(&self) -> &'static str {
        "slowdown"
    }
    fn summary(&self) -> &'static str {
        "sustained step-time rise; eval/checkpoint/periodic spikes and compile time excluded"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &["step_time", "it_per_sec", "val_loss", "eval_activity"]
    }
    fn uses_timestamps(&self) -> bool {
        true
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let (s, how) = step_times(ctx.frame);
        if s.len() < 2 {
            return vec![];
        }
        let marks = eval_or_checkpoint_steps(ctx);
        let mut out = Vec::new();
        let Some(first) = s.first() else {
            return vec![];
        };
        let rest = s.tail(1);
        let rstep = |i: usize| rest.get(i).map_or(i64::MIN, |p| p.0);
        // Selected in place: the lower quartile below reads the values in any order.
        let mut rest_vals: Vec<f64> = rest.values().collect();
        let med_rest = median_in_place(&mut rest_vals).unwrap_or(f64::NAN);
        // rows written in one burst (a tracker file replayed, a generator) are milliseconds
        // apart: their timestamps say nothing about how long a step took
        if how == "timestamp deltas" && med_rest < 0.01 {
            return vec![];
        }
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
        // Later steps slower than a first step that already paid for compilation.
        let slower_than_first: Vec<(i64, f64)> =
            rest.iter().filter(|(_, v)| *v > cf * first.1).collect();
        // Sustained: even the faster steps afterwards (lower quartile) are that slow.
        if slower_than_first.len() >= 2
            && lower_quartile_in_place(&mut rest_vals) > cf * first.1
            && first.1 <= cf * med_rest
        {
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
                        "{} of {} later steps are slower than 2x the first step ({:.3}s, which already includes compile time); slowest step {} took {:.3}s",
                        slower_than_first.len(),
                        rest.len(),
                        first.1,
                        worst.0,
                        worst.1,
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
            &rest,
            ctx.th.get("slowdown.spike_factor"),
            ctx.th.get("slowdown.window") as usize,
            5,
            0.0,
        );
        // Spikes an evaluation/checkpoint inside the step's window explains.
        let why = |i: usize| -> Option<&'static str> {
            let cur = rstep(i);
            let prev = if i == 0 { first.0 } else { rstep(i - 1) };
            marks
                .iter()
                .find(|(m, _)| prev <= *m && *m <= cur)
                .map(|(_, w)| *w)
        };
        let (explained, mut open): (Vec<_>, Vec<_>) =
            hits.iter().copied().partition(|h| why(h.0).is_some());
        // Spikes recurring with one period (3 or more, equal gaps) are periodic work.
        let open_steps: Vec<i64> = open.iter().map(|h| rstep(h.0)).collect();
        let period = (open_steps.len() >= 3)
            .then(|| open_steps[1].saturating_sub(open_steps[0]))
            .filter(|&p| {
                p > 0
                    && p < i64::MAX
                    && open_steps
                        .windows(2)
                        .all(|w| w[1].saturating_sub(w[0]) == p)
            });
        let mut excluded: Vec<(usize, f64, f64)> = explained.clone();
        let mut reasons: Vec<String> = Vec::new();
        if !explained.is_empty() {
            let mut kinds: Vec<&str> = explained.iter().filter_map(|h| why(h.0)).collect();
            kinds.sort_unstable();
            kinds.dedup();
            reasons.push(format!(
                "{} inside the step at {} of them",
                kinds.join("/"),
                explained.len()
            ));
        }
        if let Some(p) = period {
            reasons.push(format!("periodic every {p} steps at {}", open.len()));
            excluded.append(&mut open);
        }
        if !excluded.is_empty() {
            let worst = excluded.iter().copied().fold(excluded[0], |a, h| {
                if h.1 / h.2 > a.1 / a.2 {
                    h
                } else {
                    a
                }
            });
            out.push(
                Finding::new(
                    self.name(),
                    Severity::Info,
                    excluded.iter().map(|(i, _, _)| rstep(*i)).collect(),
                    format!(
                        "{} step-time spike(s) excluded from the trend ({}); largest {:.3}s at step {} ({:.1}x the recent median)",
                        excluded.len(),
                        reasons.join("; "),
                        worst.1,
                        rstep(worst.0),
                        worst.1 / worst.2
                    ),
                    &["evaluation or checkpoint saving inside the logged interval, or periodic generation vs reuse of a batch"],
                )
                .num("max_step_s", worst.1)
                .num("median_before_s", worst.2)
                .with("measured_from", how),
            );
        }
        if !open.is_empty() {
            let worst =
                open.iter()
                    .copied()
                    .fold(open[0], |a, h| if h.1 / h.2 > a.1 / a.2 { h } else { a });
            out.push(
                Finding::new(
                    self.name(),
                    Severity::Warning,
                    open.iter().map(|(i, _, _)| rstep(*i)).collect(),
                    format!(
                        "step time spikes to {:.3}s at step {} ({:.1}x the recent median) with no evaluation or checkpoint logged there",
                        worst.1,
                        rstep(worst.0),
                        worst.1 / worst.2
                    ),
                    &[
                        "checkpoint saving or evaluation inside the step that the log does not show",
                        "a batch of very long completions",
                        "memory pressure / swapping, other jobs on the device",
                    ],
                )
                .num("max_step_s", worst.1)
                .num("median_before_s", worst.2)
                .with("measured_from", how),
            );
        }
        // The trend: lower quartile of the first vs the last quarter of the steps after the
        // first, spikes left out; it must also not fall back in between (sustained).
        let skip: Vec<usize> = hits.iter().map(|h| h.0).collect();
        let mut kept: Vec<f64> = Vec::with_capacity(rest.len());
        kept.extend(
            rest.values()
                .enumerate()
                // `skip` ascends: the spikes come in series order.
                .filter(|(i, _)| skip.binary_search(i).is_err())
                .map(|(_, v)| v),
        );
        if kept.len() >= 8 {
            let q = kept.len() / 4;
            let a = lower_quartile(&kept[..q]);
            let mid = lower_quartile(&kept[q..kept.len() - q]);
            let b = lower_quartile(&kept[kept.len() - q..]);
            if b > ctx.th.get("slowdown.trend_factor") * a && mid >= a {
                out.push(
                    Finding::new(
                        self.name(),
                        Severity::Warning,
                        vec![rstep(0), rstep(rest.len() - 1)],
                        format!(
                            "steps slow down over the run: the faster steps (lower quartile) take {a:.3}s early vs {b:.3}s late ({} spike(s) left out)",
                            skip.len()
                        ),
                        &[
                            "completions getting longer (see truncation)",
                            "memory growth leading to allocator thrash (see mem-growth)",
                            "accumulating state (caches, logging buffers) across steps",
                        ],
                    )
                    .num("early_lower_quartile_s", a)
                    .num("late_lower_quartile_s", b)
                    .with("spikes_left_out", skip.len())
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
        // Still growing in the second half: a warm-up that settles (allocator caches,
        // the first long batch) is not a leak.
        let mid = s[s.len() / 2].1;
        let late_growth = (last - mid) / mid;
        if growth <= ctx.th.get("mem_growth.frac")
            || rising < 0.8
            || late_growth <= ctx.th.get("mem_growth.frac") / 4.0
        {
            return vec![];
        }
        let span = s[s.len() - 1].0.saturating_sub(s[0].0).max(1) as f64;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// In place, with non-finite values among them and in any order, the lower quartile
    /// is the copy's, bit for bit.
    #[test]
    fn lower_quartile_in_place_equals_the_copy() {
        let xs = [
            3.0,
            f64::NAN,
            -0.0,
            1.0,
            0.0,
            f64::INFINITY,
            1.0,
            -2.5,
            7.0,
            0.5,
            9.0,
        ];
        for n in 0..=xs.len() {
            let want = lower_quartile(&xs[..n]);
            let mut v: Vec<f64> = xs[..n].iter().rev().copied().collect();
            let got = lower_quartile_in_place(&mut v);
            assert_eq!(got.to_bits(), want.to_bits(), "n {n}");
        }
    }
}

//! Stage timings of an iteration, from nanoGPT-style per-micro diagnostics
//! (`[Micro k] 2. Samples generated: mem=… MB, time=…s`, the micro's clock at the end of each
//! stage; the text reader turns clock differences into `stage/<name>` seconds per
//! iteration): which stage dominates, and which grows over the run.

use super::{Context, Detector, Finding, Severity, G};
use crate::logs::aliases::{STAGES, STAGE_PREFIX};

/// `--stages`: the slow stage of an iteration, and a stage that keeps growing.
pub struct Stages;

impl Detector for Stages {
    fn name(&self) -> &'static str {
        "stages"
    }
    fn summary(&self) -> &'static str {
        "per-stage iteration time ([Micro k] stage lines): which stage dominates, which grows"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &[STAGES]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        let mut stages: Vec<(String, Vec<(i64, f64)>)> = f
            .metrics()
            .iter()
            .filter_map(|m| {
                let name = m.strip_prefix(STAGE_PREFIX)?;
                let s: Vec<(i64, f64)> = f.points(m).filter(|(_, v)| v.is_finite()).collect();
                (!s.is_empty()).then(|| (name.to_string(), s))
            })
            .collect();
        if stages.is_empty() {
            return vec![];
        }
        let total = |s: &[(i64, f64)]| s.iter().map(|(_, v)| v).sum::<f64>();
        let all: f64 = stages.iter().map(|(_, s)| total(s)).sum();
        if all <= 0.0 {
            return vec![];
        }
        stages.sort_by(|a, b| total(&b.1).total_cmp(&total(&a.1)));
        let mut out = Vec::new();
        let (name, s) = &stages[0];
        let share = total(s) / all;
        let steps: Vec<i64> = s.iter().map(|(st, _)| *st).collect();
        let breakdown: Vec<String> = stages
            .iter()
            .map(|(n, s)| format!("{n} {:.0}%", 100.0 * total(s) / all))
            .collect();
        out.push(
            Finding::new(
                self.name(),
                Severity::Info,
                steps,
                format!(
                    "stage {name} takes {:.0}% of the logged iteration time ({} s per iteration on average over {} iterations); stages: {}",
                    share * 100.0,
                    G(total(s) / s.len() as f64),
                    s.len(),
                    breakdown.join(", ")
                ),
                &[],
            )
            .with("dominant_stage", name.as_str())
            .num("share", share),
        );
        let factor = ctx.th.get("stages.growth_factor");
        for (name, s) in &stages {
            if s.len() < 4 {
                continue;
            }
            let q = (s.len() / 4).max(1);
            let mean = |xs: &[(i64, f64)]| xs.iter().map(|(_, v)| v).sum::<f64>() / xs.len() as f64;
            let (a, b) = (mean(&s[..q]), mean(&s[s.len() - q..]));
            if a > 0.0 && b > factor * a {
                out.push(
                    Finding::new(
                        self.name(),
                        Severity::Warning,
                        s[s.len() - q..].iter().map(|(st, _)| *st).collect(),
                        format!(
                            "stage {name} grows from {} s to {} s per iteration (first vs last quarter, {:.1}x)",
                            G(a),
                            G(b),
                            b / a
                        ),
                        &[
                            "generation: completions growing longer (see the completion lengths) or a KV cache not freed",
                            "recompilation every iteration (torch.compile with dynamic shapes)",
                            "memory pressure: allocator fragmentation, offload traffic",
                        ],
                    )
                    .with("stage", name.as_str())
                    .num("first_quarter_s", a)
                    .num("last_quarter_s", b),
                );
            }
        }
        out
    }
}

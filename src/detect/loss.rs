//! Loss-shaped signatures: a loss stuck at exactly zero (no learning signal) and a reward
//! that does not improve.

use super::{Context, Detector, Finding, Severity};

/// `--zero-loss`: loss ≈ 0 together with zero reward std / zero advantages / zero grad.
pub struct ZeroLoss;

impl Detector for ZeroLoss {
    fn name(&self) -> &'static str {
        "zero-loss"
    }
    fn summary(&self) -> &'static str {
        "loss ~ 0 with zero reward std / advantages / grad norm, sustained"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &[
            "loss",
            "grad_norm",
            "reward_std",
            "kl",
            "adv_max",
            "adv_min",
            "frac_reward_zero_std",
        ]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        let eps = ctx.th.get("zero_loss.eps");
        let std_eps = ctx.th.get("zero_loss.std_eps");
        let min_steps = ctx.th.get("zero_loss.min_steps").max(1.0) as usize;
        let Some(loss) = f.col("loss") else {
            return vec![];
        };
        // Runs of consecutive rows with a loss that are zero-loss rows, long enough.
        let grad = f.col("grad_norm");
        let mut zero_runs: Vec<Vec<usize>> = Vec::new();
        let mut run: Vec<usize> = Vec::new();
        for (i, l) in loss.present() {
            let grad_nan = grad.and_then(|g| g.get(i)).is_some_and(|g| !g.is_finite());
            if l.is_finite() && l.abs() <= eps && !grad_nan {
                run.push(i);
            } else if run.len() >= min_steps {
                zero_runs.push(std::mem::take(&mut run));
            } else {
                run.clear();
            }
        }
        if run.len() >= min_steps {
            zero_runs.push(run);
        }
        let first_logged_loss = loss.present().next().map(|(_, l)| l);
        let adv_zero_steps: Vec<i64> = ctx
            .events
            .iter()
            .filter(|e| e.kind == "advantages_near_zero")
            .filter_map(|e| e.step)
            .collect();
        let mut out = Vec::new();
        for idx in zero_runs {
            let steps: Vec<i64> = idx.iter().map(|&i| f.step(i)).collect();
            let mut companions: Vec<&str> = Vec::new();
            let zero_at = |name: &str| {
                let c = f.col(name);
                idx.iter()
                    .filter(|&&i| c.and_then(|c| c.get(i)).is_some_and(|v| v.abs() <= std_eps))
                    .count()
            };
            let n_std = zero_at("reward_std");
            let n_grad = zero_at("grad_norm");
            let n_kl = zero_at("kl");
            let n_adv = idx
                .iter()
                .filter(|&&i| {
                    matches!((f.at("adv_max", i), f.at("adv_min", i)),
                        (Some(x), Some(y)) if x.abs() <= std_eps && y.abs() <= std_eps)
                })
                .count();
            let n_adv_warn = steps.iter().filter(|s| adv_zero_steps.contains(s)).count();
            let n_dead = idx
                .iter()
                .filter(|&&i| f.at("frac_reward_zero_std", i).is_some_and(|v| v >= 0.999))
                .count();
            if n_std > 0 {
                companions.push("reward_std = 0");
            }
            if n_adv > 0 || n_adv_warn > 0 {
                companions.push("advantages = 0");
            }
            if n_grad > 0 {
                companions.push("grad_norm = 0");
            }
            if n_kl > 0 {
                companions.push("kl = 0");
            }
            if n_dead > 0 {
                companions.push("frac_reward_zero_std = 1");
            }
            let severity = if companions.is_empty() {
                Severity::Warning
            } else {
                Severity::Error
            };
            let max_abs = idx
                .iter()
                .filter_map(|&i| loss.get(i))
                .fold(0.0f64, |m, v| m.max(v.abs()));
            let explanation = if companions.is_empty() {
                format!(
                    "loss is zero on {} consecutive logged steps (no reward/advantage/grad metrics to confirm why)",
                    steps.len()
                )
            } else {
                format!(
                    "loss is zero on {} consecutive logged steps together with {}: no learning signal",
                    steps.len(),
                    companions.join(", ")
                )
            };
            let mut finding = Finding::new(
                self.name(),
                severity,
                steps,
                explanation,
                &[
                    "all rewards in each group identical (judge/reward function gives one score) -> advantages 0 -> pg_loss 0",
                    "empty or degenerate completions: nothing to score, nothing to train on",
                    "sequence log-probs zero: no masked positions in the batch or broken gather",
                    "loss scaled away by gradient accumulation or a zero loss mask",
                ],
            )
            .num("max_abs_loss", max_abs)
            .with("companions", companions.clone())
            .with("steps_reward_std_zero", n_std)
            .with("steps_kl_zero", n_kl)
            .with("steps_grad_norm_zero", n_grad)
            .with("steps_advantages_zero", n_adv.max(n_adv_warn));
            if let Some(l) = first_logged_loss {
                finding = finding.num("first_logged_loss", l);
            }
            out.push(finding);
        }
        out
    }
}

/// `--plateau`: the reward does not improve from the first to the last quarter of the run.
pub struct Plateau;

impl Detector for Plateau {
    fn name(&self) -> &'static str {
        "plateau"
    }
    fn summary(&self) -> &'static str {
        "reward mean not improving between the first and last quarter of the run"
    }
    fn metrics(&self) -> &'static [&'static str] {
        &["reward_mean"]
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let s: Vec<(i64, f64)> = ctx
            .frame
            .points("reward_mean")
            .filter(|(_, v)| v.is_finite())
            .collect();
        let min_points = ctx.th.get("plateau.min_points").max(2.0) as usize;
        if s.len() < min_points {
            return vec![];
        }
        let q = (s.len() / 4).max(1);
        let mean = |xs: &[(i64, f64)]| xs.iter().map(|(_, v)| v).sum::<f64>() / xs.len() as f64;
        let first = mean(&s[..q]);
        let last = mean(&s[s.len() - q..]);
        let gain = last - first;
        if gain >= ctx.th.get("plateau.min_gain") {
            return vec![];
        }
        let max = s.iter().map(|(_, v)| *v).fold(f64::NEG_INFINITY, f64::max);
        let steps = vec![s[0].0, s[s.len() - 1].0];
        let mut f = Finding::new(
            self.name(),
            Severity::Warning,
            steps,
            format!(
                "reward mean {first:.4} over the first {q} logged steps vs {last:.4} over the last {q}: no improvement"
            ),
            &[
                "no learning signal: zero-std groups / zero advantages (see zero-loss, dead-groups)",
                "learning rate too low or LoRA adapter not updated/synchronised with the rollout policy",
                "reward function too sparse for the model's current ability",
                "training on the wrong tokens (loss mask) or truncated contexts",
            ],
        )
        .num("first_quarter_mean", first)
        .num("last_quarter_mean", last)
        .num("gain", gain)
        .num("max_reward_mean", max)
        .with("points", s.len());
        f.count = s.len();
        vec![f]
    }
}

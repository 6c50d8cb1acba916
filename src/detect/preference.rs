//! Preference optimisation (DPO and its family: KTO, ORPO, SimPO/CPO, IPO), recognised from
//! the metrics it logs, and its own failure signatures. TRL's trainers log the implicit
//! rewards `rewards/chosen` = β·(log π(y_w) − log π_ref(y_w)), `rewards/rejected`, their
//! `rewards/margins` and `rewards/accuracies` (share of pairs with chosen > rejected), and the
//! policy's `logps/chosen`, `logps/rejected` (trl/trainer/dpo_trainer.py `get_batch_loss_metrics`;
//! KTO adds the batch `kl` estimate of KL(π‖π_ref) over mismatched pairs, clamped at 0,
//! trl/trainer/kto_trainer.py `kto_loss`; ORPO logs `log_odds_ratio`, `nll_loss`). GRPO's
//! rules do not apply to these numbers: KTO's `kl` is a batch-level estimate, not GRPO's
//! per-token KL, and `rewards/*` are not reward functions.

use super::{value_mean, Context, Detector, Finding, Severity, G};
use crate::frames::log::frame::LogFrame;

/// Canonical metrics only a preference trainer logs.
pub const PREF_MARKERS: [&str; 7] = [
    "pref_reward_chosen",
    "pref_reward_rejected",
    "pref_margin",
    "pref_accuracy",
    "pref_logp_chosen",
    "pref_logp_rejected",
    "pref_log_odds_ratio",
];

/// The training algorithm a frame's metric family says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// On-policy RL (GRPO, GSPO, PPO, …): the default.
    Rl,
    /// DPO, or a paired variant logging the same keys (IPO, SimPO/CPO).
    Dpo,
    /// KTO (unpaired; logs a batch `kl`).
    Kto,
    /// ORPO (logs `log_odds_ratio`).
    Orpo,
}

impl Algorithm {
    /// The name used in explanations.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Rl => "RL",
            Algorithm::Dpo => "DPO",
            Algorithm::Kto => "KTO",
            Algorithm::Orpo => "ORPO",
        }
    }
}

/// The algorithm of `frame`, from its metric family.
pub fn algorithm(frame: &LogFrame) -> Algorithm {
    // A detector that did not ask for a column cannot read it (the frame's projection):
    // the markers decide preference or not; `kl` only names the variant.
    let has = |m: &str| frame.projection().keeps(m) && frame.col(m).is_some_and(|c| c.any());
    if !PREF_MARKERS.iter().any(|m| has(m)) {
        return Algorithm::Rl;
    }
    if has("pref_log_odds_ratio") {
        Algorithm::Orpo
    } else if has("kl") && !has("pref_accuracy") {
        // TRL's KTO logs `kl` and no accuracies (its pairs are unpaired).
        Algorithm::Kto
    } else {
        Algorithm::Dpo
    }
}

/// True when `frame` is from a preference trainer (GRPO's rules do not apply).
pub fn is_preference(frame: &LogFrame) -> bool {
    algorithm(frame) != Algorithm::Rl
}

/// `--preference`: DPO/KTO/ORPO failure signatures.
pub struct Preference;

impl Detector for Preference {
    fn name(&self) -> &'static str {
        "preference"
    }
    fn summary(&self) -> &'static str {
        "DPO/KTO/ORPO: accuracies stuck at 1.0 or 0.5, margins saturating, loss 0 on saturated batches, log-probs exactly 0 (no token scored), chosen and rejected log-probs both falling"
    }
    fn metrics(&self) -> &'static [&'static str] {
        const READS: [&str; 9] = super::metric_list(&PREF_MARKERS, &["loss", "kl"]);
        &READS
    }
    fn detect(&self, ctx: &Context) -> Vec<Finding> {
        let f = ctx.frame;
        let alg = algorithm(f);
        if alg == Algorithm::Rl {
            return vec![];
        }
        let min_points = ctx.th.get("preference.min_points").max(2.0) as usize;
        let stuck_share = ctx.th.get("preference.stuck_share");
        let mut out = Vec::new();
        let acc: Vec<(i64, f64)> = f
            .points("pref_accuracy")
            .filter(|(_, v)| v.is_finite())
            .collect();
        if acc.len() >= min_points {
            for (value, severity, what, causes) in [
                (
                    1.0,
                    Severity::Warning,
                    "the chosen answer always wins: the pairs are too easy to separate (or the data gives the label away), the loss saturates and stops teaching",
                    &[
                        "pairs trivially separable (chosen and rejected differ in length or format)",
                        "β too large or learning rate too high: margins grow until the sigmoid saturates",
                        "the same pairs seen again (several epochs over a small set): memorised",
                    ][..],
                ),
                (
                    0.5,
                    Severity::Error,
                    "chosen and rejected are never told apart: the implicit rewards stay equal",
                    &[
                        "the policy is the reference: adapter not trained / learning rate 0 / frozen weights",
                        "chosen and rejected identical in the data (a preprocessing bug)",
                        "per-device batch of 2 pairs: accuracy can only be 0, 0.5 or 1 (check the margins)",
                    ][..],
                ),
            ] {
                let at: Vec<i64> = acc
                    .iter()
                    .filter(|(_, v)| (*v - value).abs() < 1e-9)
                    .map(|(s, _)| *s)
                    .collect();
                if at.len() as f64 >= stuck_share * acc.len() as f64 {
                    out.push(
                        Finding::new(
                            self.name(),
                            severity,
                            at.clone(),
                            format!(
                                "{}: rewards/accuracies is {value} on {} of {} logged steps: {what}",
                                alg.name(),
                                at.len(),
                                acc.len()
                            ),
                            causes,
                        )
                        .with("algorithm", alg.name())
                        .num("accuracy", value),
                    );
                }
            }
        }
        // Margins saturating: the loss -log σ(margin) near 0 while the margin keeps growing.
        let margin: Vec<(i64, f64)> = f
            .points("pref_margin")
            .filter(|(_, v)| v.is_finite())
            .collect();
        if margin.len() >= min_points {
            let q = (margin.len() / 4).max(1);
            let (first, last) = (
                value_mean(&margin[..q]),
                value_mean(&margin[margin.len() - q..]),
            );
            let loss_last: Vec<(i64, f64)> = f
                .points("loss")
                .filter(|(s, v)| v.is_finite() && *s >= margin[margin.len() - q].0)
                .collect();
            let loss_low = !loss_last.is_empty()
                && value_mean(&loss_last) <= ctx.th.get("preference.saturated_loss");
            if loss_low && last > first && last >= ctx.th.get("preference.saturated_margin") {
                let steps: Vec<i64> = margin[margin.len() - q..].iter().map(|(s, _)| *s).collect();
                out.push(
                    Finding::new(
                        self.name(),
                        Severity::Warning,
                        steps,
                        format!(
                            "{}: reward margins saturate: {} on average over the last {q} logged steps (from {} at the start) with the loss at {}: the sigmoid is flat, pairs no longer teach, and the policy drifts from the reference",
                            alg.name(),
                            G(last),
                            G(first),
                            G(value_mean(&loss_last))
                        ),
                        &[
                            "over-optimisation: too many epochs over the pairs, or β too small to hold the policy near the reference",
                            "pairs too easy (see accuracies)",
                            "consider IPO or a lower learning rate",
                        ],
                    )
                    .with("algorithm", alg.name())
                    .num("first_quarter_margin", first)
                    .num("last_quarter_margin", last),
                );
            }
        }
        // Batches the sigmoid has saturated on: a loss printed as 0 (−log σ(m) < 5e-5 from a
        // margin of ~10 on) where the margin is large. ORPO's loss carries an NLL term and is
        // never 0.
        if alg != Algorithm::Orpo {
            let sat_margin = ctx.th.get("preference.saturated_margin");
            let margin_at = |s: i64| margin.iter().find(|(m, _)| *m == s).map(|(_, v)| *v);
            let zero: Vec<(i64, f64)> = f
                .points("loss")
                .filter(|(_, v)| v.is_finite() && v.abs() < 1e-4)
                .filter_map(|(s, _)| margin_at(s).filter(|m| *m >= sat_margin).map(|m| (s, m)))
                .collect();
            let logged = f.points("loss").filter(|(_, v)| v.is_finite()).count();
            if zero.len() >= 2 {
                let (lo, hi) = zero
                    .iter()
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |a, (_, m)| {
                        (a.0.min(*m), a.1.max(*m))
                    });
                out.push(
                    Finding::new(
                        self.name(),
                        Severity::Warning,
                        zero.iter().map(|(s, _)| *s).collect(),
                        format!(
                            "{}: the loss is 0 on {} of {logged} logged steps, where the reward margins are {}–{}: the sigmoid is saturated on those batches, they teach nothing and the policy keeps moving away from the reference",
                            alg.name(),
                            zero.len(),
                            G(lo),
                            G(hi)
                        ),
                        &[
                            "learning rate too high for DPO (1e-6 to 5e-7 is usual; 5e-5 or more saturates within an epoch)",
                            "pairs trivially separable, or the same pairs seen again (several epochs over a small set)",
                            "β too small to hold the policy near the reference; consider IPO",
                        ],
                    )
                    .with("algorithm", alg.name())
                    .num("min_margin", lo)
                    .num("max_margin", hi),
                );
            }
        }
        // Chosen and rejected log-probs both exactly 0: a log-prob summed over no token. The
        // loss is then ln 2 and the rewards 0 whatever the model does.
        let both_zero: Vec<i64> = f
            .points("pref_logp_chosen")
            .filter(|(s, v)| {
                *v == 0.0
                    && f.points("pref_logp_rejected")
                        .any(|(r, w)| r == *s && w == 0.0)
            })
            .map(|(s, _)| s)
            .collect();
        if !both_zero.is_empty() {
            let n = both_zero.len();
            out.push(
                Finding::new(
                    self.name(),
                    Severity::Error,
                    both_zero,
                    format!(
                        "{}: logps/chosen and logps/rejected are exactly 0 on {n} logged step(s): no completion token was scored, so the loss stays at ln 2 (0.693), the implicit rewards at 0, and nothing is learned",
                        alg.name()
                    ),
                    &[
                        "every completion label masked (-100): prompt at or beyond max_length / max_prompt_length, so the completion is truncated away",
                        "a collator or chat template that masks the answer too (labels built from the prompt only)",
                        "the policy and the reference are the same frozen weights and the log-probs are not computed (check the logged loss is exactly ln 2)",
                    ],
                )
                .with("algorithm", alg.name()),
            );
        }
        // Chosen and rejected log-probs both falling: likelihood displacement.
        let chosen: Vec<(i64, f64)> = f
            .points("pref_logp_chosen")
            .filter(|(_, v)| v.is_finite())
            .collect();
        let rejected: Vec<(i64, f64)> = f
            .points("pref_logp_rejected")
            .filter(|(_, v)| v.is_finite())
            .collect();
        if chosen.len() >= min_points && rejected.len() >= min_points {
            let q = (chosen.len().min(rejected.len()) / 4).max(1);
            let drop = |s: &[(i64, f64)]| value_mean(&s[..q]) - value_mean(&s[s.len() - q..]);
            let (dc, dr) = (drop(&chosen), drop(&rejected));
            let min_drop = ctx.th.get("preference.logp_drop");
            let scale = value_mean(&chosen[..q]).abs().max(1.0);
            if dc > min_drop * scale && dr > min_drop * scale {
                let steps = vec![chosen[0].0, chosen[chosen.len() - 1].0];
                out.push(
                    Finding::new(
                        self.name(),
                        Severity::Warning,
                        steps,
                        format!(
                            "{}: log-probs of both the chosen ({} → {}) and the rejected answers ({} → {}) fall: the margin grows by pushing everything down, and the chosen answers become less likely than before training",
                            alg.name(),
                            G(value_mean(&chosen[..q])),
                            G(value_mean(&chosen[chosen.len() - q..])),
                            G(value_mean(&rejected[..q])),
                            G(value_mean(&rejected[rejected.len() - q..]))
                        ),
                        &[
                            "likelihood displacement: chosen and rejected too similar; add an NLL term on the chosen (RPO, ORPO) or use DPOP",
                            "learning rate too high or β too small",
                            "the reference (SFT) model not trained on the chosen distribution: run SFT first",
                        ],
                    )
                    .with("algorithm", alg.name())
                    .num("chosen_drop", dc)
                    .num("rejected_drop", dr),
                );
            }
        }
        out
    }
}

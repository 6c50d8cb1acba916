//! What a weaver's per-token weights (truncated importance sampling) say of a cell's loss
//! totals, in that cell and in cells whose intermediates were not read (issue 28).

use super::surrogate::unattributed;
use super::*;

/// What a weaver's per-token weight says of a cell's loss totals: weights read from its
/// own dumped `rollout_log_probs` explain a difference (a named cause, the difference a
/// failure); weights it does not dump leave which side is wrong unknown.
pub enum Weights {
    /// The weights are known: the difference is theirs ([`Tis::why`]).
    Seen(String),
    /// The weights are not dumped ([`ElemFit::unseen`]): "cannot judge".
    Unseen(String),
}

impl Weights {
    /// What the weaver's weights in other cells (`seen`: read from its rollout log-probs;
    /// `unseen`: not dumped; each "rank R micro M") say of a cell whose `is_loss_debug`
    /// was not read; `None` when no cell shows weights.
    pub fn elsewhere(seen: &[String], unseen: &[String]) -> Option<Weights> {
        if !unseen.is_empty() {
            return Some(Weights::Unseen(format!(
                "cannot judge which side is wrong: this cell's is_loss_debug was not read, and \
                 the weaver's per-token loss carries weights it does not dump in {} \
                 (importance sampling against rollout log-probs not dumped?)",
                unseen.join(", ")
            )));
        }
        (!seen.is_empty()).then(|| {
            Weights::Seen(format!(
                "likely an importance weight: this cell's is_loss_debug was not read, and the \
                 weaver applies truncated importance sampling against its rollout_log_probs in \
                 {} (TIS on the weaver's side only)",
                seen.join(", ")
            ))
        })
    }

    /// Apply to the failing totals of `out` named in `names`: a seen weight names the
    /// cause ([`unattributed`]); an unseen one makes each a warning that cannot say which
    /// side is wrong (issue 28: never a failure on a difference the check cannot explain).
    pub fn apply_to_totals(&self, out: &mut [Comparison], names: &[&str]) {
        match self {
            Weights::Seen(why) => unattributed(out, names, why),
            Weights::Unseen(why) => {
                for c in out.iter_mut() {
                    if names.contains(&c.name.as_str()) && c.verdict == Verdict::Fail {
                        c.verdict = Verdict::Warn;
                        c.reason = format!("{} — {why}", c.reason);
                    }
                }
            }
        }
    }
}

/// Make the loss totals (`names`) of every cell in `cells` a warning that says `why`: one
/// side's loss holds a term nothing states (see
/// [`crate::dumpdiff::conventions::unstated_term`]), so no total can say which side is
/// wrong (issue 28: never a failure on a difference the check cannot explain) — nor that
/// they agree: a pair that passes only within its tolerance is a warning too (never a
/// silent pass on a total the picture does not explain); totals equal to f32 rounding stay.
pub fn totals_cannot_judge<'a>(
    cells: impl Iterator<Item = &'a mut Cell>,
    names: &[&str],
    why: &str,
) {
    let w = Weights::Unseen(why.to_string());
    let equal = |c: &Comparison| {
        c.metrics
            .as_ref()
            .is_none_or(|m| m.max_rel <= 64.0 * 2f64.powi(-24))
    };
    for c in cells {
        rework(c, |out| {
            w.apply_to_totals(out, names);
            for x in out.iter_mut() {
                if names.contains(&x.name.as_str()) && x.verdict == Verdict::Pass && !equal(x) {
                    x.verdict = Verdict::Warn;
                    x.reason = format!("{} — {why}", x.reason);
                }
            }
        });
    }
}

/// A side whose own dumped pg term is the plain sum of its own dumped per-token loss
/// (losscheck's finding, [`crate::judge::Verdict::own_sum`]) is wrong whatever weights
/// that per-token loss holds: the totals of `rank`/`micro` that unseen weights (or a term
/// the other side's total holds unstated) made a "cannot judge" warning fail again, naming
/// the aggregation. `true` when one did.
pub fn own_sum_fails(
    sections: &mut [crate::dumpdiff::Section],
    rank: u32,
    micro: u32,
    role: &str,
) -> bool {
    let mut any = false;
    let why = format!(
        "yet {role}'s own pg_loss is the plain sum of its own elementwise_loss (which holds \
         the weights), which no mean gives: the aggregation differs"
    );
    for sec in sections.iter_mut().filter(|s| s.id == 3 || s.id == 4) {
        for c in sec
            .cells
            .iter_mut()
            .filter(|c| c.rank == Some(rank) && c.micro == Some(micro))
        {
            rework(c, |out| {
                for x in out.iter_mut() {
                    if x.name.ends_with("loss")
                        && x.verdict == Verdict::Warn
                        && (x.reason.contains("does not dump")
                            || x.reason.contains("holds a term no file states"))
                    {
                        x.verdict = Verdict::Fail;
                        x.reason = format!("{} — {why}", x.reason);
                        any = true;
                    }
                }
            });
        }
        sec.verdict = sec.worst();
    }
    any
}

/// The cells (rank, micro) whose `is_loss.effective_valid` fails: the sides' loss masks
/// differ, so their totals differ by the masked tokens' terms, not by rounding.
/// (The mask's counterpart for advantages: [`super::totals_over_differing_inputs`].)
pub fn masks_differ(sections: &[crate::dumpdiff::Section]) -> Vec<(u32, u32)> {
    super::cells::failing_in_is_loss(sections, "is_loss.effective_valid")
}

/// Where the loss masks differ ([`masks_differ`]), a loss total that passed only within
/// the log-probs' propagated allowance (no prediction holds when the masks differ) fails:
/// the difference is the masked tokens', named (seed 7421: a dropped token moved the
/// total by 10 % inside a 16-bit allowance). Totals equal to f32 stay.
pub fn mask_moves_totals(sections: &mut [crate::dumpdiff::Section]) {
    let masked = masks_differ(sections);
    // what the mask comparison names as the mask's cause (verl's rejection sampling read
    // off the side's own log-probs), said again beside the totals it moves (seed 8159)
    let cause_of = |r: u32, m: u32| -> Option<String> {
        let reason = &sections
            .iter()
            .filter(|s| s.name == "is_loss")
            .flat_map(|s| &s.cells)
            .find(|c| (c.rank, c.micro) == (Some(r), Some(m)))?
            .comparisons
            .iter()
            .find(|x| x.name == "is_loss.effective_valid")?
            .reason;
        let from = reason.find("verl's rejection sampling")?;
        let tail = &reason[from..];
        Some(tail[..tail.find(" — ").unwrap_or(tail.len())].to_string())
    };
    let causes: Vec<Option<String>> = masked.iter().map(|(r, m)| cause_of(*r, *m)).collect();
    for sec in sections.iter_mut().filter(|s| s.id == 3 || s.id == 4) {
        for c in sec.cells.iter_mut() {
            let (Some(r), Some(m)) = (c.rank, c.micro) else {
                continue;
            };
            let Some(k) = masked.iter().position(|x| *x == (r, m)) else {
                continue;
            };
            let cause = causes[k]
                .as_ref()
                .map(|c| format!(": {c}"))
                .unwrap_or_default();
            rework(c, |out| {
                for x in out.iter_mut() {
                    let total = matches!(
                        x.name.as_str(),
                        "loss.loss" | "is_loss.loss" | "loss.pg_loss"
                    );
                    let equal = x
                        .metrics
                        .as_ref()
                        .is_none_or(|m| m.max_rel <= 64.0 * 2f64.powi(-24));
                    if total
                        && x.verdict == Verdict::Pass
                        && !equal
                        && !x.reason.starts_with("equal unscaled")
                    {
                        x.verdict = Verdict::Fail;
                        x.reason = format!(
                            "{} — but the loss mask differs in this cell \
                             (is_loss.effective_valid{cause}): the totals differ by the \
                             masked tokens, not by rounding",
                            x.reason
                        );
                    }
                }
            });
        }
        sec.verdict = sec.worst();
    }
}

//! One line per cell whose loss disagrees, naming the term that differs: the pg term
//! (and, through the `is_loss` intermediates, the mask, the advantages, the old
//! log-probs, the ratio or the aggregation), the entropy term, the KL term, or the
//! composition itself (a coefficient). Numbers are printed with enough digits to differ.

use crate::compare::tolerance::Verdict;
use crate::dumpdiff::report::{Cell, Section};
use crate::fmt::{sig, Notation};
use crate::model::step::LossRecord;

/// `a` and `b` with the fewest significant digits (at least 4) that tell them apart.
pub fn distinct(a: f64, b: f64) -> (String, String) {
    for digits in 4..=17 {
        let (x, y) = (
            sig(a, digits, Notation::of(a)),
            sig(b, digits, Notation::of(b)),
        );
        if x != y || a == b {
            return (x, y);
        }
    }
    (format!("{a:e}"), format!("{b:e}"))
}

/// One side's coefficients for the diagnosis (0 when unknown).
#[derive(Debug, Clone, Copy, Default)]
pub struct Coeffs {
    /// Entropy coefficient.
    pub entropy: f64,
    /// KL coefficient.
    pub kl: f64,
}

/// The `is_loss` intermediate that fails first in data-flow order, named as a term.
fn failing_intermediate(cell: Option<&Cell>) -> Option<&'static str> {
    let cell = cell?;
    let fails = |name: &str| {
        cell.comparisons
            .iter()
            .any(|c| c.name == name && c.verdict >= Verdict::Warn)
    };
    // a mask that verl's rejection sampling explains whole is named beside the term that
    // differs ([`rejection`]), not in its place
    let rejected = |name: &str| {
        name == "is_loss.effective_valid"
            && cell.comparisons.iter().any(|c| {
                c.name == name
                    && c.reason.contains("verl's rejection sampling")
                    && !c.reason.contains("no rejection explains")
            })
    };
    [
        ("is_loss.effective_valid", "the mask (effective_valid)"),
        ("is_loss.advantages", "the advantages"),
        ("is_loss.old_log_probs", "old_log_probs"),
        ("is_loss.log_probs", "log_probs"),
        (
            "is_loss.prob_ratio",
            "the ratio (old_log_probs shifted or misaligned against log_probs)",
        ),
        ("is_loss.elementwise_loss", "the elementwise loss"),
    ]
    .into_iter()
    .find(|(n, _)| fails(n) && !rejected(n))
    .map(|(_, what)| what)
}

/// `": verl's rejection sampling (…)"` when the `is_loss` cell's mask comparison names
/// one (the weaver's `effective_valid` reduced by `rollout_rs`,
/// `super::sections` `rejection_note`), else empty.
fn rejection(cell: Option<&Cell>) -> String {
    const KEY: &str = "verl's rejection sampling";
    cell.and_then(|c| {
        c.comparisons.iter().find_map(|x| {
            (x.name == "is_loss.effective_valid")
                .then(|| x.reason.find(KEY).map(|i| format!(": {}", &x.reason[i..])))
                .flatten()
        })
    })
    .unwrap_or_default()
}

/// [`rejection`] said beside another cause: `"; and the mask (effective_valid): verl's
/// rejection sampling (…)"`, else empty.
fn besides(cell: Option<&Cell>) -> String {
    let r = rejection(cell);
    if r.is_empty() {
        r
    } else {
        format!("; and the mask (effective_valid){r}")
    }
}

/// The importance weights of the other side (read from its own rollout log-probs) the
/// `is_loss` cell derived the reference's per-token loss with, in words: `TIS` for verl's
/// token-level truncated weights, else the scheme its origin names (`sequence-level TIS
/// cap 5`, `token IcePop band 0.5–2`; verl 0.9.1 `compute_rollout_correction_weights`).
pub(super) fn weighted(cell: Option<&Cell>) -> Option<String> {
    let origin = cell?.comparisons.iter().find_map(|x| {
        (x.name == "is_loss.elementwise_loss" && x.origin_a.from.contains("rollout_log_probs"))
            .then_some(x.origin_a.from.as_str())
    })?;
    const KEY: &str = "importance weights, ";
    // "(the weaver's importance weights, <scheme>, from its own rollout_log_probs)",
    // "(the weaver's truncated importance weights, TIS cap 2, from …)"
    let scheme = origin.find(KEY).and_then(|i| {
        let rest = &origin[i + KEY.len()..];
        rest.find(", from")
            .filter(|&e| e > 0)
            .map(|e| rest[..e].to_string())
    });
    Some(scheme.unwrap_or_else(|| "TIS".into()))
}

/// The `is_loss` cell's note that the weaver's loss is its own elementwise_loss in
/// another reduction (`super::sections` `own_aggregation`, beside the importance
/// weights): `"; and the aggregation differs: …"`, else empty.
fn own_aggregation(cell: Option<&Cell>) -> String {
    const KEY: &str = "; and the aggregation differs: ";
    // what later passes append after it
    const AFTER: [&str; 4] = [" — ", "; unscaled", " (the weaver's loss mask", "; besides"];
    cell.and_then(|c| {
        c.comparisons.iter().find_map(|x| {
            let rest = &x.reason[x.reason.find(KEY)?..];
            let end = AFTER
                .iter()
                .filter_map(|a| rest[KEY.len()..].find(a).map(|e| e + KEY.len()))
                .min()
                .unwrap_or(rest.len());
            Some(rest[..end].to_string())
        })
    })
    .unwrap_or_default()
}

/// Whether the `is_loss` cell left the per-token loss uncompared because the other side's
/// carries per-token weights it does not dump (importance weights whose rollout
/// log-probs are not dumped, [`super::sections`]' "cannot judge which side is wrong").
fn unseen_weights(cell: Option<&Cell>) -> bool {
    cell.is_some_and(|c| {
        c.comparisons.iter().any(|x| {
            x.name == "is_loss.elementwise_loss"
                && x.verdict == Verdict::Skipped
                && x.reason.contains("a per-token weight it does not dump")
        })
    })
}

/// Whether the `is_loss` cell compared any per-token intermediate (a comparison judged,
/// not skipped): without one — the weaver's `is_loss_debug` not read — "every per-token
/// intermediate matches" cannot be said.
fn compared_per_token(cell: Option<&Cell>) -> bool {
    cell.is_some_and(|c| {
        c.comparisons
            .iter()
            .any(|x| matches!(x.verdict, Verdict::Pass | Verdict::Warn | Verdict::Fail))
    })
}

/// What the `forward_data` cell says about differing log-probs: when the current
/// log-probs (and the entropy, when dumped) differ on most tokens yet each still
/// correlates with the other side's, the forward pass changed systematically — the shape
/// logits divided by a sampling temperature on one side only give (verl and NexRL divide
/// the logits by `temperature` before `log_softmax`; a side that forgets it is sharper or
/// flatter at every token), not a misalignment (a shift or a row swap decorrelates them).
fn forward_shape(forward: Option<&Cell>) -> Option<String> {
    let cell = forward?;
    let metrics = |leaf: &str| {
        cell.comparisons
            .iter()
            .find(|c| c.name.rsplit('.').next() == Some(leaf))
            .and_then(|c| c.metrics.as_ref())
    };
    // three tokens (a one-row micro) are systematic too when every log-prob and every
    // entropy differs and each correlates at 0.99 or more (seed 7474: 0.9994 and 0.994;
    // three unrelated pairs reach 0.99 by chance about 1 time in 20, both about 1 in 400)
    let three = |m: &crate::compare::metrics::PairMetrics| {
        m.count == 3 && m.beyond_fraction >= 1.0 && m.pearson.is_some_and(|p| p >= 0.99)
    };
    let lp = metrics("log_probs")
        .filter(|m| m.systematic() || (three(m) && metrics("entropy").is_some_and(three)))?;
    let r = |m: &crate::compare::metrics::PairMetrics| {
        sig(m.pearson.unwrap_or(0.0), 3, Notation::Fixed)
    };
    let pct =
        |m: &crate::compare::metrics::PairMetrics| format!("{:.0} %", 100.0 * m.beyond_fraction);
    // the entropy moves with the temperature too, but not linearly (T = 0.6 leaves a
    // pearson near 0.9): every token differing and still correlated is its shape
    let moved = |e: &crate::compare::metrics::PairMetrics| {
        e.systematic() || (e.beyond_fraction >= 0.8 && e.pearson.is_some_and(|p| p >= 0.5))
    };
    Some(match metrics("entropy") {
        Some(e) if moved(e) => format!(
            "the forward pass differs on {} of the tokens' log-probs and {} of their entropies, \
             each still correlated with the other side's (pearson {}, {}): the shape of logits \
             divided by a sampling temperature on one side only",
            pct(lp),
            pct(e),
            r(lp),
            r(e)
        ),
        Some(_) => return None,
        None => format!(
            "the log-probs differ on {} of the tokens yet correlate with the other side's \
             (pearson {}): a systematic change of the logits, such as a sampling temperature \
             applied on one side only",
            pct(lp),
            r(lp)
        ),
    })
}

/// The diagnosis of one cell whose `loss` (section 3) or `is_loss.loss` fails, from the
/// two loss records and coefficients, the `is_loss` cell's intermediates and the
/// `forward_data` cell's log-probs and entropy.
pub fn diagnose(
    (rank, micro): (u32, u32),
    a: &LossRecord,
    b: &LossRecord,
    (ca, cb): (Coeffs, Coeffs),
    (is_loss, forward): (Option<&Cell>, Option<&Cell>),
) -> Option<String> {
    let (la, lb) = (a.loss?, b.loss?);
    let kl = |r: &LossRecord| r.kl.get("kl_loss").or_else(|| r.kl.get("kl")).copied();
    let d_pg = match (a.pg_loss, b.pg_loss) {
        (Some(x), Some(y)) => y - x,
        _ => 0.0,
    };
    let ent = |r: &LossRecord, c: &Coeffs| -c.entropy * r.entropy_loss.unwrap_or(0.0);
    let d_ent = ent(b, &cb) - ent(a, &ca);
    let d_kl = cb.kl * kl(b).unwrap_or(0.0) - ca.kl * kl(a).unwrap_or(0.0);
    let d_loss = lb - la;
    let rest = d_loss - d_pg - d_ent - d_kl;
    let (sa, sb) = distinct(la, lb);
    let head = format!(
        "rank {rank} micro {micro}: loss {sa} (self-hosted) vs {sb} (weaver), Δ {}",
        sig(d_loss, 3, Notation::Sci)
    );
    let parts = [
        ("pg", d_pg),
        ("entropy", d_ent),
        ("KL", d_kl),
        ("composition", rest),
    ];
    let &(term, _) = parts
        .iter()
        .max_by(|x, y| x.1.abs().total_cmp(&y.1.abs()))?;
    let shares = parts
        .iter()
        .map(|(n, v)| format!("{n} {}", sig(*v, 3, Notation::Sci)))
        .collect::<Vec<_>>()
        .join(", ");
    let what = match term {
        "pg" => match failing_intermediate(is_loss) {
            Some(x @ "log_probs") => match forward_shape(forward) {
                Some(shape) => {
                    format!("the pg term differs, from {x}: {shape}{}", besides(is_loss))
                }
                None => format!("the pg term differs, from {x}{}", besides(is_loss)),
            },
            Some(x) => format!("the pg term differs, from {x}{}", besides(is_loss)),
            None => match (a.pg_loss, b.pg_loss) {
                (Some(x), Some(y)) if weighted(is_loss).is_some() => {
                    let (px, py) = distinct(x, y);
                    let scheme = weighted(is_loss).unwrap_or_default();
                    let mask = besides(is_loss);
                    let agg = own_aggregation(is_loss);
                    format!(
                        "the pg term differs (pg_loss {px} vs {py}) while every per-token \
                         intermediate matches once the weaver's importance weights are \
                         applied: an importance weight ({scheme}, against rollout_log_probs on \
                         the weaver's side only){agg}{mask}"
                    )
                }
                _ if !rejection(is_loss).is_empty() => format!(
                    "the pg term differs, from the mask (effective_valid){}",
                    rejection(is_loss)
                ),
                (Some(x), Some(y)) if unseen_weights(is_loss) => {
                    let (px, py) = distinct(x, y);
                    // every other per-token intermediate matches: the weights, or the
                    // aggregation, or both — the per-token loss cannot tell
                    format!(
                        "the pg term differs (pg_loss {px} vs {py}) while every per-token \
                         intermediate but the elementwise loss matches, and the weaver's \
                         elementwise_loss carries per-token weights it does not dump: an \
                         importance weight (against rollout log-probs not dumped) or the \
                         aggregation differs; which side is wrong cannot be judged"
                    )
                }
                (Some(x), Some(y)) if compared_per_token(is_loss) => {
                    let (px, py) = distinct(x, y);
                    format!(
                        "the pg term differs (pg_loss {px} vs {py}) while every per-token \
                         intermediate matches: the aggregation differs"
                    )
                }
                (Some(x), Some(y)) => {
                    let (px, py) = distinct(x, y);
                    format!(
                        "the pg term differs (pg_loss {px} vs {py}); the per-token \
                         intermediates are not compared in this cell (its is_loss_debug was \
                         not read), so the aggregation, a weight or the inputs cannot be told \
                         apart"
                    )
                }
                _ => "the pg term differs".into(),
            },
        },
        "entropy" => match (a.entropy_loss, b.entropy_loss) {
            (Some(x), Some(y)) if x != y && ca.entropy == cb.entropy => {
                let (ex, ey) = distinct(x, y);
                // entropy_loss is a masked mean: over a loss mask that rejection reduced
                format!(
                    "the entropy term differs (entropy_loss {ex} vs {ey}){}",
                    besides(is_loss)
                )
            }
            _ => format!(
                "the entropy term differs (entropy_coeff {} vs {})",
                ca.entropy, cb.entropy
            ),
        },
        "KL" => format!(
            "the KL term differs (kl_coef {} vs {}, kl_loss {} vs {})",
            ca.kl,
            cb.kl,
            kl(a).map_or("–".into(), |v| sig(v, 6, Notation::of(v))),
            kl(b).map_or("–".into(), |v| sig(v, 6, Notation::of(v)))
        ),
        _ => "the terms match but their sum does not: the loss composition or a \
              coefficient differs"
            .into(),
    };
    Some(format!("{head}: {what} (contributions to Δ: {shares})"))
}

/// The cells (rank, micro) whose loss disagrees: a failing `loss.loss` in section 3 or
/// `is_loss.loss` in section 4.
pub fn failing_loss_cells(sections: &[Section]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = sections
        .iter()
        .flat_map(|s| &s.cells)
        .filter(|c| {
            c.comparisons.iter().any(|x| {
                (x.name == "loss.loss" || x.name == "is_loss.loss") && x.verdict >= Verdict::Warn
            })
        })
        .filter_map(|c| Some((c.rank?, c.micro?)))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The diagnosis of `rank`/`micro` once `role`'s pg term is found to be the plain sum of
/// its own per-token loss ([`super::sections::own_sum_fails`]): the cause is the
/// aggregation, whatever weights that per-token loss holds.
pub(super) fn own_sum(diagnosis: &mut [String], rank: u32, micro: u32, role: &str) {
    let head = format!("rank {rank} micro {micro}:");
    for d in diagnosis.iter_mut().filter(|d| d.starts_with(&head)) {
        *d = d.replace(
            "an importance weight (against rollout log-probs not dumped) or the aggregation \
             differs; which side is wrong cannot be judged",
            &format!(
                "yet {role}'s own pg_loss is the plain sum of its own elementwise_loss, which \
                 no mean gives: the aggregation differs"
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_looking_numbers_get_the_digits_that_tell_them_apart() {
        assert_eq!(
            distinct(-0.0015234, -0.0015198),
            ("-0.001523".into(), "-0.00152".into())
        );
        let (a, b) = distinct(-0.00150001, -0.00150002);
        assert_ne!(a, b);
        assert_eq!((a.as_str(), b.as_str()), ("-0.00150001", "-0.00150002"));
    }

    fn rec(loss: f64, pg: f64, ent: f64) -> LossRecord {
        LossRecord {
            loss: Some(loss),
            pg_loss: Some(pg),
            entropy_loss: Some(ent),
            ..LossRecord::default()
        }
    }

    #[test]
    fn the_entropy_term_is_named_when_the_coefficients_differ() {
        // pg equal, entropy_loss equal, coefficients 1e-4 vs 1e-3.
        let (a, b) = (
            rec(0.1 - 1e-4 * 2.0, 0.1, 2.0),
            rec(0.1 - 1e-3 * 2.0, 0.1, 2.0),
        );
        let ca = Coeffs {
            entropy: 1e-4,
            kl: 0.0,
        };
        let cb = Coeffs {
            entropy: 1e-3,
            kl: 0.0,
        };
        let d = diagnose((0, 1), &a, &b, (ca, cb), (None, None)).unwrap();
        assert!(
            d.contains("the entropy term differs (entropy_coeff 0.0001 vs 0.001)"),
            "{d}"
        );
        assert!(
            d.starts_with("rank 0 micro 1: loss 0.0998 (self-hosted) vs 0.098 (weaver)"),
            "{d}"
        );
        // The same coefficients on both sides: a pg difference with no failing
        // intermediate is the aggregation — when the per-token loss was compared.
        let (a, b) = (rec(0.5, 0.5, 1.0), rec(0.6, 0.6, 1.0));
        let mut el = crate::dumpdiff::sections::skipped("is_loss", "prob_ratio", "");
        el.verdict = Verdict::Pass;
        let is_loss = crate::dumpdiff::sections::cell(Some(1), Some(0), None, vec![el]);
        let run = |is_loss: Option<&Cell>| {
            diagnose(
                (1, 0),
                &a,
                &b,
                (Coeffs::default(), Coeffs::default()),
                (is_loss, None),
            )
            .unwrap()
        };
        let d = run(Some(&is_loss));
        assert!(
            d.contains("every per-token intermediate matches: the aggregation differs"),
            "{d}"
        );
        // no is_loss_debug read (a file set aside): nothing said to match
        let d = run(None);
        assert!(
            d.contains("the per-token intermediates are not compared in this cell")
                && !d.contains("aggregation differs"),
            "{d}"
        );
    }
}

//! A total loss one side dumps scaled (verl's `loss = policy_loss * loss_scale_factor`,
//! `verl/workers/actor/dp_actor.py` `update_policy`, volcengine/verl@cc62eca): the judge
//! settles the factor with the side's conventions (`judge::infer::scale`), and the `loss`
//! scalars of the two sides are compared again unscaled. The terms (`pg_loss`,
//! `entropy_loss`) are dumped unscaled and compared as they are.

use super::report::{Coefficient, Section};
use crate::compare::tolerance::Verdict;
use crate::model::step::ENTROPY_COEFF;

/// `(rank, micro)` cells.
pub type Cells = Vec<(u32, u32)>;

/// One side's factor on one disagreeing cell's dumped total.
#[derive(Debug, Clone)]
pub struct SideScale {
    /// `self-hosted` or `weaver`.
    pub role: String,
    /// Rank.
    pub rank: u32,
    /// Micro-batch.
    pub micro: u32,
    /// The factor (`rows / n` or one constant).
    pub factor: f64,
    /// Whether the side's totals are scaled at all: an unscaled side is listed only for
    /// the entropy coefficient the judge settled for it ([`rescaled_coefficients`]).
    pub scaled: bool,
    /// The side's entropy coefficient (the unscaled totals may differ by its entropy term).
    pub entropy_coeff: f64,
    /// How the judge settled `entropy_coeff` with the scale (its conventions line), when
    /// from the data rather than the preset.
    pub entropy_from: Option<String>,
    /// The standard error of that fit (0 when not fitted).
    pub entropy_se: f64,
    /// The scale as the conventions record says it.
    pub words: String,
}

/// The `entropy_coeff` line of the report for a side whose totals are scaled: dumpdiff's
/// own least squares of `loss − pg_loss` fits the scaled totals (the scale goes into the
/// coefficient, with a large error), so such a side's value becomes the one the judge
/// settled together with the scale, when every scaled cell of the side agrees on it,
/// and the two sides are compared again (beyond relative 10⁻³ and `DIFFER_SIGMAS` of the
/// settled fits' standard errors: the judge's is a fit too; a value fitted to one cell's
/// total is not compared, seed 7534; a scaled fit's error, seed 7530).
pub fn rescaled_coefficients(coefficients: &mut Vec<Coefficient>, scales: &[SideScale]) {
    // (value, how, whether the side is scaled)
    let settled = |role: &str| -> Option<(f64, String, bool)> {
        let mine: Vec<&SideScale> = scales.iter().filter(|s| s.role == role).collect();
        let first = mine.first()?;
        let from = first.entropy_from.clone()?;
        let how = match first.scaled {
            true => format!("with the loss scale {}: {from}", first.words),
            false => format!("settled by the judge: {from}"),
        };
        mine.iter()
            .all(|s| {
                (s.entropy_coeff - first.entropy_coeff).abs() <= 1e-9 * first.entropy_coeff.abs()
            })
            .then_some((first.entropy_coeff, how, first.scaled))
    };
    let (sa, sb) = (settled("self-hosted"), settled("weaver"));
    // the settled fits' standard errors: two values within DIFFER_SIGMAS of them are one
    let se: f64 = ["self-hosted", "weaver"]
        .iter()
        .filter_map(|role| scales.iter().find(|s| s.role == *role))
        .map(|s| s.entropy_se)
        .sum();
    // only where a side's totals are scaled: its own fit is then in doubt
    if !sa.iter().chain(&sb).any(|s| s.2) {
        return;
    }
    let at = match coefficients.iter().position(|c| c.name == ENTROPY_COEFF) {
        Some(i) => i,
        None => {
            coefficients.push(Coefficient {
                name: ENTROPY_COEFF.to_string(),
                self_hosted: None,
                weaver: None,
                self_hosted_from: None,
                weaver_from: None,
                differ: false,
                self_hosted_one_cell: false,
                weaver_one_cell: false,
            });
            coefficients.len() - 1
        }
    };
    let c = &mut coefficients[at];
    // a value read from the dump or a flag stays; a scaled side's inferred one gives way,
    // and an unscaled side's only when its own fit gave none
    let gives_way = |v: Option<f64>, from: &Option<String>, scaled: bool| match v {
        None => true,
        Some(_) => scaled && from.as_deref().is_none_or(|f| f.starts_with("inferred")),
    };
    if let Some((v, from, _)) = sa.filter(|s| gives_way(c.self_hosted, &c.self_hosted_from, s.2)) {
        (c.self_hosted, c.self_hosted_from) = (Some(v), Some(from));
        c.self_hosted_one_cell = false;
    }
    if let Some((v, from, _)) = sb.filter(|s| gives_way(c.weaver, &c.weaver_from, s.2)) {
        (c.weaver, c.weaver_from) = (Some(v), Some(from));
        c.weaver_one_cell = false;
    }
    // a value fitted to one cell's total is not compared (`conventions`: it fits any value)
    let lone = c.self_hosted_one_cell || c.weaver_one_cell;
    if let (Some(x), Some(y)) = (c.self_hosted, c.weaver) {
        let gap = (x - y).abs();
        c.differ = !lone
            && gap > 1e-3 * x.abs().max(y.abs())
            && gap > 1e-12
            && gap > crate::conventions::coefficients::DIFFER_SIGMAS * se;
    }
    if !c.differ && c.self_hosted.is_none_or(|v| v == 0.0) && c.weaver.is_none_or(|v| v == 0.0) {
        coefficients.remove(at);
    }
}

/// A side the judge settled no scale for whose totals dumpdiff's own fit finds to be
/// their composition over one integer `k` (`own`: `(role, k, entropy_coeff, how it was
/// settled)`,
/// `conventions::own_scales`; the judge needs two of the side's cells and may have fewer,
/// e.g. an unreadable `is_loss_debug`): its factor `1/k` on each failing cell, in place
/// of its unscaled entries.
pub fn add_own(
    scales: &mut Vec<SideScale>,
    own: &[(&str, f64, f64, String)],
    failing: &[(u32, u32)],
) {
    for (role, k, e, how) in own {
        if scales.iter().any(|s| s.role == *role && s.scaled) {
            continue;
        }
        scales.retain(|s| s.role != *role);
        for &(rank, micro) in failing {
            scales.push(SideScale {
                role: role.to_string(),
                rank,
                micro,
                factor: 1.0 / k,
                scaled: true,
                entropy_coeff: *e,
                entropy_from: Some(how.clone()),
                entropy_se: 0.0,
                words: format!("1/{k} (every total is its terms' composition over {k})"),
            });
        }
    }
}

/// Compare the failing `loss.loss` / `is_loss.loss` scalars of the cells `scales` names
/// again with each side's total divided by its factor: within the room the comparison
/// itself allowed (its tolerance and propagated error), the entropy term's agreed
/// difference and f32 rounding, they pass, saying so; else the reason gains the unscaled
/// values.
/// Returns the cells whose totals now agree, and of those the cells that no longer fail
/// at all.
pub fn rejudge(sections: &mut [Section], scales: &[SideScale]) -> (Cells, Cells) {
    use crate::dumpdiff::sections::OWN_AGG;
    if !scales.iter().any(|s| s.scaled) {
        return (Vec::new(), Vec::new());
    }
    let factor = |role: &str, r: u32, m: u32| {
        scales
            .iter()
            .find(|s| s.scaled && s.role == role && s.rank == r && s.micro == m)
    };
    // |a − b| of a passing scalar comparison of the `loss` cell (rank, micro): room the
    // unscaled totals may differ by; 0 when absent or failing (a difference, not room)
    let term_diff = |sections: &[Section], r: u32, m: u32, name: &str| -> f64 {
        sections
            .iter()
            .filter(|s| s.name == "loss")
            .flat_map(|s| &s.cells)
            .filter(|c| c.rank == Some(r) && c.micro == Some(m))
            .flat_map(|c| &c.comparisons)
            .find(|x| x.name == name && x.verdict == Verdict::Pass)
            .and_then(|x| x.metrics.as_ref()?.max_abs.as_ref().map(|d| d.abs_diff))
            .filter(|d| d.is_finite())
            .unwrap_or(0.0)
    };
    let mut touched = Vec::new();
    let snapshot: Vec<Section> = sections.to_vec();
    let masked = crate::dumpdiff::sections::masks_differ(&snapshot);
    for sec in sections.iter_mut() {
        if sec.name != "loss" && sec.name != "is_loss" {
            continue;
        }
        for cell in sec.cells.iter_mut() {
            let (Some(r), Some(m)) = (cell.rank, cell.micro) else {
                continue;
            };
            let (sa, sb) = (factor("self-hosted", r, m), factor("weaver", r, m));
            if sa.is_none() && sb.is_none() {
                continue;
            }
            let mut changed = false;
            for x in cell.comparisons.iter_mut() {
                if !x.name.ends_with("loss.loss") || x.name.matches('.').count() != 1 {
                    continue;
                }
                if x.verdict <= Verdict::Pass {
                    continue;
                }
                let Some(d) = x.metrics.as_ref().and_then(|m| m.max_abs) else {
                    continue;
                };
                let a = d.a / sa.map_or(1.0, |s| s.factor);
                let b = d.b / sb.map_or(1.0, |s| s.factor);
                let ec = sa.or(sb).map_or(0.0, |s| s.entropy_coeff).abs();
                // the room the comparison itself allowed (its tolerance and the error its
                // terms propagate: |Δ| over its excess), the entropy term's agreed
                // difference, and the rounding of dividing an f32 total
                let excess = x.metrics.as_ref().map_or(0.0, |m| m.max_excess);
                let own = if excess.is_finite() && excess > 0.0 {
                    d.abs_diff / excess
                } else {
                    x.tolerance.atol + x.tolerance.rtol * a.abs().max(b.abs())
                };
                let allowed = own
                    + ec * term_diff(&snapshot, r, m, "loss.entropy_loss")
                    + 8.0 * 2f64.powi(-24) * (a.abs() + b.abs());
                let who: Vec<String> = [("self-hosted", sa), ("weaver", sb)]
                    .iter()
                    .filter_map(|(role, s)| s.map(|s| format!("{role}'s loss scale {}", s.words)))
                    .collect();
                let (ua, ub) = super::diagnosis::distinct(a, b);
                // where the loss masks differ the totals differ by the masked tokens:
                // only totals equal to f32 are equal (seed 7421)
                let allowed = match masked.contains(&(r, m)) {
                    true => 64.0 * 2f64.powi(-24) * a.abs().max(b.abs()),
                    false => allowed,
                };
                if (a - b).abs() <= allowed && x.reason.contains(OWN_AGG) {
                    // an aggregation read off the weaver's own pg term and per-token loss
                    // is no scale's: the total naming it stays (seed 7947)
                    x.reason = format!(
                        "{}; unscaled by {} they agree within the room the comparison \
                         allows ({ua} vs {ub})",
                        x.reason,
                        who.join(" and ")
                    );
                } else if (a - b).abs() <= allowed {
                    x.verdict = Verdict::Pass;
                    // a zero-advantage cell's "cannot judge the aggregation" stays said
                    // (seed 8424: the scale explains the total, an unstated term warns)
                    let unseen = super::sections::agg_unseen_words(&x.reason).unwrap_or("");
                    x.reason = format!(
                        "equal unscaled ({} vs {}): the dumped totals differ by {}{unseen}",
                        crate::fmt::num(a),
                        crate::fmt::num(b),
                        who.join(" and ")
                    );
                    changed = true;
                } else {
                    x.reason = format!(
                        "{}; unscaled by {} they still differ: {ua} vs {ub}",
                        x.reason,
                        who.join(" and ")
                    );
                }
            }
            if changed {
                let rebuilt = super::sections::cell(
                    cell.rank,
                    cell.micro,
                    cell.rows.take(),
                    std::mem::take(&mut cell.comparisons),
                );
                *cell = rebuilt;
                touched.push((r, m));
            }
        }
        sec.verdict = sec.worst();
    }
    touched.sort_unstable();
    touched.dedup();
    // the cells that no longer fail in any section
    let clean = touched
        .iter()
        .copied()
        .filter(|(r, m)| {
            sections
                .iter()
                .filter(|s| s.name == "loss" || s.name == "is_loss")
                .flat_map(|s| &s.cells)
                .filter(|c| c.rank == Some(*r) && c.micro == Some(*m))
                .all(|c| c.verdict <= Verdict::Pass)
        })
        .collect();
    (touched, clean)
}

//! After the sections: the first divergence and worst offenders, and the adjudication of
//! loss disagreements by recomputing each side from its own inputs.

use super::*;

/// The rank/micro cells whose loss disagrees (a failing cell of section 3 `loss` or 4
/// `is_loss`), each side recomputed from its own inputs by losscheck under that side's
/// own conventions: `preset` with dumpdiff's flags (`coefficients`: `entropy_coeff`,
/// `kl_coef`) and the advantage epsilon dumpdiff settled (`adv_eps`), the rest read from
/// the side's `extra_info` or inferred from every cell of its step
/// ([`crate::judge::StepCheck::conventions`]) — judged with the preset's, a side that
/// follows other conventions would be called wrong. Sides without per-micro loss inputs
/// (remote-api) are left out. `picture_of` names a side whose picture (scale, whether its
/// conventions explain its totals) is wanted even when no cell disagrees.
pub(super) fn adjudicate(
    sections: &[Section],
    sides: &[&SideData],
    step: i64,
    preset: &str,
    traj: Option<&TrajectorySummary>,
    (coefficients, adv_eps): (&std::collections::BTreeMap<String, f64>, Option<f64>),
    picture_of: Option<&str>,
) -> Result<Adjudicated> {
    use crate::judge::infer::self_hosted_adv_eps;
    use crate::judge::{Status, StepCheck, Tolerance};
    let given = crate::judge::overrides::of_coefficients(coefficients, adv_eps);
    let base = crate::kernels::presets::preset(preset)
        .map_err(|e| Error::Usage(format!("--preset {preset}: {e}")))?;
    let preset_eps = base.advantage.eps;
    let cfg = crate::judge::overrides::apply(base, &given)?;
    let cells: BTreeSet<(u32, u32)> = sections
        .iter()
        .filter(|s| s.id == 3 || s.id == 4)
        .flat_map(|s| &s.cells)
        .filter(|c| {
            // a failing cell, or loss totals that differ as a warning (a weight the weaver
            // does not dump): the judge's scale may still explain them
            c.verdict == Verdict::Fail
                || c.comparisons
                    .iter()
                    .any(|x| x.name.ends_with("loss.loss") && x.verdict >= Verdict::Warn)
        })
        .filter_map(|c| Some((c.rank?, c.micro?)))
        .collect();
    if cells.is_empty() && picture_of.is_none() {
        return Ok(Adjudicated::default());
    }
    let tol = Tolerance::default();
    // Each side's whole-batch inputs are the values read at the start of the run: no
    // file is read twice, whatever the number of cells. Its conventions are settled
    // once, from every cell of the step.
    type Judged<'t> = (
        StepCheck<'t>,
        Resolved,
        Option<String>,
        Vec<crate::judge::Verdict>,
    );
    use crate::judge::infer::Resolved;
    let judged: Vec<(&str, std::result::Result<Judged<'_>, String>)> = sides
        .iter()
        .filter(|d| d.role != "remote-api")
        .filter(|d| !cells.is_empty() || picture_of == Some(d.role))
        .map(|d| {
            let whole = |k: Kind| d.get(k, None, None);
            let traj = traj.filter(|_| d.role == "self-hosted");
            // A self-hosted side dumps rewards, not advantages: without an epsilon from
            // dumpdiff's evidence, losscheck's own search settles it (as it does alone).
            let (cfg, eps_line) = match (d.role == "self-hosted", adv_eps) {
                (true, None) => {
                    let eps = self_hosted_adv_eps(&d.tree, step, &cfg, &given, &tol)
                        .filter(|e| *e != cfg.advantage.eps);
                    let mut c = cfg.clone();
                    c.advantage.eps = eps.unwrap_or(c.advantage.eps);
                    (
                        c,
                        eps.map(|e| format!("adv_eps {} (inferred)", crate::fmt::num(e))),
                    )
                }
                (true, Some(e)) if e != preset_eps => (
                    cfg.clone(),
                    Some(format!("adv_eps {} (dumpdiff's)", crate::fmt::num(e))),
                ),
                _ => (cfg.clone(), None),
            };
            let judged = StepCheck::with_values(&d.tree, step, &cfg, &whole, traj)
                .map_err(|e| e.to_string())
                .map(|check| {
                    let (resolved, under) = match check.conventions(&cfg, &given, &tol) {
                        Ok(r) => {
                            let differ: Vec<String> = eps_line
                                .iter()
                                .cloned()
                                .chain(
                                    r.conventions
                                        .iter()
                                        .filter(|c| !c.matches_preset)
                                        .map(|c| c.line()),
                                )
                                .collect();
                            let under = (!differ.is_empty())
                                .then(|| format!("judged under {}", differ.join(", ")));
                            (r, under)
                        }
                        Err(e) => (
                            Resolved {
                                cfg: cfg.clone(),
                                conventions: Vec::new(),
                                uncertainty: Default::default(),
                                total_uncertainty: Default::default(),
                                unstated: Default::default(),
                                cells: 0,
                                agg_rival: None,
                                own_pg_mode: None,
                            },
                            Some(format!(
                                "judged under the preset: the step's conventions could not be settled ({e})"
                            )),
                        ),
                    };
                    // check before judging: the side's conventions must reproduce most
                    // of its own cells (and its coefficients explain them) before one of
                    // them is called wrong — the checks losscheck makes, on every cell
                    let (all, _) = check.cells();
                    let mut every: Vec<crate::judge::Verdict> = all
                        .iter()
                        .filter_map(|(r, m)| check.check_under(*r, *m, &resolved, &tol).ok())
                        .collect();
                    let tried: Vec<String> =
                        resolved.conventions.iter().map(|c| c.line()).collect();
                    let tried = if tried.is_empty() {
                        format!("the {preset} preset's")
                    } else {
                        tried.join(", ")
                    };
                    crate::judge::picture::before_judging(&mut every, &resolved.conventions, &tried);
                    (check, resolved, under, every)
                });
            (d.role, judged)
        })
        .collect();
    let differ = own_conventions_differ(&judged);
    let out = cells
        .clone()
        .into_par_iter()
        .map(|(rank, micro)| {
            let verdicts: Vec<report::SideVerdict> = judged
                .iter()
                .map(|(role, check)| {
                    let verdict = check.as_ref().map_err(String::clone).and_then(
                        |(c, resolved, under, every)| {
                            // the verdict judged with the step's other cells, else the
                            // reason this cell could not be
                            match every.iter().find(|v| (v.rank, v.micro) == (rank, micro)) {
                                Some(v) => Ok((v.clone(), under)),
                                None => c
                                    .check_under(rank, micro, resolved, &tol)
                                    .map(|v| (v, under))
                                    .map_err(|e| e.to_string()),
                            }
                        },
                    );
                    match verdict {
                        Ok((v, under)) => report::SideVerdict {
                            role: (*role).into(),
                            status: Some(v.status),
                            dumped_loss: Some(v.dumped_loss),
                            recomputed_loss: Some(v.recomputed_loss),
                            detail: match under {
                                Some(u) => format!("{} ({u})", v.line()),
                                None => v.line(),
                            },
                            own_sum: v.status == Status::Inconsistent && v.own_sum,
                        },
                        Err(e) => report::SideVerdict {
                            role: (*role).into(),
                            status: None,
                            dumped_loss: None,
                            recomputed_loss: None,
                            detail: format!("could not recompute: {e}"),
                            own_sum: false,
                        },
                    }
                })
                .collect();
            let conclusion = conclusion_of(&verdicts, differ.as_ref());
            report::Adjudication {
                rank,
                micro,
                preset: preset.to_string(),
                sides: verdicts,
                conclusion,
                differ: differ.clone(),
            }
        })
        .collect();
    // a side whose total is dumped scaled (verl's loss_scale_factor, settled with its
    // conventions): the factor of each disagreeing cell, for `scaled_loss::rejudge`
    let mut scales = Vec::new();
    for (role, judged) in &judged {
        let Ok((check, resolved, _, _)) = judged else {
            continue;
        };
        let scaled = resolved.cfg.loss_scale != crate::kernels::loss::LossScale::One;
        let entropy_from = resolved
            .conventions
            .iter()
            .find(|c| c.name == "entropy_coeff" && c.source != crate::judge::infer::Source::Preset)
            // a coefficient that does not explain the side's totals settles nothing
            .filter(|c| !crate::judge::picture::misfit(c));
        let entropy_se = entropy_from.and_then(|c| c.std_err).unwrap_or(0.0);
        let entropy_from = entropy_from.map(|c| c.line());
        let words = resolved
            .conventions
            .iter()
            .find(|c| c.name == "loss_scale")
            .map_or_else(String::new, |c| c.value.clone());
        for &(rank, micro) in &cells {
            // the factor needs the cell's rows; an unscaled side's is 1 (no read)
            let factor = match scaled {
                true => check
                    .gather(rank, micro)
                    .ok()
                    .and_then(|cell| resolved.cfg.loss_scale.factor(cell.dims().0)),
                false => Some(1.0),
            };
            if let Some(factor) = factor {
                scales.push(scaled_loss::SideScale {
                    role: (*role).to_string(),
                    rank,
                    micro,
                    factor,
                    scaled,
                    entropy_coeff: resolved.cfg.entropy_coeff,
                    entropy_from: entropy_from.clone(),
                    entropy_se,
                    words: words.clone(),
                });
            }
        }
    }
    // the picture the judge has of the side dumpdiff's own fit doubts
    let picture = judged
        .iter()
        .find(|(role, _)| picture_of == Some(*role))
        .and_then(|(_, j)| j.as_ref().ok())
        .map(|(_, resolved, _, every)| SidePicture {
            scaled: resolved.cfg.loss_scale != crate::kernels::loss::LossScale::One,
            unexplained: resolved
                .conventions
                .iter()
                .any(crate::judge::picture::misfit)
                || every
                    .iter()
                    .filter(|v| v.status == Status::Consistent)
                    .count()
                    * 2
                    <= every.len(),
        });
    Ok(Adjudicated {
        adjudication: out,
        scales,
        picture,
    })
}

/// The pg-term conventions the two sides' own cells settle differently — aggregation,
/// ratio level, clip bounds — each side's taken from the judge's picture of it when its
/// pg term follows on most of its cells (a total an unstated term moves still counts), the
/// policy only when both sides' cells settled one (not the preset's): a
/// cause the diagnosis of single cells cannot see (NexRL's `seq-mean-token-sum` is verl's
/// `seq-mean-token-mean`, `core_algos.py` `agg_loss`, nex-agi/NexRL@6860191).
fn own_conventions_differ<T>(judged: &[(&str, JudgedSide<T>)]) -> Option<String> {
    use crate::kernels::config::{PolicyKind, RatioLevel};
    let picture = |role: &str| {
        let (_, (_, r, _, every)) = judged
            .iter()
            .find(|(x, _)| *x == role)
            .and_then(|(x, j)| Some((x, j.as_ref().ok()?)))?;
        let follows = every.iter().filter(|v| pg_follows(v)).count();
        // the policy (ratio level, clip) counts only where the side's own cells settled
        // it: a preset's token ratio can pass cells that never test it
        let policy = r
            .conventions
            .iter()
            .any(|c| c.name == "policy" && c.source != crate::judge::infer::Source::Preset);
        (follows * 2 > every.len()).then_some((&r.cfg, policy))
    };
    let ((a, pa), (b, pb)) = (picture("self-hosted")?, picture("weaver")?);
    let level = |l: RatioLevel| match l {
        RatioLevel::Token => "token",
        RatioLevel::Sequence | RatioLevel::GspoToken => "sequence (GSPO)",
    };
    let mut parts = Vec::new();
    if a.agg != b.agg {
        parts.push(format!(
            "aggregation {} (self-hosted) vs {} (weaver)",
            a.agg.name(),
            b.agg.name()
        ));
    }
    if pa && pb && level(a.ratio_level) != level(b.ratio_level) {
        parts.push(format!(
            "ratio level {} vs {}",
            level(a.ratio_level),
            level(b.ratio_level)
        ));
    }
    if let (PolicyKind::Clip(x), PolicyKind::Clip(y), true) = (a.policy, b.policy, pa && pb) {
        if (x.eps_low, x.eps_high) != (y.eps_low, y.eps_high) {
            parts.push(format!(
                "clip bound {}/{} vs {}/{}",
                x.eps_low, x.eps_high, y.eps_low, y.eps_high
            ));
        }
    }
    (!parts.is_empty()).then(|| {
        format!(
            "the sides' own conventions differ (each settled from its own cells): {}",
            parts.join(", ")
        )
    })
}

/// One side as the judge settled it: its step, conventions, how they differ from the
/// preset, and every cell's verdict (or why it could not be judged).
type JudgedSide<T> = std::result::Result<
    (
        T,
        crate::judge::infer::Resolved,
        Option<String>,
        Vec<crate::judge::Verdict>,
    ),
    String,
>;

/// Whether a verdict's pg term and intermediates follow its inputs (its total may not): a
/// consistent cell, or one the judge cannot judge only for its total (an unstated term).
/// A total-only cell without coefficients (undetermined) is no evidence of its conventions.
fn pg_follows(v: &crate::judge::Verdict) -> bool {
    use crate::judge::Status;
    match v.status {
        Status::Consistent => true,
        Status::CannotJudge => crate::judge::picture::pg_term_follows(v),
        _ => false,
    }
}

/// What [`adjudicate`] settles: the verdicts of disagreeing cells, each side's scale on
/// them, and the judge's picture of the side asked about.
#[derive(Default)]
pub(super) struct Adjudicated {
    /// One adjudication per disagreeing cell.
    pub adjudication: Vec<report::Adjudication>,
    /// Each side's factor on each disagreeing cell.
    pub scales: Vec<scaled_loss::SideScale>,
    /// The judge's picture of the side `picture_of` named, when it could be judged.
    pub picture: Option<SidePicture>,
}

/// The judge's picture of one side's loss totals.
pub(super) struct SidePicture {
    /// Its totals are dumped scaled (a factor the judge settled).
    pub scaled: bool,
    /// Its conventions do not explain its totals: a misfit coefficient
    /// ([`crate::judge::picture::misfit`]) or at most half its cells consistent.
    pub unexplained: bool,
}

/// Order of sections along the data flow, for "first divergence".
pub(super) fn flow_rank(id: u8) -> u8 {
    match id {
        1 => 0,
        5 => 1,
        2 => 2,
        4 => 3,
        3 => 4,
        _ => 5,
    }
}

/// The first divergence (earliest in data flow, then comparison order, rank, micro) and
/// the worst offenders (furthest beyond tolerance).
pub(super) fn findings(sections: &[Section]) -> (Option<Finding>, Vec<Finding>) {
    let mut all = Vec::new();
    for sec in sections {
        for cell in &sec.cells {
            for (ci, c) in cell.comparisons.iter().enumerate() {
                if c.verdict < Verdict::Warn {
                    continue;
                }
                let key = (
                    c.verdict != Verdict::Fail,
                    flow_rank(sec.id),
                    ci,
                    cell.rank,
                    cell.micro,
                );
                all.push((key, finding(sec, cell, c)));
            }
        }
    }
    all.sort_by_key(|x| x.0);
    let first = all.first().map(|(_, f)| f.clone());
    let mut worst: Vec<Finding> = all.into_iter().map(|(_, f)| f).collect();
    worst.sort_by(|x, y| y.excess.total_cmp(&x.excess));
    worst.truncate(5);
    (first, worst)
}

pub(super) fn finding(sec: &Section, cell: &Cell, c: &report::Comparison) -> Finding {
    let scalar = c.shape_a.is_empty() && c.shape_b.is_empty();
    let m = c.metrics.as_ref();
    let at = m.and_then(|m| m.first_beyond.or(m.max_abs));
    let (a, b, abs_diff) = at.map_or((f64::NAN, f64::NAN, f64::NAN), |d| (d.a, d.b, d.abs_diff));
    let excess = m.map_or(f64::INFINITY, |m| m.max_excess);
    Finding {
        section: sec.name.clone(),
        name: c.name.clone(),
        rank: cell.rank,
        micro: cell.micro,
        row: at.filter(|_| !scalar).map(|d| d.loc.row),
        other_row: at.filter(|_| !scalar).map(|d| d.loc.other_row),
        pos: at.filter(|_| !scalar).map(|d| d.loc.pos),
        a,
        b,
        abs_diff,
        excess,
        verdict: c.verdict,
        reason: c.reason.clone(),
    }
}

/// The one-line answer of a cell's adjudication from its sides' verdicts, and the step's
/// own conventions that differ (`differ`).
fn conclusion_of(verdicts: &[report::SideVerdict], differ: Option<&String>) -> String {
    use crate::judge::Status;
    let with = |st: Status| -> Vec<&str> {
        verdicts
            .iter()
            .filter(|v| v.status == Some(st))
            .map(|v| v.role.as_str())
            .collect()
    };
    let (bad, good) = (with(Status::Inconsistent), with(Status::Consistent));
    let open = with(Status::Undetermined);
    let doubt = with(Status::CannotJudge);
    let conclusion = match (bad.as_slice(), good.as_slice(), open.as_slice()) {
        ([], [], []) if !doubt.is_empty() => format!(
            "cannot judge {}: the conventions found do not reproduce most of its own cells, so which side is wrong is not said",
            doubt.join(" or ")
        ),
        ([], [], []) => "neither side could be recomputed from its own inputs".to_string(),
        ([], _, []) if doubt.is_empty() => "every side's loss follows from its own inputs: the inputs differ (see the first divergence)".to_string(),
        _ => {
            // what disagrees, what matches, and a side that dumps only its total
            // with coefficients nothing states
            let mut parts = Vec::new();
            if !bad.is_empty() {
                parts.push(format!("{} loss disagrees with its own inputs", bad.join(" and ")));
            }
            if !good.is_empty() {
                parts.push(format!("{} matches", good.join(" and ")));
            }
            if !doubt.is_empty() {
                parts.push(format!(
                    "cannot judge {}: the conventions found do not reproduce most of its own cells",
                    doubt.join(" and ")
                ));
            }
            if !open.is_empty() {
                parts.push(format!(
                    "{} loss cannot be judged: only its total is dumped and nothing states its coefficients (--entropy-coeff, --kl-coef)",
                    open.join(" and ")
                ));
            }
            parts.join("; ")
        }
    };
    let conclusion = match &differ {
        Some(d) if good.len() == verdicts.len() => {
            format!("every side's loss follows from its own inputs; {d}")
        }
        Some(d) => format!("{conclusion}; {d}"),
        None => conclusion,
    };
    conclusion
}

/// A side judged without a file of its cell that was set aside as unreadable is not
/// called inconsistent there: "cannot judge", the file named (a weaver cell whose
/// forward_data is cut has no entropy and no rows for its loss scale; 7947), and the
/// cell's conclusion said again.
pub(super) fn set_aside_sides(
    adjudication: &mut [report::Adjudication],
    unreadable: &[crate::model::unreadable::Unreadable],
) {
    use crate::judge::Status;
    for a in adjudication {
        let mut changed = false;
        for sd in &mut a.sides {
            let gone = unreadable.iter().find(|u| {
                u.role == sd.role && u.rank == Some(a.rank) && u.micro.is_none_or(|m| m == a.micro)
            });
            if let (Some(u), Some(Status::Inconsistent)) = (gone, sd.status) {
                sd.status = Some(Status::CannotJudge);
                sd.detail = format!(
                    "cannot judge: {} could not be read, and the cell's loss needs it; {}",
                    u.path.display(),
                    sd.detail
                );
                changed = true;
            }
        }
        if changed {
            a.conclusion = conclusion_of(&a.sides, a.differ.as_ref());
        }
    }
}

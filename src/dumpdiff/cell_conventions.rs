//! What a self-hosted vs weaver cell needs of the sides' conventions beyond its tensors:
//! the aggregation mode and KL coefficient behind its loss tolerances, the advantage
//! epsilon its weaver rows imply, and the diagnosis of a disagreeing loss.

use std::borrow::Cow;
use std::collections::HashMap;

use super::conventions;
use super::diagnosis;
use super::report::Section;
use super::sections::{self, SideData, Tensors};
use crate::compare::tolerance::Verdict;
use crate::conventions::{advantage, aggregation};
use crate::kernels::aggregate::AggMode;
use crate::model::conventions::{ConventionKey, ConventionValue, Conventions};
use crate::model::record::{Field, Record};
use crate::model::step::{LossRecord, ENTROPY_COEFF};

/// One cell's loss file on each side (self-hosted, weaver), when present.
pub(super) type LossPair<'a> = (Option<Cow<'a, Record>>, Option<Cow<'a, Record>>);

/// Every cell's loss file on each side (self-hosted, weaver), read before the cells: the
/// coefficients of each side come from all of them, and the cells' tolerances need them.
pub(super) struct LossFiles<'a> {
    pub(super) files: HashMap<(u32, Option<u32>), LossPair<'a>>,
    /// The self-hosted KL coefficient (flag, read or inferred).
    pub(super) kl_coef: Option<f64>,
}

impl LossFiles<'_> {
    pub(super) fn get(&self, key: &(u32, Option<u32>)) -> Option<&LossPair<'_>> {
        self.files.get(key)
    }
}

/// What the self-hosted vs weaver sections learnt of the sides' conventions.
#[derive(Default)]
pub(super) struct WeaverConventions {
    /// Loss terms and echoed coefficients of every self-hosted cell.
    pub(super) self_hosted: conventions::SideLosses,
    /// The same for the weaver.
    pub(super) weaver: conventions::SideLosses,
    /// Conventions inferred to recompute what a side did not dump, one sentence each.
    pub(super) notes: Vec<String>,
    /// One line per cell whose loss disagrees, naming the term that differs.
    pub(super) diagnosis: Vec<String>,
    /// What each line was diagnosed from, to diagnose it again once a side's total is
    /// found scaled ([`rediagnose_scaled`]).
    pub(super) diagnosed: Vec<Diagnosed>,
    /// The epsilon the self-hosted advantages were recomputed with (flag, inferred from
    /// the weaver's advantages, or the preset's); the adjudication judges with it.
    pub(super) adv_eps: Option<f64>,
}

/// When a side's KL coefficient is neither echoed nor inferable (one cell fits two
/// unknowns), a bound from the cell itself: its whole `loss − pg_loss` taken as the KL
/// term, `|loss − pg_loss| / |kl_loss|`. `None` without a dumped `kl_loss`.
pub(super) fn kl_coef_bound(loss: &Record) -> Option<f64> {
    let num = |f: Field| loss.number(f).map(|n| n.value);
    let kl = loss
        .metric("kl_loss")
        .flatten()
        .map(|n| n.value)
        .or_else(|| num(Field::KlLoss))?;
    let rest = num(Field::Loss)? - num(Field::PgLoss)?;
    (kl != 0.0).then(|| (rest / kl).abs())
}

/// The self-hosted cell's aggregation mode: echoed with its loss record (`stated`), else
/// the one that reproduces its dumped `pg_loss` / `entropy_loss` from its valid elements.
pub(super) fn agg_mode(
    ch: &sections::Chain,
    a_fwd: &Tensors<'_>,
    loss: Option<&Record>,
    stated: Option<&Conventions>,
) -> Option<AggMode> {
    let loss = loss?;
    let echoed = stated.and_then(|c| match &c.get(ConventionKey::Aggregation)?.value {
        ConventionValue::Name(name) => Some((name.clone(), c.number(ConventionKey::LossScale))),
        _ => None,
    });
    if let Some((name, scale)) = echoed {
        // `-norm` needs its divisor (`loss_scale_factor`): without it, inferred below
        match (AggMode::parse(&name), scale) {
            (Some(AggMode::SeqMeanTokenSumNorm { horizon: None }), Some(h)) => {
                return Some(AggMode::SeqMeanTokenSumNorm { horizon: Some(h) })
            }
            (Some(AggMode::SeqMeanTokenSumNorm { horizon: None }), None) | (None, _) => {}
            (Some(m), _) => return Some(m),
        }
    }
    let stats = ch.stats.as_ref()?;
    let x = sections::ModeInputs::of(ch, a_fwd);
    let pg: Vec<f64> = stats
        .iter()
        .zip(&x.advantage)
        .map(|(e, a)| -e.ratio * a)
        .collect();
    let num = |f: Field| loss.number(f).map(|n| n.value);
    let mut dumped = Vec::new();
    // pg elements: f64 exp of f32 log-probs against the trainer's f32 (a few ulps each)
    if let Some(value) = num(Field::PgLoss) {
        dumped.push(aggregation::Dumped {
            elems: &pg,
            u: 2f64.powi(-22),
            value,
        });
    }
    if let (Some(value), Some(u)) = (num(Field::EntropyLoss), x.entropy_u) {
        dumped.push(aggregation::Dumped {
            elems: &x.entropy,
            u,
            value,
        });
    }
    aggregation::cell_mode(&ch.extra.row_counts, &dumped)
}

/// The advantage epsilon each weaver row of a cell implies ([`advantage::eps_estimate`]):
/// its dumped advantage (the first non-zero one of the row) against the self-hosted
/// trajectory it pairs with by content.
pub(super) fn eps_estimates(
    parts: &[(f64, f64)],
    ch: &sections::Chain,
    a: &Tensors<'_>,
    b_ids: Option<&Tensors<'_>>,
    b_is: &Tensors<'_>,
) -> Vec<f64> {
    let Some(adv) = b_is.mat(Field::Advantages) else {
        return Vec::new();
    };
    let na = a.mat(Field::LogProbs).map_or(0, |m| m.rows);
    let rows = sections::pair_rows(a, b_ids, na, adv.rows);
    rows.pairs
        .iter()
        .filter_map(|&(ra, rb)| {
            let (d, sd) = *parts.get((*ch.idx.get(ra)?)?)?;
            let value = adv.row(rb).iter().copied().find(|v| *v != 0.0)?;
            advantage::eps_estimate(d, sd, value)
        })
        .collect()
}

/// One diagnosed cell: its coordinates, both sides' loss records and coefficients.
pub(super) type Diagnosed = (
    (u32, u32),
    LossRecord,
    LossRecord,
    (diagnosis::Coeffs, diagnosis::Coeffs),
);

/// The diagnosis of every cell whose loss disagrees ([`diagnosis::diagnose`]), from both
/// sides' loss records and coefficients, with what each was diagnosed from.
pub(super) fn diagnose_losses(
    sections: &[Section],
    s: &SideData,
    w: &SideData,
    losses: &LossFiles<'_>,
    conv: &WeaverConventions,
    overrides: &std::collections::BTreeMap<String, f64>,
) -> (Vec<String>, Vec<Diagnosed>) {
    let coeffs = |side: &conventions::SideLosses| diagnosis::Coeffs {
        entropy: conventions::value(ENTROPY_COEFF, side, overrides).unwrap_or(0.0),
        kl: conventions::value("kl_coef", side, overrides).unwrap_or(0.0),
    };
    let cs = (coeffs(&conv.self_hosted), coeffs(&conv.weaver));
    let record = |side: &SideData, key: (u32, Option<u32>), v: Option<&Cow<'_, Record>>| {
        side.loss_record(key.0, key.1, v?)?.ok()
    };
    diagnosis::failing_loss_cells(sections)
        .into_iter()
        .filter_map(|(rank, micro)| {
            let key = (rank, Some(micro));
            let (a, b) = losses.get(&key)?;
            let (a, b) = (record(s, key, a.as_ref())?, record(w, key, b.as_ref())?);
            let line = diagnose_cell(sections, (rank, micro), &a, &b, cs)?;
            Some((line, ((rank, micro), a, b, cs)))
        })
        .unzip()
}

/// When one side's loss holds a term nothing states ([`conventions::unstated_term`]:
/// `why`), no loss total can say which side is wrong: every failing `loss.loss` /
/// `is_loss.loss` becomes a warning saying so, and a cell left without a failure is
/// diagnosed with `why` instead of a term (issue 28).
pub(super) fn unstated_cells(sections: &mut [Section], diagnosis: &mut [String], why: &str) {
    const TOTALS: [&str; 2] = ["loss.loss", "is_loss.loss"];
    // the weaver's importance weights each cell's is_loss read off its own rollout
    // log-probs (the per-token loss matched only with them applied)
    let weighted: HashMap<(u32, u32), String> = sections
        .iter()
        .filter(|sec| sec.name == "is_loss")
        .flat_map(|sec| &sec.cells)
        .filter_map(|c| Some(((c.rank?, c.micro?), diagnosis::weighted(Some(c))?)))
        .collect();
    for sec in sections.iter_mut() {
        sections::totals_cannot_judge(sec.cells.iter_mut(), &TOTALS, why);
        for c in sec.cells.iter_mut() {
            let scheme = c.rank.zip(c.micro).and_then(|k| weighted.get(&k));
            if let Some(scheme) = scheme {
                weights_beside(c, &TOTALS, why, scheme);
            }
        }
        sec.verdict = sec
            .cells
            .iter()
            .map(|c| c.verdict)
            .max()
            .unwrap_or(sec.verdict);
    }
    for line in diagnosis.iter_mut() {
        let cell = line.split(':').next().and_then(|h| {
            let mut w = h.split_whitespace().skip(1).step_by(2);
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        });
        if let Some((rank, micro)) = cell.filter(|c| !fails_in(sections, *c)) {
            *line = format!("rank {rank} micro {micro}: {why}");
        }
    }
}

/// A total made "cannot judge" by a term no file states (`why`) in a cell whose weaver
/// weighs its per-token loss by importance weights read off its own rollout log-probs
/// (`scheme`, [`diagnosis::weighted`]): the weights are a second difference of the
/// totals, named beside the unstated term (seeds 7116, 7213: within the log-probs'
/// rounding on the pg term, yet the total's difference is theirs and the term's).
fn weights_beside(cell: &mut super::report::Cell, names: &[&str], why: &str, scheme: &str) {
    let touched = |x: &super::report::Comparison| {
        names.contains(&x.name.as_str())
            && x.verdict == Verdict::Warn
            && x.reason.contains(why)
            && !x.reason.contains("importance weight")
    };
    if !cell.comparisons.iter().any(touched) {
        return;
    }
    sections::rework(cell, |out| {
        for x in out.iter_mut().filter(|x| touched(x)) {
            x.reason = format!(
                "{}; besides, the weaver weighs its per-token loss by an importance weight \
                 ({scheme}, against its own rollout_log_probs) the self-hosted side does not \
                 apply",
                x.reason
            );
        }
    });
}

/// Whether any comparison of cell (rank, micro) fails, in any section.
fn fails_in(sections: &[Section], (rank, micro): (u32, u32)) -> bool {
    sections
        .iter()
        .flat_map(|sec| &sec.cells)
        .filter(|c| c.rank == Some(rank) && c.micro == Some(micro))
        .any(|c| c.comparisons.iter().any(|x| x.verdict == Verdict::Fail))
}

fn diagnose_cell(
    sections: &[Section],
    (rank, micro): (u32, u32),
    a: &LossRecord,
    b: &LossRecord,
    cs: (diagnosis::Coeffs, diagnosis::Coeffs),
) -> Option<String> {
    let cell_of = |name: &str| {
        sections
            .iter()
            .filter(|sec| sec.name == name)
            .flat_map(|sec| &sec.cells)
            .find(|c| c.rank == Some(rank) && c.micro == Some(micro))
    };
    let cells = (cell_of("is_loss"), cell_of("forward_data"));
    diagnosis::diagnose((rank, micro), a, b, cs, cells)
}

/// The diagnosis lines of cells whose dumped total a side scaled (`scales`, the judge's
/// factors), diagnosed again from each side's total divided by its factor: the scaled
/// total would otherwise put the whole scale into "the sum of the terms". Other lines
/// are kept.
pub(super) fn rediagnose_scaled(
    sections: &[Section],
    lines: &mut [String],
    diagnosed: &[Diagnosed],
    scales: &[super::scaled_loss::SideScale],
) {
    for (line, ((rank, micro), a, b, cs)) in lines.iter_mut().zip(diagnosed) {
        let scale = |role: &str| {
            scales
                .iter()
                .find(|s| s.scaled && s.role == role && (s.rank, s.micro) == (*rank, *micro))
        };
        let (fa, fb) = (scale("self-hosted"), scale("weaver"));
        if fa.is_none() && fb.is_none() {
            continue;
        }
        // the total divided by its factor, the entropy coefficient the judge settled with
        // it (one fitted to the scaled totals absorbs the scale)
        let unscale =
            |r: &LossRecord, c: diagnosis::Coeffs, f: Option<&super::scaled_loss::SideScale>| {
                let r = LossRecord {
                    loss: r.loss.map(|l| l / f.map_or(1.0, |f| f.factor)),
                    ..r.clone()
                };
                let c = diagnosis::Coeffs {
                    entropy: f.map_or(c.entropy, |f| f.entropy_coeff),
                    ..c
                };
                (r, c)
            };
        let ((ua, ca), (ub, cb)) = (unscale(a, cs.0, fa), unscale(b, cs.1, fb));
        if let Some(l) = diagnose_cell(sections, (*rank, *micro), &ua, &ub, (ca, cb)) {
            *line = format!("{l} (totals compared unscaled)");
        }
    }
}

/// The row order of the self-hosted whole-batch `old_log_probs`, settled from the data
/// once per step by the judge ([`crate::judge::SelfHostedStep::settle_old_order`]): the
/// trajectory file's, or NexRL's batch order (trajectories dumped as they arrived, the
/// batch sorted before old_log_probs is computed). The order when it is NexRL's, and the
/// evidence for the report's conventions when the trajectories give one to try.
pub(super) fn old_order(
    s: &SideData,
    traj: Option<&crate::model::trajectory::TrajectorySummary>,
) -> (Option<Vec<usize>>, Option<String>) {
    let (Some(ts), Some((of, ov))) = (
        traj,
        s.get_file(crate::model::tree::Kind::OldLogProbs, None, None),
    ) else {
        return (None, None);
    };
    let Ok(cfg) = crate::kernels::presets::preset("nexrl-is") else {
        return (None, None);
    };
    let Ok(mut step) =
        crate::judge::SelfHostedStep::from_summary_record(ts, of.path.clone(), ov, &cfg.advantage)
    else {
        return (None, None);
    };
    match step.settle_old_order(&s.tree, s.step) {
        Some((true, evidence)) => (
            step.old_order().map(<[usize]>::to_vec),
            Some(format!(
                "self-hosted old_log_probs rows are in NexRL's batch order (sorted by task_id, \
                 uid/group_id, run_id before old_log_probs is computed), not the trajectory \
                 file's arrival order: {evidence}"
            )),
        ),
        _ => (None, None),
    }
}

/// Where NexRL deals the self-hosted rows when the step dumps no old log-probs to place
/// them by ([`crate::judge::Dealer`], asked only by cells whose rows no token ids place);
/// `None` with old log-probs or without trajectories.
pub(super) fn dealer(
    s: &SideData,
    traj: Option<&crate::model::trajectory::TrajectorySummary>,
    inputs: &crate::dumpdiff::sections::BatchInputs,
) -> Option<std::sync::Arc<crate::judge::Dealer>> {
    if inputs.old_log_probs.is_some() {
        return None;
    }
    let cfg = crate::kernels::presets::preset("nexrl-is").ok()?;
    crate::judge::Dealer::new(traj?, &cfg.advantage, &s.tree, s.step).map(std::sync::Arc::new)
}

//! The sections of each pair of sides: self-hosted vs weaver (2, 3, 4 and the whole
//! tensors), self-hosted vs remote-api (1, 5), cell by cell.

use super::*;
use crate::conventions::advantage;
use crate::dumpdiff::cell_conventions::{
    agg_mode, diagnose_losses, eps_estimates, kl_coef_bound, LossFiles, WeaverConventions,
};
use crate::model::record::{Field, Record};
use crate::model::tokens::TokenSeq;

/// What one (rank, micro) cell contributes to sections 2, 3 and 4. A `*_only_a` is set
/// when the cell's file of that section is on one side only (true: on self-hosted).
#[derive(Default)]
pub(super) struct CellOut {
    fwd: Option<Cell>,
    fwd_only_a: Option<bool>,
    loss: Option<(Cell, Vec<String>)>,
    loss_only_a: Option<bool>,
    is_loss: Option<(Cell, Option<sections::SequenceAlt>)>,
    is_only_a: Option<bool>,
    /// The advantage epsilon each paired weaver row implies (see
    /// [`advantage::eps_estimate`]).
    eps: Vec<f64>,
    /// The self-hosted rows were realigned to the weaver's layout ([`Tensors::realign`]).
    realigned: bool,
    /// The weaver's per-token loss carries weights: `Some(true)` read from its own rollout
    /// log-probs ([`sections::Weights::Seen`]), `Some(false)` not dumped
    /// ([`sections::Weights::Unseen`]).
    weights: Option<bool>,
}

/// The (rank, micro) cells of sections 2 (`fwd`), 3 (`loss`) and 4 (`is_loss`).
pub(super) struct CellSets {
    fwd: BTreeSet<(u32, Option<u32>)>,
    loss: BTreeSet<(u32, Option<u32>)>,
    is_loss: BTreeSet<(u32, Option<u32>)>,
}

/// Which side of a pair holds a file when exactly one does.
pub(super) fn only_a<T>(a: &Option<T>, b: &Option<T>) -> Option<bool> {
    (a.is_some() != b.is_some()).then_some(a.is_some())
}

/// `side`'s file of `kind` at `(rank, micro)` when `wanted` (see [`SideData::fetch`]).
pub(super) fn fetch_if<'a>(
    side: &'a SideData,
    kind: Kind,
    (rank, micro): (u32, Option<u32>),
    wanted: bool,
    progress: &dyn Progress,
) -> Result<Option<Cow<'a, Record>>> {
    if wanted {
        side.fetch(kind, Some(rank), micro, progress)
    } else {
        Ok(None)
    }
}

/// Compare one (rank, micro) cell for sections 2, 3 and 4: read its files on both sides,
/// decode each tensor once, derive the self-hosted importance-sampling chain, compare,
/// and drop everything but the cells.
#[allow(clippy::too_many_arguments)]
pub(super) fn weaver_cell(
    s: &SideData,
    w: &SideData,
    inputs: &BatchInputs,
    policy: &TolerancePolicy,
    sets: &CellSets,
    losses: &LossFiles<'_>,
    (rank, micro): (u32, Option<u32>),
    progress: &dyn Progress,
) -> Result<CellOut> {
    let key = (rank, micro);
    let m = micro.unwrap_or(0);
    let (in_fwd, in_loss, in_is) = (
        sets.fwd.contains(&key),
        sets.loss.contains(&key),
        sets.is_loss.contains(&key),
    );
    let (fwd, lossy) = (in_fwd || in_is, in_loss || in_is);
    let fetch = |side, kind, wanted| fetch_if(side, kind, key, wanted, progress);
    let s_fwd = fetch(s, Kind::ForwardData, fwd)?;
    let w_fwd = fetch(w, Kind::ForwardData, fwd)?;
    let w_is = fetch(w, Kind::IsLossDebug, fwd)?;
    let (s_loss, w_loss) = match losses.get(&key) {
        Some((a, b)) => (
            a.as_deref().filter(|_| lossy),
            b.as_deref().filter(|_| in_loss),
        ),
        None => (None, None),
    };
    let (a_fwd, b_fwd, b_is) = (
        s_fwd.as_deref().map(Tensors::new),
        w_fwd.as_deref().map(Tensors::new),
        w_is.as_deref().map(Tensors::new),
    );
    // The weaver rows' identity: its forward_data's input_ids, else those of its
    // batch_inputs, read only when forward_data lacks them.
    let fwd_has_ids = w_fwd.as_deref().is_some_and(|v| v.has(Field::InputIds));
    let w_bi = fetch(w, Kind::BatchInputs, fwd && !fwd_has_ids)?;
    let b_bi = w_bi.as_deref().map(Tensors::new);
    // The self-hosted micro's own old_log_probs, when it writes them per micro.
    let s_old = fetch(s, Kind::OldLogProbs, fwd)?;
    let a_old = s_old.as_deref().map(Tensors::new);
    let b_ids = if fwd_has_ids {
        b_fwd.as_ref()
    } else {
        b_bi.as_ref().or(b_fwd.as_ref())
    };
    let mut out = CellOut::default();
    // NexRL's 1-token-prompt layout against a response-aligned one: the self-hosted rows
    // realigned (every per-token tensor of the forward_data, and the chain's old rows)
    if let (Some(a), Some(b)) = (&a_fwd, &b_fwd) {
        if let Some(sh) = a.layout_shifts(b_ids.unwrap_or(b), b, Field::ResponseMask) {
            a.realign(&[Field::LogProbs, Field::Entropy, Field::ResponseMask], sh);
            out.realigned = true;
        }
        sections::pair_through_batch(inputs, a, b_ids);
    }

    // Section 2: forward_data; also gives the cell's log-prob precision.
    let mut precision = None;
    if in_fwd {
        if let (Some(a), Some(b)) = (&a_fwd, &b_fwd) {
            precision = sections::logprob_precision(
                a.mat(Field::LogProbs).as_deref(),
                b.mat(Field::LogProbs).as_deref(),
            );
            out.fwd = Some(sections::forward_data_cell(
                policy,
                rank,
                m,
                a,
                b,
                b_ids.unwrap_or(b),
            ));
        }
        out.fwd_only_a = only_a(&a_fwd, &b_fwd);
    }

    // The self-hosted importance-sampling chain: derived ratios and the tolerances they
    // and the loss scalars inherit from their log-prob inputs.
    let mut chain = a_fwd.as_ref().filter(|_| in_fwd).map(|a| {
        let peer = sections::ChainPeer {
            fwd: b_fwd.as_ref(),
            ids: b_ids,
            is_loss: b_is.as_ref(),
        };
        sections::chain(policy, inputs, a, peer, a_old.as_ref(), (rank, m))
    });

    // How the self-hosted loss reduces its tokens and its KL coefficient: what its
    // loss scalars' tolerances need.
    if let (Some(ch), Some(a)) = (&mut chain, &a_fwd) {
        ch.kl_coef = losses.kl_coef.or_else(|| kl_coef_bound(s_loss?));
        let stated = s_loss.and_then(|l| s.loss_conventions(rank, Some(m), l));
        if let Some(mode) = agg_mode(ch, a, s_loss, stated.as_ref()) {
            ch.agg = mode;
        }
    }
    // The advantage epsilon each paired weaver row implies, when the self-hosted
    // advantages are recomputed from rewards.
    if let (Some(parts), Some(ch), Some(a), Some(bis)) = (&inputs.adv_parts, &chain, &a_fwd, &b_is)
    {
        out.eps = eps_estimates(parts, ch, a, b_ids, bis);
    }

    // The chain's aggregates the loss scalars' tolerances read (each a pass over every
    // valid element), computed once for sections 3 and 4.
    let memo = sections::StatsMemo::new(chain.as_ref(), s_loss);

    // Section 3: loss.
    if in_loss {
        match (s_loss, w_loss) {
            (Some(a), Some(b)) => {
                out.loss = Some(sections::loss_cell(policy, rank, m, a, b, precision, &memo));
            }
            (a, b) => out.loss_only_a = Some(a.is_some() && b.is_none()),
        }
    }

    // Section 4: is_loss_debug against the self-hosted forward_data + old_log_probs.
    if in_is {
        if let (Some(a), Some(b), Some(ch)) = (&a_fwd, &b_is, &chain) {
            let (cell, alt, weights, band) =
                sections::is_loss_cell(policy, rank, m, a, (s_loss, w_loss), b, b_ids, ch, &memo);
            // tokens between two clip bounds explain the totals' difference (seed 7942)
            if let (Some(band), Some((loss, _))) = (band, out.loss.as_mut()) {
                sections::note_clip_band(loss, &band);
            }
            out.is_loss = Some((cell, alt));
            out.weights = weights
                .as_ref()
                .map(|w| matches!(w, sections::Weights::Seen(_)));
            // the weaver's loss scalars carry the same per-token weight
            if let (Some(w), Some((loss, _))) = (weights, out.loss.as_mut()) {
                sections::rework(loss, |c| {
                    w.apply_to_totals(c, &["loss.loss", "loss.pg_loss"])
                });
            }
        }
        out.is_only_a = only_a(&a_fwd, &b_is);
        if let (Some((loss, _)), Some((is_loss, _))) = (out.loss.as_mut(), out.is_loss.as_mut()) {
            sections::clip_fractions(loss, is_loss);
            sections::note_rejection(loss, is_loss);
            sections::agg_unseen_in_loss(loss, is_loss);
            sections::agg_in_loss(loss, is_loss);
        }
    }
    if let Some(ch) = &chain {
        ch.release_old();
    }
    Ok(out)
}

/// A cell whose `is_loss_debug` was not read has no per-token loss to show its weights:
/// when the weaver's other cells carry some, its failing loss totals are read in their
/// light (issue 28): unseen weights make them a warning, seen ones the likely cause.
fn weights_elsewhere(keys: &[(u32, Option<u32>)], outs: &mut [CellOut]) {
    let cells = |seen: bool| -> Vec<String> {
        keys.iter()
            .zip(outs.iter())
            .filter(|(_, o)| o.weights == Some(seen))
            .map(|((r, m), _)| format!("rank {r} micro {}", m.unwrap_or(0)))
            .collect()
    };
    let Some(why) = sections::Weights::elsewhere(&cells(true), &cells(false)) else {
        return;
    };
    for o in outs.iter_mut().filter(|o| o.is_loss.is_none()) {
        if let Some((loss, _)) = o.loss.as_mut() {
            sections::rework(loss, |c| {
                why.apply_to_totals(c, &["loss.loss", "loss.pg_loss"])
            });
        }
    }
}

/// Sections 2, 3, 4 and 6: self-hosted against weaver, cell by cell.
#[allow(clippy::too_many_arguments)]
pub(super) fn weaver_sections(
    s: &SideData,
    w: &SideData,
    r: Option<&SideData>,
    traj: Option<&TrajectorySummary>,
    opts: &Options,
    coverage: &mut Vec<Coverage>,
    conv: &mut WeaverConventions,
    progress: &dyn Progress,
    params: &mut dyn FnMut() -> Option<Result<ParamSections>>,
) -> Result<Vec<Section>> {
    let (adv_preset, policy) = (opts.advantage_preset.as_deref(), &opts.policy);
    let pair = "self-hosted vs weaver";
    let mut note_missing = |kind: Kind, rank: u32, micro: Option<u32>, a_has: bool| {
        note_missing_in(&mut *coverage, kind, rank, micro, a_has)
    };
    let mut out = Vec::new();

    let has_is = w.tree.kinds().contains(&Kind::IsLossDebug);
    let sets = CellSets {
        fwd: cells_of(s, Kind::ForwardData, w, Kind::ForwardData),
        loss: cells_of(s, Kind::Loss, w, Kind::Loss),
        is_loss: if has_is {
            cells_of(s, Kind::ForwardData, w, Kind::IsLossDebug)
        } else {
            BTreeSet::new()
        },
    };
    let keys: Vec<(u32, Option<u32>)> = sets
        .fwd
        .iter()
        .chain(&sets.loss)
        .chain(&sets.is_loss)
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    // The loss files first (small scalar dicts): each side's coefficients, read or
    // inferred over every cell, are known before any cell is compared.
    let loss_keys: Vec<(u32, Option<u32>)> = sets.loss.union(&sets.is_loss).copied().collect();
    let files: HashMap<_, _> = loss_keys
        .par_iter()
        .map(|&key| {
            let a = s.fetch(Kind::Loss, Some(key.0), key.1, progress)?;
            let b = w.fetch(Kind::Loss, Some(key.0), key.1, progress)?;
            Ok((key, (a, b)))
        })
        .collect::<Result<_>>()?;
    // In rank/micro order, so that the fits add their terms in one order every run.
    for (&(rank, micro), (a, b)) in loss_keys.iter().filter_map(|k| Some((k, files.get(k)?))) {
        for (side, v, acc) in [(s, a, &mut conv.self_hosted), (w, b, &mut conv.weaver)] {
            let Some(v) = v else { continue };
            if let Some(Ok(rec)) = side.loss_record(rank, micro, v) {
                acc.push_at((rank, micro), &rec);
            }
        }
    }
    // a cell whose loss file was set aside as unreadable is still one of the step's
    // micros (the bound on a loss scale's 1/k: 9217 with one weaver loss file cut)
    for acc in [&mut conv.self_hosted, &mut conv.weaver] {
        acc.cells = acc.cells.max(loss_keys.len());
    }
    let losses = LossFiles {
        files,
        kl_coef: conventions::value("kl_coef", &conv.self_hosted, &opts.coefficients),
    };
    let mut inputs = batch_inputs(s, r, traj, adv_preset, opts.advantage_eps)?;
    let (old_of_traj, order_note) = crate::dumpdiff::cell_conventions::old_order(s, traj);
    conv.notes.extend(order_note);
    inputs.old_of_traj = old_of_traj.clone();
    let dealer = crate::dumpdiff::cell_conventions::dealer(s, traj, &inputs);
    inputs.dealer = dealer.clone();
    // One cell a task (`with_max_len(1)`): rayon otherwise runs a split-off range of cells
    // in one sequential piece that no idle thread can steal from, and a run ended with one
    // thread comparing its last few cells alone.
    let run_cells = |inputs: &BatchInputs| -> Result<Vec<CellOut>> {
        keys.par_iter()
            .with_max_len(1)
            .map(|&key| weaver_cell(s, w, inputs, policy, &sets, &losses, key, progress))
            .collect()
    };
    let mut outs = run_cells(&inputs)?;
    if let Some(how) = dealer.as_deref().and_then(crate::judge::Dealer::how) {
        conv.notes.push(format!(
            "self-hosted rows of a forward_data file without input_ids: {how}"
        ));
    }
    if outs.iter().any(|o| o.realigned) {
        conv.notes.push(
            "self-hosted rows realigned to the weaver's: their response-width tensors hold the \
             prompt too (NexRL's 1-token-prompt layout), so each row is moved left to its first \
             valid position; positions are the weaver's"
                .into(),
        );
    }
    // The advantage epsilon: when the weaver's advantages agree on one other than the
    // preset's (and no flag gave it), recompute the self-hosted advantages with it and
    // compare again. The epsilon the evidence settles (the flag's, the weaver rows', else
    // the one remote-api's advantages imply) is the one the adjudication judges with.
    conv.adv_eps = opts.advantage_eps;
    if let (Some(preset_eps), None) = (inputs.adv_eps, opts.advantage_eps) {
        let est: Vec<f64> = outs.iter().flat_map(|o| o.eps.iter().copied()).collect();
        if let Some((eps, n)) = advantage::infer_eps(&est) {
            conv.adv_eps = Some(preset_eps);
            if (eps - preset_eps).abs() > 2e-7 + 1e-3 * preset_eps {
                conv.notes.push(format!(
                    "advantage epsilon {eps:e} inferred from {n} weaver is_loss_debug advantage rows \
                     (the preset's is {preset_eps:e}): the self-hosted advantages are recomputed with it \
                     (--adv-eps overrides)"
                ));
                conv.adv_eps = Some(eps);
                inputs = batch_inputs(s, r, traj, adv_preset, Some(eps))?;
                inputs.old_of_traj = old_of_traj.clone();
                inputs.dealer = dealer.clone();
                outs = run_cells(&inputs)?;
            }
        }
    }
    if conv.adv_eps.is_none() && inputs.adv_eps.is_none() {
        conv.adv_eps = match (traj, adv_preset, &inputs.advantages) {
            (Some(tr), Some(p), Some(a)) => advantage::eps_of_advantages(tr, p, a),
            _ => None,
        };
    }

    weights_elsewhere(&keys, &mut outs);
    sections::rejection_elsewhere(keys.iter().zip(outs.iter_mut()).map(|(k, o)| {
        let is_loss = o.is_loss.as_ref().map(|x| &x.0);
        (*k, o.loss.as_mut().map(|x| &mut x.0), is_loss)
    }));
    // Section 2: the compared cells, then those on one side only, ordered by rank/micro.
    let mut cells: Vec<Cell> = outs.iter_mut().filter_map(|o| o.fwd.take()).collect();
    for (&(rank, micro), o) in keys.iter().zip(&outs) {
        if let Some(a_has) = o.fwd_only_a {
            cells.push(note_missing(Kind::ForwardData, rank, micro, a_has));
        }
    }
    sort_cells(&mut cells);
    out.push(section(2, "forward_data", pair, cells, vec![]));

    // Section 3: loss, in rank/micro order.
    let mut notes = Vec::new();
    let mut cells = Vec::new();
    for (&(rank, micro), o) in keys.iter().zip(&mut outs) {
        if let Some((c, n)) = o.loss.take() {
            cells.push(c);
            notes.extend(n);
        } else if let Some(a_has) = o.loss_only_a {
            cells.push(note_missing(Kind::Loss, rank, micro, a_has));
        }
    }
    out.push(section(3, "loss", pair, cells, notes));

    // Section 4: is_loss_debug.
    if has_is {
        let mut judged: Vec<(Cell, Option<sections::SequenceAlt>)> =
            outs.iter_mut().filter_map(|o| o.is_loss.take()).collect();
        let level = sections::settle_ratio_level(&mut judged);
        let mut cells: Vec<Cell> = judged.into_iter().map(|(c, _)| c).collect();
        for (&(rank, micro), o) in keys.iter().zip(&outs) {
            if let Some(a_has) = o.is_only_a {
                cells.push(note_missing(Kind::IsLossDebug, rank, micro, a_has));
            }
        }
        sort_cells(&mut cells);
        let mut notes: Vec<String> = level.into_iter().collect();
        if inputs.advantages.is_none() {
            notes.push("advantages and elementwise_loss need the remote-api prepared_trajectories (--remote-api-dir)".into());
        }
        out.push(section(4, "is_loss", pair, cells, notes));
    }

    // Section 6: param / gradient, usually compared ahead (see [`param_sections`]).
    let params = match params() {
        Some(p) => p,
        None => param_sections(s, w, policy, progress, true),
    }?;
    out.extend(params.sections);
    coverage.extend(params.coverage);
    sections::totals_over_differing_inputs(&mut out);
    sections::clip_fractions_settled(&mut out);
    sections::clip_fractions_by_level(&mut out);
    (conv.diagnosis, conv.diagnosed) =
        diagnose_losses(&out, s, w, &losses, conv, &opts.coefficients);
    Ok(out)
}

/// The coverage entry of a self-hosted vs weaver file on one side only (`a_has`: on the
/// self-hosted side), pushed to `coverage`, and the cell that says so.
fn note_missing_in(
    coverage: &mut Vec<Coverage>,
    kind: Kind,
    rank: u32,
    micro: Option<u32>,
    a_has: bool,
) -> Cell {
    let (present_on, missing_on) = if a_has {
        ("self-hosted", "weaver")
    } else {
        ("weaver", "self-hosted")
    };
    coverage.push(Coverage {
        kind: kind.dir_name().into(),
        rank: Some(rank),
        micro,
        present_on: present_on.into(),
        missing_on: missing_on.into(),
    });
    sections::missing_cell(Some(rank), micro, present_on, missing_on)
}

/// Section 6 (param / gradient: self-hosted per rank, weaver per rank or per micro) and the
/// coverage entries of its files on one side only, in the order [`weaver_sections`] reports
/// them.
pub(super) struct ParamSections {
    pub(super) sections: Vec<Section>,
    pub(super) coverage: Vec<Coverage>,
}

/// [`ParamSections`] of `s` against `w`, rank by rank (in parallel, or one after the other
/// on the calling thread): one rank's tensors in memory per thread. It reads only per-rank
/// files and needs no cell's outcome, so [`super::run_with_progress`] computes it ahead,
/// while the whole-batch files are read.
pub(super) fn param_sections(
    s: &SideData,
    w: &SideData,
    policy: &TolerancePolicy,
    progress: &dyn Progress,
    parallel: bool,
) -> Result<ParamSections> {
    let pair = "self-hosted vs weaver";
    let mut coverage = Vec::new();
    let mut note_missing = |kind: Kind, rank: u32, micro: Option<u32>, a_has: bool| {
        note_missing_in(&mut coverage, kind, rank, micro, a_has)
    };
    let mut sections_out = Vec::new();
    for (kind, key, field) in [
        (Kind::Param, "param", Field::Param),
        (Kind::Gradient, "gradient", Field::Gradient),
    ] {
        // A weaver writing these per micro writes one for each micro of its rank: the
        // micros its forward_data and this kind show on that rank (after the filters;
        // ranks of a dynamic batch size hold different numbers of micros).
        let w_micros = |rank: u32| -> BTreeSet<u32> {
            [Kind::ForwardData, kind]
                .into_iter()
                .flat_map(|k| w.tree.files_of(k, w.step))
                .filter(|f| f.rank == Some(rank) && w.has(&f.path))
                .filter_map(|f| f.micro)
                .collect()
        };
        let ranks: Vec<u32> = s
            .tree
            .ranks(kind, s.step)
            .union(&w.tree.ranks(kind, w.step))
            .copied()
            .collect();
        type RankCells = (Vec<Cell>, Option<bool>, Vec<u32>);
        let one_rank = |&rank: &u32| -> Result<RankCells> {
            let a = s.fetch(kind, Some(rank), None, progress)?;
            let b_files: Vec<Option<u32>> = w
                .tree
                .files_of(kind, w.step)
                .filter(|f| f.rank == Some(rank) && w.has(&f.path))
                .map(|f| f.micro)
                .collect();
            // Per-micro weaver files of this rank that are absent.
            let absent: Vec<u32> = if a.is_some() && b_files.iter().any(Option::is_some) {
                w_micros(rank)
                    .iter()
                    .filter(|m| !b_files.contains(&Some(**m)))
                    .copied()
                    .collect()
            } else {
                Vec::new()
            };
            Ok(match (a, b_files.is_empty()) {
                (Some(a), false) => {
                    let mut cells = Vec::new();
                    for m in b_files {
                        if let Some(b) = w.fetch(kind, Some(rank), m, progress)? {
                            cells.push(sections::tensor_cell(policy, key, field, rank, m, &a, &b));
                        }
                    }
                    (cells, None, absent)
                }
                (Some(_), true) => (vec![], Some(true), absent),
                (None, false) => (vec![], Some(false), absent),
                (None, true) => (vec![], None, absent),
            })
        };
        let per_rank: Vec<RankCells> = if parallel {
            ranks.par_iter().map(one_rank).collect::<Result<_>>()?
        } else {
            ranks.iter().map(one_rank).collect::<Result<_>>()?
        };
        let mut cells = Vec::new();
        for (&rank, (cs, missing, absent)) in ranks.iter().zip(per_rank) {
            cells.extend(cs);
            if let Some(a_has) = missing {
                cells.push(note_missing(kind, rank, None, a_has));
            }
            for m in absent {
                cells.push(note_missing(kind, rank, Some(m), true));
            }
        }
        if !cells.is_empty() {
            sections_out.push(section(6, key, pair, cells, vec![]));
        }
    }
    Ok(ParamSections {
        sections: sections_out,
        coverage,
    })
}

/// Sections 1 and 5: trajectories (self-hosted vs remote-api) and remote-api datums vs
/// its own trajectories.
pub(super) fn remote_sections(
    s: &SideData,
    r: &SideData,
    traj: Option<&TrajectorySummary>,
    policy: &TolerancePolicy,
    coverage: &mut Vec<Coverage>,
) -> Result<Vec<Section>> {
    let mut out = Vec::new();
    let whole = |kind: Kind, present_on: &str, missing_on: &str| Coverage {
        kind: kind.dir_name().into(),
        rank: None,
        micro: None,
        present_on: present_on.into(),
        missing_on: missing_on.into(),
    };
    let prepared = r
        .trajectories(Kind::PreparedTrajectories)?
        .map(|b| batch::trajectories(&b));
    let own = s
        .trajectories(Kind::Trajectory)?
        .map(|b| batch::trajectories(&b));
    match (&own, &prepared) {
        (Some(a), Some(b)) => {
            let (cell, notes) = batch::trajectories_cell(policy, a, b);
            out.push(section(
                1,
                "trajectories",
                "self-hosted vs remote-api",
                vec![cell],
                notes,
            ));
        }
        (None, None) => {}
        (a, _) => {
            let (on, off) = if a.is_some() {
                ("self-hosted", "remote-api")
            } else {
                ("remote-api", "self-hosted")
            };
            coverage.push(whole(Kind::Trajectory, on, off));
            let cell = sections::missing_cell(None, None, on, off);
            out.push(section(
                1,
                "trajectories",
                "self-hosted vs remote-api",
                vec![cell],
                vec![],
            ));
        }
    }
    let datums = r.datums()?.map(batch::datums);
    match (&prepared, &datums) {
        (Some(t), Some(d)) => {
            let inputs = batch_inputs(s, None, traj, None, None)?;
            let (cell, notes) = batch::datums_cell(policy, t, d, &inputs);
            out.push(section(
                5,
                "datums",
                "remote-api datums vs trajectories",
                vec![cell],
                notes,
            ));
        }
        (None, None) => {}
        (t, _) => {
            let (on, off) = if t.is_some() {
                ("prepared_trajectories", "datums")
            } else {
                ("datums", "prepared_trajectories")
            };
            let cell = sections::missing_cell(None, None, on, off);
            out.push(section(
                5,
                "datums",
                "remote-api datums vs trajectories",
                vec![cell],
                vec![format!("remote-api has {on} but no {off}")],
            ));
        }
    }
    Ok(out)
}

pub(super) fn sort_cells(cells: &mut [Cell]) {
    cells.sort_by_key(|c| (c.rank, c.micro));
}

/// The self-hosted whole-batch inputs: old_log_probs, trajectory index by token hash,
/// advantages from remote-api prepared_trajectories when given, else recomputed from the
/// trajectories' rewards and group ids with `adv_preset`'s convention.
pub(super) fn batch_inputs(
    s: &SideData,
    r: Option<&SideData>,
    traj: Option<&TrajectorySummary>,
    adv_preset: Option<&str>,
    adv_eps: Option<f64>,
) -> Result<BatchInputs> {
    // Read in place from the file's map, each cell's rows released once sliced.
    let old_log_probs = s
        .get(Kind::OldLogProbs, None, None)
        .and_then(|v| Mat::of(v, Field::OldLogProbs))
        .map(
            |m| match s.get(Kind::OldLogProbs, None, None).and_then(Record::pages) {
                Some(p) => m.with_pages(p.clone()),
                None => m,
            },
        );
    let (mut traj_index, mut traj_short) = (HashMap::new(), HashMap::new());
    if let Some(tr) = traj {
        let empty = tokens_hash(&[]);
        for (i, row) in tr.rows.iter().enumerate() {
            traj_index.entry(row.tokens.unwrap_or(empty)).or_insert(i);
            if let Some(h) = row.tokens_short {
                traj_short.entry(h).or_insert(i);
            }
        }
    }
    // Advantages by self-hosted batch index, matched by token content: the batch-level
    // `advantages` of the remote-api prepared_trajectories.
    let prepared = match r {
        Some(r) => r.trajectories(Kind::PreparedTrajectories)?,
        None => None,
    };
    let advantages = prepared.and_then(|p| {
        let adv = p.batch_advantages?;
        let empty = tokens_hash(&[]);
        let mut out = vec![f64::NAN; traj_index.len().max(adv.len())];
        for (j, t) in p.rows.iter().enumerate() {
            let h = t.tokens.as_ref().map_or(empty, TokenSeq::hash);
            let i = if traj_index.is_empty() {
                Some(j)
            } else {
                traj_index.get(&h).copied()
            };
            if let (Some(i), Some(a)) = (i, adv.get(j)) {
                if let Some(slot) = out.get_mut(i) {
                    *slot = *a;
                }
            }
        }
        Some(out)
    });
    let mut recomputed = None;
    let (advantages, advantages_from) = match advantages {
        Some(a) => (
            Some(a),
            "prepared_trajectories.advantages broadcast over valid positions".to_string(),
        ),
        None => match (traj, adv_preset) {
            (Some(tr), Some(name)) => match recomputed_advantages(tr, name, adv_eps)? {
                Some((a, cfg)) => {
                    recomputed = Some((advantage::advantage_parts(tr, &cfg), cfg.eps));
                    let eps = match adv_eps {
                        Some(e) => format!(", epsilon {e:e}"),
                        None => String::new(),
                    };
                    (
                        Some(a),
                        format!(
                            "group advantages recomputed from trajectory rewards and group_id \
                             ({name} convention{eps}, rounded to f32), broadcast over valid positions"
                        ),
                    )
                }
                None => (None, String::new()),
            },
            _ => (None, String::new()),
        },
    };
    let (adv_parts, adv_eps) = match recomputed {
        Some((parts, eps)) => (parts, Some(eps)),
        None => (None, None),
    };
    let micros_per_rank = s.tree.micros(Kind::ForwardData, s.step).len().max(1);
    Ok(BatchInputs {
        old_log_probs,
        traj_index,
        traj_short,
        advantages,
        advantages_from,
        micros_per_rank,
        adv_parts,
        adv_eps,
        old_of_traj: None,
        response_lens: traj.map_or_else(Vec::new, |t| {
            t.rows.iter().map(|r| r.response_len).collect()
        }),
        dealer: None,
    })
}

/// GRPO advantages of every trajectory of a trajectory file, by batch index, with the
/// advantage convention of losscheck preset `preset` (losscheck's reference kernel), rounded
/// to f32 as trainers store them. `None` when a reward or group id is missing or there are
/// no trajectories. The rewards and groups are the model's ([`TrajectorySummary`]), the
/// ones losscheck reads, so both tools recompute the same advantages.
///
/// Errors: an unknown preset (usage).
pub(super) fn recomputed_advantages(
    traj: &TrajectorySummary,
    preset: &str,
    eps: Option<f64>,
) -> Result<Option<(Vec<f64>, crate::kernels::advantage::AdvantageConfig)>> {
    let mut cfg = crate::kernels::presets::preset(preset)
        .map_err(|e| Error::Usage(format!("--preset {preset}: {e}")))?;
    if let Some(e) = eps {
        cfg.advantage.eps = e;
    }
    let rewards: Option<Vec<f64>> = traj.rows.iter().map(|t| t.reward).collect();
    let groups: Option<Vec<String>> = traj.rows.iter().map(|t| t.group.clone()).collect();
    let (Some(rewards), Some(groups)) = (rewards, groups) else {
        return Ok(None);
    };
    if rewards.is_empty() {
        return Ok(None);
    }
    let runs: Vec<Option<String>> = traj.rows.iter().map(|t| t.ids.run_id.clone()).collect();
    let adv =
        crate::kernels::advantage::group_advantages_runs(&rewards, &groups, &runs, &cfg.advantage)
            .map_err(|e| {
                Error::format(
                    &traj.file,
                    crate::error::Position::Key("trajectories".into()),
                    format!("group advantages: {e}"),
                )
            })?;
    Ok(Some((
        adv.iter().map(|a| *a as f32 as f64).collect(),
        cfg.advantage,
    )))
}

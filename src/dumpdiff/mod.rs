//! `dumpdiff`: compare two or three producers' dumps of one training step, per rank and
//! per micro-batch, and find the first place they really diverge.
//!
//! [`run`] discovers the trees, reads the whole-batch files once, then compares rank ×
//! micro cells in parallel, each reading its own files and dropping them when done, and
//! returns a [`report::Report`]; renderers in [`render`] turn it into text. Tensors are
//! read in place, chunk by chunk, in their own dtype ([`mat::Mat`]), and a whole-batch
//! file's rows leave memory once a cell has sliced them ([`pages`]): peak memory follows
//! the cells in flight, not the tree or the batch.
//!
//! Tolerances: dumped tensors are judged at torch.testing's default for the coarser
//! precision of the two sides (or a `--tol-file` rule). Quantities derived from
//! log-probabilities (prob_ratio, elementwise_loss, and the loss scalars that are masked
//! means of them: loss, pg_loss, avg_ratio, clip_frac) are judged at their own precision
//! plus the error they inherit from their inputs, element by element: a ratio is allowed
//! `r·(e^E − 1)` where `E` is the sum of its log-prob inputs' tolerances there, a masked
//! mean the mean of its elements' allowances, a clip fraction `flips / n` where `flips`
//! counts the tokens whose ratio lies within its allowance of a clip boundary (see
//! [`crate::compare::propagate`]). Scalars no rule covers (KL estimates, entropy) keep
//! the log-prob precision scaled by [`crate::compare::tolerance::derived_rtol_factor`].

pub mod batch;
pub mod mat;
pub mod pages;
pub mod render;
pub mod report;
pub mod sections;

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use rayon::prelude::*;

use crate::compare::tolerance::{Severity, TolerancePolicy, Verdict};
use crate::error::{Error, Result};
use crate::frames::{tokens_hash, value_tokens_hash};
use crate::losscheck::self_hosted::TrajectorySummary;
use crate::readers::layout::{DumpTree, Kind};
use crate::value::Value;
use report::{Cell, Coverage, Finding, Report, Section, SideSummary, SCHEMA_VERSION};
use sections::{BatchInputs, Mat, SideData, Tensors};

/// What to compare and how strictly.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Self-hosted dump root (the reference side).
    pub self_hosted: PathBuf,
    /// Remote-API dump root.
    pub remote_api: Option<PathBuf>,
    /// Weaver dump root.
    pub weaver: Option<PathBuf>,
    /// The step to compare.
    pub step: i64,
    /// Only these ranks (default: every rank found).
    pub ranks: Option<BTreeSet<u32>>,
    /// Only these micros (default: every micro found).
    pub micros: Option<BTreeSet<u32>>,
    /// Tolerance rules and overrides.
    pub policy: TolerancePolicy,
    /// The tolerance file the rules came from, for the report.
    pub tol_file: Option<PathBuf>,
    /// losscheck preset used to recompute both sides of a loss disagreement
    /// (`None`: no adjudication).
    pub adjudicate_with: Option<String>,
    /// Preset whose advantage convention recomputes the self-hosted advantages from its
    /// trajectories when no remote-api `prepared_trajectories` supply them (`None`: don't).
    pub advantage_preset: Option<String>,
}

/// Receives reading progress; the library itself never prints. Called from reader
/// threads, so it must be `Sync`.
pub trait Progress: Sync {
    /// `files` files of `bytes` bytes are about to be read for `role`.
    fn start(&self, role: &str, files: usize, bytes: u64);
    /// One file of `bytes` bytes has been read.
    fn file_done(&self, bytes: u64);
}

/// The progress sink that ignores everything.
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _: &str, _: usize, _: u64) {}
    fn file_done(&self, _: u64) {}
}

/// The exit code for a report: 1 when some verdict reaches `fail_on`, else 0.
pub fn exit_code(report: &Report, fail_on: Severity) -> u8 {
    let hit = report.sections.iter().any(|s| s.verdict.reaches(fail_on))
        || (!report.coverage.is_empty() && Verdict::Missing.reaches(fail_on));
    if hit {
        crate::exit_codes::EXIT_FOUND
    } else {
        crate::exit_codes::EXIT_CLEAN
    }
}

/// Discover one side and list its files of `step` (filtered by ranks/micros): whole-batch
/// files (no rank in the name) are read now, one after the other; per-rank files are left for the
/// cells that compare them ([`SideData::fetch`]). With `digest`, the trajectory file is
/// summarised as it is read ([`pages::read_trajectory_summary`]) and its summary returned.
fn load_side(
    role: &'static str,
    root: &std::path::Path,
    opts: &Options,
    progress: &dyn Progress,
    digest: bool,
) -> Result<(SideData, Option<TrajectorySummary>)> {
    let tree = DumpTree::discover(root)?;
    let wanted: Vec<&crate::readers::layout::DumpFile> = tree
        .files()
        .iter()
        .filter(|f| f.step == opts.step)
        .filter(|f| {
            f.rank
                .is_none_or(|r| opts.ranks.as_ref().is_none_or(|s| s.contains(&r)))
        })
        .filter(|f| {
            f.micro
                .is_none_or(|m| opts.micros.as_ref().is_none_or(|s| s.contains(&m)))
        })
        .collect();
    progress.start(role, wanted.len(), wanted.iter().map(|f| f.size).sum());
    let (per_rank, mut whole): (Vec<_>, Vec<_>) =
        wanted.into_iter().partition(|f| f.rank.is_some());
    // One whole-batch file at a time: each is mapped and CRC-checked whole while it is
    // parsed, so reading them side by side would add their sizes at the peak. Tensor
    // files (old_log_probs) first: their pages are released once parsed, while the
    // trajectory files' lists stay on the heap until summarised.
    whole.sort_by_key(|f| {
        matches!(
            f.kind,
            Kind::Trajectory | Kind::PreparedTrajectories | Kind::Datums
        )
    });
    let mut summary = None;
    let mut read = Vec::with_capacity(whole.len());
    for f in &whole {
        let (v, pages) = if digest && f.kind == Kind::Trajectory {
            let (v, pages, s) = pages::read_trajectory_summary(&f.path)?;
            summary = s;
            (v, pages)
        } else {
            pages::read_whole(&f.path)?
        };
        progress.file_done(f.size);
        read.push((f.path.clone(), v, pages));
    }
    let mut values = HashMap::new();
    let mut maps = HashMap::new();
    for (path, v, p) in read {
        if let Some(p) = p {
            maps.insert(path.clone(), p);
        }
        values.insert(path, v);
    }
    let streamed = per_rank.iter().map(|f| (f.path.clone(), f.size)).collect();
    let side = SideData::new(role, tree, values, streamed, opts.step).with_pages(maps);
    Ok((side, summary))
}

/// Per-(rank, micro) cells of `kind` present on either side.
fn cells_of(a: &SideData, ka: Kind, b: &SideData, kb: Kind) -> BTreeSet<(u32, Option<u32>)> {
    let mut set = BTreeSet::new();
    for (side, kind) in [(a, ka), (b, kb)] {
        for f in side.tree.files_of(kind, side.step) {
            if let (Some(r), true) = (f.rank, side.has(&f.path)) {
                set.insert((r, f.micro));
            }
        }
    }
    set
}

/// Compare the trees named in `opts`.
pub fn run(opts: &Options) -> Result<Report> {
    run_with_progress(opts, &NoProgress)
}

/// [`run`], reporting file reads to `progress`.
pub fn run_with_progress(opts: &Options, progress: &dyn Progress) -> Result<Report> {
    if opts.weaver.is_none() && opts.remote_api.is_none() {
        return Err(Error::Usage(
            "nothing to compare: pass --weaver-dir and/or --remote-api-dir besides --self-hosted-dir".into(),
        ));
    }
    // Without remote-api, nothing compares the trajectories' token lists (section 1): the
    // trajectory file is summarised as it is read, never held whole.
    let digest = opts.remote_api.is_none();
    let (mut s, streamed) = load_side("self-hosted", &opts.self_hosted, opts, progress, digest)?;
    let w = opts
        .weaver
        .as_ref()
        .map(|p| load_side("weaver", p, opts, progress, false).map(|x| x.0))
        .transpose()?;
    let r = opts
        .remote_api
        .as_ref()
        .map(|p| load_side("remote-api", p, opts, progress, false).map(|x| x.0))
        .transpose()?;
    // What the cells and the adjudication need of the trajectories (hashes, rewards,
    // groups) is kept; their token lists only while section 1 (remote-api) compares them.
    let traj = streamed.or_else(|| {
        s.tree
            .get(Kind::Trajectory, s.step, None, None)
            .and_then(|f| {
                let v = s.get(Kind::Trajectory, None, None)?;
                TrajectorySummary::of(f.path.clone(), v).ok()
            })
    });
    if r.is_none() {
        if let Some(f) = s.tree.get(Kind::Trajectory, s.step, None, None) {
            if let Some(v) = s.values.get_mut(&f.path) {
                *v = Value::None;
            }
        }
    }
    let traj = traj.as_ref();
    if s.files_read() == 0 {
        return Err(Error::Usage(format!(
            "{}: no files for step {} (steps present: {:?})",
            s.tree.root.display(),
            opts.step,
            s.tree.steps()
        )));
    }
    let mut sections = Vec::new();
    let mut coverage = Vec::new();
    if let Some(w) = &w {
        sections.extend(weaver_sections(
            &s,
            w,
            r.as_ref(),
            traj,
            opts.advantage_preset.as_deref(),
            &opts.policy,
            &mut coverage,
            progress,
        )?);
    }
    if let Some(r) = &r {
        sections.extend(remote_sections(&s, r, traj, &opts.policy, &mut coverage));
    }
    sections.sort_by_key(|sec| sec.id);
    let sides: Vec<&SideData> = [Some(&s), w.as_ref(), r.as_ref()]
        .into_iter()
        .flatten()
        .collect();
    for side in &sides {
        side.check_unread(progress)?;
    }
    let (first_divergence, worst) = findings(&sections);
    let adjudication = match &opts.adjudicate_with {
        Some(preset) => adjudicate(&sections, &sides, opts.step, preset, traj)?,
        None => Vec::new(),
    };
    let verdict = sections
        .iter()
        .map(|s| s.verdict)
        .chain((!coverage.is_empty()).then_some(Verdict::Missing))
        .max()
        .unwrap_or(Verdict::Skipped);
    let trees: Vec<(&str, &DumpTree)> = sides.iter().map(|d| (d.role, &d.tree)).collect();
    let offending_files = report::offending_files(&sections, &coverage, &trees, opts.step);
    Ok(Report {
        schema_version: SCHEMA_VERSION,
        step: opts.step,
        sides: sides
            .iter()
            .map(|d| SideSummary {
                role: d.role.into(),
                root: d.tree.root.clone(),
                producer: d.tree.producer,
                files: d.files_read(),
                not_placed: d.tree.unrecognised.clone(),
            })
            .collect(),
        tolerance_file: opts.tol_file.clone(),
        verdict,
        sections,
        coverage,
        first_divergence,
        worst,
        adjudication,
        offending_files,
        files_read: sides.iter().map(|d| d.files_read()).sum(),
        bytes_read: sides.iter().map(|d| d.bytes_read()).sum(),
    })
}

/// The rank/micro cells whose loss disagrees (a failing cell of section 3 `loss` or 4
/// `is_loss`), each side recomputed from its own inputs by losscheck with `preset`.
/// Sides without per-micro loss inputs (remote-api) are left out.
fn adjudicate(
    sections: &[Section],
    sides: &[&SideData],
    step: i64,
    preset: &str,
    traj: Option<&TrajectorySummary>,
) -> Result<Vec<report::Adjudication>> {
    use crate::losscheck::{Status, StepCheck, Tolerance};
    let cfg = crate::kernels::presets::preset(preset)
        .map_err(|e| Error::Usage(format!("--preset {preset}: {e}")))?;
    let cells: BTreeSet<(u32, u32)> = sections
        .iter()
        .filter(|s| s.id == 3 || s.id == 4)
        .flat_map(|s| &s.cells)
        .filter(|c| c.verdict == Verdict::Fail)
        .filter_map(|c| Some((c.rank?, c.micro?)))
        .collect();
    if cells.is_empty() {
        return Ok(Vec::new());
    }
    // Each side's whole-batch inputs are the values read at the start of the run: no
    // file is read twice, whatever the number of cells.
    let judged: Vec<(&str, std::result::Result<StepCheck, String>)> = sides
        .iter()
        .filter(|d| d.role != "remote-api")
        .map(|d| {
            let whole = |k: Kind| d.get(k, None, None);
            let traj = traj.filter(|_| d.role == "self-hosted");
            (
                d.role,
                StepCheck::with_values(&d.tree, step, &cfg, &whole, traj)
                    .map_err(|e| e.to_string()),
            )
        })
        .collect();
    let out = cells
        .into_par_iter()
        .map(|(rank, micro)| {
            let verdicts: Vec<report::SideVerdict> = judged
                .iter()
                .map(|(role, check)| {
                    let verdict = check.as_ref().map_err(String::clone).and_then(|c| {
                        c.check(rank, micro, &cfg, &Tolerance::default())
                            .map_err(|e| e.to_string())
                    });
                    match verdict {
                        Ok(v) => report::SideVerdict {
                            role: (*role).into(),
                            status: Some(v.status),
                            dumped_loss: Some(v.dumped_loss),
                            recomputed_loss: Some(v.recomputed_loss),
                            detail: v.line(),
                        },
                        Err(e) => report::SideVerdict {
                            role: (*role).into(),
                            status: None,
                            dumped_loss: None,
                            recomputed_loss: None,
                            detail: format!("could not recompute: {e}"),
                        },
                    }
                })
                .collect();
            let with = |st: Status| -> Vec<&str> {
                verdicts
                    .iter()
                    .filter(|v| v.status == Some(st))
                    .map(|v| v.role.as_str())
                    .collect()
            };
            let (bad, good) = (with(Status::Inconsistent), with(Status::Consistent));
            let conclusion = match (bad.as_slice(), good.as_slice()) {
                ([], []) => "neither side could be recomputed from its own inputs".to_string(),
                ([], _) => "every side's loss follows from its own inputs: the inputs differ (see the first divergence)".to_string(),
                (_, []) => format!("{} loss disagrees with its own inputs", bad.join(" and ")),
                (_, _) => format!(
                    "{} loss disagrees with its own inputs; {} matches",
                    bad.join(" and "),
                    good.join(" and ")
                ),
            };
            report::Adjudication {
                rank,
                micro,
                preset: preset.to_string(),
                sides: verdicts,
                conclusion,
            }
        })
        .collect();
    Ok(out)
}

/// Make a section from its cells.
fn section(id: u8, name: &str, pair: &str, cells: Vec<Cell>, notes: Vec<String>) -> Section {
    Section {
        id,
        name: name.into(),
        pair: pair.into(),
        verdict: cells
            .iter()
            .map(|c| c.verdict)
            .max()
            .unwrap_or(Verdict::Skipped),
        cells,
        notes,
    }
}

/// What one (rank, micro) cell contributes to sections 2, 3 and 4. A `*_only_a` is set
/// when the cell's file of that section is on one side only (true: on self-hosted).
#[derive(Default)]
struct CellOut {
    fwd: Option<Cell>,
    fwd_only_a: Option<bool>,
    loss: Option<(Cell, Vec<String>)>,
    loss_only_a: Option<bool>,
    is_loss: Option<Cell>,
    is_only_a: Option<bool>,
}

/// The (rank, micro) cells of sections 2 (`fwd`), 3 (`loss`) and 4 (`is_loss`).
struct CellSets {
    fwd: BTreeSet<(u32, Option<u32>)>,
    loss: BTreeSet<(u32, Option<u32>)>,
    is_loss: BTreeSet<(u32, Option<u32>)>,
}

/// Which side of a pair holds a file when exactly one does.
fn only_a<T>(a: &Option<T>, b: &Option<T>) -> Option<bool> {
    (a.is_some() != b.is_some()).then_some(a.is_some())
}

/// `side`'s file of `kind` at `(rank, micro)` when `wanted` (see [`SideData::fetch`]).
fn fetch_if<'a>(
    side: &'a SideData,
    kind: Kind,
    (rank, micro): (u32, Option<u32>),
    wanted: bool,
    progress: &dyn Progress,
) -> Result<Option<Cow<'a, Value>>> {
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
fn weaver_cell(
    s: &SideData,
    w: &SideData,
    inputs: &BatchInputs,
    policy: &TolerancePolicy,
    sets: &CellSets,
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
    let s_loss = fetch(s, Kind::Loss, lossy)?;
    let w_loss = fetch(w, Kind::Loss, in_loss)?;
    let (a_fwd, b_fwd, b_is) = (
        s_fwd.as_deref().map(Tensors::new),
        w_fwd.as_deref().map(Tensors::new),
        w_is.as_deref().map(Tensors::new),
    );
    let mut out = CellOut::default();

    // Section 2: forward_data; also gives the cell's log-prob precision.
    let mut precision = None;
    if in_fwd {
        if let (Some(a), Some(b)) = (&a_fwd, &b_fwd) {
            precision = sections::logprob_precision(
                a.mat("log_probs").as_deref(),
                b.mat("log_probs").as_deref(),
            );
            out.fwd = Some(sections::forward_data_cell(policy, rank, m, a, b));
        }
        out.fwd_only_a = only_a(&a_fwd, &b_fwd);
    }

    // The self-hosted importance-sampling chain: derived ratios and the tolerances they
    // and the loss scalars inherit from their log-prob inputs.
    let chain = a_fwd.as_ref().filter(|_| in_fwd).map(|a| {
        let peer = sections::ChainPeer {
            fwd: b_fwd.as_ref(),
            is_loss: b_is.as_ref(),
        };
        sections::chain(policy, inputs, a, peer, rank, m)
    });

    // Section 3: loss.
    if in_loss {
        match (&s_loss, &w_loss) {
            (Some(a), Some(b)) => {
                let stats = chain.as_ref().and_then(|c| c.stats.as_ref());
                out.loss = Some(sections::loss_cell(policy, rank, m, a, b, precision, stats));
            }
            (a, b) => out.loss_only_a = Some(a.is_some() && b.is_none()),
        }
    }

    // Section 4: is_loss_debug against the self-hosted forward_data + old_log_probs.
    if in_is {
        if let (Some(a), Some(b), Some(ch)) = (&a_fwd, &b_is, &chain) {
            out.is_loss = Some(sections::is_loss_cell(
                policy,
                rank,
                m,
                a,
                s_loss.as_deref(),
                b,
                b_fwd.as_ref(),
                ch,
            ));
        }
        out.is_only_a = only_a(&a_fwd, &b_is);
    }
    Ok(out)
}

/// Sections 2, 3, 4 and 6: self-hosted against weaver, cell by cell.
#[allow(clippy::too_many_arguments)]
fn weaver_sections(
    s: &SideData,
    w: &SideData,
    r: Option<&SideData>,
    traj: Option<&TrajectorySummary>,
    adv_preset: Option<&str>,
    policy: &TolerancePolicy,
    coverage: &mut Vec<Coverage>,
    progress: &dyn Progress,
) -> Result<Vec<Section>> {
    let pair = "self-hosted vs weaver";
    let mut note_missing = |kind: Kind, rank: u32, micro: Option<u32>, a_has: bool| {
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
    let inputs = batch_inputs(s, r, traj, adv_preset);
    let mut outs: Vec<CellOut> = keys
        .par_iter()
        .map(|&key| weaver_cell(s, w, &inputs, policy, &sets, key, progress))
        .collect::<Result<_>>()?;

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
        let mut cells: Vec<Cell> = outs.iter_mut().filter_map(|o| o.is_loss.take()).collect();
        for (&(rank, micro), o) in keys.iter().zip(&outs) {
            if let Some(a_has) = o.is_only_a {
                cells.push(note_missing(Kind::IsLossDebug, rank, micro, a_has));
            }
        }
        sort_cells(&mut cells);
        let mut notes = vec![];
        if inputs.advantages.is_none() {
            notes.push("advantages and elementwise_loss need the remote-api prepared_trajectories (--remote-api-dir)".into());
        }
        out.push(section(4, "is_loss", pair, cells, notes));
    }

    // Section 6: param / gradient (self-hosted per rank, weaver per rank or per micro),
    // rank by rank: one rank's tensors in memory per thread.
    for (kind, key) in [(Kind::Param, "param"), (Kind::Gradient, "gradient")] {
        let ranks: Vec<u32> = s
            .tree
            .ranks(kind, s.step)
            .union(&w.tree.ranks(kind, w.step))
            .copied()
            .collect();
        let per_rank: Vec<(Vec<Cell>, Option<bool>)> = ranks
            .par_iter()
            .map(|&rank| -> Result<(Vec<Cell>, Option<bool>)> {
                let a = s.fetch(kind, Some(rank), None, progress)?;
                let b_files: Vec<Option<u32>> = w
                    .tree
                    .files_of(kind, w.step)
                    .filter(|f| f.rank == Some(rank) && w.has(&f.path))
                    .map(|f| f.micro)
                    .collect();
                Ok(match (a, b_files.is_empty()) {
                    (Some(a), false) => {
                        let mut cells = Vec::new();
                        for m in b_files {
                            if let Some(b) = w.fetch(kind, Some(rank), m, progress)? {
                                cells
                                    .push(sections::tensor_cell(policy, key, key, rank, m, &a, &b));
                            }
                        }
                        (cells, None)
                    }
                    (Some(_), true) => (vec![], Some(true)),
                    (None, false) => (vec![], Some(false)),
                    (None, true) => (vec![], None),
                })
            })
            .collect::<Result<_>>()?;
        let mut cells = Vec::new();
        for (&rank, (cs, missing)) in ranks.iter().zip(per_rank) {
            cells.extend(cs);
            if let Some(a_has) = missing {
                cells.push(note_missing(kind, rank, None, a_has));
            }
        }
        if !cells.is_empty() {
            out.push(section(6, key, pair, cells, vec![]));
        }
    }
    Ok(out)
}

/// Sections 1 and 5: trajectories (self-hosted vs remote-api) and remote-api datums vs
/// its own trajectories.
fn remote_sections(
    s: &SideData,
    r: &SideData,
    traj: Option<&TrajectorySummary>,
    policy: &TolerancePolicy,
    coverage: &mut Vec<Coverage>,
) -> Vec<Section> {
    let mut out = Vec::new();
    let whole = |kind: Kind, present_on: &str, missing_on: &str| Coverage {
        kind: kind.dir_name().into(),
        rank: None,
        micro: None,
        present_on: present_on.into(),
        missing_on: missing_on.into(),
    };
    let prepared = r
        .get(Kind::PreparedTrajectories, None, None)
        .map(batch::trajectories);
    let own = s.get(Kind::Trajectory, None, None).map(batch::trajectories);
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
    let datums = r.get(Kind::Datums, None, None).map(batch::datums);
    match (&prepared, &datums) {
        (Some(t), Some(d)) => {
            let inputs = batch_inputs(s, None, traj, None);
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
    out
}

fn sort_cells(cells: &mut [Cell]) {
    cells.sort_by_key(|c| (c.rank, c.micro));
}

/// The self-hosted whole-batch inputs: old_log_probs, trajectory index by token hash,
/// advantages from remote-api prepared_trajectories when given, else recomputed from the
/// trajectories' rewards and group ids with `adv_preset`'s convention.
fn batch_inputs(
    s: &SideData,
    r: Option<&SideData>,
    traj: Option<&TrajectorySummary>,
    adv_preset: Option<&str>,
) -> BatchInputs {
    // Read in place from the file's map, each cell's rows released once sliced.
    let old_log_probs = s
        .get(Kind::OldLogProbs, None, None)
        .and_then(|v| Mat::of(v, "old_log_probs"))
        .map(|m| match s.pages(Kind::OldLogProbs, None, None) {
            Some(p) => m.with_pages(p.clone()),
            None => m,
        });
    // Token hashes straight from each trajectory's (packed) token list: no copy of it.
    let traj_hashes = |v: &Value| -> Vec<u64> {
        v.get("trajectories")
            .and_then(Value::as_seq)
            .map(|ts| {
                ts.iter()
                    .map(|t| value_tokens_hash(t.get("tokens")))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut traj_index = HashMap::new();
    if let Some(tr) = traj {
        let empty = tokens_hash(&[]);
        for (i, row) in tr.rows.iter().enumerate() {
            traj_index.entry(row.tokens.unwrap_or(empty)).or_insert(i);
        }
    }
    // Advantages by self-hosted batch index, matched by token content.
    let advantages = r
        .and_then(|r| r.get(Kind::PreparedTrajectories, None, None))
        .and_then(|p| {
            let adv = p.get("advantages")?.to_f64s()?;
            let hashes = traj_hashes(p);
            let mut out = vec![f64::NAN; traj_index.len().max(adv.len())];
            for (j, h) in hashes.iter().enumerate() {
                let i = if traj_index.is_empty() {
                    Some(j)
                } else {
                    traj_index.get(h).copied()
                };
                if let (Some(i), Some(a)) = (i, adv.get(j)) {
                    if let Some(slot) = out.get_mut(i) {
                        *slot = *a;
                    }
                }
            }
            Some(out)
        });
    let (advantages, advantages_from) = match advantages {
        Some(a) => (
            Some(a),
            "prepared_trajectories.advantages broadcast over valid positions".to_string(),
        ),
        None => match (traj, adv_preset) {
            (Some(tr), Some(name)) => match recomputed_advantages(tr, name) {
                Some(a) => (
                    Some(a),
                    format!(
                        "group advantages recomputed from trajectory rewards and group_id \
                         ({name} convention, rounded to f32), broadcast over valid positions"
                    ),
                ),
                None => (None, String::new()),
            },
            _ => (None, String::new()),
        },
    };
    let micros_per_rank = s.tree.micros(Kind::ForwardData, s.step).len().max(1);
    BatchInputs {
        old_log_probs,
        traj_index,
        advantages,
        advantages_from,
        micros_per_rank,
    }
}

/// GRPO advantages of every trajectory of a trajectory file, by batch index, with the
/// advantage convention of losscheck preset `preset` (losscheck's reference kernel), rounded
/// to f32 as trainers store them. `None` when a reward or group id is missing.
fn recomputed_advantages(traj: &TrajectorySummary, preset: &str) -> Option<Vec<f64>> {
    let cfg = crate::kernels::presets::preset(preset).ok()?;
    // Read exactly as losscheck reads them, so both tools recompute the same advantages.
    let rewards: Vec<f64> = traj.rows.iter().map(|t| t.reward).collect::<Option<_>>()?;
    let groups: Vec<String> = traj
        .rows
        .iter()
        .map(|t| t.group.clone())
        .collect::<Option<_>>()?;
    let adv =
        crate::kernels::advantage::group_advantages(&rewards, &groups, &cfg.advantage).ok()?;
    Some(adv.iter().map(|a| *a as f32 as f64).collect())
}

/// Order of sections along the data flow, for "first divergence".
fn flow_rank(id: u8) -> u8 {
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
fn findings(sections: &[Section]) -> (Option<Finding>, Vec<Finding>) {
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

fn finding(sec: &Section, cell: &Cell, c: &report::Comparison) -> Finding {
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

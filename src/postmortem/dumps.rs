//! `postmortem --dumps DIR --step N`: the verdict on one training step's tensor dumps, for
//! the report's "Training-step dumps" section and `summary.json`'s `dumps` object.
//!
//! How the `--dumps` folders map onto the tools:
//!
//! - Each `--dumps DIR` is either ONE dump tree (it holds kind folders such as
//!   `forward_data/`, `loss/`, `is_loss_debug/`: a producer's `debug_dump/`) or a folder
//!   whose subfolders are dump trees (e.g. `self_hosted/`, `weaver/`, `remote_api/`);
//!   then every such subfolder counts. `--dumps` may be repeated; the trees of every
//!   `--dumps` are pooled (the same tree twice counts once).
//! - **One tree in all**: losscheck's self-consistency over every rank/micro of step N
//!   (weaver layout: the `is_loss_debug/` cells; self-hosted layout: the `forward_data/`
//!   cells), each loss recomputed from the tree's own inputs with `--preset`. Verdict FAIL
//!   when some cell is not self-consistent; a cell that cannot be recomputed (a file cut
//!   short by the crash) is reported, not fatal.
//! - **Several trees**: each tree's producer is identified from its files
//!   ([`DumpTree::discover`]); there must be exactly one self-hosted tree (the reference)
//!   and at most one weaver and one remote-api tree besides it. dumpdiff compares them,
//!   and losscheck recomputes both sides of every loss disagreement (adjudication). Trees
//!   of unknown producer, two trees of one producer, or no self-hosted tree are refused
//!   (exit 2) with the trees and their producers named: nothing is guessed; pass the
//!   trees to compare as `--dumps A --dumps B`.
//!
//! Errors (exit 2, the path named): a `--dumps` folder that does not exist or holds no
//! dump tree, a tree without files of step N, an unknown preset, a tree losscheck cannot
//! check alone (remote-api), and whatever dumpdiff refuses to read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::compare::tolerance::{TolerancePolicy, Verdict};
use crate::dumpdiff::report::{Adjudication, Coverage, Finding, Report, SideSummary};
use crate::error::{Error, Result};
use crate::judge::{layout_of, Divergence, Layout, Status, StepCheck, Tolerance};
use crate::kernels::loss::LossConfig;
use crate::model::finding::Severity;
use crate::model::tree::{DumpTree, Kind, Producer};

/// The default losscheck preset (NexRL importance sampling, no clip).
pub const DEFAULT_PRESET: &str = "nexrl-is";

/// What `--dumps`, `--step` and `--preset` asked for.
#[derive(Debug, Clone)]
pub struct DumpsOptions {
    /// The `--dumps` folders, in order.
    pub dirs: Vec<PathBuf>,
    /// The training step.
    pub step: i64,
    /// The losscheck preset (`nexrl-is`, `trl-grpo`, …).
    pub preset: String,
}

/// One dump tree taking part.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TreeRef {
    /// Its dump root.
    pub root: PathBuf,
    /// The producer recognised from its files.
    pub producer: Producer,
}

/// One rank/micro of a tree checked alone.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckedCell {
    /// Rank.
    pub rank: u32,
    /// Micro-batch.
    pub micro: u32,
    /// Consistent or inconsistent; absent when the cell could not be recomputed.
    pub status: Option<Status>,
    /// The dumped loss.
    pub dumped_loss: Option<f64>,
    /// The loss recomputed from the cell's own inputs.
    pub recomputed_loss: Option<f64>,
    /// The first dumped intermediate that does not follow from the inputs (weaver).
    pub first_divergence: Option<Divergence>,
    /// losscheck's verdict line, or why the cell could not be recomputed.
    pub line: String,
}

/// One row of the sections × ranks grid.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GridRow {
    /// Section number.
    pub id: u8,
    /// Section name.
    pub name: String,
    /// Which sides are compared.
    pub pair: String,
    /// Worst cell verdict.
    pub verdict: Verdict,
    /// One symbol per micro for each rank of [`DumpdiffSummary::ranks`] (empty when the
    /// section has no cell at that rank).
    pub by_rank: Vec<String>,
    /// The symbol of a whole-batch section (trajectories, datums).
    pub batch: Option<String>,
}

/// A cell beyond tolerance.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProblemCell {
    /// Section name.
    pub section: String,
    /// Rank (absent for whole-batch files).
    pub rank: Option<u32>,
    /// Micro (absent for per-rank and whole-batch files).
    pub micro: Option<u32>,
    /// The cell's verdict.
    pub verdict: Verdict,
    /// Why.
    pub reason: String,
}

/// dumpdiff's report of several trees, condensed for a postmortem.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DumpdiffSummary {
    /// The trees compared, reference first, with the files read of the step.
    pub sides: Vec<SideSummary>,
    /// The grid's columns.
    pub ranks: Vec<u32>,
    /// Sections × ranks.
    pub grid: Vec<GridRow>,
    /// Every cell beyond tolerance (warn or fail), in section order; cells present on one
    /// side only are in `coverage`.
    pub problems: Vec<ProblemCell>,
    /// The earliest failing comparison in data-flow order.
    pub first_divergence: Option<Finding>,
    /// The comparisons furthest beyond tolerance, worst first.
    pub worst: Vec<Finding>,
    /// Each disagreeing loss recomputed on both sides by losscheck.
    pub adjudication: Vec<Adjudication>,
    /// Files present on one side only.
    pub coverage: Vec<Coverage>,
    /// The sections' notes (`section: note`).
    pub notes: Vec<String>,
}

/// The dump verdict of one step: `summary.json`'s `dumps` object.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Dumps {
    /// `losscheck` (one tree checked alone) or `dumpdiff` (several trees compared).
    pub mode: &'static str,
    /// The step.
    pub step: i64,
    /// The losscheck preset.
    pub preset: String,
    /// The trees, as found under the `--dumps` folders.
    pub trees: Vec<TreeRef>,
    /// The overall verdict (`pass`, `missing`: pass with files on one side only, `warn`,
    /// `fail`).
    pub verdict: Verdict,
    /// True when the verdict makes `postmortem` exit 1 (`fail`).
    pub failed: bool,
    /// One line: the step, the trees, the verdict and why (stdout's `dumps:` line).
    pub headline: String,
    /// Why, in one line (the headline without the step, trees and verdict).
    pub detail: String,
    /// One tree: each rank/micro checked, rank then micro order.
    pub cells: Vec<CheckedCell>,
    /// Several trees: the comparison.
    pub dumpdiff: Option<DumpdiffSummary>,
    /// Holes and files that could not be placed.
    pub notes: Vec<String>,
}

/// `PASS`, `FAIL`, … as dumpdiff prints them.
pub fn verdict_word(v: Verdict) -> &'static str {
    crate::dumpdiff::words::verdict_word(v)
}

/// True when `p` holds a kind folder (`trajectory/`, `forward_data/`, …).
fn holds_kind_dir(p: &Path) -> bool {
    Kind::ALL
        .iter()
        .any(|k| crate::logs::input::is_dir(&p.join(k.dir_name())))
}

/// The dump roots one `--dumps` folder stands for: itself, or its subfolders that are
/// dump trees (sorted by name).
fn roots_of(dir: &Path) -> Result<Vec<PathBuf>> {
    if crate::logs::input::is_remote(dir) {
        // A prefix in a store (issue 33): listed, never copied (the dump readers fetch
        // only the step's files, with ranged reads).
        if holds_kind_dir(dir) {
            return Ok(vec![dir.to_path_buf()]);
        }
        let subs = crate::logs::input::sub_prefixes(dir)?;
        let out: Vec<PathBuf> = subs.into_iter().filter(|p| holds_kind_dir(p)).collect();
        if out.is_empty() {
            return Err(Error::input(
                dir,
                format!(
                    "--dumps: no dump tree here: expected kind folders ({}) in it or in its subfolders",
                    Kind::ALL.map(Kind::dir_name).join(", ")
                ),
            ));
        }
        return Ok(out);
    }
    let meta = std::fs::metadata(dir).map_err(|e| Error::input(dir, format!("--dumps: {e}")))?;
    if !meta.is_dir() {
        return Err(Error::input(
            dir,
            "--dumps expects a dump folder (holding forward_data/, loss/, is_loss_debug/ …) or a folder of dump folders, found a file",
        ));
    }
    if holds_kind_dir(dir) {
        return Ok(vec![dir.to_path_buf()]);
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let p = entry.map_err(|e| Error::io(dir, e))?.path();
        if p.is_dir() && holds_kind_dir(&p) {
            out.push(p);
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(Error::input(
            dir,
            format!(
                "--dumps: no dump tree here: expected kind folders ({}) in it or in its subfolders",
                Kind::ALL.map(Kind::dir_name).join(", ")
            ),
        ));
    }
    Ok(out)
}

/// Every tree under the `--dumps` folders, each once.
fn discover_all(dirs: &[PathBuf]) -> Result<Vec<DumpTree>> {
    if dirs.is_empty() {
        return Err(Error::Usage("--dumps: no folder given".into()));
    }
    let mut seen = BTreeSet::new();
    let mut trees = Vec::new();
    for d in dirs {
        for root in roots_of(d)? {
            let key = root.canonicalize().unwrap_or_else(|_| root.clone());
            if seen.insert(key) {
                trees.push(DumpTree::discover(&root)?);
            }
        }
    }
    Ok(trees)
}

fn tree_list(trees: &[&DumpTree]) -> String {
    trees
        .iter()
        .map(|t| format!("{} ({})", t.root.display(), t.producer))
        .collect::<Vec<_>>()
        .join(", ")
}

fn preset_config(name: &str) -> Result<LossConfig> {
    crate::kernels::presets::preset(name).map_err(|e| Error::Usage(format!("--preset {name}: {e}")))
}

/// Check the `--dumps` trees at step `opts.step` and return the verdict.
pub fn analyze(opts: &DumpsOptions) -> Result<Dumps> {
    let cfg = preset_config(&opts.preset)?;
    let trees = discover_all(&opts.dirs)?;
    for t in &trees {
        if !t.steps().contains(&opts.step) {
            return Err(Error::input(
                &t.root,
                format!(
                    "--dumps: no files for step {} (steps present: {:?})",
                    opts.step,
                    t.steps()
                ),
            ));
        }
    }
    match trees.as_slice() {
        [one] => check_alone(one, opts, &cfg),
        _ => compare(&trees, opts),
    }
}

/// One tree: losscheck over every rank/micro of the step.
fn check_alone(tree: &DumpTree, opts: &DumpsOptions, cfg: &LossConfig) -> Result<Dumps> {
    let step = opts.step;
    let layout = layout_of(tree, step).ok_or_else(|| {
        Error::input(&tree.root, format!(
            "--dumps: a {} tree checked alone needs is_loss_debug/ files (weaver layout) or \
             forward_data/ + old_log_probs/ + trajectory/ files (self-hosted layout) at step {step}; \
             to compare it, pass a self-hosted tree too (--dumps A --dumps B)",
            tree.producer
        ))
    })?;
    let kind = match layout {
        Layout::Weaver => Kind::IsLossDebug,
        Layout::SelfHosted => Kind::ForwardData,
    };
    let mut grid: Vec<(u32, u32)> = tree
        .files_of(kind, step)
        .filter_map(|f| Some((f.rank?, f.micro?)))
        .collect();
    grid.sort_unstable();
    grid.dedup();
    let tol = Tolerance::default();
    // The tree's own conventions (advantage epsilon of a self-hosted tree, aggregation,
    // KL estimator, coefficients: read from its `extra_info` or inferred from every cell),
    // as losscheck settles them: judged with the preset's alone, a tree written under
    // other conventions is called inconsistent. When they cannot be settled (a cell
    // unreadable), each cell is judged with the preset.
    let given = crate::judge::overrides::Overrides::default();
    let mut cfg = cfg.clone();
    if let Some(eps) = crate::judge::infer::self_hosted_adv_eps(tree, step, &cfg, &given, &tol) {
        cfg.advantage.eps = eps;
    }
    let cfg = &cfg;
    let check = StepCheck::new(tree, step, cfg)?;
    let resolved = check.conventions(cfg, &given, &tol).ok();
    let cells: Vec<CheckedCell> = grid
        .iter()
        .map(|&(rank, micro)| {
            let v = match &resolved {
                Some(r) => check.check_under(rank, micro, r, &tol),
                None => check.check(rank, micro, cfg, &tol),
            };
            match v {
                Ok(v) => CheckedCell {
                    rank,
                    micro,
                    status: Some(v.status),
                    dumped_loss: Some(v.dumped_loss),
                    recomputed_loss: Some(v.recomputed_loss),
                    line: v.line(),
                    first_divergence: v.first_divergence,
                },
                Err(e) => CheckedCell {
                    rank,
                    micro,
                    status: None,
                    dumped_loss: None,
                    recomputed_loss: None,
                    first_divergence: None,
                    line: format!("rank {rank} micro {micro}: could not recompute: {e}"),
                },
            }
        })
        .collect();
    let mut notes: Vec<String> = tree
        .missing_cells(kind, step)
        .iter()
        .map(|(r, m)| {
            format!("rank {r} micro {m}: no {kind}/ file (a hole in the rank × micro grid)")
        })
        .collect();
    notes.extend(
        tree.unrecognised
            .iter()
            .map(|u| format!("{}: not read ({})", u.path.display(), u.reason)),
    );
    let bad: Vec<&CheckedCell> = cells
        .iter()
        .filter(|c| c.status == Some(Status::Inconsistent))
        .collect();
    let unchecked = cells.iter().filter(|c| c.status.is_none()).count();
    let verdict = if !bad.is_empty() {
        Verdict::Fail
    } else if unchecked > 0 {
        Verdict::Warn
    } else if cells.is_empty() {
        Verdict::Skipped
    } else {
        Verdict::Pass
    };
    let what = format!(
        "step {step}, {} tree `{}` checked alone by losscheck ({})",
        tree.producer,
        tree.root.display(),
        opts.preset
    );
    let mut detail = match bad.as_slice() {
        [] if unchecked == 0 => format!(
            "every one of {} rank/micro cells is self-consistent",
            cells.len()
        ),
        [] => format!(
            "{} of {} rank/micro cells are self-consistent",
            cells.len() - unchecked,
            cells.len()
        ),
        _ => format!(
            "{} of {} rank/micro cells are not self-consistent: {}",
            bad.len(),
            cells.len(),
            bad.iter()
                .map(|c| {
                    let at = format!("rank {} micro {}", c.rank, c.micro);
                    match &c.first_divergence {
                        Some(d) => format!("{at} ({} at row {} pos {})", d.name, d.row, d.pos),
                        None => at,
                    }
                })
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    if unchecked > 0 {
        detail.push_str(&format!("; {unchecked} could not be recomputed"));
    }
    Ok(Dumps {
        mode: "losscheck",
        step,
        preset: opts.preset.clone(),
        trees: vec![TreeRef {
            root: tree.root.clone(),
            producer: tree.producer,
        }],
        verdict,
        failed: verdict == Verdict::Fail,
        headline: format!("{what}: {} — {detail}", verdict_word(verdict)),
        detail,
        cells,
        dumpdiff: None,
        notes,
    })
}

/// The one tree of `producer`, or an error naming the ambiguity.
fn only_one<'a>(trees: &[&'a DumpTree], producer: Producer) -> Result<Option<&'a DumpTree>> {
    match trees {
        [] => Ok(None),
        [one] => Ok(Some(*one)),
        _ => Err(Error::Usage(format!(
            "--dumps: {} {producer} dump trees: {}; ambiguous, pass the trees to compare as --dumps A --dumps B",
            trees.len(),
            tree_list(trees)
        ))),
    }
}

/// Several trees: dumpdiff self-hosted vs weaver and/or remote-api, with adjudication.
fn compare(trees: &[DumpTree], opts: &DumpsOptions) -> Result<Dumps> {
    let all: Vec<&DumpTree> = trees.iter().collect();
    let of = |p: Producer| -> Vec<&DumpTree> {
        trees.iter().filter(|t| t.producer == p).collect::<Vec<_>>()
    };
    let unknown = of(Producer::Unknown);
    if !unknown.is_empty() {
        return Err(Error::Usage(format!(
            "--dumps: cannot tell which trainer wrote {} (not enough distinctive files); the trees found: {}",
            unknown
                .iter()
                .map(|t| t.root.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            tree_list(&all)
        )));
    }
    let reference = only_one(&of(Producer::SelfHosted), Producer::SelfHosted)?.ok_or_else(|| {
        Error::Usage(format!(
            "--dumps: several dump trees but no self-hosted one to compare them against: {}; pass one tree to check it alone",
            tree_list(&all)
        ))
    })?;
    let weaver = only_one(&of(Producer::Weaver), Producer::Weaver)?;
    let remote = only_one(&of(Producer::RemoteApi), Producer::RemoteApi)?;
    let dopts = crate::dumpdiff::Options {
        self_hosted: reference.root.clone(),
        remote_api: remote.map(|t| t.root.clone()),
        weaver: weaver.map(|t| t.root.clone()),
        step: opts.step,
        policy: TolerancePolicy::default(),
        adjudicate_with: Some(opts.preset.clone()),
        advantage_preset: Some(opts.preset.clone()),
        ..Default::default()
    };
    let report = crate::dumpdiff::run(&dopts)?;
    let failed =
        crate::dumpdiff::exit_code(&report, Severity::Error) != crate::exit_codes::EXIT_CLEAN;
    let pair = std::iter::once("self-hosted")
        .chain(weaver.map(|_| "weaver"))
        .chain(remote.map(|_| "remote-api"))
        .collect::<Vec<_>>()
        .join(" vs ");
    let detail = compare_detail(&report);
    let headline = format!(
        "step {}, {pair} compared by dumpdiff (losscheck {}): {} — {detail}",
        report.step,
        opts.preset,
        verdict_word(report.verdict)
    );
    let ordered: Vec<&DumpTree> = [Some(reference), weaver, remote]
        .into_iter()
        .flatten()
        .collect();
    Ok(Dumps {
        mode: "dumpdiff",
        step: opts.step,
        preset: opts.preset.clone(),
        trees: ordered
            .iter()
            .map(|t| TreeRef {
                root: t.root.clone(),
                producer: t.producer,
            })
            .collect(),
        verdict: report.verdict,
        failed,
        headline,
        detail,
        cells: Vec::new(),
        dumpdiff: Some(summarize(&report)),
        notes: Vec::new(),
    })
}

fn compare_detail(report: &Report) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(f) = &report.first_divergence {
        parts.push(format!(
            "first divergence: {} at {}",
            f.name,
            crate::dumpdiff::words::location(f)
        ));
    }
    // Adjudications grouped by conclusion, cells in order.
    let mut by: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for a in &report.adjudication {
        let c = a.conclusion.as_str();
        if !by.contains_key(c) {
            order.push(c);
        }
        by.entry(c)
            .or_default()
            .push(format!("rank {} micro {}", a.rank, a.micro));
    }
    for c in order {
        let cells = by.get(c).map(|v| v.join(" and ")).unwrap_or_default();
        parts.push(format!("at {cells}, {c}"));
    }
    if !report.coverage.is_empty() {
        parts.push(format!(
            "{} file(s) on one side only",
            report.coverage.len()
        ));
    }
    if parts.is_empty() {
        "every compared value within tolerance".to_string()
    } else {
        parts.join(". ")
    }
}

/// The report condensed: grid, problems, findings, adjudication, coverage, notes.
fn summarize(report: &Report) -> DumpdiffSummary {
    let ranks: Vec<u32> = report
        .sections
        .iter()
        .flat_map(|s| s.cells.iter().filter_map(|c| c.rank))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let grid = report
        .sections
        .iter()
        .map(|sec| {
            let whole = sec.cells.iter().all(|c| c.rank.is_none());
            GridRow {
                id: sec.id,
                name: sec.name.clone(),
                pair: sec.pair.clone(),
                verdict: sec.verdict,
                by_rank: if whole {
                    vec![String::new(); ranks.len()]
                } else {
                    ranks
                        .iter()
                        .map(|r| {
                            sec.cells
                                .iter()
                                .filter(|c| c.rank == Some(*r))
                                .map(|c| c.verdict.symbol())
                                .collect()
                        })
                        .collect()
                },
                batch: whole.then(|| sec.verdict.symbol().to_string()),
            }
        })
        .collect();
    let problems = report
        .sections
        .iter()
        .flat_map(|sec| {
            sec.cells
                .iter()
                .filter(|c| c.verdict >= Verdict::Warn)
                .map(|c| ProblemCell {
                    section: sec.name.clone(),
                    rank: c.rank,
                    micro: c.micro,
                    verdict: c.verdict,
                    reason: c.reason.clone(),
                })
        })
        .collect();
    let notes = report
        .sections
        .iter()
        .flat_map(|sec| sec.notes.iter().map(|n| format!("{}: {n}", sec.name)))
        .collect();
    DumpdiffSummary {
        sides: report.sides.clone(),
        ranks,
        grid,
        problems,
        first_divergence: report.first_divergence.clone(),
        worst: report.worst.clone(),
        adjudication: report.adjudication.clone(),
        coverage: report.coverage.clone(),
        notes,
    }
}

/// The recommendation a failing dump verdict adds to "What to do".
pub fn recommendation(d: &Dumps) -> Option<String> {
    if !d.failed {
        return None;
    }
    Some(match &d.dumpdiff {
        Some(s) if !s.adjudication.is_empty() => {
            let cells: Vec<String> = s
                .adjudication
                .iter()
                .map(|a| format!("rank {} micro {} ({})", a.rank, a.micro, a.conclusion))
                .collect();
            format!(
                "Step {} dumps disagree; losscheck says where the loss is wrong: {}.",
                d.step,
                cells.join("; ")
            )
        }
        Some(s) => format!(
            "Step {} dumps disagree: start from the first divergence{}.",
            d.step,
            s.first_divergence
                .as_ref()
                .map_or(String::new(), |f| format!(
                    ", {} at {}",
                    f.name,
                    crate::dumpdiff::words::location(f)
                ))
        ),
        None => {
            let cells: Vec<String> = d
                .cells
                .iter()
                .filter(|c| c.status == Some(Status::Inconsistent))
                .map(|c| format!("rank {} micro {}", c.rank, c.micro))
                .collect();
            format!(
                "Step {} dumps: the loss at {} does not follow from its own dumped inputs (losscheck {}).",
                d.step,
                cells.join(", "),
                d.preset
            )
        }
    })
}

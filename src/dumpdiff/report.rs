//! The report model every renderer sees: sections × cells × comparisons, coverage gaps,
//! the first divergence and the worst offenders. One `Serialize` tree; JSON is this as is.

use std::path::PathBuf;

use serde::Serialize;

use crate::compare::align::MatchMethod;
use crate::compare::metrics::PairMetrics;
use crate::compare::tolerance::{Tolerance, Verdict};
use crate::model::tree::{DumpTree, Kind, Producer, Unrecognised};
use crate::tensor::DType;

/// Version of the JSON report layout; bumped on incompatible changes.
pub const SCHEMA_VERSION: u32 = 1;

/// The whole comparison of one step.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Layout version of this report.
    pub schema_version: u32,
    /// The compared training step.
    pub step: i64,
    /// The dump trees compared, reference first.
    pub sides: Vec<SideSummary>,
    /// The tolerance file used, if any.
    pub tolerance_file: Option<PathBuf>,
    /// Worst verdict over every section (and Fail when a coefficient differs).
    pub verdict: Verdict,
    /// Loss-composition coefficients of both sides (read, inferred or given by a flag)
    /// that are non-zero or differ, differing ones first; absent when there is none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub coefficients: Vec<Coefficient>,
    /// Conventions dumpdiff inferred to recompute what a side did not dump (e.g. the
    /// advantage epsilon), one sentence each; absent when none was needed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conventions: Vec<String>,
    /// Per cell whose loss disagrees, the term that differs (pg — and through which
    /// intermediate —, entropy, KL, or the composition); absent when no loss disagrees.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub diagnosis: Vec<String>,
    /// Sections in report order (1 trajectories … 6 param/gradient).
    pub sections: Vec<Section>,
    /// Files present on one side only.
    pub coverage: Vec<Coverage>,
    /// The earliest failing comparison in data-flow order, if any.
    pub first_divergence: Option<Finding>,
    /// The failing or warning comparisons furthest beyond tolerance, worst first.
    pub worst: Vec<Finding>,
    /// For each rank/micro whose loss disagrees: which side's loss follows from its own
    /// inputs (losscheck's reference kernels), so the analyst knows which side is wrong.
    pub adjudication: Vec<Adjudication>,
    /// The files behind each failing, warning or one-sided rank/micro cell, so the user can
    /// open them (`losscheck --dump-dir …`, `dumpdiff --inspect FILE`).
    pub offending_files: Vec<OffendingFile>,
    /// Dump files that could not be read (truncated, corrupt, a tensor missing), each with
    /// its reason: their cells are left out, every other cell is compared, and the command
    /// exits 2 with this report. Absent when every file was read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<Unreadable>,
    /// Files read (each once).
    pub files_read: usize,
    /// Bytes read.
    pub bytes_read: u64,
}

/// One loss-composition coefficient on both sides.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Coefficient {
    /// `entropy_coeff` or `kl_coef`.
    pub name: String,
    /// The self-hosted value, when known.
    pub self_hosted: Option<f64>,
    /// The weaver value, when known.
    pub weaver: Option<f64>,
    /// How the self-hosted value was obtained (read, inferred with its fit, flag).
    pub self_hosted_from: Option<String>,
    /// How the weaver value was obtained.
    pub weaver_from: Option<String>,
    /// True when the two values differ beyond what their rounding explains: a finding.
    pub differ: bool,
    /// True when the self-hosted value was fitted to one cell's total, which fits any value
    /// (a loss scale or a term no file states goes into it): the values are not compared.
    pub self_hosted_one_cell: bool,
    /// The same for the weaver value.
    pub weaver_one_cell: bool,
}

/// One dump tree taking part.
#[derive(Debug, Clone, Serialize)]
pub struct SideSummary {
    /// `self-hosted`, `remote-api` or `weaver`: the flag it came from.
    pub role: String,
    /// Its dump root.
    pub root: PathBuf,
    /// The producer recognised from its files.
    pub producer: Producer,
    /// Files of the compared step.
    pub files: usize,
    /// Files in its kind folders that were not read: a name that is not
    /// `step_N[_rankR][_microM].ext`, an unknown extension, or not a regular file (a FIFO
    /// or socket named like a dump is never opened). Said, so nothing is skipped silently.
    pub not_placed: Vec<Unrecognised>,
}

/// One section of the comparison (SPEC issue 3: 1 trajectories … 6 param/gradient).
#[derive(Debug, Clone, Serialize)]
pub struct Section {
    /// Section number as the issue lists them.
    pub id: u8,
    /// Short name (`forward_data`, `is_loss`, …).
    pub name: String,
    /// Which sides are compared (`self-hosted vs weaver`).
    pub pair: String,
    /// Worst cell verdict.
    pub verdict: Verdict,
    /// Per rank × micro (or whole-batch) results.
    pub cells: Vec<Cell>,
    /// Why something was not compared, count explanations, and the like.
    pub notes: Vec<String>,
}

impl Section {
    /// The worst of its cells' verdicts (skipped when it has none): set again after a
    /// cell's comparisons are re-judged.
    pub fn worst(&self) -> Verdict {
        self.cells
            .iter()
            .map(|c| c.verdict)
            .max()
            .unwrap_or(Verdict::Skipped)
    }
}

/// One rank × micro cell of a section (`rank`/`micro` absent for whole-batch files).
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// Rank, for per-rank files.
    pub rank: Option<u32>,
    /// Micro-batch, for per-micro files.
    pub micro: Option<u32>,
    /// Worst comparison verdict (or Missing).
    pub verdict: Verdict,
    /// One line saying why.
    pub reason: String,
    /// How rows were paired, for row-wise tensors.
    pub rows: Option<RowSummary>,
    /// Every tensor or scalar compared.
    pub comparisons: Vec<Comparison>,
}

/// How a cell's rows were paired.
#[derive(Debug, Clone, Serialize)]
pub struct RowSummary {
    /// Content, content with the datum shift, or index.
    pub method: MatchMethod,
    /// `(reference row, other row)` pairs.
    pub pairs: Vec<(usize, usize)>,
    /// Reference rows without partner.
    pub only_reference: Vec<usize>,
    /// Other rows without partner.
    pub only_other: Vec<usize>,
}

/// Where a compared value came from on one side.
#[derive(Debug, Clone, Serialize)]
pub struct Origin {
    /// `dumped`, `derived` or `sliced`.
    pub how: String,
    /// The file (kind folder) and key, or the formula.
    pub from: String,
}

impl Origin {
    /// A value read as is from `kind` under `key`.
    pub fn dumped(kind: &str, key: &str) -> Self {
        Origin {
            how: "dumped".into(),
            from: format!("{kind}.{key}"),
        }
    }

    /// A value computed here from dumped inputs.
    pub fn derived(formula: impl Into<String>) -> Self {
        Origin {
            how: "derived".into(),
            from: formula.into(),
        }
    }

    /// Rows cut from a whole-batch tensor.
    pub fn sliced(from: impl Into<String>) -> Self {
        Origin {
            how: "sliced".into(),
            from: from.into(),
        }
    }
}

/// One compared tensor or scalar pair.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Full name (`is_loss.prob_ratio`), the key tolerance rules match.
    pub name: String,
    /// Reference side origin.
    pub origin_a: Origin,
    /// Other side origin.
    pub origin_b: Origin,
    /// Declared dtype, reference side.
    pub dtype_a: Option<DType>,
    /// Declared dtype, other side.
    pub dtype_b: Option<DType>,
    /// The precision the pair is judged at (coarsest of declared and value-detected).
    pub precision: Option<DType>,
    /// Shape, reference side (empty for scalars).
    pub shape_a: Vec<usize>,
    /// Shape, other side.
    pub shape_b: Vec<usize>,
    /// The tolerance applied.
    pub tolerance: Tolerance,
    /// The metrics (absent when not compared).
    pub metrics: Option<PairMetrics>,
    /// The verdict.
    pub verdict: Verdict,
    /// Why.
    pub reason: String,
}

/// A file (or cell) present on one side only.
#[derive(Debug, Clone, Serialize)]
pub struct Coverage {
    /// Kind folder.
    pub kind: String,
    /// Rank, when per-rank.
    pub rank: Option<u32>,
    /// Micro, when per-micro.
    pub micro: Option<u32>,
    /// The side that has it.
    pub present_on: String,
    /// The side that lacks it.
    pub missing_on: String,
}

pub use crate::model::unreadable::Unreadable;

/// One place worth pointing a user at.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// Section name.
    pub section: String,
    /// Comparison name.
    pub name: String,
    /// Rank.
    pub rank: Option<u32>,
    /// Micro.
    pub micro: Option<u32>,
    /// Reference-side row (None for scalars).
    pub row: Option<usize>,
    /// Other-side row.
    pub other_row: Option<usize>,
    /// Position along the response.
    pub pos: Option<usize>,
    /// Reference value.
    pub a: f64,
    /// Other value.
    pub b: f64,
    /// `|a − b|`.
    pub abs_diff: f64,
    /// `|a − b|` over the allowed difference at that element (how many tolerances off).
    pub excess: f64,
    /// The comparison's verdict.
    pub verdict: Verdict,
    /// The comparison's reason.
    pub reason: String,
}

/// Both sides of one loss disagreement recomputed from their own dumped inputs.
#[derive(Debug, Clone, Serialize)]
pub struct Adjudication {
    /// Rank.
    pub rank: u32,
    /// Micro-batch.
    pub micro: u32,
    /// The losscheck preset whose conventions were used (e.g. `nexrl-is`).
    pub preset: String,
    /// One verdict per side, reference first.
    pub sides: Vec<SideVerdict>,
    /// The answer in one line ("weaver loss disagrees with its own inputs; self-hosted matches").
    pub conclusion: String,
    /// The step's own conventions that differ, said in `conclusion`.
    #[serde(skip)]
    pub differ: Option<String>,
}

/// One side's self-consistency at a rank/micro.
#[derive(Debug, Clone, Serialize)]
pub struct SideVerdict {
    /// `self-hosted`, `weaver` or `remote-api`.
    pub role: String,
    /// Consistent or inconsistent; absent when the side could not be recomputed.
    pub status: Option<crate::judge::Status>,
    /// The dumped loss.
    pub dumped_loss: Option<f64>,
    /// The loss recomputed from the side's own inputs.
    pub recomputed_loss: Option<f64>,
    /// losscheck's verdict line, or why the side could not be recomputed.
    pub detail: String,
    /// Its dumped pg term is the plain sum of its own per-token loss
    /// ([`crate::judge::Verdict::own_sum`]).
    #[serde(skip)]
    pub own_sum: bool,
}

/// One file behind a cell that did not pass.
#[derive(Debug, Clone, Serialize)]
pub struct OffendingFile {
    /// Section of the cell (`is_loss`, or `coverage` for a file on one side only).
    pub section: String,
    /// Rank.
    pub rank: Option<u32>,
    /// Micro-batch.
    pub micro: Option<u32>,
    /// Side the file belongs to (`self-hosted`, `weaver`, `remote-api`).
    pub role: String,
    /// Its kind folder.
    pub kind: String,
    /// The file.
    pub path: PathBuf,
}

/// The kind folders a section reads (the importance-sampling section compares the
/// self-hosted `forward_data`/`old_log_probs` with weaver's `is_loss_debug`).
fn section_kinds(section: &str) -> Vec<Kind> {
    match section {
        "is_loss" => vec![Kind::ForwardData, Kind::OldLogProbs, Kind::IsLossDebug],
        "loss" => vec![Kind::Loss],
        s => Kind::ALL
            .into_iter()
            .filter(|k| k.dir_name().trim_end_matches('s') == s.trim_end_matches('s'))
            .collect(),
    }
}

/// The files of `step` behind every non-passing per-rank cell of `sections` and every
/// one-sided file of `coverage`, looked up in each side's tree (`(role, tree)`).
pub fn offending_files(
    sections: &[Section],
    coverage: &[Coverage],
    trees: &[(&str, &DumpTree)],
    step: i64,
) -> Vec<OffendingFile> {
    let mut out: Vec<OffendingFile> = Vec::new();
    let mut push = |section: &str, kind: Kind, rank, micro, role: &str, path: &PathBuf| {
        if !out.iter().any(|o| o.path == *path) {
            out.push(OffendingFile {
                section: section.into(),
                rank,
                micro,
                role: role.into(),
                kind: kind.dir_name().into(),
                path: path.clone(),
            });
        }
    };
    for sec in sections {
        for c in sec.cells.iter().filter(|c| {
            c.rank.is_some() && c.verdict > Verdict::Pass && c.verdict != Verdict::Missing
        }) {
            for kind in section_kinds(&sec.name) {
                for (role, tree) in trees {
                    if let Some(f) = tree.get(kind, step, c.rank, c.micro) {
                        push(&sec.name, kind, c.rank, c.micro, role, &f.path);
                    }
                }
            }
        }
    }
    for c in coverage {
        let Some(kind) = Kind::ALL.into_iter().find(|k| k.dir_name() == c.kind) else {
            continue;
        };
        for (role, tree) in trees.iter().filter(|(r, _)| *r == c.present_on) {
            if let Some(f) = tree.get(kind, step, c.rank, c.micro) {
                push("coverage", kind, c.rank, c.micro, role, &f.path);
            }
        }
    }
    out
}

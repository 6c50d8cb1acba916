//! The mismatch report model: one section per step analysed, the trends across steps and
//! every finding; what the renderers print and `--format json` writes.

use std::path::PathBuf;

use super::attribution::Attribution;
use super::cell::MaskSource;
use super::metrics::ProducerMetrics;
use super::scan::{Histogram, TokenTable};
use super::trend::Trend;
use super::whatif::WhatIf;
use crate::model::finding::{Finding, Severity};
use crate::model::step::LogProbSource;

/// Version of the JSON report's layout; bumped on any change a consumer could notice.
pub const SCHEMA_VERSION: u32 = 1;

/// A metric under its producer's logged name.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct NamedMetric {
    /// The logged name (`rollout_corr/kl`, `vllm_kl`, …).
    pub name: String,
    /// Its value recomputed from the dump.
    pub value: f64,
}

/// What was compared and what could not be.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Coverage {
    /// Cells (rank × micro) scanned.
    pub cells: usize,
    /// Rows scanned.
    pub rows: u64,
    /// Tokens compared.
    pub tokens: u64,
    /// Rows one role holds and the other does not (no content match), never compared.
    pub unmatched_rows: usize,
    /// Masked tokens past the shorter role's columns, never compared.
    pub unmatched_tokens: usize,
    /// Masked tokens with a non-finite log-prob on either side, left out.
    pub unscored_tokens: u64,
    /// The masks the cells were read with.
    pub masks: Vec<MaskSource>,
    /// Token ids were dumped (attribution by token id).
    pub token_ids: bool,
    /// The what-if loss was computed (advantages dumped) on this many cells.
    pub loss_cells: usize,
    /// Why the what-if loss is missing, when it is.
    pub loss_note: Option<String>,
}

/// Where a row sits in its tree.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RowAt {
    /// Data-parallel rank.
    pub rank: usize,
    /// Micro-batch, `None` for a whole-batch cell.
    pub micro: Option<usize>,
    /// Row within the cell.
    pub row: usize,
}

/// How the rows of two trees of one step were paired (trainer A vs trainer B): by
/// content — each row's response token ids — never by index. Rows without a partner are
/// counted here and in [`Coverage::unmatched_rows`], with the first few named.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Pairing {
    /// The second tree (side B, role `b`).
    pub root_b: PathBuf,
    /// Its producer.
    pub producer_b: String,
    /// Rows paired.
    pub rows_paired: usize,
    /// Rows of A whose response no row of B holds.
    pub only_a: usize,
    /// Rows of B whose response no row of A holds.
    pub only_b: usize,
    /// Rows of A without response token ids (cannot be paired by content).
    pub without_ids_a: usize,
    /// Rows of B without response token ids.
    pub without_ids_b: usize,
    /// The first unpaired rows of A (at most [`Pairing::EXAMPLES`]).
    pub first_only_a: Vec<RowAt>,
    /// The first unpaired rows of B.
    pub first_only_b: Vec<RowAt>,
}

impl Pairing {
    /// Unpaired rows named per side.
    pub const EXAMPLES: usize = 10;
}

/// The analysis of one step.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StepReport {
    /// The step.
    pub step: i64,
    /// The producer whose files were read.
    pub producer: String,
    /// Where.
    pub root: PathBuf,
    /// The log-prob roles compared: `[a, b]`, `Δ = b − a`.
    pub pair: [LogProbSource; 2],
    /// Trainer A vs trainer B: role `a` read from this tree, role `b` from a second tree
    /// of the same step, rows paired by content (absent for one tree).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub against: Option<Pairing>,
    /// What was compared.
    pub coverage: Coverage,
    /// The producers' metrics.
    pub metrics: ProducerMetrics,
    /// The same under their logged names.
    pub named: Vec<NamedMetric>,
    /// The Δ histogram.
    pub histogram: Histogram,
    /// Where the mismatch sits.
    pub attribution: Attribution,
    /// The loss preset of the what-if loss.
    pub loss_preset: String,
    /// What each correction would have done.
    pub whatif: Vec<WhatIf>,
    /// This step's findings.
    pub findings: Vec<Finding>,
    /// The per-token table (`--export-frames`), not serialised.
    #[serde(skip)]
    pub token_table: Option<TokenTable>,
    /// Every sequence record (`--export-frames`), not serialised.
    #[serde(skip)]
    pub seq_table: Option<Vec<super::attribution::SeqRecord>>,
}

impl StepReport {
    /// A named metric's value.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.named.iter().find(|m| m.name == name).map(|m| m.value)
    }
}

/// The whole report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// `mismatch`.
    pub tool: &'static str,
    /// One section per step, ascending.
    pub steps: Vec<StepReport>,
    /// Metrics across steps (dumped steps, then logs).
    pub trends: Vec<Trend>,
    /// Every finding (steps' then trends').
    pub findings: Vec<Finding>,
}

impl Report {
    /// The most severe finding's severity.
    pub fn worst(&self) -> Option<Severity> {
        self.findings.iter().map(|f| f.severity).max()
    }
}

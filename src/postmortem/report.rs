//! What a postmortem found: the [`Postmortem`] (`summary.json` is it, serialised) and its
//! parts — the run, the crash, the last steps, pre-flight, replay, plots.

use std::path::PathBuf;

use super::dumps;
use super::traceback::{ExceptionBlock, Frame};
use crate::detect::classify::Classification;
use crate::detect::{Finding, Severity};
use crate::frames::log::frame::LogFrame;
use crate::logs::crash_bundle::CrashContext;

/// Version of the `summary.json` layout.
pub const SCHEMA_VERSION: u32 = 1;

/// Rows in the "last steps" table.
pub const LAST_STEPS: usize = 10;

/// How to analyse.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Threshold overrides for the detectors (`name=value`).
    pub thresholds: Vec<String>,
    /// `--dumps DIR --step N`: the training-step dumps to check (see [`dumps`]).
    pub dumps: Option<dumps::DumpsOptions>,
}

/// What the input was and how the run was started.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunInfo {
    /// The run's name (its folder name; a bundle's own name when given a bundle).
    pub name: String,
    /// The path given.
    pub path: PathBuf,
    /// `run` (a run folder) or `bundle` (a single crash bundle).
    pub kind: &'static str,
    /// `run_metadata.json`'s `timestamp`.
    pub started: Option<String>,
    /// `run_metadata.json`'s `argv`.
    pub argv: Vec<String>,
    /// Selected `config` entries (model, data, iters, batch/group size, lr, seed, …).
    pub config: serde_json::Map<String, serde_json::Value>,
    /// Planned iterations (`config.iters`).
    pub iters: Option<i64>,
}

/// The crash: where it came from, the exception, its signature and the batch.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CrashSummary {
    /// `bundle` (a `failures/` folder) or `event` (only a `crash` event in events.jsonl).
    pub source: &'static str,
    /// Bundle folder name.
    pub bundle: Option<String>,
    /// Step of the crash.
    pub step: Option<i64>,
    /// Bundle time `YYYYmmdd-HHMMSS`.
    pub time: Option<String>,
    /// Type of the exception the process died of.
    pub exception_type: String,
    /// Its message.
    pub message: String,
    /// The known signature (or `unknown`).
    pub classification: Classification,
    /// Every exception of the chain with its frames.
    pub chain: Vec<ExceptionBlock>,
    /// The innermost frame of the trainer's own code.
    pub trainer_frame: Option<Frame>,
    /// `context.json`: the offending batch.
    pub context: Option<CrashContext>,
    /// `extra.json`, as JSON.
    pub extra: Option<serde_json::Value>,
    /// Bundle files that were missing.
    pub missing_files: Vec<String>,
    /// `exception.txt` as written (the traceback shown plainly).
    pub exception_text: Option<String>,
}

/// The last steps before the crash (or the end) as a table.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StepTable {
    /// Where the rows come from (`recent_steps.jsonl`, `run logs`).
    pub source: String,
    /// Canonical metric names, one per column after `step`.
    pub columns: Vec<String>,
    /// `step` then one cell per column (`null` when absent; NaN as `"NaN"`).
    pub rows: Vec<(i64, Vec<Option<f64>>)>,
}

/// Token-length statistics of one pre-flight split.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Preflight {
    /// `train`/`valid`.
    pub split: String,
    /// Rows inspected.
    pub inspected: Option<i64>,
    /// Prompt token stats `{count, p50, p95, p99, max}`.
    pub prompt_token_stats: serde_json::Value,
    /// Answer token stats.
    pub answer_token_stats: serde_json::Value,
    /// Rows with an empty prompt (first 20).
    pub empty_prompt_indices: Vec<i64>,
    /// Rows with an empty answer (first 20).
    pub empty_answer_indices: Vec<i64>,
    /// Example rows `(index, prompt preview, answer preview)`.
    pub examples: Vec<(i64, String, String)>,
}

/// How to replay the crash.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Replay {
    /// Shell command reproducing the run up to the crashing step.
    pub command: String,
    /// Shell command with the usual fix applied, when the signature has one.
    pub fix_command: Option<String>,
    /// What to look at, one line each.
    pub notes: Vec<String>,
}

/// A plot written next to the report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PlotRef {
    /// Panel key (`loss`, `reward`, `grad_norm`, …).
    pub key: String,
    /// Panel title.
    pub title: String,
    /// PNG file name, relative to the report folder.
    pub png: String,
    /// SVG file name, relative to the report folder.
    pub svg: String,
}

/// Everything a postmortem found: `summary.json` is this, serialised.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Postmortem {
    /// Layout version of `summary.json`.
    pub schema_version: u32,
    /// The run.
    pub run: RunInfo,
    /// `crashed`, `completed`, `incomplete` (stopped before `iters` with no crash
    /// record) or `unknown` (no plan to compare with).
    pub status: &'static str,
    /// One sentence: what happened.
    pub headline: String,
    /// The crash, when there was one (the latest bundle when there are several).
    pub crash: Option<CrashSummary>,
    /// Other bundles in `failures/`, oldest first.
    pub earlier_bundles: Vec<String>,
    /// Run-level signatures (blank completions from the first step).
    pub diagnoses: Vec<Classification>,
    /// What to do, most important first.
    pub recommendations: Vec<String>,
    /// Logged steps in the whole-run frame.
    pub logged_steps: usize,
    /// First logged step.
    pub first_step: Option<i64>,
    /// Last logged step.
    pub last_step: Option<i64>,
    /// The last steps before the crash.
    pub last_steps: StepTable,
    /// logscan's findings over the whole run, worst first.
    pub findings: Vec<Finding>,
    /// Event counts by type.
    pub event_counts: std::collections::BTreeMap<String, usize>,
    /// Pre-flight summaries per split.
    pub preflight: Vec<Preflight>,
    /// The replay recipe.
    pub replay: Option<Replay>,
    /// Plots written (filled by `render::postmortem::write_report`).
    pub plots: Vec<PlotRef>,
    /// Data-quality notes (truncated lines, missing files, NaN counts).
    pub data_notes: Vec<String>,
    /// The training-step dump verdict (`--dumps DIR --step N`); absent from
    /// `summary.json` when no dumps were given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dumps: Option<dumps::Dumps>,
    /// The whole-run frame (not serialised).
    #[serde(skip)]
    pub frame: LogFrame,
}

impl Postmortem {
    /// The worst finding's severity.
    pub fn worst(&self) -> Option<Severity> {
        self.findings.iter().map(|f| f.severity).max()
    }

    /// The crash step, if any.
    pub fn crash_step(&self) -> Option<i64> {
        self.crash.as_ref().and_then(|c| c.step)
    }
}

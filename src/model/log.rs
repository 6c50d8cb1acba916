//! What every log reader emits: per-step metric records, discrete events and the
//! data-quality counts (bad lines, NaN, nulls, type changes) that are reported, never fatal.

use std::path::PathBuf;

/// Which kind of log a record came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// DebugTrainer `steps.jsonl`.
    Steps,
    /// DebugTrainer `events.jsonl` (`train_report`, `val_report`, `nan_gradient`, …).
    Events,
    /// verl file-logger JSONL `{"step", "data"}`.
    VerlJsonl,
    /// Hugging Face `trainer_state.json` `log_history`.
    HfTrainerState,
    /// verl console `step:N - key:value - …`.
    VerlConsole,
    /// TRL stdout dict lines `{'loss': 0.0, …}`.
    TrlDict,
    /// mlx-lm-lora `Iter N: Train loss …` reports.
    MlxReport,
    /// nanoGPT-style `iter N: loss …` lines.
    NanoGpt,
    /// Per-micro diagnostics `[Micro k] 3. Samples scored: …`.
    MicroDiag,
    /// A JSONL file of flat objects with a step field, of no known producer.
    GenericJsonl,
    /// A notebook progress table (`Step | Training Loss | …`).
    NotebookTable,
    /// Megatron ` iteration N/ M | … |` lines.
    Megatron,
    /// TensorBoard event file.
    Tensorboard,
    /// W&B transaction log (`run-*.wandb`).
    Wandb,
    /// CSV table (W&B export or plain, with a step column).
    Csv,
    /// MLflow file-store metric file.
    Mlflow,
    /// MLflow SQLite backend (`mlflow.db`).
    MlflowDb,
    /// Trackio project database or its Parquet export.
    Trackio,
    /// W&B run summary (`files/wandb-summary.json`): the last value of each key.
    WandbSummary,
    /// A Parquet table with a step column (not Trackio's export).
    Parquet,
    /// A generic `key: value` / `key=value` text step line (DeepSpeed-Chat, minimind, …).
    KvText,
}

impl SourceKind {
    /// A short stable name for tables and the frame's `source` column.
    pub fn name(self) -> &'static str {
        match self {
            SourceKind::Steps => "steps",
            SourceKind::Events => "events",
            SourceKind::VerlJsonl => "verl_jsonl",
            SourceKind::HfTrainerState => "hf_trainer_state",
            SourceKind::VerlConsole => "verl_console",
            SourceKind::TrlDict => "trl_dict",
            SourceKind::MlxReport => "mlx_report",
            SourceKind::NanoGpt => "nanogpt",
            SourceKind::MicroDiag => "micro_diag",
            SourceKind::GenericJsonl => "jsonl",
            SourceKind::NotebookTable => "notebook_table",
            SourceKind::Megatron => "megatron",
            SourceKind::Tensorboard => "tensorboard",
            SourceKind::Wandb => "wandb",
            SourceKind::Csv => "csv",
            SourceKind::Mlflow => "mlflow",
            SourceKind::MlflowDb => "mlflow_db",
            SourceKind::Trackio => "trackio",
            SourceKind::WandbSummary => "wandb_summary",
            SourceKind::Parquet => "parquet",
            SourceKind::KvText => "kv_text",
        }
    }
}

/// One step's numbers from one line (or one aggregated group of text lines).
#[derive(Debug, Clone, PartialEq)]
pub struct LogRecord {
    /// Training step; `None` when the line carries none (a TRL dict line).
    pub step: Option<i64>,
    /// Unix time in seconds, if the line has one.
    pub timestamp: Option<f64>,
    /// Producer format.
    pub source: SourceKind,
    /// 0-based index of the file in the scan.
    pub file: usize,
    /// 1-based line the record starts on.
    pub line: u64,
    /// Raw numeric fields, nested keys joined with `.`; NaN/±inf kept as they are.
    pub fields: Vec<(String, f64)>,
}

/// A discrete event: a warning line, a DebugTrainer event, a crash.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LogEvent {
    /// Event type (`empty_completion_tokens`, `nan_gradient`, `advantages_near_zero`, …).
    pub kind: String,
    /// Step the event belongs to (after inference, see `step_inferred`).
    pub step: Option<i64>,
    /// The step the producer wrote, when it differs from `step`.
    pub reported_step: Option<i64>,
    /// True when `step` was inferred from the file order rather than read.
    pub step_inferred: bool,
    /// Unix time in seconds.
    pub timestamp: Option<f64>,
    /// `level` field (`warning`, `info`, …) when present.
    pub level: Option<String>,
    /// 0-based index of the file in the scan.
    pub file: usize,
    /// 1-based line.
    pub line: u64,
    /// Numeric payload (`nan_count`, `grad_norm`, …).
    pub numbers: Vec<(String, f64)>,
    /// Integer lists of the payload (`token_counts`, `indices`).
    pub lists: Vec<(String, Vec<f64>)>,
    /// A short text payload (`message`), if any.
    pub text: Option<String>,
    /// The run of its file the event belongs to (0 unless the file's step restarted).
    #[serde(skip_serializing_if = "is_zero")]
    pub run: u32,
}

fn is_zero(r: &u32) -> bool {
    *r == 0
}

/// Splits one file's records into appended runs: a step that goes back below the last
/// one to (or below) the first step of the current run starts a new run. Steps that only
/// arrive out of order inside a run (a late record merged into an earlier step) do not.
#[derive(Debug, Default, Clone)]
pub struct RunTracker {
    /// The current run (0-based).
    pub run: u32,
    first: Option<i64>,
    last: Option<i64>,
    /// `(line, step)` where each run after the first starts.
    pub starts: Vec<(u64, i64)>,
}

impl RunTracker {
    /// Note a training record's step at `line`; returns the run it belongs to.
    pub fn observe(&mut self, step: i64, line: u64) -> u32 {
        match (self.first, self.last) {
            (Some(first), Some(last)) if step < last && step <= first => {
                self.run += 1;
                self.first = Some(step);
                self.starts.push((line, step));
            }
            (None, _) => self.first = Some(step),
            _ => {}
        }
        self.last = Some(step);
        self.run
    }

    /// The run a line belongs to (by the run starts seen so far).
    pub fn run_at_line(&self, line: u64) -> u32 {
        self.starts.iter().filter(|(l, _)| *l <= line).count() as u32
    }
}

impl LogEvent {
    /// An event of `kind` at `line` with nothing else filled in.
    pub fn new(kind: impl Into<String>, file: usize, line: u64) -> Self {
        LogEvent {
            kind: kind.into(),
            step: None,
            reported_step: None,
            step_inferred: false,
            timestamp: None,
            level: None,
            file,
            line,
            numbers: Vec::new(),
            lists: Vec::new(),
            text: None,
            run: 0,
        }
    }

    /// The numeric payload field `name`.
    pub fn number(&self, name: &str) -> Option<f64> {
        self.numbers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v)
    }

    /// The list payload field `name`.
    pub fn list(&self, name: &str) -> Option<&[f64]> {
        self.lists
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// A line that could not be read, kept for the report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BadLine {
    /// 1-based line.
    pub line: u64,
    /// What was wrong (with column when known).
    pub message: String,
}

/// A key whose JSON type changed between lines.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TypeChange {
    /// The flattened key.
    pub key: String,
    /// Line where it first appeared with `from`.
    pub first_line: u64,
    /// Line where it first appeared with `to`.
    pub line: u64,
    /// The earlier type name.
    pub from: String,
    /// The later type name.
    pub to: String,
}

/// Most bad lines kept verbatim per file; the rest are only counted.
pub const MAX_BAD_LINES_KEPT: usize = 20;

/// Per-file reading statistics: what was read and what was odd about it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FileStats {
    /// The file.
    pub path: PathBuf,
    /// Detected format (`steps`, `events`, `verl_jsonl`, `text`, …).
    pub format: String,
    /// Bytes read.
    pub bytes: u64,
    /// Lines seen (including blank ones).
    pub lines: u64,
    /// Records produced.
    pub records: u64,
    /// Events produced.
    pub events: u64,
    /// Lines that could not be parsed (the truncated last line included).
    pub bad_line_count: u64,
    /// The first few bad lines.
    pub bad_lines: Vec<BadLine>,
    /// The last line ended without a newline and did not parse: a crash cut it.
    pub truncated_last_line: bool,
    /// Fields that were `null`.
    pub nulls: u64,
    /// Numeric fields that were NaN or ±Infinity.
    pub non_finite: u64,
    /// Keys whose type changed between lines (first change per key).
    pub type_changes: Vec<TypeChange>,
    /// Text lines that matched no known pattern.
    pub unrecognised_lines: u64,
    /// Events dropped as exact duplicates of the previous one (same payload, <1 s apart).
    pub duplicate_events: u64,
    /// Events whose step was inferred from file order (their own step field was stale).
    pub inferred_steps: u64,
    /// The first non-blank line, cut to [`PREVIEW_CHARS`] (what a user sees when nothing
    /// in the file was understood).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_line: Option<String>,
    /// Appended runs in the file: the step went back to (or below) the start of the run
    /// before it this many times, plus one (0 when no step was read).
    pub runs: u32,
    /// Records that are evaluation/validation only (kept apart from training steps).
    pub eval_records: u64,
    /// TensorBoard text summaries seen (`add_text`: verl's validation generations), read
    /// as completions by logscan.
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub text_summaries: u64,
    /// Text lines that were only a progress bar (among [`FileStats::unrecognised_lines`]):
    /// a console of bars alone logged no training step.
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub progress_bars: u64,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// Characters of a file's first line kept in [`FileStats::first_line`].
pub const PREVIEW_CHARS: usize = 100;

/// The first non-blank line of `head`, cut to [`PREVIEW_CHARS`] characters.
pub fn preview(head: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(head);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let mut out: String = line.chars().take(PREVIEW_CHARS).collect();
    if line.chars().count() > PREVIEW_CHARS {
        out.push('…');
    }
    Some(out)
}

impl FileStats {
    /// Remember a bad line (the first [`MAX_BAD_LINES_KEPT`] verbatim).
    pub fn bad_line(&mut self, line: u64, message: impl Into<String>) {
        self.bad_line_count += 1;
        if self.bad_lines.len() < MAX_BAD_LINES_KEPT {
            self.bad_lines.push(BadLine {
                line,
                message: message.into(),
            });
        }
    }
}

/// Tracks each key's first JSON type to report changes between lines; keys are the frame
/// builder's key ids.
#[derive(Debug, Default)]
pub struct TypeTracker {
    /// `(first type, first line, change reported)` per key id.
    seen: Vec<Option<(&'static str, u64, bool)>>,
}

impl TypeTracker {
    /// Note that key `id` (named `key`) had type `ty` on `line`; record the first change
    /// per key.
    pub fn observe(
        &mut self,
        id: u32,
        key: &str,
        ty: &'static str,
        line: u64,
        stats: &mut FileStats,
    ) {
        let i = id as usize;
        if self.seen.len() <= i {
            self.seen.resize(i + 1, None);
        }
        match &mut self.seen[i] {
            slot @ None => *slot = Some((ty, line, false)),
            Some((first, first_line, reported)) => {
                // Types are `&'static str` constants: the same pointer is the same type
                // (no byte compare on the hot path), else the text decides.
                if !std::ptr::eq(*first, ty) && *first != ty && !*reported {
                    *reported = true;
                    stats.type_changes.push(TypeChange {
                        key: key.to_string(),
                        first_line: *first_line,
                        line,
                        from: first.to_string(),
                        to: ty.to_string(),
                    });
                }
            }
        }
    }
}

/// Field marking a record as evaluation/validation only (not a training step).
pub const EVAL_MARK: &str = "eval_record";

//! `postmortem`: turn a crashed or failed DebugTrainer run folder (or one crash bundle)
//! into a report people read: what happened and when, the exception and its known
//! signature, the offending batch, the last steps, logscan's findings over the whole run,
//! the pre-flight summary, a replay recipe and plots. With [`Options::dumps`]
//! (`--dumps DIR --step N`) it also gives the verdict on that training step's tensor dumps:
//! losscheck's self-consistency when DIR is one dump tree, dumpdiff (plus losscheck's
//! adjudication) when it holds several; see [`dumps`] for how the folders map onto the tools.
//!
//! ```no_run
//! use rlforensics::postmortem::{analyze, Options};
//! use rlforensics::render::postmortem::write_report;
//! let pm = analyze("debug_runs/20251008-110028".as_ref(), &Options::default()).unwrap();
//! let written = write_report(&pm, "reports".as_ref()).unwrap();
//! println!("{} -> {}", pm.headline, written.dir.display());
//! ```

pub mod classify;
pub mod document;
pub mod dumps;
pub mod replay;
pub mod traceback;

use std::path::{Path, PathBuf};

use crate::detect::{json_num, Finding, Severity};
use crate::error::{Error, Result};
use crate::frames::log::frame::LogFrame;
use crate::logscan::{scan, ScanOptions};
use crate::model::log::LogEvent;
use crate::readers::crash_bundle::{self, CrashBundle, CrashContext};
use crate::value::Value;
use classify::Classification;
use traceback::{ExceptionBlock, Frame, Traceback};

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

/// Keys of `run_metadata.json`'s `config` shown in the report.
const CONFIG_KEYS: &[&str] = &[
    "model",
    "data",
    "train_mode",
    "iters",
    "batch_size",
    "group_size",
    "learning_rate",
    "seed",
    "importance_sampling_level",
    "grpo_loss_type",
    "max_completion_length",
    "temperature",
    "beta",
    "epsilon",
    "gradient_accumulation_steps",
];

/// Metrics shown in the last-steps table, in order, when present.
const TABLE_METRICS: &[&str] = &[
    "loss",
    "grad_norm",
    "grad_nan_count",
    "reward_mean",
    "reward_std",
    "kl",
    "entropy",
    "completion_len_min",
    "completion_len_mean",
    "empty_count",
    "lr",
    "peak_memory_gb",
    "step_time",
    "it_per_sec",
];

/// A JSON value from a [`Value`] (NaN/inf as strings, as in every report).
pub fn to_json(v: &Value) -> serde_json::Value {
    match v {
        Value::None => serde_json::Value::Null,
        Value::Bool(b) => (*b).into(),
        Value::Int(i) => (*i).into(),
        Value::BigInt(s) => s.clone().into(),
        Value::Float(f) => json_num(*f),
        Value::Str(s) => s.clone().into(),
        Value::Bytes(b) => format!("<{} bytes>", b.len()).into(),
        Value::List(xs) | Value::Tuple(xs) => xs.iter().map(to_json).collect(),
        Value::Packed(p) => p.to_values().iter().map(to_json).collect(),
        Value::Dict(items) => items
            .iter()
            .map(|(k, v)| {
                let key = match k {
                    Value::Str(s) => s.clone(),
                    other => format!("{other:?}"),
                };
                (key, to_json(v))
            })
            .collect::<serde_json::Map<_, _>>()
            .into(),
        Value::Tensor(t) => format!("<tensor {:?} {:?}>", t.dtype(), t.shape()).into(),
    }
}

/// Analyse `path`: a run folder (`run_metadata.json`, logs, `failures/`) or one bundle.
pub fn analyze(path: &Path, opts: &Options) -> Result<Postmortem> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_dir() {
        return Err(Error::input(
            path,
            "expected a run folder (run_metadata.json, steps.jsonl, events.jsonl, failures/) or a crash bundle folder",
        ));
    }
    let name = path
        .canonicalize()
        .map_err(|e| Error::io(path, e))?
        .file_name()
        .map_or_else(|| "run".to_string(), |n| n.to_string_lossy().into_owned());
    let is_bundle = crash_bundle::is_bundle(path);
    let mut notes: Vec<String> = Vec::new();
    let dumps = opts.dumps.as_ref().map(dumps::analyze).transpose()?;

    // Bundles.
    let bundle_dirs = if is_bundle {
        vec![path.to_path_buf()]
    } else {
        crash_bundle::list_bundles(path)?
    };
    let mut bundles: Vec<CrashBundle> = Vec::new();
    for d in &bundle_dirs {
        bundles.push(crash_bundle::read_bundle(d)?);
    }
    let latest = bundles.pop();

    // Run metadata.
    let meta_path = path.join("run_metadata.json");
    let metadata = if meta_path.is_file() {
        Some(crash_bundle::read_json(&meta_path)?)
    } else {
        None
    };
    let run = run_info(&name, path, is_bundle, metadata.as_ref());

    // Whole-run frame and findings: the run's logs, else the bundle's recent steps.
    let mut scan_paths: Vec<PathBuf> = Vec::new();
    if !is_bundle {
        scan_paths = log_files(path)?;
    }
    let mut table_source = "run logs".to_string();
    if scan_paths.is_empty() {
        if let Some(p) = latest.as_ref().and_then(|b| b.recent_steps_path.clone()) {
            scan_paths.push(p);
            table_source = "recent_steps.jsonl".to_string();
        }
    }
    let sopts = ScanOptions {
        thresholds: opts.thresholds.clone(),
        ..ScanOptions::default()
    };
    let (frame, events, findings, event_counts) = if scan_paths.is_empty() {
        notes.push("no step logs found: no findings and no plots".to_string());
        (
            LogFrame::default(),
            Vec::new(),
            Vec::new(),
            Default::default(),
        )
    } else {
        let r = scan(&scan_paths, &sopts)?;
        notes.extend(crate::logscan::notes::file_notes(&r));
        (r.frame, r.events, r.findings, r.event_counts)
    };

    // Last-steps table: the bundle's recent steps when there are some.
    let last_steps = match latest.as_ref().and_then(|b| b.recent_steps_path.clone()) {
        Some(p) if !is_bundle && !latest.as_ref().is_some_and(|b| b.recent_steps.is_empty()) => {
            let r = scan(&[p], &sopts)?;
            step_table(&r.frame, "recent_steps.jsonl")
        }
        _ => step_table(&frame, &table_source),
    };

    // Events read again for what logscan keeps no payload of (pre-flight, crash).
    let events_path = path.join("events.jsonl");
    let raw_events = if is_bundle || !events_path.exists() {
        Vec::new()
    } else {
        read_raw_events(&events_path)?
    };
    let preflight = raw_events
        .iter()
        .filter(|e| e.get("event").and_then(Value::as_str) == Some("preflight_summary"))
        .map(preflight_of)
        .collect();
    let crash_event = raw_events
        .iter()
        .rev()
        .find(|e| e.get("event").and_then(Value::as_str) == Some("crash"));

    let crash = match &latest {
        Some(b) => {
            notes.extend(b.notes.iter().cloned());
            if !b.missing.is_empty() {
                notes.push(format!(
                    "{}: missing {}",
                    b.dir.display(),
                    b.missing.join(", ")
                ));
            }
            Some(crash_from_bundle(b))
        }
        None => crash_event.map(|e| crash_from_event(e, frame.steps().last())),
    };

    let diagnoses: Vec<Classification> = chat_template_diagnosis(&frame, &events)
        .into_iter()
        .collect();
    let status = if crash.is_some() {
        "crashed"
    } else {
        match (run.iters, frame.steps().last()) {
            (Some(n), Some(l)) if l >= n => "completed",
            (Some(_), _) => "incomplete",
            _ => "unknown",
        }
    };
    let replay = replay::recipe(&run, crash.as_ref());
    let mut recommendations = recommendations(crash.as_ref(), &diagnoses, &findings);
    recommendations.extend(dumps.as_ref().and_then(dumps::recommendation));
    let headline = headline(status, &run, crash.as_ref(), &diagnoses, &findings, &frame);
    Ok(Postmortem {
        schema_version: SCHEMA_VERSION,
        run,
        status,
        headline,
        crash,
        earlier_bundles: bundles.iter().map(|b| b.name.clone()).collect(),
        diagnoses,
        recommendations,
        logged_steps: frame.len(),
        first_step: frame.steps().first(),
        last_step: frame.steps().last(),
        last_steps,
        findings,
        event_counts,
        preflight,
        replay,
        plots: Vec::new(),
        data_notes: notes,
        dumps,
        frame,
    })
}

/// Log files directly in a run folder (`*.jsonl`, `*.log`, `*.txt`, `*.out`), non-empty.
pub(crate) fn log_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .map(|e| e.map(|e| e.path()).map_err(|e| Error::io(dir, e)))
        .collect::<Result<Vec<PathBuf>>>()?;
    let mut out: Vec<PathBuf> = entries
        .into_iter()
        .filter(|p| {
            let n = p
                .file_name()
                .map(|n| n.to_string_lossy().to_ascii_lowercase())
                .unwrap_or_default();
            p.is_file()
                && [".jsonl", ".log", ".txt", ".out"]
                    .iter()
                    .any(|e| n.ends_with(e))
                && p.metadata().is_ok_and(|m| m.len() > 0)
        })
        .collect();
    out.sort();
    Ok(out)
}

fn run_info(name: &str, path: &Path, is_bundle: bool, meta: Option<&Value>) -> RunInfo {
    let argv = meta
        .and_then(|m| m.get("argv"))
        .and_then(Value::as_seq)
        .map(|xs| {
            xs.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let cfg = meta.and_then(|m| m.get("config"));
    let mut config = serde_json::Map::new();
    for k in CONFIG_KEYS {
        if let Some(v) = cfg.and_then(|c| c.get(k)) {
            if !matches!(v, Value::None) {
                config.insert((*k).to_string(), to_json(v));
            }
        }
    }
    if let Some(d) = meta.and_then(|m| m.get("debug")) {
        for k in [
            "min_new_tokens",
            "fallback_sequence_on_empty",
            "keep_recent_steps",
        ] {
            if let Some(v) = d.get(k) {
                config.insert(format!("debug.{k}"), to_json(v));
            }
        }
    }
    let iters = cfg
        .and_then(|c| c.get("iters"))
        .and_then(Value::as_f64)
        .map(|f| f as i64);
    RunInfo {
        name: name.to_string(),
        path: path.to_path_buf(),
        kind: if is_bundle { "bundle" } else { "run" },
        started: meta
            .and_then(|m| m.get("timestamp"))
            .and_then(Value::as_str)
            .map(str::to_string),
        argv,
        config,
        iters,
    }
}

fn step_table(frame: &LogFrame, source: &str) -> StepTable {
    let columns: Vec<String> = TABLE_METRICS
        .iter()
        .filter(|m| frame.col(m).is_some())
        .map(|m| m.to_string())
        .collect();
    let n = frame.len();
    let start = n.saturating_sub(LAST_STEPS);
    let rows = (start..n)
        .map(|i| {
            (
                frame.step(i),
                columns.iter().map(|c| frame.at(c, i)).collect(),
            )
        })
        .collect();
    StepTable {
        source: source.to_string(),
        columns,
        rows,
    }
}

/// Every parseable line of an events file (bad lines are logscan's to report: the scan
/// of the same file counts them in the data notes); an unreadable file is an error.
fn read_raw_events(path: &Path) -> Result<Vec<Value>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|l| crate::json::parse_value(l.trim()).ok())
        .filter(|v| v.as_dict().is_some())
        .collect())
}

fn ints(v: Option<&Value>) -> Vec<i64> {
    v.and_then(Value::as_seq)
        .map(|xs| xs.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default()
}

fn preflight_of(e: &Value) -> Preflight {
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    Preflight {
        split: text(e, "split"),
        inspected: e.get("inspected").and_then(Value::as_i64),
        prompt_token_stats: e.get("prompt_token_stats").map(to_json).unwrap_or_default(),
        answer_token_stats: e.get("answer_token_stats").map(to_json).unwrap_or_default(),
        empty_prompt_indices: ints(e.get("empty_prompt_indices")),
        empty_answer_indices: ints(e.get("empty_answer_indices")),
        examples: e
            .get("example_previews")
            .and_then(Value::as_seq)
            .map(|xs| {
                xs.iter()
                    .map(|x| {
                        (
                            x.get("index").and_then(Value::as_i64).unwrap_or(-1),
                            text(x, "prompt_preview"),
                            text(x, "answer_preview"),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn crash_from_bundle(b: &CrashBundle) -> CrashSummary {
    let tb: Option<Traceback> = b.exception.as_deref().and_then(traceback::parse);
    let (exc_type, message, chain, trainer_frame, classification) = match &tb {
        Some(tb) => {
            let last = tb.last();
            (
                last.map(|l| l.exc_type.clone()).unwrap_or_default(),
                last.map(|l| l.message.clone()).unwrap_or_default(),
                tb.chain.clone(),
                last.and_then(|l| l.last_trainer_frame().cloned()),
                classify::classify(&tb.signature_text()),
            )
        }
        None => {
            let text = b.exception.clone().unwrap_or_default();
            let c = if text.trim().is_empty() {
                classify::classify("")
            } else {
                classify::classify(&text)
            };
            (
                if b.exception.is_some() {
                    "<unparsed>".to_string()
                } else {
                    "<no exception.txt>".to_string()
                },
                text.trim().lines().last().unwrap_or("").to_string(),
                Vec::new(),
                None,
                c,
            )
        }
    };
    CrashSummary {
        source: "bundle",
        bundle: Some(b.name.clone()),
        step: b.step(),
        time: b.time.clone(),
        exception_type: exc_type,
        message,
        classification,
        chain,
        trainer_frame,
        context: b.context.clone(),
        extra: b.extra.as_ref().map(to_json),
        missing_files: b.missing.clone(),
        exception_text: b.exception.clone(),
    }
}

fn crash_from_event(e: &Value, last_step: Option<i64>) -> CrashSummary {
    let message = e
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let bundle = e
        .get("crash_dir")
        .and_then(Value::as_str)
        .and_then(|d| d.rsplit('/').next())
        .map(str::to_string);
    let (time, name_step) = bundle
        .as_deref()
        .map(crash_bundle::parse_bundle_name)
        .unwrap_or((None, None));
    CrashSummary {
        source: "event",
        bundle,
        step: name_step.or(last_step),
        time,
        exception_type: "<from crash event>".to_string(),
        classification: classify::classify(&message),
        message,
        chain: Vec::new(),
        trainer_frame: None,
        context: None,
        extra: None,
        missing_files: Vec::new(),
        exception_text: None,
    }
}

/// Blank completions from the first step on, in at least half of the logged steps.
fn chat_template_diagnosis(frame: &LogFrame, events: &[LogEvent]) -> Option<Classification> {
    let empty: Vec<&LogEvent> = events
        .iter()
        .filter(|e| e.kind == "empty_completion_tokens")
        .collect();
    let first_event = empty.iter().filter_map(|e| e.step).min()?;
    let first_step = frame.steps().first().unwrap_or(first_event);
    if first_event > first_step.max(1) {
        return None;
    }
    let with_empty: std::collections::BTreeSet<i64> = empty.iter().filter_map(|e| e.step).collect();
    let covered = frame
        .steps()
        .iter()
        .filter(|s| with_empty.contains(s))
        .count();
    if frame.is_empty() || (covered as f64) < 0.5 * frame.len() as f64 {
        return None;
    }
    let (mut n_empty, mut n_all) = (0usize, 0usize);
    for e in &empty {
        if let Some(tc) = e.list("token_counts") {
            n_all += tc.len();
            n_empty += tc.iter().filter(|c| **c == 0.0).count();
        }
    }
    let share = if n_all > 0 {
        format!(
            "; {:.0}% of the completions in those batches had no token",
            100.0 * n_empty as f64 / n_all as f64
        )
    } else {
        String::new()
    };
    Some(classify::chat_template_garbage(format!(
        "{covered} of {} logged steps had empty completions, the first at step {first_event}{share}",
        frame.len()
    )))
}

fn recommendations(
    crash: Option<&CrashSummary>,
    diagnoses: &[Classification],
    findings: &[Finding],
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Some(c) = crash {
        out.extend(c.classification.fixes.iter().map(|s| s.to_string()));
        if c.classification.id == "unknown" {
            match &c.trainer_frame {
                Some(f) => out.push(format!(
                    "Start from the trainer's last frame: {}:{} in {}.",
                    f.file,
                    f.line.map_or("?".to_string(), |l| l.to_string()),
                    f.function
                )),
                None => out.push("Read the traceback from its last line up.".to_string()),
            }
        }
    }
    for d in diagnoses {
        out.extend(d.fixes.iter().map(|s| s.to_string()));
    }
    for f in findings.iter().filter(|f| f.severity >= Severity::Error) {
        if let Some(c) = f.likely_causes.first() {
            out.push(format!(
                "{} (steps {}): check {}",
                f.detector,
                f.step_range(),
                c
            ));
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|s| seen.insert(s.clone()));
    out
}

fn headline(
    status: &str,
    run: &RunInfo,
    crash: Option<&CrashSummary>,
    diagnoses: &[Classification],
    findings: &[Finding],
    frame: &LogFrame,
) -> String {
    let worst = findings
        .iter()
        .map(|f| f.severity)
        .max()
        .map_or(String::new(), |w| format!(" (worst: {})", w.name()));
    let nf = format!("{} finding(s){worst}", findings.len());
    match crash {
        Some(c) => {
            let at = c
                .step
                .map_or("an unknown step".to_string(), |s| format!("step {s}"));
            let what = if c.classification.id == "unknown" {
                format!("{}: {}", c.exception_type, first_line(&c.message))
            } else {
                format!(
                    "{} ({}: {})",
                    c.classification.title,
                    c.exception_type,
                    first_line(&c.message)
                )
            };
            format!("Crashed at {at}: {what}. {nf} over the run.")
        }
        None => {
            let last = frame
                .steps()
                .last()
                .map_or("-".to_string(), |s| s.to_string());
            let plan = run.iters.map_or(String::new(), |n| format!(" of {n}"));
            let diag = diagnoses
                .first()
                .map_or(String::new(), |d| format!(" {}.", d.title));
            let what = match status {
                "completed" => format!("No crash: ran to step {last}{plan}."),
                "incomplete" => format!("No crash record, but stopped at step {last}{plan}."),
                _ => format!("No crash record; last logged step {last}."),
            };
            format!("{what}{diag} {nf}.")
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

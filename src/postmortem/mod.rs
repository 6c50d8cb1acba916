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
//! let written = write_report(&pm, "reports/20251008-110028".as_ref()).unwrap();
//! println!("{} -> {}", pm.headline, written.dir.display());
//! ```

mod advice;
mod crash;
pub mod document;
pub mod dumps;
pub mod replay;
pub mod report;
pub mod traceback;

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::detect::classify::Classification;
use crate::error::{Error, Result};
use crate::frames::log::frame::LogFrame;
use crate::logs::crash_bundle::{self, CrashBundle};
use crate::logscan::{scan, ScanOptions};

use advice::{chat_template_diagnosis, headline, recommendations};
use crash::{crash_from_bundle, crash_from_event, preflight_of};
pub use report::{
    CrashSummary, Options, PlotRef, Postmortem, Preflight, Replay, RunInfo, StepTable, LAST_STEPS,
    SCHEMA_VERSION,
};

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
        Some(crash_bundle::read_json_doc(&meta_path)?)
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
    let (frame, events, mut findings, event_counts) = if scan_paths.is_empty() {
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
        crate::logs::events::read_raw(&events_path)?
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

    if crash.is_some() {
        // the crash section reports it, from the bundle or the event: logscan's crash
        // finding would say it twice (it stays for a run whose only trace of the crash
        // is a traceback in a text log)
        findings.retain(|f| f.detector != "crash");
    }
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
        .and_then(Value::as_array)
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
            if !v.is_null() {
                config.insert((*k).to_string(), v.clone());
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
                config.insert(format!("debug.{k}"), v.clone());
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

//! Experiment-tracker files, where most runs' metrics actually live: TensorBoard event
//! files, W&B offline runs (`run-*.wandb`, `files/wandb-summary.json`), MLflow file stores
//! (`mlruns/…/metrics/`) and SQLite backends (`mlflow.db`), Trackio databases and their
//! Parquet export, W&B CSV exports and plain CSV or Parquet with a step column. Each reader streams its file into per-step [`LogRecord`]s with the step axis
//! the tracker records; logscan's frame builder then resolves keys through the alias
//! table as for any other log.
//!
//! ```no_run
//! use rlforensics::logs::trackers::{self, TrackerKind};
//! let path = std::path::Path::new("runs/a/events.out.tfevents.1700000000.host.1.0");
//! let kind = trackers::sniff(path, b"").unwrap_or(TrackerKind::Tensorboard);
//! let f = std::fs::File::open(path).unwrap();
//! let stats = trackers::read(kind, path, f, 0, &mut |r| println!("{:?}", r.step)).unwrap();
//! println!("{} records", stats.records);
//! ```

pub mod csv;
mod json_num;
mod lines;
pub mod mlflow;
pub mod parquet;
pub mod rows;
pub mod sqlite;
pub mod tfevents;
pub mod wandb;
pub mod wandb_config;
pub mod wandb_files;
mod wandb_record;
mod wire;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::logs::aliases::AliasTable;
use crate::model::log::{FileStats, LogRecord};
use rows::{RowBatch, RowWriter};

/// A tracker file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrackerKind {
    /// TensorBoard `events.out.tfevents.*` (TFRecord framing, `Event` protobufs).
    Tensorboard,
    /// W&B transaction log `run-*.wandb` (LevelDB-log framing, `Record` protobufs).
    Wandb,
    /// A CSV file: a W&B chart export (`Step`, `<run> - <key>`) or a plain table with a
    /// step column.
    Csv,
    /// One metric file of an MLflow file store run (`<run>/metrics/<key>`).
    Mlflow,
    /// A SQLite database: MLflow's backend (`mlflow.db`) or a Trackio project, told apart
    /// by their tables.
    Sqlite,
    /// A Parquet table with a step column (Trackio's export, or plain).
    Parquet,
    /// A W&B run's `files/wandb-summary.json`.
    WandbSummary,
}

impl TrackerKind {
    /// The format name shown in reports.
    pub fn name(self) -> &'static str {
        match self {
            TrackerKind::Tensorboard => "tensorboard",
            TrackerKind::Wandb => "wandb",
            TrackerKind::Csv => "csv",
            TrackerKind::Mlflow => "mlflow",
            TrackerKind::Sqlite => "sqlite",
            TrackerKind::Parquet => "parquet",
            TrackerKind::WandbSummary => "wandb_summary",
        }
    }
}

/// The tracker kind of the file `path` whose first bytes are `head`, or `None` when it is
/// not a tracker file (logscan then reads it as a log). Names decide: a file named like a
/// tracker file that is not one is refused by [`read`] with a reason, never scanned as
/// text with no findings.
pub fn sniff(path: &Path, head: &[u8]) -> Option<TrackerKind> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_ascii_lowercase();
    if name.contains("tfevents") {
        return Some(TrackerKind::Tensorboard);
    }
    if name.ends_with(".wandb") || head.starts_with(wandb::MAGIC) {
        return Some(TrackerKind::Wandb);
    }
    if name.ends_with(".csv") {
        return Some(TrackerKind::Csv);
    }
    if head.starts_with(sqlite::MAGIC)
        || [".db", ".sqlite", ".sqlite3"]
            .iter()
            .any(|e| name.ends_with(e))
    {
        return Some(TrackerKind::Sqlite);
    }
    if head.starts_with(parquet::MAGIC) || name.ends_with(".parquet") {
        return Some(TrackerKind::Parquet);
    }
    if name == wandb_files::SUMMARY {
        return Some(TrackerKind::WandbSummary);
    }
    if path.components().any(|c| c.as_os_str() == "metrics") && mlflow::metric_key(path).is_some() {
        return Some(TrackerKind::Mlflow);
    }
    None
}

/// Read a whole tracker file of `kind` from `input` (file index `file` in the scan),
/// handing each per-step record to `push`, in file order. Returns the file's statistics.
/// Errors name the file and the byte offset (or line) of what could not be read.
pub fn read(
    kind: TrackerKind,
    path: &Path,
    input: impl Read,
    file: usize,
    push: &mut dyn FnMut(&mut LogRecord),
) -> Result<FileStats> {
    read_run(kind, path, input, file, None, push)
}

/// True for the kinds whose one file can hold several runs ([`read_run`] picks one).
pub fn holds_runs(kind: TrackerKind) -> bool {
    matches!(kind, TrackerKind::Sqlite | TrackerKind::Parquet)
}

/// [`read`], taking the run named (or with the id) `run` from a file that holds several
/// (a tracker database, a Parquet export); `None` wants the file to hold exactly one.
pub fn read_run(
    kind: TrackerKind,
    path: &Path,
    input: impl Read,
    file: usize,
    run: Option<&str>,
    push: &mut dyn FnMut(&mut LogRecord),
) -> Result<FileStats> {
    let mut names = Vec::new();
    read_rows(kind, path, input, run, &mut |b| {
        rows::to_records(&b, &mut names, file, push);
        Some(b)
    })
}

/// [`read_run`] handing the rows on in batches with file-local key ids (no `String` per
/// value): what logscan's frame builder takes, possibly on another thread. `sink` may
/// give back a used batch to be refilled.
pub fn read_rows(
    kind: TrackerKind,
    path: &Path,
    input: impl Read,
    run: Option<&str>,
    sink: &mut dyn FnMut(RowBatch) -> Option<RowBatch>,
) -> Result<FileStats> {
    read_rows_keeping(kind, path, input, run, sink, None)
}

/// [`read_rows`], keeping a `.wandb` file's config records in `configs` (in file order)
/// when given: [`run_config_known`] then needs no second pass over the file.
pub fn read_rows_keeping(
    kind: TrackerKind,
    path: &Path,
    input: impl Read,
    run: Option<&str>,
    sink: &mut dyn FnMut(RowBatch) -> Option<RowBatch>,
    configs: Option<&mut Vec<wandb::ConfigRecord>>,
) -> Result<FileStats> {
    let mut stats = FileStats {
        path: path.to_path_buf(),
        format: kind.name().to_string(),
        ..FileStats::default()
    };
    let mut w = RowWriter::new(sink);
    match kind {
        TrackerKind::Tensorboard => tfevents::read(path, input, &mut stats, &mut w)?,
        TrackerKind::Csv => csv::read(path, input, &mut stats, &mut w)?,
        TrackerKind::Mlflow => mlflow::read(path, input, &mut stats, &mut w)?,
        TrackerKind::Wandb => match configs {
            Some(keep) => wandb::read_with_configs(path, input, &mut stats, &mut w, keep)?,
            None => wandb::read(path, input, &mut stats, &mut w, None)?,
        },
        other => {
            // The other readers hand on whole records.
            let mut push = |r: &mut LogRecord| w.record(r);
            match other {
                TrackerKind::Sqlite => {
                    drop(input);
                    sqlite::read(path, 0, run, &mut stats, &mut push)?;
                }
                TrackerKind::Parquet => {
                    drop(input);
                    parquet::read(path, 0, run, &mut stats, &mut push)?;
                }
                TrackerKind::WandbSummary => {
                    wandb_files::read_summary(path, input, 0, &mut stats, &mut push)?
                }
                TrackerKind::Tensorboard
                | TrackerKind::Wandb
                | TrackerKind::Csv
                | TrackerKind::Mlflow => {}
            }
        }
    }
    w.flush();
    // an event file of text summaries only (verl's generations writer) is read for them
    if stats.records == 0 && stats.text_summaries == 0 {
        return Err(Error::format(
            path,
            crate::error::Position::File,
            format!(
                "{} file holds no scalar metrics ({} bytes read)",
                stats.format, stats.bytes
            ),
        ));
    }
    Ok(stats)
}

/// The key the frame should see for tracker key `key`: trackers prefix the trainer's keys
/// (`train/reward_std`, `train/frac_reward_zero_std`), so a `train/` key the alias table
/// does not know is tried without its prefix. Other prefixes (`eval/`) stay: evaluation
/// numbers are not training steps.
pub fn canonical_key<'a>(aliases: &AliasTable, key: &'a str) -> Cow<'a, str> {
    if aliases.resolve(key).is_some() {
        return Cow::Borrowed(key);
    }
    match key.strip_prefix("train/") {
        Some(rest) if aliases.resolve(rest).is_some() => Cow::Borrowed(rest),
        _ => Cow::Borrowed(key),
    }
}

/// True for a file name a directory scan picks up as a tracker file.
fn is_tracker_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name.contains("tfevents") || (name.starts_with("run-") && name.ends_with(".wandb"))
}

/// True when `path` starts with the SQLite header (a `.db` beside the logs may be
/// anything; only databases are read as trackers in a directory scan).
fn is_sqlite_file(path: &Path) -> bool {
    let mut head = [0u8; 16];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && head == sqlite::MAGIC
}

/// True for a Parquet file a directory scan takes: not an export of a database in the
/// same folder (Trackio writes `<project>.parquet`, `<project>_system.parquet`, … beside
/// `<project>.db`: the database is read instead).
fn is_scanned_parquet(path: &Path) -> bool {
    let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
        return false;
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut prefix = stem;
    loop {
        if dir.join(format!("{prefix}.db")).is_file() {
            return false;
        }
        match prefix.rfind('_') {
            Some(i) => prefix = &prefix[..i],
            None => return true,
        }
    }
}

/// Tracker files under directory `dir`: event files, `run-*.wandb` files, MLflow
/// metric files and SQLite databases (`mlflow.db`, Trackio's `<project>.db`) at any depth
/// (TensorBoard writes sub-folders per writer, W&B `wandb/offline-run-*/`, MLflow
/// `mlruns/<exp>/<run>/metrics/`); a W&B run's `files/output.log`, and its
/// `files/wandb-summary.json` when the run has no `run-*.wandb` (its history is the better
/// record of the same steps); `*.csv` with a step column and `*.parquet` (not a database's
/// export) at the top level only. In [`sort_for_reading`] order. A folder holding several
/// W&B runs (folders of one run id, a resumed run, are one), MLflow runs or databases is
/// refused: one run is one input, and merging runs by step would mix them.
pub fn find_in_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut wandb_runs: BTreeSet<PathBuf> = BTreeSet::new();
    let mut mlflow_runs: BTreeSet<PathBuf> = BTreeSet::new();
    let mut databases: BTreeSet<PathBuf> = BTreeSet::new();
    let mut wandb_files: Vec<PathBuf> = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| Error::io(&d, e))?;
        for e in entries.flatten() {
            let p = e.path();
            // Symlinks are not followed (W&B's `latest-run` would read a run twice).
            let Ok(ft) = e.file_type() else { continue };
            let name = e.file_name().to_string_lossy().to_string();
            if ft.is_dir() {
                stack.push((p, depth + 1));
            } else if ft.is_file() {
                if is_tracker_name(&name) {
                    if name.ends_with(".wandb") {
                        wandb_runs.insert(d.clone());
                    }
                    out.push(p);
                } else if depth == 0
                    && ((name.to_ascii_lowercase().ends_with(".csv") && csv::has_step_column(&p))
                        || (name.to_ascii_lowercase().ends_with(".parquet")
                            && is_scanned_parquet(&p)))
                {
                    out.push(p);
                } else if is_sqlite_file(&p) {
                    databases.insert(p.clone());
                    out.push(p);
                } else if wandb_files::run_of(&p).is_some() {
                    wandb_files.push(p);
                } else if p.components().any(|c| c.as_os_str() == "metrics") {
                    if let Some((run, _)) = mlflow::metric_key(&p) {
                        mlflow_runs.insert(run);
                        out.push(p);
                    }
                }
            }
        }
    }
    // A run's console capture always (its tracebacks and NaN lines, and steps the history
    // never got); its summary only when the run has no transaction log (the history holds
    // the same values, step by step).
    let mut files_runs: BTreeSet<PathBuf> = BTreeSet::new();
    for p in wandb_files {
        if let Some(run) = wandb_files::run_of(&p) {
            let is_output = p.file_name().is_some_and(|n| n == wandb_files::OUTPUT);
            if is_output || !wandb_runs.contains(&run) {
                files_runs.insert(run);
                out.push(p);
            }
        }
    }
    wandb_runs.extend(files_runs);
    // A resumed W&B run is one run in several folders (`offline-run-<time>-<id>`, one per
    // launch, the same id).
    let wandb_ids: BTreeSet<String> = wandb_runs.iter().map(|r| wandb_run_id(r)).collect();
    for (what, n, runs, pass) in [
        ("W&B runs", wandb_ids.len(), &wandb_runs, "one run's folder"),
        (
            "MLflow runs",
            mlflow_runs.len(),
            &mlflow_runs,
            "one run's folder",
        ),
        (
            "tracker databases",
            databases.len(),
            &databases,
            "one database file",
        ),
    ] {
        if n > 1 {
            let names: Vec<String> = runs
                .iter()
                .map(|r| r.strip_prefix(dir).unwrap_or(r).display().to_string())
                .collect();
            return Err(Error::Usage(format!(
                "{}: holds {n} {what} ({}); pass {pass}",
                dir.display(),
                names.join(", ")
            )));
        }
    }
    sort_for_reading(&mut out);
    Ok(out)
}

/// The run id of a W&B run folder (`offline-run-20250101_000000-<id>`, `run-…-<id>`), or
/// the folder's whole name.
fn wandb_run_id(run: &Path) -> String {
    let name = run
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    match name.rsplit_once('-') {
        Some((_, id)) if name.contains("run-") => id.to_string(),
        _ => name,
    }
}

/// Sort files into reading order: by path, except that a W&B run's `files/` (console,
/// summary) come after every transaction log, so the history's values are the ones a
/// step keeps when both hold it (the first value read for a step and metric stays).
pub fn sort_for_reading(files: &mut [PathBuf]) {
    files.sort_by(|a, b| {
        let ka = wandb_files::run_of(a).is_some();
        let kb = wandb_files::run_of(b).is_some();
        ka.cmp(&kb).then_with(|| a.cmp(b))
    });
}

/// A run's configuration, flattened to `key → JSON text`, from what the run directory or
/// file carries: W&B `files/config.yaml` and the config records of `run-*.wandb` files
/// (applied over it), MLflow `params/`, `run_metadata.json`.
/// Empty when the input carries none.
pub fn run_config(input: &Path) -> Result<BTreeMap<String, String>> {
    run_config_of(input, None)
}

/// [`run_config`] of run `run` when the input is a database holding several.
pub fn run_config_of(input: &Path, run: Option<&str>) -> Result<BTreeMap<String, String>> {
    run_config_known(input, run, &[])
}

/// [`run_config_of`], taking the config records of `.wandb` files already read whole
/// ([`read_rows_keeping`]) from `known` (`(path, records)`) instead of reading them again.
pub fn run_config_known(
    input: &Path,
    run: Option<&str>,
    known: &[(PathBuf, Vec<wandb::ConfigRecord>)],
) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let files: Vec<PathBuf> = if input.is_dir() {
        let mut v = find_in_dir(input)?;
        let meta = input.join("run_metadata.json");
        if meta.is_file() {
            v.push(meta);
        }
        v
    } else {
        vec![input.to_path_buf()]
    };
    // A W&B run's config.yaml first: its transaction log's config records, when there is
    // one, are applied over it.
    let mut yaml_runs: BTreeSet<PathBuf> = BTreeSet::new();
    for f in &files {
        let run = match wandb_files::run_of(f) {
            Some(r) => Some(r),
            None if f.extension().is_some_and(|e| e == "wandb") => {
                f.parent().map(Path::to_path_buf)
            }
            None => None,
        };
        if let Some(run) = run {
            let yaml = run.join("files").join(wandb_config::CONFIG);
            if yaml.is_file() && yaml_runs.insert(run) {
                wandb_config::read(&yaml, &mut out)?;
            }
        }
    }
    let mut mlflow_runs: Vec<PathBuf> = Vec::new();
    for f in files {
        let name = f
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_ascii_lowercase();
        if let Some((run, _)) = mlflow::metric_key(&f) {
            if !mlflow_runs.contains(&run) {
                mlflow::params(&run, &mut out)?;
                mlflow_runs.push(run);
            }
        } else if sniff(&f, b"") == Some(TrackerKind::Sqlite) || is_sqlite_file(&f) {
            sqlite::config(&f, run, &mut out)?;
        } else if name == "run_metadata.json" {
            let text = std::fs::read_to_string(&f).map_err(|e| Error::io(&f, e))?;
            let v = crate::json::parse_value(&text).map_err(|e| e.in_file(&f))?;
            flatten_value(&v, "", &mut out);
        } else if let Some((_, kept)) = known.iter().find(|(p, _)| same_file(p, &f)) {
            wandb_config::apply_configs(kept, &mut out);
        } else if name.ends_with(".wandb") {
            let file = std::fs::File::open(&f).map_err(|e| Error::io(&f, e))?;
            let mut stats = FileStats::default();
            let mut sink = Some;
            let mut w = RowWriter::new(&mut sink);
            wandb::read(&f, file, &mut stats, &mut w, Some(&mut out))?;
        }
    }
    Ok(out)
}

/// `a` and `b` name the same file (the same path, or the same canonical path).
fn same_file(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// Flatten a JSON value into `prefix.key → JSON text` entries.
fn flatten_value(v: &crate::value::Value, prefix: &str, out: &mut BTreeMap<String, String>) {
    if let Some(d) = v.as_dict() {
        for (k, child) in d {
            let Some(k) = k.as_str() else { continue };
            let key = if prefix.is_empty() {
                k.to_string()
            } else {
                format!("{prefix}.{k}")
            };
            flatten_value(child, &key, out);
        }
        return;
    }
    out.insert(prefix.to_string(), value_text(v));
}

/// A config leaf as short text: numbers in Rust's shortest form, strings unquoted, lists
/// as `[a, b]`.
fn value_text(v: &crate::value::Value) -> String {
    use crate::value::Value;
    match v {
        Value::None => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::BigInt(s) | Value::Str(s) => s.clone(),
        Value::Float(f) => f.to_string(),
        Value::List(xs) | Value::Tuple(xs) => {
            let parts: Vec<String> = xs.iter().map(value_text).collect();
            format!("[{}]", parts.join(", "))
        }
        other => other.type_name().to_string(),
    }
}

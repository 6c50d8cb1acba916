//! `logscan`: read every log a GRPO/GSPO run leaves, normalise it into one frame of
//! canonical metrics per step, and run the failure-signature detectors.
//!
//! ```no_run
//! use rlforensics::logscan::{scan, ScanOptions};
//! let report = scan(&["debug_runs/20251008-110028".into()], &ScanOptions::default()).unwrap();
//! for f in &report.findings {
//!     println!("{} {} {}", f.detector, f.step_range(), f.explanation);
//! }
//! ```

pub mod compare;
pub mod completions;
pub mod notes;
pub mod runs;
pub mod scan;
mod tracker;

use std::path::PathBuf;

use crate::detect::{self, Context, Finding, Severity, Thresholds};
use crate::error::Result;
use crate::frames::log::frame::{FrameBuilder, LogFrame, Projection};
use crate::logs::aliases::AliasTable;
use crate::model::log::{FileStats, LogEvent};

/// Version of the JSON report layout.
pub const SCHEMA_VERSION: u32 = 1;

/// What to scan for and how.
#[derive(Debug, Clone, Default)]
pub struct ScanOptions {
    /// Detector names to run (all when empty).
    pub detectors: Vec<String>,
    /// Threshold overrides `name=value`.
    pub thresholds: Vec<String>,
    /// A user alias file extending the built-in table.
    pub aliases: Option<PathBuf>,
    /// Keep raw columns in the frame (needed for `--export`); keeps every metric too.
    pub keep_raw: bool,
    /// Canonical metrics the frame keeps besides those the selected detectors read (the
    /// plot's, say). With no detector selected, or `keep_raw`, every metric is kept.
    pub also_keep: Vec<String>,
    /// The run to read from inputs that hold several (a tracker database, a Parquet
    /// export), by name or id; `None` wants each such input to hold one run.
    pub run: Option<String>,
    /// Add the per-hypothesis verdicts (`--why`; [`crate::detect::hypotheses`]).
    pub why: bool,
    /// Prompt groups per step (`--groups`; else a run config's `rollout_batch_size`): slime's
    /// dead-group counts over it are the dead-group share.
    pub groups: Option<u32>,
}

impl ScanOptions {
    /// The columns the frame must keep for these options.
    pub fn projection(&self) -> Projection {
        if self.keep_raw || self.detectors.is_empty() {
            return Projection::All;
        }
        let mut metrics: Vec<String> = self.also_keep.clone();
        let mut timestamps = false;
        for d in detect::all_detectors() {
            if !self.detectors.iter().any(|n| n == d.name()) {
                continue;
            }
            timestamps |= d.uses_timestamps();
            for m in d.metrics() {
                if !metrics.iter().any(|k| k == m) {
                    metrics.push(m.to_string());
                }
            }
        }
        // slime's dead-group counts, for the note when the group count is unknown.
        if self.detectors.iter().any(|d| d == "dead-groups") {
            metrics.push(crate::logs::aliases::ZERO_STD_GROUPS.to_string());
        }
        Projection::Only {
            metrics,
            timestamps,
        }
    }
}

/// A scan's result: the frame, the events, per-file statistics and the findings.
#[derive(Debug, serde::Serialize)]
pub struct ScanReport {
    /// Layout version of this report.
    pub schema_version: u32,
    /// Files read, with what was odd about each.
    pub files: Vec<FileStats>,
    /// Logged steps in the frame.
    pub steps: usize,
    /// First logged step.
    pub first_step: Option<i64>,
    /// Last logged step.
    pub last_step: Option<i64>,
    /// Canonical metrics found.
    pub metrics: Vec<String>,
    /// Event counts by type.
    pub event_counts: std::collections::BTreeMap<String, usize>,
    /// Detectors that ran.
    pub detectors_run: Vec<String>,
    /// Findings, worst first.
    pub findings: Vec<Finding>,
    /// Raw keys read that no detector uses (bookkeeping keys left out): what was read but
    /// not understood.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_understood: Vec<String>,
    /// The normalised frame (not serialised; export it as Parquet): the columns of
    /// [`ScanOptions::projection`].
    #[serde(skip)]
    pub frame: LogFrame,
    /// The events (not serialised).
    #[serde(skip)]
    pub events: Vec<LogEvent>,
    /// A verdict per hypothesis H01–H06 (with `--why`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hypotheses: Option<detect::hypotheses::HypothesisTable>,
    /// Completions read (TRL parquet, W&B tables, rollout dumps) and judged by the
    /// completions detectors: something was read even with no metric.
    #[serde(skip_serializing_if = "completions::is_zero")]
    pub completions_read: usize,
}

impl ScanReport {
    /// The worst severity found.
    pub fn worst(&self) -> Option<Severity> {
        self.findings.iter().map(|f| f.severity).max()
    }

    /// Findings of detector `name`.
    pub fn by_detector(&self, name: &str) -> Vec<&Finding> {
        self.findings
            .iter()
            .filter(|f| f.detector == name)
            .collect()
    }
}

/// Run the detectors on each run of the frame apart: an appended log whose step restarts
/// holds several runs, and a trend or a zero-loss streak must not straddle two of them.
/// Findings of run `r` (of several) say so; one info finding names where each run starts.
fn detect_per_run(
    frame: &LogFrame,
    events: &[LogEvent],
    th: &Thresholds,
    only: &[String],
    starts: &[(usize, u64, i64)],
) -> Vec<Finding> {
    let n = frame.run_count();
    if n <= 1 {
        let ctx = Context { frame, events, th };
        return detect::run_detectors(&ctx, only);
    }
    let mut out = Vec::new();
    for (r, sub) in frame.split_runs().iter().enumerate() {
        let evs: Vec<LogEvent> = events
            .iter()
            .filter(|e| e.run as usize == r)
            .cloned()
            .collect();
        let ctx = Context {
            frame: sub,
            events: &evs,
            th,
        };
        let (a, b) = (sub.steps().first(), sub.steps().last());
        for mut f in detect::run_detectors(&ctx, only) {
            f.run = Some(r as u32);
            f.explanation = format!(
                "run {} of {n} (steps {}–{}): {}",
                r + 1,
                a.unwrap_or(0),
                b.unwrap_or(0),
                f.explanation
            );
            out.push(f);
        }
    }
    let lines: Vec<String> = starts
        .iter()
        .map(|(_, line, step)| format!("line {line} (step {step})"))
        .collect();
    let steps: Vec<i64> = starts.iter().map(|s| s.2).collect();
    out.push(
        Finding::new(
            "runs",
            Severity::Info,
            steps,
            format!(
                "the step restarts at {}: {n} appended runs, each scanned on its own",
                lines.join(", ")
            ),
            &["several runs appended to one metrics file (re-launched training writing to the same path)"],
        )
        .with("runs", n),
    );
    out.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(a.run.cmp(&b.run))
            .then(a.first_step.cmp(&b.first_step))
    });
    out
}

/// Scan `paths` (files or run directories) and run the detectors.
pub fn scan(paths: &[PathBuf], opts: &ScanOptions) -> Result<ScanReport> {
    let known: Vec<&str> = detect::all_detectors().iter().map(|d| d.name()).collect();
    for d in &opts.detectors {
        if !known.contains(&d.as_str()) {
            return Err(crate::Error::Usage(format!(
                "unknown detector {d:?}; known: {}",
                known.join(", ")
            )));
        }
    }
    let th = Thresholds::with_overrides(&opts.thresholds)?;
    let aliases = match &opts.aliases {
        Some(p) => AliasTable::with_user_file(p)?,
        None => AliasTable::builtin()?,
    };
    let (files, completion_paths) = completions::split_paths(paths)?;
    let mut completion_files = completions::read_all(&completion_paths)?;
    let read = |groups: Option<u32>| -> Result<scan::Collected> {
        let builder = FrameBuilder::new(aliases.clone(), opts.keep_raw)
            .with_projection(opts.projection())
            .with_group_count(groups);
        let mut col = scan::Collected::new(builder);
        col.run = opts.run.clone();
        for f in &files {
            col.read_file(f)?;
        }
        Ok(col)
    };
    let mut groups = opts.groups;
    let mut col = read(groups)?;
    // slime's dead-group counts need the groups per step: a run config's
    // rollout_batch_size, looked up (and the inputs read again) only when such counts came.
    if groups.is_none() && col.builder.has_dead_group_counts() {
        if let Some(g) = group_count(paths, &col.wandb_configs) {
            groups = Some(g);
            col = read(groups)?;
        }
    }
    if let (Some(run), false) = (&opts.run, col.run_used) {
        return Err(crate::error::Error::Usage(format!(
            "--run {run}: no input holds several runs (--run picks one from a tracker database or a Parquet export)"
        )));
    }
    completion_files.extend(completions::from_text_summaries(&col.files)?);
    let frame = col.builder.finish();
    let events = col.events;
    let mut findings = detect_per_run(&frame, &events, &th, &opts.detectors, &col.run_starts);
    let dead_groups_run =
        opts.detectors.is_empty() || opts.detectors.iter().any(|d| d == "dead-groups");
    if groups.is_none() && dead_groups_run {
        findings.extend(dead_counts_without_groups(&frame));
    }
    if let Some(level) = sequence_level(paths, &col.wandb_configs) {
        gspo_advice(&mut findings, &level);
    }
    if !completion_files.is_empty() {
        completions::merge(&mut findings, &completion_files, &frame, &opts.detectors);
        col.files.extend(completions::file_stats(&completion_files));
    }
    let mut event_counts = std::collections::BTreeMap::new();
    for e in &events {
        *event_counts.entry(e.kind.clone()).or_insert(0) += 1;
    }
    Ok(ScanReport {
        schema_version: SCHEMA_VERSION,
        files: col.files,
        steps: frame.len(),
        first_step: frame.steps().first(),
        last_step: frame.steps().last(),
        metrics: frame.metrics().to_vec(),
        event_counts,
        detectors_run: detect::all_detectors()
            .iter()
            .map(|d| d.name().to_string())
            .filter(|n| opts.detectors.is_empty() || opts.detectors.contains(n))
            .collect(),
        hypotheses: opts
            .why
            .then(|| detect::hypotheses::verdicts(&frame, &findings)),
        findings,
        not_understood: frame.unmapped_keys().to_vec(),
        completions_read: completion_files.iter().map(|f| f.items.len()).sum(),
        frame,
        events,
    })
}

/// A `.wandb` file read by the scan and its config records (no second pass for them).
type KnownConfigs = (PathBuf, Vec<crate::logs::trackers::wandb::ConfigRecord>);

/// Prompt groups per step from a run directory's config: slime's `rollout_batch_size`
/// (prompts per rollout, each one group of `n_samples_per_prompt` samples).
fn group_count(paths: &[PathBuf], known: &[KnownConfigs]) -> Option<u32> {
    paths.iter().filter(|p| p.is_dir()).find_map(|p| {
        let cfg = crate::logs::trackers::run_config_known(p, None, known).ok()?;
        let (_, v) = cfg
            .iter()
            .find(|(k, _)| k.rsplit(['.', '/']).next() == Some("rollout_batch_size"))?;
        v.trim_matches('"').parse::<u32>().ok().filter(|g| *g > 0)
    })
}

/// slime logs how many groups were dead (`rollout/zero_std/count_*`) but not how many
/// groups a step has: without `--groups` or a config giving it, say so rather than judge.
fn dead_counts_without_groups(frame: &LogFrame) -> Option<Finding> {
    use crate::logs::aliases::{FRAC_ZERO_STD, ZERO_STD_GROUPS};
    if frame.metrics().iter().any(|m| m == FRAC_ZERO_STD) {
        return None;
    }
    let pts: Vec<(i64, f64)> = frame.points(ZERO_STD_GROUPS).collect();
    let max = pts.iter().map(|p| p.1).fold(0.0, f64::max);
    let (step, _) = *pts.iter().find(|p| p.1 == max)?;
    Some(
        Finding::new(
            "dead-groups",
            Severity::Info,
            vec![step],
            format!(
                "slime's rollout/zero_std/count_* say up to {max} groups per step had identical rewards (step {step}), but not how many groups a step has: pass --groups N (slime's --rollout-batch-size) to judge the dead-group share"
            ),
            &["the number of groups per step is not in the log"],
        )
        .with("dead_groups_max", max),
    )
}

/// The clip epsilon of a run whose config says its importance ratio is per sequence
/// (GSPO: `importance_sampling_level: sequence` in `run_metadata.json`, a W&B or MLflow
/// config), as text ("" when not given); `None` for token-level or unknown runs.
fn sequence_level(paths: &[PathBuf], known: &[KnownConfigs]) -> Option<String> {
    for p in paths.iter().filter(|p| p.is_dir()) {
        let Ok(cfg) = crate::logs::trackers::run_config_known(p, None, known) else {
            continue;
        };
        let level = cfg
            .iter()
            .find(|(k, _)| k.ends_with("importance_sampling_level"))
            .map(|(_, v)| v.trim_matches('"').to_string());
        if level.as_deref() == Some("sequence") {
            let eps = cfg
                .iter()
                .find(|(k, _)| k.rsplit(['.', '/']).next() == Some("epsilon"))
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            return Some(eps);
        }
    }
    None
}

/// GSPO clips a sequence-level ratio: its epsilon is ~3e-4 (the GSPO paper: 3e-4 / 4e-4),
/// so the token-level advice "epsilon too small (1e-4 instead of 0.2)" is wrong there.
fn gspo_advice(findings: &mut [Finding], eps: &str) {
    for f in findings.iter_mut().filter(|f| f.detector == "clip-high") {
        for c in &mut f.likely_causes {
            if c.starts_with("clip epsilon too small") {
                let given = if eps.is_empty() {
                    String::new()
                } else {
                    format!(" (this run: {eps})")
                };
                *c = format!(
                    "GSPO (sequence-level ratio): a clip epsilon of ~3e-4 is normal{given}, and clip fractions of ~0.15 are typical (far above token-level PPO's); a much higher fraction means the epsilon is below ~3e-4 or the policy moves too far per step"
                );
            }
        }
    }
}

//! The `logscan` command line: arguments (clap derive), `run`, which does everything but
//! print, so tests call it directly, and [`run_cli`], the whole command the binary shims.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Parser;

use crate::cli::{self as shared, CommonFlags, FailOn, Format};
use crate::detect::THRESHOLDS;
use crate::error::{Error, Result};
use crate::exit_codes::{EXIT_CLEAN, EXIT_FOUND};
use crate::logscan::compare::{self, CompareReport};
use crate::logscan::{scan, ScanOptions, ScanReport};
use crate::render::logscan::compare as compare_render;
use crate::render::{self, Renderer, Style};

/// The defaults table shown by `--help`.
pub fn thresholds_help() -> String {
    let mut s = String::from(
        "Detectors (all run when none is given):\n  zero-loss dead-groups nan-grad grad-spike zero-grad kl-explosion kl-negative\n  entropy-collapse truncation empty-completions adv-explosion slowdown mem-growth\n  logprob-mismatch plateau grad-not-flowing clip-high reward-constant bounds\n  first-update kl-zero preference stages\n\nThresholds (override with --threshold NAME=VALUE):\n",
    );
    for (name, v, what) in THRESHOLDS {
        s.push_str(&format!("  {name:<28} {v:<8} {what}\n"));
    }
    s.push_str(EXAMPLES);
    s.push_str("\nExit codes: 0 clean, 1 a finding at or above --fail-on, 2 usage error or unreadable input.\n");
    s
}

/// The inputs `--help` lists: one command per kind of input, and `--compare`.
const EXAMPLES: &str = "
Inputs (a folder means every log and tracker file in it; files of one folder are one run,
several runs are each scanned on their own and reported one after the other; a folder of
run folders means each of them):
  logscan runs/20251009-091500                  steps.jsonl + events.jsonl of a run folder
  logscan train.log --nan-grad --dead-groups    a console log (verl, TRL, Megatron, nanoGPT, DeepSpeed-Chat, minimind, slime, ...)
  logscan debug_runs/                           every run folder in it, side by side
  logscan tb_logs/run_1                         TensorBoard events.out.tfevents.* (sub-folders too)
  logscan wandb/offline-run-20260101_000000-abc W&B run-*.wandb, or files/wandb-summary.json + output.log
  logscan export.csv                            W&B CSV export or any CSV with a step column
  logscan mlruns/1/0a1b2c                       MLflow file store run (metrics/, params/)
  logscan mlflow.db                             MLflow SQLite backend (one run)
  logscan ~/.cache/huggingface/trackio/proj.db  Trackio project (one run), or its proj.parquet export
  logscan out/completions                       TRL completions_*.parquet (W&B media/table/*.table.json,
                                                verl rollout_data_dir/*.jsonl, AReaL dump_dir/<v>/*.txt):
                                                blank, garbled, template leak, loops, one answer for all
  logscan run/ --why                            a verdict per hypothesis H01-H06 for a run that does not improve
  logscan --compare tb_logs/run_1 wandb/offline-run-20260101_000000-abc --plot cmp.png
                                                where run B leaves run A, per metric, any two formats
";

/// `logscan` arguments.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "logscan",
    about = "Scan GRPO/GSPO training logs (steps.jsonl, events.jsonl, verl, HF trainer_state.json, text, TensorBoard, W&B, MLflow, Trackio, CSV) for failure signatures, or compare two runs",
    after_long_help = thresholds_help()
)]
pub struct LogscanArgs {
    /// Log files or run directories (a directory means every log in it).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Loss ~ 0 with zero reward std / advantages / grad, sustained.
    #[arg(long)]
    pub zero_loss: bool,
    /// Many groups with zero reward std.
    #[arg(long)]
    pub dead_groups: bool,
    /// Non-finite grad/loss/kl/reward, NaN gradient events, grad_nan_count > 0.
    #[arg(long)]
    pub nan_grad: bool,
    /// grad_norm spikes.
    #[arg(long)]
    pub grad_spike: bool,
    /// grad_norm ~ 0 on consecutive steps.
    #[arg(long)]
    pub zero_grad: bool,
    /// KL explosion.
    #[arg(long)]
    pub kl_explosion: bool,
    /// Negative KL (k3 cannot be negative).
    #[arg(long)]
    pub kl_negative: bool,
    /// Entropy collapse.
    #[arg(long)]
    pub entropy_collapse: bool,
    /// Completions truncated at max length.
    #[arg(long)]
    pub truncation: bool,
    /// Zero-token completions.
    #[arg(long)]
    pub empty_completions: bool,
    /// Advantages blown up by a tiny reward std.
    #[arg(long)]
    pub adv_explosion: bool,
    /// Step-time spikes and trends.
    #[arg(long)]
    pub slowdown: bool,
    /// Peak memory growth.
    #[arg(long)]
    pub mem_growth: bool,
    /// Trainer vs rollout log-prob mismatch.
    #[arg(long)]
    pub logprob_mismatch: bool,
    /// Reward not improving (or flat over a long horizon).
    #[arg(long)]
    pub plateau: bool,
    /// grad_norm exactly 0 while reward_std > 0.
    #[arg(long)]
    pub grad_not_flowing: bool,
    /// Clip ratio / clipfrac high on most steps.
    #[arg(long)]
    pub clip_high: bool,
    /// A reward component that never changes.
    #[arg(long)]
    pub reward_constant: bool,
    /// Absolute bounds: grad norm, loss, entropy beyond any healthy run.
    #[arg(long)]
    pub bounds: bool,
    /// ppo_kl / clip fraction / ratio / KL not ~0 at the run's first update.
    #[arg(long)]
    pub first_update: bool,
    /// KL exactly 0 for many steps (beta = 0 or reference = policy).
    #[arg(long)]
    pub kl_zero: bool,
    /// DPO/KTO/ORPO signatures (accuracies stuck, margins saturating, log-probs falling).
    #[arg(long)]
    pub preference: bool,
    /// Iteration time per stage ([Micro k] stage lines): the slowest, the growing.
    #[arg(long)]
    pub stages: bool,
    /// Override a threshold: NAME=VALUE (repeatable; see the table below).
    #[arg(long = "threshold", value_name = "NAME=VALUE")]
    pub thresholds: Vec<String>,
    /// Extra metric aliases (JSON {"canonical": ["raw key", …]}), tried before the built-in ones.
    #[arg(long, value_name = "FILE")]
    pub aliases: Option<PathBuf>,
    /// Stdout format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Add a verdict per hypothesis for a run that does not improve (H01 advantage scaling,
    /// H02 token masking, H03 KL term, H04 context truncation, H05 reward signal, H06 LoRA /
    /// weight sync): supported / not supported / cannot tell, with the evidence and what
    /// to log or run to decide.
    #[arg(long)]
    pub why: bool,
    /// Write the JSON report (with schema_version) to FILE.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Write the normalised frame (canonical + raw columns) as Parquet.
    #[arg(long, value_name = "FILE")]
    pub export: Option<PathBuf>,
    /// Draw the key metrics with findings marked to FILE (.png or .svg).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Exit 1 when a finding is at or above this severity.
    #[arg(long, value_enum, default_value = "error")]
    pub fail_on: FailOn,
    /// Never colour the table.
    #[arg(long)]
    pub no_color: bool,
    /// Compare two runs (exactly two paths, any formats): first divergent step and effect
    /// size per shared metric, findings in one run only, config differences; exit 1 when
    /// they diverge.
    #[arg(long)]
    pub compare: bool,
    /// With --compare: a step diverges when |A - B| exceeds this many σ of the runs'
    /// step-to-step noise, 3 aligned steps in a row.
    #[arg(long, value_name = "SIGMAS", default_value_t = 3.0)]
    pub tolerance: f64,
    /// The run to read from a tracker database or Parquet export holding several (name or
    /// id); with --compare, give it twice for runs A and B of one database.
    #[arg(long, value_name = "NAME")]
    pub run: Vec<String>,
    /// Prompt groups per step (slime's --rollout-batch-size): turns slime's dead-group
    /// counts `rollout/zero_std/count_*` into the share the dead-groups detector judges.
    /// Read from the run's config (`rollout_batch_size`) when not given.
    #[arg(long, value_name = "N")]
    pub groups: Option<u32>,
    /// Print on stderr the bytes and requests fetched from object storage (s3://, gs://,
    /// az://, http(s):// inputs; docs/storage.md).
    #[arg(long)]
    pub stats: bool,
}

impl LogscanArgs {
    /// Detector names selected by flags.
    pub fn selected(&self) -> Vec<String> {
        let flags = [
            (self.zero_loss, "zero-loss"),
            (self.dead_groups, "dead-groups"),
            (self.nan_grad, "nan-grad"),
            (self.grad_spike, "grad-spike"),
            (self.zero_grad, "zero-grad"),
            (self.kl_explosion, "kl-explosion"),
            (self.kl_negative, "kl-negative"),
            (self.entropy_collapse, "entropy-collapse"),
            (self.truncation, "truncation"),
            (self.empty_completions, "empty-completions"),
            (self.adv_explosion, "adv-explosion"),
            (self.slowdown, "slowdown"),
            (self.mem_growth, "mem-growth"),
            (self.logprob_mismatch, "logprob-mismatch"),
            (self.plateau, "plateau"),
            (self.grad_not_flowing, "grad-not-flowing"),
            (self.clip_high, "clip-high"),
            (self.reward_constant, "reward-constant"),
            (self.bounds, "bounds"),
            (self.first_update, "first-update"),
            (self.kl_zero, "kl-zero"),
            (self.preference, "preference"),
            (self.stages, "stages"),
        ];
        flags
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| n.to_string())
            .collect()
    }
}

/// Never silent: a scan that read no record and no event is an error (exit 2) naming what
/// was seen, not "no findings": a CI gate must not pass a log it could not read.
pub fn nothing_read(paths: &[PathBuf], report: &crate::logscan::ScanReport) -> Result<()> {
    // Checkpoint notes alone are no training record.
    let events = report.events.iter().any(|e| e.kind != "checkpoint");
    if events || report.files.iter().any(|f| f.records > 0) {
        return Ok(());
    }
    let all_empty = report.files.iter().all(|f| f.bytes == 0);
    let dirs: Vec<&PathBuf> = paths.iter().filter(|p| p.is_dir()).collect();
    if all_empty {
        let names: Vec<String> = report
            .files
            .iter()
            .map(|f| f.path.display().to_string())
            .collect();
        let what = if dirs.is_empty() {
            "the input is empty".to_string()
        } else {
            format!(
                "run folder {} holds only empty logs",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        return Err(Error::Usage(format!(
            "{what} ({}: 0 bytes): nothing to scan",
            names.join(", ")
        )));
    }
    let mut lines = Vec::new();
    for f in &report.files {
        let seen = match (&f.first_line, f.bytes) {
            (_, 0) => "the file is empty".to_string(),
            (Some(l), _) => format!("first line looks like: {l}"),
            (None, _) => format!("{} blank line(s)", f.lines),
        };
        let bad = f
            .bad_lines
            .first()
            .map(|b| format!(" (line {}: {})", b.line, b.message))
            .unwrap_or_default();
        // Progress bars and nothing else (OpenRLHF#350: vLLM's `Processed prompts` and the
        // `Episode` bars, no `Train epoch` bar with its metrics): understood, and empty.
        let what = if f.progress_bars > 0 && f.progress_bars * 2 >= f.unrecognised_lines {
            format!(
                "only progress bars ({} bar line(s)), no metrics: no training step was logged (a bar's postfix or a step line would carry them)",
                f.progress_bars
            )
        } else {
            format!("not a format logscan knows{bad}")
        };
        lines.push(format!(
            "read 0 records from {} ({} lines): {what}; {seen}",
            f.path.display(),
            f.lines
        ));
    }
    Err(Error::Usage(lines.join("\n")))
}

/// Canonical metrics no detector judges a run by (bookkeeping and schedule).
const NOT_EVIDENCE: &[&str] = &["lr", "eval_activity", "trained_tokens", "val_loss"];

/// Never "no findings" on records that hold no metric a detector uses: exit 2 naming what
/// was read and which keys were not understood.
pub fn nothing_usable(report: &ScanReport) -> Result<()> {
    let events = report.events.iter().any(|e| e.kind != "checkpoint");
    // Completions were read and judged by the completions detectors.
    if events
        || report.completions_read > 0
        || report
            .metrics
            .iter()
            .any(|m| !NOT_EVIDENCE.contains(&m.as_str()))
    {
        return Ok(());
    }
    let records: u64 = report.files.iter().map(|f| f.records).sum();
    let files: Vec<String> = report
        .files
        .iter()
        .map(|f| format!("{} ({})", f.path.display(), f.format))
        .collect();
    let read = if report.metrics.is_empty() {
        "no metric logscan knows".to_string()
    } else {
        format!("only {}", report.metrics.join(", "))
    };
    let keys = if report.not_understood.is_empty() {
        String::new()
    } else {
        format!(
            "; keys not understood: {} (map them with --aliases FILE)",
            report.not_understood.join(", ")
        )
    };
    Err(Error::Usage(format!(
        "read {records} record(s) from {} but {read}: nothing a detector can judge{keys}",
        files.join(", ")
    )))
}

/// What the binary prints and returns.
#[derive(Debug)]
pub struct RunOutput {
    /// Text for stdout.
    pub stdout: String,
    /// Process exit code.
    pub code: u8,
    /// Lines for stderr (objects of a URL prefix not fetched), printed unless `-q`.
    pub notes: Vec<String>,
}

/// Scan, write the requested files, render stdout, decide the exit code. A URL input
/// (s3://, gs://, az://, http(s)://) is copied first ([`crate::logs::fetch_dir`]: the
/// objects a log reader reads, into a private temporary folder) and scanned as a local
/// folder; stdout, `--output` and errors then name the URLs, never the copy.
pub fn run(args: &LogscanArgs, color: bool) -> Result<RunOutput> {
    let (args, uploads, _scratch) = remote_files(args)?;
    let local = crate::logs::fetch_dir::localise(&args.paths)?;
    let mut out = if local.is_remote() {
        let mut copy = args.clone();
        copy.paths = local.paths.clone();
        let mut out = run_local(&copy, color).map_err(|e| local.error_to_urls(e))?;
        if let Some(o) = &args.output {
            local.rewrite_file(o)?;
        }
        out.stdout = local.to_urls(&out.stdout);
        out.notes.extend(local.skipped_note());
        out
    } else {
        run_local(&args, color)?
    };
    // written locally, then each put whole: nothing is put when the scan fails
    for (url, file) in &uploads {
        let bytes = std::fs::read(file).map_err(|e| Error::io(file, e))?;
        crate::formats::source::write_object(url, bytes)?;
        out.stdout = out.stdout.replace(
            file.to_string_lossy().as_ref(),
            url.to_string_lossy().as_ref(),
        );
    }
    Ok(out)
}

/// [`remote_files`]' answer: the arguments to scan with, the `(url, local file)` pairs to
/// put after the scan, and the scratch folder holding them (removed when dropped).
type RemoteFiles = (
    LogscanArgs,
    Vec<(PathBuf, PathBuf)>,
    Option<crate::logs::fetch_dir::Scratch>,
);

/// `args` with its URL files made local: `--aliases` fetched into a scratch folder, and
/// `--output`, `--export` and `--plot` written there, to be put at their URLs after the
/// scan (`(url, local file)` pairs; each URL's bucket checked with one LIST first).
fn remote_files(args: &LogscanArgs) -> Result<RemoteFiles> {
    use crate::formats::source::{is_remote, list_dir, read_all};
    let remote = |p: &Option<PathBuf>| p.as_ref().filter(|p| is_remote(p)).cloned();
    let outputs = [
        remote(&args.output),
        remote(&args.export),
        remote(&args.plot),
    ];
    let aliases = remote(&args.aliases);
    if aliases.is_none() && outputs.iter().all(Option::is_none) {
        return Ok((args.clone(), Vec::new(), None));
    }
    let scratch = crate::logs::fetch_dir::Scratch::new()?;
    let mut copy = args.clone();
    if let Some(url) = aliases {
        let file = scratch.path().join("aliases.json");
        std::fs::write(&file, read_all(&url)?).map_err(|e| Error::io(&file, e))?;
        copy.aliases = Some(file);
    }
    let mut uploads = Vec::new();
    let slots = [&mut copy.output, &mut copy.export, &mut copy.plot];
    for (k, (url, slot)) in outputs.into_iter().zip(slots).enumerate() {
        let Some(url) = url else { continue };
        // the bucket and credentials, before any work
        list_dir(url.parent().unwrap_or(&url))?;
        let name = url.file_name().map_or_else(
            || format!("output{k}"),
            |n| n.to_string_lossy().into_owned(),
        );
        let file = scratch.path().join(format!("{k}-{name}"));
        *slot = Some(file.clone());
        uploads.push((url, file));
    }
    Ok((copy, uploads, Some(scratch)))
}

/// [`run`] on local inputs.
fn run_local(args: &LogscanArgs, color: bool) -> Result<RunOutput> {
    if args.compare {
        return run_compare(args, color);
    }
    if args.run.len() > 1 {
        return Err(Error::Usage(format!(
            "--run is given {} times; a scan reads one run (give it twice with --compare)",
            args.run.len()
        )));
    }
    let opts = ScanOptions {
        run: args.run.first().cloned(),
        detectors: args.selected(),
        thresholds: args.thresholds.clone(),
        aliases: args.aliases.clone(),
        keep_raw: args.export.is_some(),
        also_keep: if args.plot.is_some() {
            render::plot::METRICS
                .iter()
                .map(|m| m.to_string())
                .collect()
        } else {
            Vec::new()
        },
        why: args.why,
        groups: args.groups,
    };
    let opts = crate::logscan::completions::keep_for_why(opts);
    let groups = crate::logscan::runs::group_runs(&args.paths)?;
    if groups.len() > 1 {
        return run_several(args, &opts, color, &groups);
    }
    let paths = groups
        .first()
        .map_or_else(|| args.paths.clone(), |g| g.paths.clone());
    let report = scan(&paths, &opts)?;
    nothing_read(&paths, &report)?;
    nothing_usable(&report)?;
    if let Some(out) = &args.output {
        let text = render::logscan::json::JsonRenderer.render(&report)?;
        std::fs::write(out, text).map_err(|e| Error::io(out, e))?;
    }
    if let Some(p) = &args.plot {
        let panels = render::plot::panels(&report.frame, &report.findings);
        render::plot::write_grid(p, &panels, None)?;
    }
    if let Some(p) = &args.export {
        report.frame.write_parquet(p)?;
    }
    let style = Style {
        color: color && !args.no_color,
        width: crate::cli::terminal_width(),
    };
    let stdout = render::by_name::<ScanReport>(args.format, style).render(&report)?;
    let code = match report.worst() {
        Some(w) if w >= args.fail_on.severity() => EXIT_FOUND,
        _ => EXIT_CLEAN,
    };
    Ok(RunOutput {
        stdout,
        code,
        notes: Vec::new(),
    })
}

/// Several runs: each scanned on its own and reported one after the other (JSON: a
/// `runs` array); a run that cannot be read is reported as such and makes the exit code 2.
fn run_several(
    args: &LogscanArgs,
    opts: &ScanOptions,
    color: bool,
    groups: &[crate::logscan::runs::RunInputs],
) -> Result<RunOutput> {
    if args.plot.is_some() || args.export.is_some() {
        return Err(Error::Usage(format!(
            "--plot and --export take one run; these inputs are {} runs: {} (compare two with --compare)",
            groups.len(),
            groups.iter().map(|g| g.label.as_str()).collect::<Vec<_>>().join(", ")
        )));
    }
    let style = Style {
        color: color && !args.no_color,
        width: crate::cli::terminal_width(),
    };
    let mut text = format!(
        "{} runs, each scanned on its own: {}\n",
        groups.len(),
        groups
            .iter()
            .map(|g| g.label.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut json_runs = Vec::new();
    let mut code = EXIT_CLEAN;
    for g in groups {
        let scanned = scan(&g.paths, opts).and_then(|r| {
            nothing_read(&g.paths, &r)?;
            nothing_usable(&r)?;
            Ok(r)
        });
        match scanned {
            Ok(r) => {
                if let Some(w) = r.worst() {
                    if w >= args.fail_on.severity() && code == EXIT_CLEAN {
                        code = EXIT_FOUND;
                    }
                }
                let j = render::logscan::json::JsonRenderer.render(&r)?;
                let v: serde_json::Value = serde_json::from_str(&j).unwrap_or_default();
                json_runs.push(serde_json::json!({"run": g.label, "report": v}));
                let body = render::by_name::<ScanReport>(args.format, style).render(&r)?;
                text.push_str(&format!("\n== {} ==\n{body}", g.label));
            }
            Err(e) => {
                code = crate::exit_codes::EXIT_BAD_INPUT;
                json_runs.push(serde_json::json!({"run": g.label, "error": e.to_string()}));
                text.push_str(&format!("\n== {} ==\nnot scanned: {e}\n", g.label));
            }
        }
    }
    let json = serde_json::to_string_pretty(&serde_json::json!({
        "schema_version": crate::logscan::SCHEMA_VERSION,
        "runs": json_runs,
    }))
    .unwrap_or_default();
    if let Some(out) = &args.output {
        std::fs::write(out, &json).map_err(|e| Error::io(out, e))?;
    }
    let stdout = if matches!(args.format, Format::Json) {
        json + "\n"
    } else {
        text
    };
    Ok(RunOutput {
        stdout,
        code,
        notes: Vec::new(),
    })
}

/// `logscan --compare`: scan both paths, compare, write `--output`/`--plot`, render.
fn run_compare(args: &LogscanArgs, color: bool) -> Result<RunOutput> {
    let [pa, pb] = args.paths.as_slice() else {
        return Err(Error::Usage(format!(
            "--compare takes exactly two runs (files or directories), got {}: {}",
            args.paths.len(),
            args.paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    if !(args.tolerance.is_finite() && args.tolerance > 0.0) {
        return Err(Error::Usage(format!(
            "--tolerance must be a positive number of noise σ, got {}",
            args.tolerance
        )));
    }
    // Every metric is kept (no detector selection narrows the frame); the selected
    // detectors only narrow the findings compared.
    let selected = args.selected();
    if args.run.len() > 2 {
        return Err(Error::Usage(format!(
            "--run is given {} times; --compare takes it once (both runs) or twice (A, B)",
            args.run.len()
        )));
    }
    let run_a = args.run.first().cloned();
    let run_b = args.run.get(1).cloned().or_else(|| run_a.clone());
    let all = ScanOptions {
        detectors: Vec::new(),
        thresholds: args.thresholds.clone(),
        aliases: args.aliases.clone(),
        keep_raw: false,
        also_keep: Vec::new(),
        run: None,
        why: false,
        groups: args.groups,
    };
    let scan_one = |p: &PathBuf, run: &Option<String>| -> Result<ScanReport> {
        let opts = ScanOptions {
            run: run.clone(),
            ..all.clone()
        };
        let mut r = scan(std::slice::from_ref(p), &opts)?;
        if !selected.is_empty() {
            r.findings.retain(|f| selected.contains(&f.detector));
        }
        Ok(r)
    };
    let ra = scan_one(pa, &run_a)?;
    let rb = scan_one(pb, &run_b)?;
    let configs = (
        crate::logs::trackers::run_config_of(pa, run_a.as_deref())?,
        crate::logs::trackers::run_config_of(pb, run_b.as_deref())?,
    );
    let report = compare::compare_reports((pa, &ra), (pb, &rb), args.tolerance, Some(configs));
    if report.aligned_steps == 0 {
        return Err(Error::Usage(format!(
            "{} (steps {}..{}) and {} (steps {}..{}) share no step: nothing to align",
            pa.display(),
            compare_render::fmt_step(ra.first_step),
            compare_render::fmt_step(ra.last_step),
            pb.display(),
            compare_render::fmt_step(rb.first_step),
            compare_render::fmt_step(rb.last_step)
        )));
    }
    if let Some(out) = &args.output {
        let text = compare_render::CompareJson.render(&report)?;
        std::fs::write(out, text).map_err(|e| Error::io(out, e))?;
    }
    if let Some(p) = &args.plot {
        compare_render::write_plot(p, &report, &ra, &rb)?;
    }
    let style = Style {
        color: color && !args.no_color,
        width: None,
    };
    let stdout = render::by_name::<CompareReport>(args.format, style).render(&report)?;
    let code = if report.diverged {
        EXIT_FOUND
    } else {
        EXIT_CLEAN
    };
    Ok(RunOutput {
        stdout,
        code,
        notes: Vec::new(),
    })
}

/// Invocations on a user's own logs, one on the shipped fixtures (in a clone of the
/// repository).
const HELP_EXAMPLES: &[&str] = &[
    "logscan debug_runs/20251008-110028 --format markdown --output findings.json",
    "logscan train.log --zero-loss --nan-grad",
    "logscan --compare wandb/run-20251008_110028-abc123 wandb/run-20251009_091500-def456 --plot compare.png",
    "logscan fixtures/logs/debug_faults/steps.jsonl --zero-loss --nan-grad",
];

/// The end of `-h`: examples, then the exit codes.
fn short_tail() -> String {
    shared::help_tail(HELP_EXAMPLES)
}

/// The end of `--help`: the detectors and thresholds, then the examples and exit codes.
fn long_tail() -> String {
    let table = thresholds_help();
    let table = match table.find("\nExit codes:") {
        Some(i) => &table[..i],
        None => table.as_str(),
    };
    format!("{}\n\n{}", table.trim_end(), short_tail())
}

/// `logscan`'s flags and the shared ones.
#[derive(Debug, Parser)]
#[command(
    name = "logscan",
    version,
    about = "Scan GRPO/GSPO training logs (steps.jsonl, events.jsonl, verl, HF trainer_state.json, text, TensorBoard, W&B, MLflow, Trackio, CSV) for failure signatures, or compare two runs",
    after_help = short_tail(),
    after_long_help = long_tail()
)]
struct Cli {
    #[command(flatten)]
    scan: LogscanArgs,
    #[command(flatten)]
    common: CommonFlags,
}

/// Run `logscan` on `args` (the first item is the program name, as in
/// `std::env::args_os`) and return its exit code; output, `--help`/`--version` and usage
/// errors as the binary gives them.
pub fn run_cli<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut cli: Cli = match shared::parse_from(args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    cli.scan.paths = cli
        .scan
        .paths
        .iter()
        .map(|p| shared::stdin_path(p))
        .collect();
    let color = cli.common.color.enabled() && !cli.scan.no_color;
    let stats = cli.scan.stats.then(crate::formats::source::stats);
    let result = run(&cli.scan, color);
    if let Some(before) = stats {
        let now = crate::formats::source::stats();
        eprintln!(
            "logscan: fetched {} bytes of object data in {} requests",
            now.bytes - before.bytes,
            now.requests - before.requests
        );
    }
    match result {
        Ok(out) => {
            if !cli.common.quiet {
                for n in &out.notes {
                    eprintln!("logscan: {n}");
                }
            }
            shared::finish("logscan", &out.stdout, cli.common.quiet, out.code)
        }
        Err(err) => shared::fail("logscan", &err),
    }
}

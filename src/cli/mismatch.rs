//! The `mismatch` command line: arguments (clap derive), `run` (everything but printing)
//! and `run_cli` (parse, run, print, exit code), so the binary is a shim and tests call it.
//!
//! A separate command, not `dumpdiff --mismatch`: dumpdiff compares two sides of one step;
//! mismatch reads one side and compares two log-prob roles of the same tokens (engine vs
//! trainer), attributes the difference, replays corrections and follows it over steps —
//! its flags (pair, corrections, buckets, trends) would double dumpdiff's.
//!
//! Exit codes: 0 analysed, no finding at or above `--fail-on` (default `error`: a jump);
//! 1 a finding at or above it; 2 usage error, unreadable input, or a step without both
//! log-prob roles of the pair (the message names the roles the step holds).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Parser;

use crate::cli::{self, CommonFlags, FailOn, Format};
use crate::error::{Error, Result};
use crate::exit_codes::{EXIT_CLEAN, EXIT_FOUND};
use crate::mismatch::{self, whatif, Options};
use crate::render::{self, Style};

/// Real invocations.
const EXAMPLES: &[&str] = &[
    "mismatch runs/verl_dump --step 12",
    "mismatch runs/verl_dump --pair old:current --format markdown",
    "mismatch runs/verl_dump --correction token-tis --correction is=token:0.5_5 --correction rs=seq_mean_k3:0.01",
    "mismatch runs/verl_dump --logs runs/tb --plot plots/ --export-frames frames/",
    "mismatch runs/fsdp_dump runs/megatron_dump --step 12 --pair old:old",
];

/// `mismatch` arguments.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "mismatch",
    version,
    about = "Rollout-engine vs trainer log-prob mismatch of dumped steps: the producers' metrics (verl, TRL, OpenRLHF, NeMo-RL, slime), where it sits (positions, tokens, sequences, ranks, groups), what each correction (TIS, IS, IcePop, rejection) would have done, and whether it grows or jumps across steps",
    after_help = cli::help_tail(EXAMPLES)
)]
pub struct Args {
    /// A producer's dump folder (any producer whose steps the model reads).
    pub path: PathBuf,
    /// A second dump of the same steps (trainer A vs trainer B: FSDP vs Megatron,
    /// micro-batch 4 vs 8): role A of `--pair` is read from PATH, role B from this tree,
    /// rows paired by content (response token ids); default pair `old:old`.
    #[arg(value_name = "B")]
    pub against: Option<PathBuf>,
    /// Step to analyse (repeatable); default every step the folder holds.
    #[arg(long = "step", value_name = "N")]
    pub steps: Vec<i64>,
    /// The two log-prob roles compared, `A:B` (Δ = B − A): rollout (engine), old,
    /// current, reference. Default `rollout:old`; with a second tree, `old:old` (A from
    /// PATH, B from the second tree).
    #[arg(long, value_name = "A:B")]
    pub pair: Option<String>,
    /// A correction for the what-if table (repeatable): a verl preset (none, token-tis,
    /// seq-is, token-icepop, seq-is-rs, geo-rs, geo-rs-token-tis, geo-rs-seq-tis, k3-rs,
    /// k3-rs-token-tis) or a spec `is=token:C`, `is=sequence:C`, `is=token:LO_HI`
    /// (IcePop), `rs=OPTION:U` / `rs=OPTION:LO_HI` (token_k1..seq_max_k3), joined by `+`.
    /// Default: none, token-tis, seq-is, token-icepop, seq-is-rs, geo-rs, geo-rs-token-tis, k3-rs.
    #[arg(long = "correction", value_name = "SPEC")]
    pub corrections: Vec<String>,
    /// Skip the what-if table.
    #[arg(long)]
    pub no_whatif: bool,
    /// Loss preset of the what-if loss (losscheck's presets).
    #[arg(long, default_value = "verl-vanilla", value_name = "NAME")]
    pub loss_preset: String,
    /// Width of a response-position bucket (default: widest row / 16, a power of two).
    #[arg(long, value_name = "TOKENS")]
    pub bucket: Option<usize>,
    /// Entries of each top list (tokens, sequences, groups).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,
    /// Metric whose trend across steps is judged (a logged name).
    #[arg(
        long,
        default_value = "sampling/sampling_logp_difference/mean",
        value_name = "NAME"
    )]
    pub trend_metric: String,
    /// Training logs (repeatable, any format logscan reads): the producers' logged
    /// mismatch metrics (verl rollout_corr/* and mismatch/*, TRL sampling/*, vllm_kl,
    /// token_mult_prob_error, train_rollout_logprob_abs_diff) judged for growth and jumps.
    #[arg(long = "logs", value_name = "PATH")]
    pub logs: Vec<PathBuf>,
    /// Write plots into this folder (Δlogp histogram, by position, trends).
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Plot image format.
    #[arg(long, default_value = "png", value_parser = ["png", "svg"])]
    pub plot_format: String,
    /// Write the per-token and per-sequence tables of each step as Parquet into this folder.
    #[arg(long, value_name = "DIR")]
    pub export_frames: Option<PathBuf>,
    /// Output format on stdout.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Also write the JSON report to this file.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Exit 1 when a finding is at or above this severity.
    #[arg(long, value_enum, default_value = "error")]
    pub fail_on: FailOn,
    #[command(flatten)]
    /// Shared flags.
    pub common: CommonFlags,
}

/// The options `args` ask for.
///
/// Errors: an unknown role or correction.
pub fn options(args: &Args) -> Result<Options> {
    let pair = args.pair.as_deref().unwrap_or(if args.against.is_some() {
        "old:old"
    } else {
        "rollout:old"
    });
    let (a, b) = pair
        .split_once(':')
        .ok_or_else(|| Error::Usage(format!("--pair {pair}: expected A:B (e.g. rollout:old)")))?;
    let role = |s: &str| {
        mismatch::parse_role(s).ok_or_else(|| {
            Error::Usage(format!(
                "--pair: unknown role `{s}` (rollout, old, current, reference)"
            ))
        })
    };
    let mut o = Options {
        pair: (role(a)?, role(b)?),
        bucket_width: args.bucket,
        top_n: args.top,
        loss_preset: args.loss_preset.clone(),
        keep_tokens: args.export_frames.is_some(),
        trend_metric: args.trend_metric.clone(),
        ..Options::default()
    };
    if args.no_whatif {
        o.corrections.clear();
    } else if !args.corrections.is_empty() {
        o.corrections = args
            .corrections
            .iter()
            .map(|s| whatif::parse(s).map_err(|e| Error::Usage(format!("--correction: {e}"))))
            .collect::<Result<_>>()?;
    }
    Ok(o)
}

/// Write a frame as Parquet.
fn write_parquet(path: &std::path::Path, mut df: polars::prelude::DataFrame) -> Result<()> {
    let f = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    polars::prelude::ParquetWriter::new(f)
        .finish(&mut df)
        .map_err(|e| Error::Export {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
    Ok(())
}

/// Analyse, render and write side files; returns stdout's text and the exit code.
///
/// Errors: unreadable input, a step without the pair's roles, an unwritable output.
pub fn run(args: &Args) -> Result<(String, u8)> {
    let opts = options(args)?;
    let reader = crate::producers::step_reader_for(&args.path)?;
    let against = match &args.against {
        Some(b) => Some((crate::producers::step_reader_for(b)?, b)),
        None => None,
    };
    let steps = if args.steps.is_empty() {
        reader.steps(&args.path)?
    } else {
        args.steps.clone()
    };
    if steps.is_empty() {
        return Err(Error::Input {
            path: args.path.clone(),
            msg: format!("no step in this {} dump", reader.name()),
        });
    }
    let mut reports = Vec::new();
    for s in steps {
        // One step at a time, read cell by cell where the producer's files allow it:
        // a cell is read, scanned and dropped; only the report is kept.
        let step = reader.open_step(&args.path, s)?;
        let mut rep = match &against {
            Some((reader_b, root_b)) => {
                let other = reader_b.open_step(root_b, s)?;
                mismatch::analyse_pair(step.as_ref(), other.as_ref(), &opts)?
            }
            None => mismatch::analyse_cells(step.as_ref(), &opts)?,
        };
        drop(step);
        if let Some(dir) = &args.export_frames {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
            if let Some(t) = rep.token_table.take() {
                let df = mismatch::frames::tokens_frame(rep.step, &t)?;
                write_parquet(&dir.join(format!("tokens_step{}.parquet", rep.step)), df)?;
            }
            if let Some(q) = rep.seq_table.take() {
                let df = mismatch::frames::sequences_frame(rep.step, &q)?;
                write_parquet(&dir.join(format!("sequences_step{}.parquet", rep.step)), df)?;
            }
        }
        reports.push(rep);
    }
    let mut logged = Vec::new();
    for log in &args.logs {
        let scan = crate::logscan::scan(
            std::slice::from_ref(log),
            &crate::logscan::ScanOptions {
                detectors: vec!["logprob-mismatch".into()],
                keep_raw: true,
                ..Default::default()
            },
        )?;
        logged.extend(mismatch::trend::logged_series(
            &scan.frame,
            &log.display().to_string(),
        ));
    }
    let report = mismatch::build_report(reports, logged, &opts);
    if let Some(dir) = &args.plot {
        render::mismatch::plot::write_plots(&report, dir, &args.plot_format)?;
    }
    if let Some(out) = &args.output {
        let json = render::by_name::<mismatch::report::Report>(Format::Json, Style::default())
            .render(&report)?;
        std::fs::write(out, json).map_err(|e| Error::io(out, e))?;
    }
    let style = Style {
        color: args.common.color.enabled(),
        width: cli::terminal_width(),
    };
    let text = render::by_name::<mismatch::report::Report>(args.format, style).render(&report)?;
    let code = match report.worst() {
        Some(s) if s >= args.fail_on.severity() => EXIT_FOUND,
        _ => EXIT_CLEAN,
    };
    Ok((text, code))
}

/// Run `mismatch` on `args` (the first item is the program name) and return its exit
/// code; output, `--help`/`--version` and usage errors as the binary gives them.
pub fn run_cli<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Args = match cli::parse_from(args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match run(&args) {
        Ok((text, code)) => cli::finish("mismatch", &text, args.common.quiet, code),
        Err(err) => cli::fail("mismatch", &err),
    }
}

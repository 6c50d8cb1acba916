//! `dumpdiff`'s command line: compare the tensor dumps of two or three implementations of one
//! training step. Parses flags, calls the library, prints, and maps the outcome to the exit
//! codes of SPEC §1 (0 clean, 1 beyond tolerance, 2 bad input). The binary is a shim over
//! [`run_cli`], so the Python package and tests run the very same code.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;

use crate::cli::sides::{check_sides, Filter, Side};
use crate::cli::{self, CommonFlags, FailOn, Format};
use crate::compare::tolerance::{TolerancePolicy, ToleranceRules};
use crate::dumpdiff::report::Report;
use crate::dumpdiff::{self, Options};
use crate::exit_codes::EXIT_CLEAN;
use crate::frames::export_frames;
use crate::kernels::presets::preset;
use crate::producers::layout::Producer;
use crate::render::{self, Renderer, Style};
use crate::Error;
use clap::Parser;

/// The end of `--help`: invocations on a user's own dumps, one on the shipped fixtures
/// (in a clone of the repository), then the exit codes.
fn help_tail() -> String {
    cli::help_tail(&[
        "dumpdiff --self-hosted-dir run_a/debug_dump --weaver-dir run_b/debug_dump --step 12 --output report.json",
        "dumpdiff --inspect run_a/debug_dump/forward_data/step_000012_rank3_micro0.pt",
        "ssh node7 cat debug_dump/loss/step_000012_rank3_micro0.pt | dumpdiff --inspect -",
        "dumpdiff --self-hosted-dir fixtures/dumps/self_hosted_pt --weaver-dir fixtures/dumps/weaver_faulty_pt --step 0",
    ])
}

/// Compare RL training-step dumps, or inspect one dump file or folder.
#[derive(Parser, Debug)]
#[command(
    name = "dumpdiff",
    version,
    about = "Compare the tensor dumps of two or three implementations of one RL training step, or inspect one dump file or folder",
    after_help = help_tail()
)]
struct Args {
    /// Print what a dump file (.pt/.safetensors/.npy/.npz/.jsonl) holds, or the layout of a
    /// dump folder, and exit (`-` reads the file from stdin).
    #[arg(long, value_name = "PATH")]
    inspect: Option<PathBuf>,
    /// Two dumps of one step to compare, each a folder (or file) of any known producer
    /// (verl, NeMo-RL, slime/Miles, SGLang's dumper, AReaL), detected from its files:
    /// `dumpdiff A B --step N`. Rows match by token content, log-probs by role.
    #[arg(
        value_name = "DUMP",
        num_args = 0..=2,
        conflicts_with_all = ["inspect", "self_hosted_dir", "weaver_dir", "remote_api_dir"]
    )]
    dumps: Vec<PathBuf>,
    /// With `dumpdiff A B`: a TOML mapping of an in-house layout (file pattern → step,
    /// rank, micro; key → field and role; docs/stacks.md); a side it matches is read with it.
    #[arg(long, value_name = "FILE", requires = "dumps")]
    mapping: Option<PathBuf>,
    /// With --inspect on a folder: also write scalars/tokens/trajectories Parquet frames here.
    #[arg(long, value_name = "DIR", requires = "inspect")]
    export_frames: Option<PathBuf>,
    /// Training step to compare (required to compare; with --inspect DIR --export-frames:
    /// the step to export, every step when absent).
    #[arg(long, allow_negative_numbers = true)]
    step: Option<i64>,
    /// Dump folder of the self-hosted trainer (the reference side).
    #[arg(long, alias = "self_hosted_dir", value_name = "DIR")]
    self_hosted_dir: Option<PathBuf>,
    /// Dump folder of the remote-API run.
    #[arg(long, alias = "remote_api_dir", value_name = "DIR")]
    remote_api_dir: Option<PathBuf>,
    /// Dump folder of the weaver trainer.
    #[arg(long, alias = "weaver_dir", value_name = "DIR")]
    weaver_dir: Option<PathBuf>,
    /// Also write the JSON report (with schema_version) to FILE.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Format of stdout.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Only these ranks (`0,3,5-7`; default: all found).
    #[arg(long, value_name = "LIST")]
    ranks: Option<String>,
    /// Only these micro-batches (`0,1`; default: all found).
    #[arg(long, value_name = "LIST")]
    micros: Option<String>,
    /// Compare only ranks 0..N (the python comparator's flag).
    #[arg(long, alias = "num_ranks", value_name = "N", conflicts_with = "ranks")]
    num_ranks: Option<u32>,
    /// Compare only micros 0..N (the python comparator's flag).
    #[arg(
        long,
        alias = "num_micros",
        value_name = "N",
        conflicts_with = "micros"
    )]
    num_micros: Option<u32>,
    /// Absolute tolerance for every pair (overrides dtype defaults and rules).
    #[arg(long, value_name = "X")]
    atol: Option<f64>,
    /// Relative tolerance for every pair (overrides dtype defaults and rules).
    #[arg(long, value_name = "X")]
    rtol: Option<f64>,
    /// TOML file of per-tensor rules: [[rule]] name, atol, rtol, allowed_fraction, severity.
    #[arg(long, alias = "tol_file", value_name = "FILE")]
    tol_file: Option<PathBuf>,
    /// losscheck preset whose conventions recompute what one side did not dump (self-hosted
    /// advantages from trajectory rewards and groups) and both sides of a loss
    /// disagreement, to say which side's loss follows from its own inputs.
    #[arg(long, value_name = "PRESET", default_value = "nexrl-is")]
    preset: String,
    /// Do not recompute disagreeing losses with losscheck.
    #[arg(long)]
    no_adjudicate: bool,
    /// Epsilon of the recomputed self-hosted advantages `(r − mean)/(std + eps)`
    /// (default: inferred from the weaver's dumped advantages, else the preset's).
    #[arg(long = "adv-eps", alias = "advantage-eps", value_name = "X")]
    advantage_eps: Option<f64>,
    /// Entropy coefficient of both sides' loss (default: read from each side's loss
    /// `extra_info`, else inferred from its dumped loss terms).
    #[arg(long, value_name = "X")]
    entropy_coeff: Option<f64>,
    /// KL coefficient of both sides' loss (default: read, else inferred, as above).
    #[arg(long = "kl-coef", alias = "kl-coeff", value_name = "X")]
    kl_coeff: Option<f64>,
    /// Lowest severity that makes the exit code 1: warning (a WARN verdict, e.g. a rule
    /// with severity = "warn") or error (a FAIL verdict or a file on one side only).
    #[arg(long, alias = "fail_on", value_enum, default_value = "error")]
    fail_on: FailOn,
    /// Print on stderr the bytes and requests fetched from object storage (s3://, gs://,
    /// az://, http(s):// paths; docs/storage.md), to check that only what is read is fetched.
    #[arg(long)]
    stats: bool,
    #[command(flatten)]
    common: CommonFlags,
}

/// The stderr progress bar: drawn only when stderr is a terminal and not under CI, and
/// without colour (so `NO_COLOR` has nothing to turn off); otherwise a no-op.
struct ProgressBar(Option<indicatif::ProgressBar>);

impl ProgressBar {
    fn for_stderr(quiet: bool) -> Self {
        let wanted = !quiet && std::io::stderr().is_terminal() && std::env::var_os("CI").is_none();
        ProgressBar(wanted.then(|| {
            let bar = indicatif::ProgressBar::with_draw_target(
                Some(0),
                indicatif::ProgressDrawTarget::stderr(),
            );
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{msg:12} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        }))
    }

    fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

impl dumpdiff::Progress for ProgressBar {
    fn start(&self, role: &str, _files: usize, bytes: u64) {
        if let Some(b) = &self.0 {
            b.set_message(role.to_string());
            b.inc_length(bytes);
        }
    }

    fn file_done(&self, bytes: u64) {
        if let Some(b) = &self.0 {
            b.inc(bytes);
        }
    }
}

/// Parse `0,3,5-7` into a set.
fn parse_list(s: &str) -> Result<BTreeSet<u32>, Error> {
    let bad = || {
        Error::Usage(format!(
            "bad list '{s}': expected numbers and ranges like 0,3,5-7"
        ))
    };
    let mut set = BTreeSet::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                set.extend(a..=b);
            }
            None => {
                set.insert(part.parse().map_err(|_| bad())?);
            }
        }
    }
    Ok(set)
}

/// Check each side against its flag and the step, compare, write `--output`, and return
/// stdout's text with the exit code.
fn run(args: Args, progress: bool) -> Result<(String, u8), Error> {
    if let Some(path) = &args.inspect {
        let path = cli::stdin_path(path);
        let mut text = crate::inspect::render(&crate::producers::open::inspect(&path)?);
        if let Some(dir) = &args.export_frames {
            let mut frames = crate::frames::frames_for_path(&path, args.step)?;
            for written in export_frames(&mut frames, dir)? {
                text.push_str(&format!("wrote {}\n", written.display()));
            }
        }
        return Ok((text, EXIT_CLEAN));
    }
    if !args.dumps.is_empty() {
        return crate::cli::model_compare::run(
            &args.dumps,
            args.mapping.as_deref(),
            args.step,
            args.atol,
            args.rtol,
            args.format,
            args.common.quiet,
        );
    }
    // The preset recomputes advantages and adjudicates losses: an unknown name is a usage
    // error, not a silent skip of both.
    preset(&args.preset).map_err(|e| Error::Usage(format!("--preset: {e}")))?;
    let self_hosted = args
        .self_hosted_dir
        .clone()
        .ok_or_else(|| Error::Usage("--self-hosted-dir is required (or --inspect PATH)".into()))?;
    let step = args
        .step
        .ok_or_else(|| Error::Usage("--step N is required to compare".into()))?;
    let sides: Vec<Side> = [
        (
            "--self-hosted-dir",
            Some(self_hosted.clone()),
            Producer::SelfHosted,
        ),
        ("--weaver-dir", args.weaver_dir.clone(), Producer::Weaver),
        (
            "--remote-api-dir",
            args.remote_api_dir.clone(),
            Producer::RemoteApi,
        ),
    ]
    .into_iter()
    .filter_map(|(flag, dir, expected)| {
        dir.map(|dir| Side {
            flag,
            dir,
            expected,
        })
    })
    .collect();
    let rules = match &args.tol_file {
        Some(p) => ToleranceRules::load(p)?,
        None => ToleranceRules::default(),
    };
    let ranks = match (&args.ranks, args.num_ranks) {
        (Some(s), _) => Some(parse_list(s)?),
        (None, Some(n)) => Some((0..n).collect()),
        _ => None,
    };
    let micros = match (&args.micros, args.num_micros) {
        (Some(s), _) => Some(parse_list(s)?),
        (None, Some(n)) => Some((0..n).collect()),
        _ => None,
    };
    if sides.len() > 1 {
        let filter = Filter {
            ranks: ranks.as_ref(),
            micros: micros.as_ref(),
        };
        check_sides(&sides, step, filter)?;
    }
    let opts = Options {
        self_hosted,
        remote_api: args.remote_api_dir.clone(),
        weaver: args.weaver_dir.clone(),
        step,
        ranks,
        micros,
        policy: TolerancePolicy {
            rules,
            atol: args.atol,
            rtol: args.rtol,
        },
        tol_file: args.tol_file.clone(),
        adjudicate_with: (!args.no_adjudicate).then(|| args.preset.clone()),
        advantage_preset: Some(args.preset.clone()),
        advantage_eps: args.advantage_eps,
        coefficients: [
            ("entropy_coeff", args.entropy_coeff),
            ("kl_coef", args.kl_coeff),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), v?)))
        .collect(),
    };
    let bar = ProgressBar::for_stderr(args.common.quiet || !progress);
    let report = dumpdiff::run_with_progress(&opts, &bar)?;
    bar.finish();
    if let Some(out) = &args.output {
        let text = render::dumpdiff::json::JsonRenderer.render(&report)?;
        std::fs::write(out, text).map_err(|e| Error::io(out, e))?;
    }
    let text = if args.common.quiet {
        String::new()
    } else {
        let style = Style {
            color: args.common.color.enabled(),
            width: cli::terminal_width(),
        };
        render::by_name::<Report>(args.format, style).render(&report)?
    };
    // Files set aside as unreadable make it an input error, after the report of every
    // other cell was printed and written; the binary also names each on stderr, as it
    // names any input error there.
    if progress {
        for u in &report.unreadable {
            eprintln!(
                "dumpdiff: {} (set aside; every other cell compared)",
                u.reason
            );
        }
    }
    let code = if report.unreadable.is_empty() {
        dumpdiff::exit_code(&report, args.fail_on.severity())
    } else {
        crate::exit_codes::EXIT_BAD_INPUT
    };
    Ok((text, code))
}

/// Parse `args` (the program name first) and run `dumpdiff`, returning stdout's text and the
/// exit code instead of printing them: the door of the Python bindings, which run the
/// command with `--format json` and raise the error this returns (the binary prints it and
/// exits 2). A usage error (clap's, `--help` included) is [`Error::Usage`] with clap's text.
pub fn run_args<I, T>(args: I) -> Result<(String, u8), Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args = <Args as clap::Parser>::try_parse_from(args)
        .map_err(|e| Error::Usage(e.render().to_string().trim_end().to_string()))?;
    // A library caller (the Python functions) gets no progress bar: stderr is not ours.
    run(args, false)
}

/// Run `dumpdiff` on `args` (the first item is the program name, as in `std::env::args_os`)
/// and return its exit code: stdout and stderr are written as the binary writes them, and
/// `--help`, `--version` and usage errors print clap's text and give clap's exit code.
pub fn run_cli<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Args = match cli::parse_from(args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let quiet = args.common.quiet;
    let stats = args.stats.then(crate::formats::source::stats);
    let result = run(args, true);
    if let Some(before) = stats {
        let now = crate::formats::source::stats();
        eprintln!(
            "dumpdiff: fetched {} bytes of object data in {} requests",
            now.bytes - before.bytes,
            now.requests - before.requests
        );
    }
    match result {
        Ok((text, code)) => cli::finish("dumpdiff", &text, quiet, code),
        Err(err) => cli::fail("dumpdiff", &err),
    }
}

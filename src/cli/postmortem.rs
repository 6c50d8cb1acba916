//! The `postmortem` command line: arguments (clap derive), `run`, which does everything but
//! print, so tests call it directly, and [`run_cli`], the whole command the binary shims.
//!
//! Exit codes: 0 the report was made and the run did not crash and no finding reaches
//! `--fail-on` (by default no finding fails) and the `--dumps` verdict (if any) is not FAIL;
//! 1 a crash was found (a `failures/` bundle or a `crash` event), or a finding reaches
//! `--fail-on`, or the `--dumps` verdict is FAIL; 2 usage error or unreadable input (a bad
//! `--dumps` folder included: the path is named).
//!
//! `--dumps DIR --step N` (DIR repeatable): one dump tree in all → losscheck checks every
//! rank/micro of step N; several trees (one self-hosted plus a weaver and/or a remote-api
//! one, given as several `--dumps` or as the subfolders of one) → dumpdiff compares them
//! and losscheck adjudicates each loss disagreement. See [`crate::postmortem::dumps`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::Parser;

use crate::cli::{CommonFlags, FailOn, Format};
use crate::error::{Error, Result};
use crate::exit_codes::{EXIT_CLEAN, EXIT_FOUND};
use crate::postmortem::dumps::{DumpsOptions, DEFAULT_PRESET};
use crate::postmortem::report::Postmortem;
use crate::postmortem::{analyze, Options};
use crate::render::postmortem::json::JsonRenderer;
use crate::render::postmortem::markdown::MarkdownRenderer;
use crate::render::postmortem::write_report;
use crate::render::Renderer;

/// Where the report goes with `--format table` and no `--output`: `reports/<run-name>/`.
pub const DEFAULT_OUTPUT: &str = "reports";

/// The `--dumps` paragraph of `--help`.
const DUMPS_HELP: &str = "Training-step dumps (--dumps DIR --step N, DIR repeatable):\n  Each DIR is one dump tree (a producer's debug_dump/: forward_data/, loss/, is_loss_debug/ ...)\n  or a folder whose subfolders are dump trees; the trees of every --dumps are pooled.\n  One tree in all: losscheck recomputes every rank/micro's loss of step N from the tree's own\n  inputs (--preset) and lists the cells that are not self-consistent, with the first divergent\n  intermediate. Several trees: each tree's producer is identified from its files; exactly one\n  self-hosted tree (the reference) and at most one weaver and one remote-api tree are compared\n  by dumpdiff, and losscheck says which side of each loss disagreement follows from its own\n  inputs. Two trees of one producer, an unknown producer or no self-hosted tree: exit 2, nothing\n  is guessed (name the trees: --dumps A --dumps B). The verdict goes into report.md and\n  report.html (Training-step dumps) and summary.json (dumps).";

/// Invocations on a user's own runs, then one on the shipped fixtures (in a clone of the
/// repository).
const EXAMPLES: &[&str] = &[
    "postmortem debug_runs/20251008-110028 --output report-1100/",
    "postmortem debug_runs/20251008-110028/failures/20251008-113012-step-0041 --format markdown",
    "postmortem debug_runs/20251008-110028 --dumps run_b/debug_dump --step 41 --fail-on warning",
    "postmortem fixtures/runs/20251009-091500 --format markdown",
];

/// What postmortem's exit codes mean (more precise than the shared paragraph).
const EXIT_HELP: &str = "Exit codes:\n  0  no crash, no finding at or above --fail-on (none by default), dumps not FAIL\n  1  the run crashed, or a finding is at or above --fail-on, or the --dumps verdict is FAIL\n  2  usage error or unreadable input (a bad --dumps folder is named), or no run in the folder";

/// `Examples:` then the exit codes: the end of `-h`.
fn short_tail() -> String {
    let mut s = String::from("Examples:\n");
    for e in EXAMPLES {
        s.push_str(&format!("  {e}\n"));
    }
    s + "\n" + EXIT_HELP
}

/// The `--dumps` paragraph, the examples and the exit codes: the end of `--help`.
fn long_tail() -> String {
    format!("{DUMPS_HELP}\n\n{}", short_tail())
}

/// `postmortem` arguments.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "postmortem",
    version,
    about = "Turn a crashed or failed DebugTrainer run folder (or one crash bundle) into a report: report.md, report.html, summary.json and plots in --output DIR (default reports/<run-name>/)",
    after_help = short_tail(),
    after_long_help = long_tail()
)]
pub struct PostmortemArgs {
    /// A run folder (run_metadata.json, steps.jsonl, events.jsonl, failures/) or one
    /// crash bundle folder (failures/<time>-step-NNNN/).
    pub path: PathBuf,
    /// Folder to write report.md, report.html, summary.json and the plots into (DIR itself,
    /// created if absent). Default: reports/<run-name>/ with --format table; with --format
    /// json or markdown and no --output, nothing is written (the report goes to stdout).
    #[arg(long, short, value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Format of stdout: table (the headline and where the report is), json (summary.json),
    /// markdown (report.md; without --output it names no plot files, as none are written).
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Exit 1 when a finding is at or above this severity (by default findings never fail).
    #[arg(long, value_enum)]
    pub fail_on: Option<FailOn>,
    /// Override a detector threshold: NAME=VALUE (repeatable; see logscan --help).
    #[arg(long = "threshold", value_name = "NAME=VALUE")]
    pub thresholds: Vec<String>,
    /// A training step's dump tree, or a folder of dump trees (repeatable; needs --step):
    /// one tree is checked by losscheck, several are compared by dumpdiff.
    #[arg(long = "dumps", value_name = "DIR", requires = "step")]
    pub dumps: Vec<PathBuf>,
    /// The training step of the --dumps to check.
    #[arg(long, allow_negative_numbers = true, requires = "dumps")]
    pub step: Option<i64>,
    /// losscheck preset for --dumps (nexrl-is, trl-grpo, verl-gspo, …).
    #[arg(long, value_name = "PRESET", default_value = DEFAULT_PRESET)]
    pub preset: String,
    #[command(flatten)]
    pub common: CommonFlags,
}

/// What the binary prints and returns.
#[derive(Debug)]
pub struct RunOutput {
    /// Text for stdout: the headline and where the report is.
    pub stdout: String,
    /// Process exit code.
    pub code: u8,
}

/// True when `dir` holds what a run or a crash bundle leaves: run_metadata.json,
/// steps.jsonl, events.jsonl, failures/, a non-empty log file, or a bundle's
/// exception.txt/context.json.
fn looks_like_run(dir: &Path) -> bool {
    crate::logs::crash_bundle::is_bundle(dir)
        || ["run_metadata.json", "steps.jsonl", "events.jsonl"]
            .iter()
            .any(|f| dir.join(f).is_file())
        || dir.join("failures").is_dir()
        || crate::postmortem::log_files(dir).is_ok_and(|f| !f.is_empty())
}

/// Refuse a folder with nothing a run leaves, saying what it holds instead: the run
/// folders below it (the parent of several runs), or how many files and folders it has.
fn check_is_run(dir: &Path) -> Result<()> {
    if !dir.is_dir() || looks_like_run(dir) {
        return Ok(()); // analyze names a missing path or a file itself.
    }
    let mut runs = Vec::new();
    let (mut files, mut folders) = (0usize, 0usize);
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let p = entry.map_err(|e| Error::io(dir, e))?.path();
        if p.is_dir() {
            folders += 1;
            if looks_like_run(&p) {
                runs.push(
                    p.file_name()
                        .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
                );
            }
        } else {
            files += 1;
        }
    }
    runs.sort();
    let what = "run_metadata.json, steps.jsonl, events.jsonl, failures/, *.log, or a crash bundle's exception.txt/context.json";
    Err(Error::Usage(if runs.is_empty() {
        format!(
            "no run found in {}: it holds {files} file(s) and {folders} folder(s), none of them \
             {what}",
            dir.display()
        )
    } else {
        format!(
            "no run found in {}; it holds {} run folder(s): {} (pass one of them, e.g. {})",
            dir.display(),
            runs.len(),
            runs.join(", "),
            dir.join(&runs[0]).display()
        )
    }))
}

/// Analyse, write the report, decide the exit code. A run folder or bundle given as a
/// URL (s3://, gs://, az://, http(s)://) is copied first ([`crate::logs::fetch_dir`]: the
/// log, config and bundle objects, into a private temporary folder) and analysed as a
/// local folder; stdout, the written files and errors name the URL, never the copy. An
/// `--output` URL: the report is written to a temporary folder, then each file is PUT
/// under the prefix (nothing is put when the analysis fails).
pub fn run(args: &PostmortemArgs) -> Result<RunOutput> {
    let local = crate::logs::fetch_dir::localise(std::slice::from_ref(&args.path))?;
    let remote_out = args
        .output
        .as_ref()
        .filter(|o| crate::formats::source::is_remote(o));
    if let Some(url) = remote_out {
        // The output's bucket and credentials checked (one LIST) before any work.
        crate::formats::source::list_dir(url)?;
    }
    let scratch = remote_out
        .map(|_| crate::logs::fetch_dir::Scratch::new())
        .transpose()?;
    let mut copy = args.clone();
    copy.path = local.paths[0].clone();
    if let Some(s) = &scratch {
        copy.output = Some(s.path().join("report"));
    }
    let mut out = run_local(&copy, &local).map_err(|e| local.error_to_urls(e))?;
    if let (Some(note), false) = (local.skipped_note(), args.common.quiet) {
        eprintln!("postmortem: {note}");
    }
    if let (Some(url), Some(s)) = (remote_out, &scratch) {
        let url = url.to_string_lossy();
        crate::logs::fetch_dir::upload_dir(&s.path().join("report"), &url)?;
        let at = s.path().join("report").to_string_lossy().into_owned();
        out.stdout = out.stdout.replace(&at, url.trim_end_matches('/'));
    }
    Ok(out)
}

/// [`run`] on a local run folder (`local` says how to name its copies' paths as URLs).
fn run_local(
    args: &PostmortemArgs,
    local: &crate::logs::fetch_dir::Localised,
) -> Result<RunOutput> {
    check_is_run(&args.path)?;
    let dumps = match (args.dumps.is_empty(), args.step) {
        (true, _) => None,
        (false, Some(step)) => Some(DumpsOptions {
            dirs: args.dumps.clone(),
            step,
            preset: args.preset.clone(),
        }),
        (false, None) => return Err(Error::Usage("--dumps needs --step N".into())),
    };
    let opts = Options {
        thresholds: args.thresholds.clone(),
        dumps,
    };
    let pm = analyze(&args.path, &opts)?;
    let dir = match (&args.output, args.format) {
        (Some(dir), _) => Some(dir.clone()),
        (None, Format::Table) => Some(Path::new(DEFAULT_OUTPUT).join(&pm.run.name)),
        (None, Format::Json | Format::Markdown) => None,
    };
    let written = dir.map(|d| write_report(&pm, &d)).transpose()?;
    if let Some(w) = &written {
        for f in w.files.iter().filter(|f| {
            f.extension()
                .is_some_and(|e| e == "json" || e == "md" || e == "html" || e == "svg")
        }) {
            local.rewrite_file(f)?;
        }
    }
    let failing = match (args.fail_on, pm.worst()) {
        (Some(f), Some(w)) => w >= f.severity(),
        _ => false,
    };
    let dumps_failed = pm.dumps.as_ref().is_some_and(|d| d.failed);
    let code = if pm.crash.is_some() || failing || dumps_failed {
        EXIT_FOUND
    } else {
        EXIT_CLEAN
    };
    let dumps_line = pm
        .dumps
        .as_ref()
        .map_or(String::new(), |d| format!("dumps: {}\n", d.headline));
    // The written file when there is one (byte for byte what stdout shows), else the same
    // renderer on the report without plots.
    let text = |name: &str, r: &dyn Renderer<Postmortem>| match &written {
        Some(w) => {
            let p = w.dir.join(name);
            std::fs::read_to_string(&p).map_err(|e| Error::io(&p, e))
        }
        None => r.render(&pm),
    };
    let stdout = match args.format {
        _ if args.common.quiet => String::new(),
        Format::Table => format!(
            "{}\n{dumps_line}report: {}\n",
            pm.headline,
            written.as_ref().map_or_else(String::new, |w| w
                .dir
                .join("report.html")
                .display()
                .to_string())
        ),
        Format::Json => text("summary.json", &JsonRenderer)?,
        Format::Markdown => text("report.md", &MarkdownRenderer)?,
    };
    let stdout = local.to_urls(&stdout);
    Ok(RunOutput { stdout, code })
}

/// Run `postmortem` on `args` (the first item is the program name, as in
/// `std::env::args_os`) and return its exit code; output, `--help`/`--version` and usage
/// errors as the binary gives them.
pub fn run_cli<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: PostmortemArgs = match crate::cli::parse_from(args) {
        Ok(a) => a,
        Err(code) => return code,
    };
    match run(&args) {
        Ok(out) => crate::cli::finish("postmortem", &out.stdout, args.common.quiet, out.code),
        Err(err) => crate::cli::fail("postmortem", &err),
    }
}

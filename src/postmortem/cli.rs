//! The `postmortem` command line: arguments (clap derive) and `run`, which does everything
//! but print, so the binary stays a few lines and tests call it directly.
//!
//! Exit codes: 0 the report was written and the run did not crash and no finding reaches
//! `--fail-on` (by default no finding fails); 1 a crash was found (a `failures/` bundle
//! or a `crash` event), or a finding reaches `--fail-on`; 2 usage error or unreadable input.

use std::path::PathBuf;

use clap::Parser;

use crate::detect::Severity;
use crate::error::Result;
use crate::exit_codes::{EXIT_CLEAN, EXIT_FOUND};
use crate::postmortem::{analyze, write_report, Options};

/// `postmortem` arguments.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "postmortem",
    about = "Turn a crashed or failed DebugTrainer run folder (or one crash bundle) into a report: report.md, report.html, summary.json and plots in OUTPUT/<run-name>/",
    after_long_help = "Exit codes: 0 report written, no crash, no finding at or above --fail-on (none by default);\n1 the run crashed, or a finding is at or above --fail-on; 2 usage error or unreadable input."
)]
pub struct PostmortemArgs {
    /// A run folder (run_metadata.json, steps.jsonl, events.jsonl, failures/) or one
    /// crash bundle folder (failures/<time>-step-NNNN/).
    pub path: PathBuf,
    /// Folder to write the report into (as OUTPUT/<run-name>/).
    #[arg(long, short, default_value = "reports")]
    pub output: PathBuf,
    /// Exit 1 when a finding is at or above this severity (by default findings never fail).
    #[arg(long, value_enum)]
    pub fail_on: Option<Severity>,
    /// Override a detector threshold: NAME=VALUE (repeatable; see logscan --help).
    #[arg(long = "threshold", value_name = "NAME=VALUE")]
    pub thresholds: Vec<String>,
}

/// What the binary prints and returns.
#[derive(Debug)]
pub struct RunOutput {
    /// Text for stdout: the headline and where the report is.
    pub stdout: String,
    /// Process exit code.
    pub code: u8,
}

/// Analyse, write the report, decide the exit code.
pub fn run(args: &PostmortemArgs) -> Result<RunOutput> {
    let opts = Options {
        thresholds: args.thresholds.clone(),
    };
    let pm = analyze(&args.path, &opts)?;
    let written = write_report(&pm, &args.output)?;
    let failing = match (args.fail_on, pm.worst()) {
        (Some(f), Some(w)) => w >= f,
        _ => false,
    };
    let code = if pm.crash.is_some() || failing {
        EXIT_FOUND
    } else {
        EXIT_CLEAN
    };
    let stdout = format!(
        "{}\nreport: {}\n",
        pm.headline,
        written.dir.join("report.html").display()
    );
    Ok(RunOutput { stdout, code })
}

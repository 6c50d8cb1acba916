//! `logscan`: failure signatures in GRPO/GSPO training logs. Thin: parse, run, exit.
//! The scan's own flags are [`LogscanArgs`]; this adds the flags every command shares.

use std::process::ExitCode;

use clap::Parser;
use rlforensics::cli::logscan::{run, thresholds_help, LogscanArgs};
use rlforensics::cli::{self, CommonFlags};

/// Real invocations on the shipped fixtures.
const EXAMPLES: &[&str] = &[
    "logscan fixtures/logs/debug_faults/steps.jsonl --zero-loss --nan-grad",
    "logscan fixtures/trackers/tb/run_a --format markdown --output findings.json",
    "ssh node7 cat run/steps.jsonl | logscan -",
    "logscan --compare fixtures/trackers/tb/run_a fixtures/trackers/wandb/run_b --plot compare.png",
];

/// The end of `-h`: examples, then the exit codes.
fn short_tail() -> String {
    cli::help_tail(EXAMPLES)
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

fn main() -> ExitCode {
    let mut cli: Cli = match cli::parse() {
        Ok(a) => a,
        Err(code) => return code,
    };
    cli.scan.paths = cli.scan.paths.iter().map(|p| cli::stdin_path(p)).collect();
    let color = cli.common.color.enabled() && !cli.scan.no_color;
    match run(&cli.scan, color) {
        Ok(out) => cli::finish("logscan", &out.stdout, cli.common.quiet, out.code),
        Err(err) => cli::fail("logscan", &err),
    }
}

//! `logscan`: failure signatures in GRPO/GSPO training logs. Thin: parse, run, exit.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use rlforensics::exit_codes::EXIT_BAD_INPUT;
use rlforensics::logscan::cli::{run, LogscanArgs};

fn main() -> ExitCode {
    let args = LogscanArgs::parse();
    let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    match run(&args, color) {
        Ok(out) => {
            // A closed pipe (`| head`) is not an error.
            let _ = std::io::stdout().write_all(out.stdout.as_bytes());
            ExitCode::from(out.code)
        }
        Err(err) => {
            eprintln!("logscan: {err}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

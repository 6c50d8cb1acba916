//! `postmortem`: a crashed or failed run turned into a report. Thin: parse, run, exit.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use rlforensics::exit_codes::EXIT_BAD_INPUT;
use rlforensics::postmortem::cli::{run, PostmortemArgs};

fn main() -> ExitCode {
    rlforensics::alloc::keep_freed_memory();
    let args = PostmortemArgs::parse();
    match run(&args) {
        Ok(out) => {
            // A closed pipe (`| head`) is not an error.
            let _ = std::io::stdout().write_all(out.stdout.as_bytes());
            ExitCode::from(out.code)
        }
        Err(err) => {
            eprintln!("postmortem: {err}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

//! `postmortem`: a crashed or failed run turned into a report. Thin: parse, run, exit.

use std::process::ExitCode;

use rlforensics::cli;
use rlforensics::cli::postmortem::{run, PostmortemArgs};

fn main() -> ExitCode {
    let args: PostmortemArgs = match cli::parse() {
        Ok(a) => a,
        Err(code) => return code,
    };
    match run(&args) {
        Ok(out) => cli::finish("postmortem", &out.stdout, args.common.quiet, out.code),
        Err(err) => cli::fail("postmortem", &err),
    }
}

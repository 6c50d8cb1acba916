//! `postmortem`: a shim over [`rlforensics::cli::postmortem::run_cli`], where the command lives.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(rlforensics::cli::postmortem::run_cli(std::env::args_os()))
}

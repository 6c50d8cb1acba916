//! `dumpdiff`: a shim over [`rlforensics::cli::dumpdiff::run_cli`], where the command lives.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(rlforensics::cli::dumpdiff::run_cli(std::env::args_os()))
}

//! `mismatch`: a shim over [`rlforensics::cli::mismatch::run_cli`], where the command lives.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(rlforensics::cli::mismatch::run_cli(std::env::args_os()))
}

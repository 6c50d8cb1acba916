//! `logscan`: a shim over [`rlforensics::cli::logscan::run_cli`], where the command lives.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(rlforensics::cli::logscan::run_cli(std::env::args_os()))
}

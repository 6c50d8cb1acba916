//! `mismatch`: a shim over [`rlforensics::cli::mismatch::run_cli`], where the command lives.

#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOC: rlforensics::alloc::HugeBlocks = rlforensics::alloc::HugeBlocks;

fn main() -> std::process::ExitCode {
    rlforensics::alloc::keep_freed_memory();
    std::process::ExitCode::from(rlforensics::cli::mismatch::run_cli(std::env::args_os()))
}

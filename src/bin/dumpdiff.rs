//! `dumpdiff`: compare the tensor dumps of two or three implementations of one training
//! step. This binary is thin: it parses flags, calls the library, prints, and maps the
//! outcome to the exit codes of SPEC §1 (0 clean, 1 beyond tolerance, 2 bad input).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rlforensics::exit_codes::{EXIT_BAD_INPUT, EXIT_CLEAN};
use rlforensics::frames::{build_frames, export_frames};
use rlforensics::inspect::inspect_path;
use rlforensics::readers::layout::DumpTree;

/// Compare RL training-step dumps, or inspect one dump file or folder.
#[derive(Parser, Debug)]
#[command(name = "dumpdiff", version, about)]
struct Args {
    /// Print what a dump file (.pt/.safetensors/.npy/.npz/.jsonl) holds, or the layout of a
    /// dump folder, and exit.
    #[arg(long, value_name = "PATH")]
    inspect: Option<PathBuf>,
    /// With --inspect on a folder: also write scalars/tokens/trajectories Parquet frames here.
    #[arg(long, value_name = "DIR", requires = "inspect")]
    export_frames: Option<PathBuf>,
    /// Training step to read (default: every step).
    #[arg(long, allow_negative_numbers = true)]
    step: Option<i64>,
    /// Dump folder of the self-hosted trainer.
    #[arg(long, alias = "self_hosted_dir", value_name = "DIR")]
    self_hosted_dir: Option<PathBuf>,
    /// Dump folder of the remote-API run.
    #[arg(long, alias = "remote_api_dir", value_name = "DIR")]
    remote_api_dir: Option<PathBuf>,
    /// Dump folder of the weaver trainer.
    #[arg(long, alias = "weaver_dir", value_name = "DIR")]
    weaver_dir: Option<PathBuf>,
    /// Where to write the JSON report.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

fn run(args: Args) -> Result<u8, rlforensics::Error> {
    if let Some(path) = &args.inspect {
        print!("{}", inspect_path(path)?);
        if let Some(dir) = &args.export_frames {
            let tree = DumpTree::discover(path)?;
            let mut frames = build_frames(&tree, args.step)?;
            for written in export_frames(&mut frames, dir)? {
                println!("wrote {}", written.display());
            }
        }
        return Ok(EXIT_CLEAN);
    }
    Err(rlforensics::Error::Usage(
        "comparing dumps is not built yet; use --inspect PATH to read a dump".into(),
    ))
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("dumpdiff: {err}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

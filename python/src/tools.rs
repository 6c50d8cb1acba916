//! The commands from Python: `main(tool, argv)` runs a command line exactly as its binary
//! does (console entry points), and `run_json(tool, argv)` runs it with `--format json`
//! and returns the report's JSON text with the exit code, raising the error the command
//! would print and exit 2 with.

use clap::Parser;
use pyo3::prelude::*;
use rlforensics::cli::logscan::LogscanArgs;

use crate::errors::to_py;

/// The tools `main` and `run_json` know.
pub const TOOLS: [&str; 5] = ["dumpdiff", "logscan", "losscheck", "mismatch", "postmortem"];

/// A usage error in the Python caller's arguments (clap's own message).
fn usage(e: clap::Error) -> PyErr {
    to_py(rlforensics::Error::Usage(
        e.render().to_string().trim_end().to_string(),
    ))
}

/// Run `logscan` with `argv` (the arguments after the program name, `--format json`
/// appended): the JSON report and the exit code.
fn logscan_json(py: Python<'_>, argv: Vec<String>) -> PyResult<(String, u8)> {
    let args = LogscanArgs::try_parse_from(
        std::iter::once("logscan".to_string())
            .chain(argv)
            .chain(["--format".to_string(), "json".to_string()]),
    )
    .map_err(usage)?;
    let out = py
        .detach(|| rlforensics::cli::logscan::run(&args, false))
        .map_err(to_py)?;
    Ok((out.stdout, out.code))
}

/// Run `tool` with `argv` (after the program name) and `--format json`: `(json, exit code)`.
/// An input the command cannot use raises `RlforensicsError` (the command exits 2).
#[pyfunction]
fn run_json(py: Python<'_>, tool: &str, argv: Vec<String>) -> PyResult<(String, u8)> {
    let full: Vec<String> = std::iter::once(tool.to_string())
        .chain(argv.iter().cloned())
        .chain(["--format".to_string(), "json".to_string()])
        .collect();
    let out = match tool {
        "logscan" => return logscan_json(py, argv),
        "dumpdiff" => py.detach(|| rlforensics::cli::dumpdiff::run_args(full)),
        "losscheck" => py.detach(|| rlforensics::cli::losscheck::run_args(full)),
        "mismatch" => {
            let args = rlforensics::cli::mismatch::Args::try_parse_from(full).map_err(usage)?;
            py.detach(|| rlforensics::cli::mismatch::run(&args))
        }
        _ => {
            return Err(to_py(rlforensics::Error::Usage(format!(
                "run_json: unknown tool {tool:?}; known: dumpdiff, logscan, losscheck, mismatch"
            ))))
        }
    };
    out.map_err(to_py)
}

/// Run the command line `argv` (program name first, as `sys.argv`) of `tool` exactly as its
/// binary does (stdout, stderr, `--help`) and return its exit code: the console entry
/// points `dumpdiff`, `logscan`, `losscheck`, `mismatch`, `postmortem` of the wheel.
#[pyfunction]
fn main(py: Python<'_>, tool: &str, argv: Vec<String>) -> PyResult<u8> {
    let code = py.detach(|| match tool {
        "dumpdiff" => Some(rlforensics::cli::dumpdiff::run_cli(argv)),
        "logscan" => Some(rlforensics::cli::logscan::run_cli(argv)),
        "losscheck" => Some(rlforensics::cli::losscheck::run_cli(argv)),
        "mismatch" => Some(rlforensics::cli::mismatch::run_cli(argv)),
        "postmortem" => Some(rlforensics::cli::postmortem::run_cli(argv)),
        _ => None,
    });
    code.ok_or_else(|| {
        to_py(rlforensics::Error::Usage(format!(
            "unknown tool {tool:?}; known: {}",
            TOOLS.join(", ")
        )))
    })
}

/// Register the functions of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run_json, m)?)?;
    m.add_function(wrap_pyfunction!(main, m)?)?;
    m.add("TOOLS", TOOLS.to_vec())?;
    Ok(())
}

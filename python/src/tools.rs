//! The commands from Python: `main(tool, argv)` runs a command line exactly as its binary
//! does (console entry points), and `run_json(tool, argv)` runs it with `--format json`
//! and returns the report's JSON text with the exit code, raising the error the command
//! would print and exit 2 with.

use clap::Parser;
use pyo3::prelude::*;
use rlforensics::cli::logscan::LogscanArgs;

use crate::errors::to_py;

/// The tools `main` and `run_json` know.
pub const TOOLS: [&str; 4] = ["dumpdiff", "logscan", "losscheck", "postmortem"];

/// A usage error in the Python caller's arguments (clap's own message).
fn usage(e: clap::Error) -> PyErr {
    to_py(rlforensics::Error::Usage(e.render().to_string().trim_end().to_string()))
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
    match tool {
        "logscan" => logscan_json(py, argv),
        _ => Err(to_py(rlforensics::Error::Usage(format!(
            "run_json: unknown tool {tool:?}; known: logscan"
        )))),
    }
}

/// Register the functions of this module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run_json, m)?)?;
    m.add("TOOLS", TOOLS.to_vec())?;
    Ok(())
}

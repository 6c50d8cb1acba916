//! `rlforensics._native`: the compiled half of the `rlforensics` Python package.
//!
//! Everything here is a thin door into the library: the readers build polars-rs frames
//! ([`rlforensics::frames`], [`rlforensics::logscan::scan`]) with the GIL released, the
//! frames cross as Arrow C streams ([`arrow::ArrowFrame`]), reports cross as the JSON the
//! commands print, and every library error becomes a [`errors::RlforensicsError`] with the
//! message the command line prints. The Python modules (`python/rlforensics/*.py`) turn
//! streams into polars DataFrames and JSON into Python objects.

mod arrow;
mod errors;
mod events;
mod tools;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use pyo3::prelude::*;

use arrow::ArrowFrame;
use errors::{to_py, RlforensicsError};
use rlforensics::logscan::{scan, ScanOptions};

/// The dump tables of a dump folder (or of one dump file in a kind folder), by name:
/// `scalars`, `tokens`, `trajectories` ([`rlforensics::frames::Frames`]), the frames
/// `dumpdiff --inspect PATH --export-frames DIR` writes as Parquet.
#[pyfunction]
#[pyo3(signature = (path, step=None))]
fn read_dump(
    py: Python<'_>,
    path: PathBuf,
    step: Option<i64>,
) -> PyResult<BTreeMap<String, ArrowFrame>> {
    let frames = py
        .detach(|| {
            // A path that is not there is an I/O error naming it, not a naming complaint.
            std::fs::metadata(&path).map_err(|e| rlforensics::Error::io(&path, e))?;
            rlforensics::inspect::frames_for_path(&path, step)
        })
        .map_err(to_py)?;
    Ok(frames
        .tables()
        .into_iter()
        .map(|(name, df)| (name.to_string(), ArrowFrame::new(df.clone())))
        .collect())
}

/// Seconds the library alone takes to build [`read_dump`]'s frames (best of `repeats`),
/// for the benchmark that compares the Python read with the Rust one in the same build.
#[pyfunction]
#[pyo3(signature = (path, step=None, repeats=5))]
fn _rust_read_dump_seconds(
    py: Python<'_>,
    path: PathBuf,
    step: Option<i64>,
    repeats: usize,
) -> PyResult<f64> {
    py.detach(|| {
        let mut best = f64::INFINITY;
        for _ in 0..repeats.max(1) {
            let t = Instant::now();
            let frames = rlforensics::inspect::frames_for_path(&path, step)?;
            std::hint::black_box(&frames);
            drop(frames);
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    })
    .map_err(to_py)
}

/// Scan options of the readers: every canonical metric kept, raw columns on request.
fn read_options(raw: bool, aliases: Option<PathBuf>, run: Option<String>) -> ScanOptions {
    ScanOptions {
        keep_raw: raw,
        aliases,
        run,
        ..ScanOptions::default()
    }
}

/// The per-step frame logscan judges (`step`, `timestamp`, `source`, the canonical metric
/// columns, with `raw` also every raw key as `raw:<key>`) of log files or run folders.
#[pyfunction]
#[pyo3(signature = (paths, raw=false, aliases=None, run=None))]
fn read_logs(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    raw: bool,
    aliases: Option<PathBuf>,
    run: Option<String>,
) -> PyResult<ArrowFrame> {
    let opts = read_options(raw, aliases, run);
    let df = py
        .detach(|| {
            let report = scan(&paths, &opts)?;
            rlforensics::cli::logscan::nothing_read(&paths, &report)?;
            report.frame.to_polars()
        })
        .map_err(to_py)?;
    Ok(ArrowFrame::new(df))
}

/// The events (`events.jsonl` lines and their kin) of log files or run folders, one row
/// per event ([`events::events_frame`]).
#[pyfunction]
#[pyo3(signature = (paths, aliases=None, run=None))]
fn read_events(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    aliases: Option<PathBuf>,
    run: Option<String>,
) -> PyResult<ArrowFrame> {
    let opts = read_options(false, aliases, run);
    let df = py
        .detach(|| {
            let report = scan(&paths, &opts)?;
            events::events_frame(&report.events, &report.files)
        })
        .map_err(to_py)?;
    Ok(ArrowFrame::new(df))
}

/// The module: its functions, [`ArrowFrame`] and the exception type.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("RlforensicsError", m.py().get_type::<RlforensicsError>())?;
    m.add_class::<ArrowFrame>()?;
    m.add_function(wrap_pyfunction!(read_dump, m)?)?;
    m.add_function(wrap_pyfunction!(_rust_read_dump_seconds, m)?)?;
    m.add_function(wrap_pyfunction!(read_logs, m)?)?;
    m.add_function(wrap_pyfunction!(read_events, m)?)?;
    tools::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

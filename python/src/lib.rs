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
            // (A URL, s3://…, is looked up by the reader, which names it the same way.)
            if !rlforensics::formats::source::is_remote(&path) {
                std::fs::metadata(&path).map_err(|e| rlforensics::Error::io(&path, e))?;
            }
            rlforensics::frames::frames_for_path(&path, step)
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
/// Bytes of object data and requests fetched from object storage (s3://, gs://, az://,
/// http(s)://) by this process so far: `{"bytes": n, "requests": m}`. Take the difference
/// around a call to see what it fetched.
#[pyfunction]
fn fetch_stats() -> BTreeMap<&'static str, u64> {
    let s = rlforensics::formats::source::stats();
    BTreeMap::from([("bytes", s.bytes), ("requests", s.requests)])
}

/// Where a dump file sits in its tree, from its path alone (`…/forward_data/
/// step_000003_rank1_micro0.pt` → `("forward_data", 3, 1, 0)`): the kind folder, step,
/// rank and micro, as `DumpTree` places it; `None` for a file it would set aside. For
/// pipelines that receive files one by one (the Ray recipe, python/examples/).
#[pyfunction]
fn dump_coords(path: PathBuf) -> Option<(String, i64, Option<u32>, Option<u32>)> {
    use rlforensics::producers::layout::{parse_stem, Kind};
    let kind = Kind::from_dir_name(path.parent()?.file_name()?.to_str()?)?;
    rlforensics::formats::FileFormat::from_path(&path)?;
    let (step, rank, micro) = parse_stem(path.file_stem()?.to_str()?)?;
    Some((kind.dir_name().to_string(), step, rank, micro))
}

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
            let frames = rlforensics::frames::frames_for_path(&path, step)?;
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
            // URLs (s3://, gs://, az://, http(s)://) read from a private copy of their log
            // objects, errors naming the URLs (docs/storage.md).
            let local = rlforensics::logs::fetch_dir::localise(&paths)?;
            let read = || {
                let report = scan(&local.paths, &opts)?;
                rlforensics::cli::logscan::nothing_read(&local.paths, &report)?;
                report.frame.to_polars()
            };
            read().map_err(|e| local.error_to_urls(e))
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
            let local = rlforensics::logs::fetch_dir::localise(&paths)?;
            let read = || {
                let mut report = scan(&local.paths, &opts)?;
                // The `file` column names the URL, not the copy.
                for f in &mut report.files {
                    f.path = local.path_to_url(&f.path);
                }
                events::events_frame(&report.events, &report.files)
            };
            read().map_err(|e| local.error_to_urls(e))
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
    m.add_function(wrap_pyfunction!(fetch_stats, m)?)?;
    m.add_function(wrap_pyfunction!(dump_coords, m)?)?;
    m.add_function(wrap_pyfunction!(_rust_read_dump_seconds, m)?)?;
    m.add_function(wrap_pyfunction!(read_logs, m)?)?;
    m.add_function(wrap_pyfunction!(read_events, m)?)?;
    tools::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

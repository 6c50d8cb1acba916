//! polars-rs frames handed to Python as Arrow, through the Arrow PyCapsule interface
//! (<https://arrow.apache.org/docs/format/CDataInterface/PyCapsuleInterface.html>).
//!
//! A [`ArrowFrame`] holds a polars-rs `DataFrame` and implements `__arrow_c_stream__`: it
//! exports the frame as an `ArrowArrayStream` (one struct array per chunk, the record-batch
//! convention of the C stream interface) with polars-arrow's own C data interface
//! (`polars_arrow::ffi::export_iterator`), the way py-polars exports its own frames
//! (`dataframe_to_stream` in pola-rs/polars `crates/polars-python/src/interop/arrow/to_py.rs`).
//! Exporting a chunk hands over the column's buffers (reference-counted),
//! so the numbers are never copied between Rust and Python: the consumer (polars ≥ 1.3,
//! pyarrow ≥ 14, DuckDB, …) imports the same memory.
//!
//! Strings and the frames' few categorical columns cross at `CompatLevel::newest()`
//! (Arrow's `Utf8View`), polars' in-memory layout, again without a copy; every consumer
//! named above reads string views.

use polars::prelude::{CompatLevel, DataFrame};
use polars_arrow::array::{Array, StructArray};
use polars_arrow::datatypes::{ArrowDataType, Field};
use polars_arrow::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// A polars-rs frame waiting to cross into Python: any Arrow PyCapsule consumer takes it
/// (`polars.DataFrame(f)`, `pyarrow.table(f)`), each time without copying its buffers.
#[pyclass(module = "rlforensics._native", name = "ArrowFrame", frozen)]
pub struct ArrowFrame {
    df: DataFrame,
}

impl ArrowFrame {
    /// Wrap a frame; its chunks are aligned across columns (one Arrow record batch per
    /// chunk needs equal chunk boundaries in every column; the library's frames are built
    /// in one chunk per column, so this is a no-op for them).
    pub fn new(mut df: DataFrame) -> Self {
        if df.should_rechunk() {
            df.align_chunks_par();
        }
        ArrowFrame { df }
    }
}

/// The frame as an Arrow C stream: its schema is a struct of the columns' Arrow fields
/// and each item a struct array over chunk `i` of every column.
pub fn export_stream(df: &DataFrame) -> ffi::ArrowArrayStream {
    let compat = CompatLevel::newest();
    let fields: Vec<Field> = df
        .columns()
        .iter()
        .map(|c| c.field().to_arrow(compat))
        .collect();
    let dtype = ArrowDataType::Struct(fields);
    let n_chunks = df.columns().first().map_or(1, |c| c.n_chunks().max(1));
    let height = df.height();
    let df = df.clone();
    let item_dtype = dtype.clone();
    let iter = (0..n_chunks).map(move |i| {
        let arrays: Vec<Box<dyn Array>> = df
            .columns()
            .iter()
            .map(|c| c.as_materialized_series().to_arrow(i, compat))
            .collect();
        let len = arrays.first().map_or(height, |a| a.len());
        Ok(StructArray::new(item_dtype.clone(), len, arrays, None).boxed())
    });
    ffi::export_iterator(Box::new(iter), Field::new("".into(), dtype, false))
}

#[pymethods]
impl ArrowFrame {
    /// The Arrow PyCapsule stream protocol: a capsule named `arrow_array_stream` holding an
    /// `ArrowArrayStream`. `requested_schema` is accepted and ignored, as the protocol
    /// allows (the consumer casts if it must).
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        let stream = export_stream(&self.df);
        PyCapsule::new_with_value(py, stream, c"arrow_array_stream")
    }

    /// Rows.
    #[getter]
    fn height(&self) -> usize {
        self.df.height()
    }

    /// Column names, in order.
    #[getter]
    fn columns(&self) -> Vec<String> {
        self.df
            .get_column_names()
            .iter()
            .map(|n| n.to_string())
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "ArrowFrame(height={}, columns={:?})",
            self.df.height(),
            self.columns()
        )
    }
}

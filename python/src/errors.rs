//! The one Python exception of the package: `RlforensicsError`, a `ValueError` carrying the
//! message the command line prints after `tool: ` (file and position included), with the
//! parts as attributes: `kind` (`io`, `format`, `usage`, `input`, `export`, `internal`),
//! `path` (the file, or `None`) and `position` (`line 3`, `byte 120`, …, or `None`).

use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rlforensics::Error;

create_exception!(
    rlforensics._native,
    RlforensicsError,
    PyValueError,
    "An input rlforensics cannot use, or a usage error: the command line's message (file and position) as a ValueError."
);

/// The exception for a library error, its attributes set.
pub fn to_py(err: Error) -> PyErr {
    let (kind, path, position) = match &err {
        Error::Io { path, .. } => ("io", Some(path.display().to_string()), None),
        Error::Format { path, pos, .. } => (
            "format",
            Some(path.display().to_string()),
            Some(pos.to_string()),
        ),
        Error::Usage(_) => ("usage", None, None),
        Error::Input { path, .. } => ("input", Some(path.display().to_string()), None),
        Error::Export { path, .. } => ("export", Some(path.display().to_string()), None),
        Error::Internal(_) => ("internal", None, None),
        // A variant added to the library later: its message still crosses.
        #[allow(unreachable_patterns)]
        _ => ("other", None, None),
    };
    let e = RlforensicsError::new_err(err.to_string());
    Python::attach(|py| {
        let v = e.value(py);
        // Setting attributes on a fresh exception instance cannot fail short of memory.
        let _ = v.setattr("kind", kind);
        let _ = v.setattr("path", path);
        let _ = v.setattr("position", position);
    });
    e
}

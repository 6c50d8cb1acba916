//! `.npy` and `.npz` files. (Being written.)
use std::path::Path;
use crate::error::Result;
use crate::value::Value;

/// Read a `.npy` file into a tensor.
pub fn read_npy(path: &Path) -> Result<Value> {
    Err(crate::Error::Usage(format!("{}: not yet written", path.display())))
}

/// Read a `.npz` file into a dict of tensors.
pub fn read_npz(path: &Path) -> Result<Value> {
    Err(crate::Error::Usage(format!("{}: not yet written", path.display())))
}

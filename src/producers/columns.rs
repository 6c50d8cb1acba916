//! Per-row lists (JSON records, pickled sample dicts) stacked into the model's `[rows, T]`
//! tensors, right-padded with 0 to the longest row: shared by the producers that dump one
//! record per sample (NeMo-RL, slime, AReaL).

use std::path::Path;

use crate::model::step::TokenTensor;
use crate::model::trajectory::Provenance;
use crate::tensor::Tensor;

/// `[rows.len(), longest]` f64 tensor of `rows`, right-padded with 0.
pub fn padded_f64(rows: &[Vec<f64>]) -> Tensor {
    let w = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut v = vec![0.0; rows.len() * w];
    for (i, r) in rows.iter().enumerate() {
        v[i * w..i * w + r.len()].copy_from_slice(r);
    }
    Tensor::from_f64(vec![rows.len(), w], &v).expect("shape matches the values")
}

/// `[rows.len(), longest]` i64 tensor of `rows`, right-padded with 0.
pub fn padded_i64(rows: &[Vec<i64>]) -> Tensor {
    let w = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut v = vec![0i64; rows.len() * w];
    for (i, r) in rows.iter().enumerate() {
        v[i * w..i * w + r.len()].copy_from_slice(r);
    }
    Tensor::from_i64(vec![rows.len(), w], &v).expect("shape matches the values")
}

/// A per-token tensor stacked from lists: no stored dtype (the file held numbers as
/// text or Python lists), with its file and key.
pub fn listed(tensor: Tensor, file: &Path, key: &str) -> TokenTensor {
    TokenTensor {
        tensor,
        dtype: None,
        source: Provenance {
            file: file.to_path_buf(),
            key: key.to_string(),
        },
    }
}

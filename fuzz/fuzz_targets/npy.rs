//! `.npy` and `.npz` from bytes: the header literal parser, payload windows, zip members.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;

#[path = "common/mod.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    // The same bytes through both readers: an .npz is a zip of .npy members.
    if let Ok(v) = rlforensics::formats::npy::read_npy_bytes(Arc::new(data.to_vec())) {
        common::touch(&v);
    }
    if let Ok(v) = rlforensics::formats::npy::read_npz_bytes(data) {
        common::touch(&v);
    }
});

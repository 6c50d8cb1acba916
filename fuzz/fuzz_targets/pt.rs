//! `torch.save` archives from bytes: zip parsing, the restricted unpickler, storage windows.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;

#[path = "common/mod.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = rlforensics::formats::pt::read_pt_bytes(Arc::new(data.to_vec())) {
        common::touch(&v);
    }
});

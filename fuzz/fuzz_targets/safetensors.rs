//! `.safetensors` from bytes: header length, JSON header, offsets, zero-copy windows.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;

#[path = "common/mod.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) =
        rlforensics::formats::safetensors::read_safetensors_bytes(Arc::new(data.to_vec()))
    {
        common::touch(&v);
    }
});

//! Python-style JSON (`json::parse_value`, bare NaN/Infinity) and the one-line `.jsonl`
//! dump's conversion of nested lists into tensors.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common/mod.rs"]
mod common;

/// Convert nested lists to tensors the way dump readers' callers do.
fn to_tensors(v: &rlforensics::Value) {
    use rlforensics::Value;
    match v {
        Value::Dict(pairs) => pairs.iter().for_each(|(_, v)| to_tensors(v)),
        Value::List(items) => {
            if let Some(t) = v.to_tensor() {
                common::touch(&Value::Tensor(t));
            }
            items.iter().for_each(to_tensors);
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(v) = rlforensics::json::parse_value(text) {
        to_tensors(&v);
    }
});

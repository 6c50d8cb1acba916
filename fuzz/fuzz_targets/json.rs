//! Python-style JSON (`json::parse_value`, bare NaN/Infinity) and the one-line `.jsonl`
//! dump's conversion of nested lists into tensors; the packed parse the dump reader uses
//! (`json::parse_value_packed`) must give the same value.
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
        Value::Packed(_) => common::touch(v),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let plain = rlforensics::json::parse_value(text);
    let packed = rlforensics::json::parse_value_packed(text);
    match (&plain, &packed) {
        (Ok(a), Ok(b)) => assert!(common::same(a, b), "packed parse differs"),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => panic!("one parse failed, the other did not"),
    }
    if let Ok(v) = packed {
        to_tensors(&v);
    }
});

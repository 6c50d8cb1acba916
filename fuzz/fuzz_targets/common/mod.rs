//! Shared by every fuzz target: walk what a reader returned and touch every tensor's
//! elements, so a forged shape/stride/offset that slipped past validation panics here
//! (an out-of-bounds index) instead of in a command later.

use rlforensics::Value;

/// Tensors larger than this are only checked for metadata (the fuzzer's time goes to parsing).
const MAX_TOUCH: usize = 1 << 16;

/// Visit every tensor in `v` and read its elements back.
pub fn touch(v: &Value) {
    match v {
        Value::List(items) | Value::Tuple(items) => items.iter().for_each(touch),
        Value::Dict(pairs) => pairs.iter().for_each(|(k, v)| {
            touch(k);
            touch(v);
        }),
        Value::Tensor(t) => {
            if t.numel() <= MAX_TOUCH {
                // Complex dtypes give two values (re, im) per element.
                let per = if t.dtype().is_complex() { 2 } else { 1 };
                let f = t.to_f64_vec();
                assert_eq!(f.len(), t.numel() * per);
                let i = t.to_i64_vec();
                assert_eq!(i.len(), t.numel() * per);
                assert_eq!(t.element_bytes().len(), t.numel() * t.dtype().size());
            }
        }
        _ => {}
    }
}

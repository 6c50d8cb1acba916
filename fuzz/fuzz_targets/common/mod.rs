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
        Value::Packed(p) => {
            // A packed list is a list: its items, its length and its tensor agree.
            let items = v.items().expect("a packed list has items");
            assert_eq!(items.len(), p.len());
            assert_eq!(v.seq_len(), Some(p.len()));
            assert!(!p.is_empty());
            if p.len() <= MAX_TOUCH {
                let t = v.to_tensor().expect("a packed list is a 1-d tensor");
                assert_eq!(t.shape(), &[p.len()]);
                assert_eq!(v.to_f64s().map(|f| f.len()), Some(p.len()));
            }
        }
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

/// True when `a` and `b` are the same Python value, a packed list equal to the list of
/// its items (floats compared bit for bit).
#[allow(dead_code)]
pub fn same(a: &Value, b: &Value) -> bool {
    let seq = |v: &Value| match v {
        Value::Packed(p) => Some(p.to_values()),
        Value::List(x) => Some(x.clone()),
        _ => None,
    };
    match (a, b) {
        (Value::Packed(_) | Value::List(_), Value::Packed(_) | Value::List(_)) => {
            let (x, y) = (seq(a).unwrap_or_default(), seq(b).unwrap_or_default());
            x.len() == y.len() && x.iter().zip(&y).all(|(p, q)| same(p, q))
        }
        (Value::Dict(x), Value::Dict(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((k1, v1), (k2, v2))| same(k1, k2) && same(v1, v2))
        }
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
        (Value::Int(x), Value::Int(y)) => x == y,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::BigInt(x), Value::BigInt(y)) | (Value::Str(x), Value::Str(y)) => x == y,
        (Value::None, Value::None) => true,
        _ => false,
    }
}

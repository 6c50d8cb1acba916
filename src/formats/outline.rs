//! A decoded file as the inspector shows it ([`Outline`]): per value its type, dtype,
//! shape, views, small values or stats, and its children by key.

use std::fmt::Write as _;

use crate::model::outline::Outline;
use crate::tensor::Tensor;
use crate::value::Value;

/// Items of a list shown before the rest is summarised.
const SHOWN_ITEMS: usize = 4;
/// Tensors with at most this many elements are printed in full.
const SHOWN_VALUES: usize = 8;
/// Tensors larger than this many elements get no stats (inspection stays instant).
const STATS_LIMIT: usize = 50_000_000;

/// Summary statistics of a numeric tensor, computed in f64.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Stats {
    /// Smallest finite value.
    pub min: f64,
    /// Largest finite value.
    pub max: f64,
    /// Mean of the finite values.
    pub mean: f64,
    /// Number of NaN elements.
    pub nan: usize,
    /// Number of ±inf elements.
    pub inf: usize,
}

/// Stats over the finite values of `t` (min/max/mean are NaN when there are none).
pub fn tensor_stats(t: &Tensor) -> Stats {
    let (mut min, mut max, mut sum, mut n, mut nan, mut inf) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        0usize,
        0usize,
        0usize,
    );
    for x in t.to_f64_vec() {
        if x.is_nan() {
            nan += 1;
        } else if x.is_infinite() {
            inf += 1;
        } else {
            min = min.min(x);
            max = max.max(x);
            sum += x;
            n += 1;
        }
    }
    if n == 0 {
        (min, max) = (f64::NAN, f64::NAN);
    }
    Stats {
        min,
        max,
        mean: if n == 0 { f64::NAN } else { sum / n as f64 },
        nan,
        inf,
    }
}

fn tensor_line(t: &Tensor, from_list: bool) -> String {
    let mut s = if from_list {
        format!(
            "list {} {:?}",
            if t.dtype().is_float() { "float" } else { "int" },
            t.shape()
        )
    } else {
        format!("tensor {} {:?}", t.dtype(), t.shape())
    };
    if !from_list && !t.is_contiguous() || t.offset() != 0 {
        let _ = write!(s, " strides {:?} offset {}", t.strides(), t.offset());
    }
    if !from_list && t.storage_numel() != t.numel() {
        let _ = write!(
            s,
            " (view of storage {} with {} elements)",
            t.storage_key().unwrap_or("?"),
            t.storage_numel()
        );
    }
    if let Some(q) = t.quantization() {
        match (q.scales.as_slice(), q.zero_points.as_slice(), q.axis) {
            ([s1], [z], None) => {
                let _ = write!(s, " ({} scale {s1} zero_point {z}; int_repr", q.scheme);
            }
            (sc, _, axis) => {
                let _ = write!(
                    s,
                    " ({} axis {} with {} scales; int_repr",
                    q.scheme,
                    axis.unwrap_or(0),
                    sc.len()
                );
            }
        }
        s.push(')');
    } else if t.dtype().is_raw() {
        s.push_str(" (raw bits, shown as unsigned integers)");
    }
    if t.dtype().is_complex() {
        if t.numel() <= SHOWN_VALUES {
            let v = t.to_f64_vec();
            let pairs: Vec<String> = v
                .chunks_exact(2)
                .map(|c| {
                    format!(
                        "({}{}{}j)",
                        fmt_num(c[0]),
                        if c[1] < 0.0 || c[1].is_nan() { "" } else { "+" },
                        fmt_num(c[1])
                    )
                })
                .collect();
            let _ = write!(s, " = [{}]", pairs.join(", "));
        }
        return s;
    }
    if t.numel() <= SHOWN_VALUES {
        let vals: Vec<String> = if t.dtype().is_float() {
            t.to_f64_vec().iter().map(|x| fmt_num(*x)).collect()
        } else if t.dtype() == crate::tensor::DType::U64 {
            // Exactly, above i64::MAX too.
            t.element_bytes()
                .chunks_exact(8)
                .map(|c| {
                    // `chunks_exact(8)`: every chunk is 8 bytes.
                    let mut b = [0u8; 8];
                    b.copy_from_slice(c);
                    u64::from_le_bytes(b).to_string()
                })
                .collect()
        } else {
            t.to_i64_vec().iter().map(i64::to_string).collect()
        };
        let _ = write!(s, " = [{}]", vals.join(", "));
    } else if t.numel() > 0 && t.numel() <= STATS_LIMIT {
        let st = tensor_stats(t);
        let _ = write!(
            s,
            "  min {} max {} mean {}",
            fmt_num(st.min),
            fmt_num(st.max),
            fmt_num(st.mean)
        );
        if st.nan > 0 || st.inf > 0 {
            let _ = write!(s, "  nan {} inf {}", st.nan, st.inf);
        }
    }
    s
}

/// A number for people: integers plain, moderate values with 6 decimals, the rest in
/// scientific notation (used by the inspector and dumpdiff's findings).
pub fn fmt_num(x: f64) -> String {
    if !x.is_finite() || (x == x.trunc() && x.abs() < 1e15) {
        format!("{x}")
    } else if (1e-3..1e6).contains(&x.abs()) {
        format!("{x:.6}")
    } else {
        format!("{x:.4e}")
    }
}

/// One line describing `v` (without children).
fn headline(v: &Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(b) => format!("bool {}", if *b { "True" } else { "False" }),
        Value::Int(i) => format!("int {i}"),
        Value::BigInt(s) => format!("int {s}"),
        Value::Float(f) => format!("float {f:?}"),
        Value::Str(s) => {
            let short: String = s.chars().take(60).collect();
            let ell = if short.len() < s.len() { "…" } else { "" };
            format!("str {short:?}{ell}")
        }
        Value::Bytes(b) => format!("bytes ({} bytes)", b.len()),
        Value::Tensor(t) => tensor_line(t, false),
        Value::Dict(items) => format!("dict ({} keys)", items.len()),
        Value::List(items) | Value::Tuple(items) => match v.to_tensor() {
            Some(t) if !items.is_empty() => tensor_line(&t, true),
            _ => format!("{} ({} items)", v.type_name(), items.len()),
        },
        // Never empty, always numeric: the same line as the list of values it stands for.
        Value::Packed(p) => match v.to_tensor() {
            Some(t) => tensor_line(&t, true),
            None => format!("list ({} items)", p.len()),
        },
    }
}

/// The outline of a decoded value: its line, its entries (a dict's) or first items (a
/// list's that is not a tensor), and how many items are not shown.
pub fn outline(v: &Value) -> Outline {
    let (children, hidden): (Vec<(String, &Value)>, usize) = match v {
        Value::Dict(items) => (items.iter().map(|(k, val)| (key_text(k), val)).collect(), 0),
        Value::List(items) | Value::Tuple(items) if v.to_tensor().is_none() => (
            items
                .iter()
                .take(shown(items))
                .enumerate()
                .map(|(i, val)| (format!("[{i}]"), val))
                .collect(),
            items.len().saturating_sub(shown(items)),
        ),
        _ => (Vec::new(), 0),
    };
    Outline {
        line: headline(v),
        children: children.into_iter().map(|(k, c)| (k, outline(c))).collect(),
        hidden,
    }
}

/// How many items of a list to expand: one when they are dicts (trajectories, datums:
/// the first shows the shape of all), a few otherwise.
fn shown(items: &[Value]) -> usize {
    if items.first().is_some_and(|v| matches!(v, Value::Dict(_))) {
        1
    } else {
        SHOWN_ITEMS
    }
}

fn key_text(k: &Value) -> String {
    match k {
        Value::Str(s) => s.clone(),
        other => headline(other),
    }
}

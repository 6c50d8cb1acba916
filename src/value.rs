//! The value tree every dump reader returns: the Python objects `torch.save` and
//! `json.dumps` write (None, bool, int, float, str, bytes, list, tuple, dict) plus tensors.

use crate::tensor::{DType, Tensor};

/// A decoded Python value.
#[derive(Debug, Clone)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer outside i64, kept exactly as its decimal digits.
    BigInt(String),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    /// A dict in insertion order; keys are usually `Str` but may be any value.
    Dict(Vec<(Value, Value)>),
    Tensor(Tensor),
}

impl Value {
    /// The value under string key `key` of a dict.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(items) => items
                .iter()
                .find(|(k, _)| matches!(k, Value::Str(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The entries of a dict.
    pub fn as_dict(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Dict(items) => Some(items),
            _ => None,
        }
    }

    /// The items of a list or tuple.
    pub fn as_seq(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) | Value::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// A tensor.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// An integer (bools count as 0/1, as in Python; one-element integer tensors too).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(*b as i64),
            Value::Tensor(t) if t.numel() == 1 && !t.dtype().is_float() => {
                t.to_i64_vec().first().copied()
            }
            _ => None,
        }
    }

    /// A number as f64: float, int, bool, or a one-element tensor (a 0-d `loss`).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            Value::Bool(b) => Some(*b as u8 as f64),
            Value::Tensor(t) => t.scalar_f64(),
            _ => None,
        }
    }

    /// A short name of the Python type, for error messages and the inspector.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Tensor(_) => "tensor",
        }
    }

    /// This value as a numeric tensor: a tensor as is, or a rectangular nested list of
    /// numbers (how `.jsonl` dumps and `.tolist()` write tensors) as i64 when every leaf is
    /// an int or bool, else f64. `None` for ragged or non-numeric lists.
    pub fn to_tensor(&self) -> Option<Tensor> {
        match self {
            Value::Tensor(t) => Some(t.clone()),
            Value::List(_) | Value::Tuple(_) => {
                let mut shape = Vec::new();
                let mut cur = self;
                while let Some(items) = cur.as_seq() {
                    shape.push(items.len());
                    match items.first() {
                        Some(first) => cur = first,
                        None => break,
                    }
                }
                let mut leaves = Vec::new();
                let mut all_int = true;
                if !collect_leaves(self, &shape, &mut leaves, &mut all_int) {
                    return None;
                }
                if all_int {
                    let ints: Vec<i64> = leaves
                        .iter()
                        .map(|v| v.as_i64().unwrap_or_default())
                        .collect();
                    Tensor::from_i64(shape, &ints).ok()
                } else {
                    let fl: Vec<f64> = leaves
                        .iter()
                        .map(|v| v.as_f64().unwrap_or(f64::NAN))
                        .collect();
                    Tensor::from_f64(shape, &fl).ok()
                }
            }
            Value::Int(_) | Value::Bool(_) => {
                Tensor::from_i64(vec![], &[self.as_i64().unwrap_or_default()]).ok()
            }
            Value::Float(f) => Tensor::from_f64(vec![], &[*f]).ok(),
            _ => None,
        }
    }

    /// True for ints, floats and bools.
    pub fn is_number(&self) -> bool {
        matches!(self, Value::Int(_) | Value::Float(_) | Value::Bool(_))
    }
}

/// Walk a nested list checking it is rectangular with `shape`; gather the leaves.
fn collect_leaves<'a>(
    v: &'a Value,
    shape: &[usize],
    out: &mut Vec<&'a Value>,
    all_int: &mut bool,
) -> bool {
    match (shape.split_first(), v.as_seq()) {
        (Some((&n, rest)), Some(items)) => {
            items.len() == n
                && items
                    .iter()
                    .all(|item| collect_leaves(item, rest, out, all_int))
        }
        (None, None) if v.is_number() => {
            if matches!(v, Value::Float(_)) {
                *all_int = false;
            }
            out.push(v);
            true
        }
        _ => false,
    }
}

/// The dtype a value's numbers are stored with, for the inspector.
pub fn value_dtype(v: &Value) -> Option<DType> {
    match v {
        Value::Tensor(t) => Some(t.dtype()),
        _ => v.to_tensor().map(|t| t.dtype()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_lists_become_tensors() {
        let v = Value::List(vec![
            Value::List(vec![Value::Int(1), Value::Int(2)]),
            Value::List(vec![Value::Int(3), Value::Float(4.5)]),
        ]);
        let t = v.to_tensor().unwrap();
        assert_eq!(t.shape(), &[2, 2]);
        assert_eq!(t.dtype(), DType::F64);
        assert_eq!(t.to_f64_vec(), vec![1.0, 2.0, 3.0, 4.5]);
        let ragged = Value::List(vec![
            Value::List(vec![Value::Int(1)]),
            Value::List(vec![Value::Int(3), Value::Int(4)]),
        ]);
        assert!(ragged.to_tensor().is_none());
    }
}

//! The value tree every dump reader returns: the Python objects `torch.save` and
//! `json.dumps` write (None, bool, int, float, str, bytes, list, tuple, dict) plus tensors.
//!
//! A list whose items are all ints, all floats or all bools (a trajectory's `tokens` and
//! `loss_mask`) may arrive [`Value::Packed`]: one typed array instead of one `Value` per
//! item, so that a pickled token list takes about the memory of its pickle, not 40× it.
//! It is the same Python list: [`Value::type_name`] says `list`, [`Value::seq_len`] and
//! [`Value::items`] see its items, [`Value::to_tensor`] reads it directly.

use std::borrow::Cow;
use std::sync::Arc;

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
    /// A list of ints, floats or bools (never mixed, never empty) stored as one typed array;
    /// shared, so that a memo reference or a clone does not copy it.
    Packed(Arc<Packed>),
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

    /// The items of a list or tuple held as values (not a [`Value::Packed`] list: see
    /// [`Value::items`]).
    pub fn as_seq(&self) -> Option<&[Value]> {
        match self {
            Value::List(v) | Value::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// The items of any list or tuple, packed ones unpacked into values (a copy).
    pub fn items(&self) -> Option<Cow<'_, [Value]>> {
        match self {
            Value::List(v) | Value::Tuple(v) => Some(Cow::Borrowed(v)),
            Value::Packed(p) => Some(Cow::Owned(p.to_values())),
            _ => None,
        }
    }

    /// The number of items of a list (packed or not) or tuple.
    pub fn seq_len(&self) -> Option<usize> {
        match self {
            Value::List(v) | Value::Tuple(v) => Some(v.len()),
            Value::Packed(p) => Some(p.len()),
            _ => None,
        }
    }

    /// A packed list.
    pub fn as_packed(&self) -> Option<&Packed> {
        match self {
            Value::Packed(p) => Some(p),
            _ => None,
        }
    }

    /// The numbers of a tensor or (nested) list as i64, exactly as
    /// `to_tensor()?.to_i64_vec()` gives them, but straight from a packed list of ints or
    /// bools, without a tensor in between.
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        match self {
            Value::Packed(p) => match &**p {
                Packed::Ints(v) => Some(v.to_vec()),
                Packed::Bools(v) => Some(v.iter().map(|&b| b as i64).collect()),
                Packed::Floats(_) => self.to_tensor().map(|t| t.to_i64_vec()),
            },
            _ => self.to_tensor().map(|t| t.to_i64_vec()),
        }
    }

    /// The numbers of a tensor or (nested) list as f64, exactly as
    /// `to_tensor()?.to_f64_vec()` gives them, but straight from a packed list.
    pub fn to_f64s(&self) -> Option<Vec<f64>> {
        match self {
            Value::Packed(p) => Some(match &**p {
                Packed::Ints(v) => v.iter().map(|x| x as f64).collect(),
                Packed::Bools(v) => v.iter().map(|&b| b as u8 as f64).collect(),
                Packed::Floats(v) => v.clone(),
            }),
            _ => self.to_tensor().map(|t| t.to_f64_vec()),
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
            Value::Packed(_) => "list",
        }
    }

    /// This value as a numeric tensor: a tensor as is, or a rectangular nested list of
    /// numbers (how `.jsonl` dumps and `.tolist()` write tensors) as i64 when every leaf is
    /// an int or bool, else f64. `None` for ragged or non-numeric lists.
    pub fn to_tensor(&self) -> Option<Tensor> {
        match self {
            Value::Tensor(t) => Some(t.clone()),
            Value::List(_) | Value::Tuple(_) | Value::Packed(_) => {
                let mut shape = Vec::new();
                let mut cur = self;
                loop {
                    if let Value::Packed(p) = cur {
                        shape.push(p.len());
                        break;
                    }
                    let Some(items) = cur.as_seq() else { break };
                    shape.push(items.len());
                    match items.first() {
                        Some(first) => cur = first,
                        None => break,
                    }
                }
                let mut leaves = Leaves::Ints(Vec::new());
                if !collect_leaves(self, &shape, &mut leaves) {
                    return None;
                }
                match leaves {
                    Leaves::Ints(ints) => Tensor::from_i64(shape, &ints).ok(),
                    Leaves::Floats(fl) => Tensor::from_f64(shape, &fl).ok(),
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

/// The items of a homogeneous list of numbers, stored as one typed array.
#[derive(Debug, Clone, PartialEq)]
pub enum Packed {
    /// Python ints, in the narrowest width that holds them all.
    Ints(Ints),
    /// Python floats.
    Floats(Vec<f64>),
    /// Python bools.
    Bools(Vec<bool>),
}

impl Packed {
    /// Number of items.
    pub fn len(&self) -> usize {
        match self {
            Packed::Ints(v) => v.len(),
            Packed::Floats(v) => v.len(),
            Packed::Bools(v) => v.len(),
        }
    }

    /// True when there are no items.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Item `i` as a value.
    pub fn get(&self, i: usize) -> Option<Value> {
        match self {
            Packed::Ints(v) => v.get(i).map(Value::Int),
            Packed::Floats(v) => v.get(i).map(|&f| Value::Float(f)),
            Packed::Bools(v) => v.get(i).map(|&b| Value::Bool(b)),
        }
    }

    /// Every item as a value (a copy, for code that walks values one by one).
    pub fn to_values(&self) -> Vec<Value> {
        match self {
            Packed::Ints(v) => v.iter().map(Value::Int).collect(),
            Packed::Floats(v) => v.iter().map(|&f| Value::Float(f)).collect(),
            Packed::Bools(v) => v.iter().map(|&b| Value::Bool(b)).collect(),
        }
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        match self {
            Packed::Ints(v) => v.heap_bytes(),
            Packed::Floats(v) => v.capacity() * 8,
            Packed::Bools(v) => v.capacity(),
        }
    }

    /// A packed list holding `v` alone, when `v` is an int, float or bool.
    pub fn of_scalar(v: &Value) -> Option<Packed> {
        let mut p = match v {
            Value::Int(_) => Packed::Ints(Ints::default()),
            Value::Float(_) => Packed::Floats(Vec::new()),
            Value::Bool(_) => Packed::Bools(Vec::new()),
            _ => return None,
        };
        p.push_scalar(v);
        Some(p)
    }

    /// Append `v` when it is a scalar of this list's kind (int, float or bool); false,
    /// nothing appended, otherwise.
    pub fn push_scalar(&mut self, v: &Value) -> bool {
        match (self, v) {
            (Packed::Ints(x), Value::Int(i)) => x.push(*i),
            (Packed::Floats(x), Value::Float(f)) => x.push(*f),
            (Packed::Bools(x), Value::Bool(b)) => x.push(*b),
            _ => return false,
        }
        true
    }

    /// Release spare capacity left by growth.
    pub fn shrink_to_fit(&mut self) {
        match self {
            Packed::Ints(v) => v.shrink_to_fit(),
            Packed::Floats(v) => v.shrink_to_fit(),
            Packed::Bools(v) => v.shrink_to_fit(),
        }
    }
}

/// Ints stored in the narrowest of u8, u16, i32 and i64 that holds every one of them (a
/// loss mask takes a byte per item, token ids two or four), widened as larger ones arrive.
#[derive(Debug, Clone, PartialEq)]
pub enum Ints {
    U8(Vec<u8>),
    U16(Vec<u16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl Default for Ints {
    fn default() -> Self {
        Ints::U8(Vec::new())
    }
}

/// Apply `$body` to the vector inside an [`Ints`], whatever its width.
macro_rules! ints_dispatch {
    ($ints:expr, $v:ident => $body:expr) => {
        match $ints {
            Ints::U8($v) => $body,
            Ints::U16($v) => $body,
            Ints::I32($v) => $body,
            Ints::I64($v) => $body,
        }
    };
}

impl Ints {
    /// Number of ints.
    pub fn len(&self) -> usize {
        ints_dispatch!(self, v => v.len())
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Int `i`.
    pub fn get(&self, i: usize) -> Option<i64> {
        match self {
            Ints::U8(v) => v.get(i).map(|&x| i64::from(x)),
            Ints::U16(v) => v.get(i).map(|&x| i64::from(x)),
            Ints::I32(v) => v.get(i).map(|&x| i64::from(x)),
            Ints::I64(v) => v.get(i).copied(),
        }
    }

    /// The ints in order.
    pub fn iter(&self) -> IntsIter<'_> {
        match self {
            Ints::U8(v) => IntsIter::U8(v.iter()),
            Ints::U16(v) => IntsIter::U16(v.iter()),
            Ints::I32(v) => IntsIter::I32(v.iter()),
            Ints::I64(v) => IntsIter::I64(v.iter()),
        }
    }

    /// Widen the ints from `start` into `out` (as many as fit, fewer at the end); return
    /// how many were written. Walks a packed list a block at a time, for loops that would
    /// otherwise dispatch on the storage width once per element.
    pub fn widen_block(&self, start: usize, out: &mut [i64]) -> usize {
        fn copy<T: Copy + Into<i64>>(v: &[T], start: usize, out: &mut [i64]) -> usize {
            let src = v.get(start..).unwrap_or_default();
            let n = src.len().min(out.len());
            for (o, &x) in out[..n].iter_mut().zip(&src[..n]) {
                *o = x.into();
            }
            n
        }
        ints_dispatch!(self, v => copy(v, start, out))
    }

    /// The ints as i64 (a copy).
    pub fn to_vec(&self) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.len());
        self.extend_into(&mut out);
        out
    }

    /// Append the ints to `out` as i64.
    pub fn extend_into(&self, out: &mut Vec<i64>) {
        match self {
            Ints::U8(v) => out.extend(v.iter().map(|&x| i64::from(x))),
            Ints::U16(v) => out.extend(v.iter().map(|&x| i64::from(x))),
            Ints::I32(v) => out.extend(v.iter().map(|&x| i64::from(x))),
            Ints::I64(v) => out.extend_from_slice(v),
        }
    }

    /// Append `x`, widening the storage when it does not fit.
    pub fn push(&mut self, x: i64) {
        let fits = match self {
            Ints::U8(v) => u8::try_from(x).map(|x| v.push(x)).is_ok(),
            Ints::U16(v) => u16::try_from(x).map(|x| v.push(x)).is_ok(),
            Ints::I32(v) => i32::try_from(x).map(|x| v.push(x)).is_ok(),
            Ints::I64(v) => {
                v.push(x);
                true
            }
        };
        if !fits {
            self.widen_for(x);
            self.push(x);
        }
    }

    /// Append a batch of ints, widening the storage once for the whole batch. Lists up to
    /// 64 Ki items grow to their exact length (a token list holds no spare capacity);
    /// longer ones grow geometrically.
    pub fn extend_from_i64(&mut self, xs: &[i64]) {
        if xs.is_empty() {
            return;
        }
        // Token ids and masks are never negative: then the OR of the ints (one pass the
        // compiler vectorises) bounds them as well as their maximum does.
        let or = xs.iter().fold(0i64, |a, &x| a | x);
        let (lo, hi) = if or >= 0 {
            (0, or)
        } else {
            xs.iter()
                .fold((i64::MAX, i64::MIN), |(l, h), &x| (l.min(x), h.max(x)))
        };
        let width = if lo >= 0 && hi <= u8::MAX as i64 {
            0
        } else if lo >= 0 && hi <= u16::MAX as i64 {
            1
        } else if lo >= i32::MIN as i64 && hi <= i32::MAX as i64 {
            2
        } else {
            3
        };
        let rank = match self {
            Ints::U8(_) => 0,
            Ints::U16(_) => 1,
            Ints::I32(_) => 2,
            Ints::I64(_) => 3,
        };
        if width > rank {
            let old = std::mem::take(self);
            *self = match width {
                1 => Ints::U16(old.iter().map(|v| v as u16).collect()),
                2 => Ints::I32(old.iter().map(|v| v as i32).collect()),
                _ => Ints::I64(old.to_vec()),
            };
        }
        fn grow<T>(v: &mut Vec<T>, add: usize) {
            if v.len() + add <= 1 << 16 {
                v.reserve_exact(add);
            } else {
                v.reserve(add);
            }
        }
        match self {
            Ints::U8(v) => {
                grow(v, xs.len());
                v.extend(xs.iter().map(|&x| x as u8));
            }
            Ints::U16(v) => {
                grow(v, xs.len());
                v.extend(xs.iter().map(|&x| x as u16));
            }
            Ints::I32(v) => {
                grow(v, xs.len());
                v.extend(xs.iter().map(|&x| x as i32));
            }
            Ints::I64(v) => {
                grow(v, xs.len());
                v.extend_from_slice(xs);
            }
        }
    }

    /// Keep the first `n` ints (the storage stays as wide as it became).
    pub fn truncate(&mut self, n: usize) {
        ints_dispatch!(self, v => v.truncate(n))
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        match self {
            Ints::U8(v) => v.capacity(),
            Ints::U16(v) => v.capacity() * 2,
            Ints::I32(v) => v.capacity() * 4,
            Ints::I64(v) => v.capacity() * 8,
        }
    }

    fn shrink_to_fit(&mut self) {
        ints_dispatch!(self, v => v.shrink_to_fit())
    }

    /// Re-store in the narrowest width that holds `x`, which the current one does not
    /// (so it is wider than the current one, and holds every int stored so far).
    fn widen_for(&mut self, x: i64) {
        let old = std::mem::take(self);
        *self = if u16::try_from(x).is_ok() {
            Ints::U16(old.iter().map(|v| v as u16).collect())
        } else if i32::try_from(x).is_ok() {
            Ints::I32(old.iter().map(|v| v as i32).collect())
        } else {
            Ints::I64(old.to_vec())
        };
    }
}

/// Iterator over [`Ints`] as i64: the storage's own slice iterator, widened.
pub enum IntsIter<'a> {
    U8(std::slice::Iter<'a, u8>),
    U16(std::slice::Iter<'a, u16>),
    I32(std::slice::Iter<'a, i32>),
    I64(std::slice::Iter<'a, i64>),
}

impl Iterator for IntsIter<'_> {
    type Item = i64;

    fn next(&mut self) -> Option<i64> {
        match self {
            IntsIter::U8(it) => it.next().map(|&x| i64::from(x)),
            IntsIter::U16(it) => it.next().map(|&x| i64::from(x)),
            IntsIter::I32(it) => it.next().map(|&x| i64::from(x)),
            IntsIter::I64(it) => it.next().copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.len();
        (n, Some(n))
    }
}

impl ExactSizeIterator for IntsIter<'_> {
    fn len(&self) -> usize {
        match self {
            IntsIter::U8(it) => it.len(),
            IntsIter::U16(it) => it.len(),
            IntsIter::I32(it) => it.len(),
            IntsIter::I64(it) => it.len(),
        }
    }
}

/// The leaves of a numeric nested list: i64 while every leaf is an int or bool, f64 from
/// the first float on (the ints before it converted).
enum Leaves {
    Ints(Vec<i64>),
    Floats(Vec<f64>),
}

impl Leaves {
    fn floats_mut(&mut self) -> &mut Vec<f64> {
        if let Leaves::Ints(v) = self {
            *self = Leaves::Floats(v.iter().map(|&x| x as f64).collect());
        }
        match self {
            Leaves::Floats(v) => v,
            Leaves::Ints(_) => unreachable!("converted just above"),
        }
    }
}

/// Walk a nested list checking it is rectangular with `shape`; gather the leaves.
fn collect_leaves(v: &Value, shape: &[usize], out: &mut Leaves) -> bool {
    match (shape.split_first(), v) {
        (Some((&n, [])), Value::Packed(p)) => {
            if p.len() != n {
                return false;
            }
            match (&**p, &mut *out) {
                (Packed::Ints(x), Leaves::Ints(o)) => x.extend_into(o),
                (Packed::Bools(x), Leaves::Ints(o)) => o.extend(x.iter().map(|&b| b as i64)),
                (Packed::Ints(x), Leaves::Floats(o)) => o.extend(x.iter().map(|i| i as f64)),
                (Packed::Bools(x), Leaves::Floats(o)) => {
                    o.extend(x.iter().map(|&b| b as u8 as f64))
                }
                (Packed::Floats(x), o) => o.floats_mut().extend_from_slice(x),
            }
            true
        }
        (Some((&n, rest)), _) => match v.as_seq() {
            Some(items) => {
                items.len() == n && items.iter().all(|item| collect_leaves(item, rest, out))
            }
            None => false,
        },
        (None, Value::Float(f)) => {
            out.floats_mut().push(*f);
            true
        }
        (None, Value::Int(_) | Value::Bool(_)) => {
            let x = v.as_i64().unwrap_or_default();
            match out {
                Leaves::Ints(o) => o.push(x),
                Leaves::Floats(o) => o.push(x as f64),
            }
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

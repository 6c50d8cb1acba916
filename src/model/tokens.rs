//! Token sequences as the model hands them out: borrowed in place from a packed list when
//! the reader packed one, owned otherwise, and the content hash rows are matched by.

use crate::value::{Ints, Packed, Value};

/// A stable 64-bit hash of a token sequence (xxh3 over little-endian i64), used to match
/// trajectories by content across producers and row orders.
pub fn tokens_hash(tokens: &[i64]) -> u64 {
    tokens_hash_iter(tokens.iter().copied())
}

/// [`tokens_hash`] of ints given one by one (a packed list's, without an i64 copy): the
/// same xxh3 of the little-endian i64 bytes, fed in blocks.
pub fn tokens_hash_iter(tokens: impl IntoIterator<Item = i64>) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = [0u8; 8 * 512];
    let mut n = 0;
    for t in tokens {
        buf[n..n + 8].copy_from_slice(&t.to_le_bytes());
        n += 8;
        if n == buf.len() {
            h.update(&buf);
            n = 0;
        }
    }
    h.update(&buf[..n]);
    h.digest()
}

/// [`tokens_hash`] of a value's token ids (a packed list hashed in place), the empty
/// sequence's when it has none.
pub fn value_tokens_hash(v: Option<&Value>) -> u64 {
    match v.and_then(Value::as_packed) {
        Some(Packed::Ints(ints)) => tokens_hash_iter(ints.iter()),
        _ => tokens_hash(&v.and_then(Value::to_i64s).unwrap_or_default()),
    }
}

/// Integer ids of one sequence (tokens, a 0/1 mask): the reader's packed list borrowed as
/// it is, or ids widened once from a tensor or a list of values.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenSeq<'v> {
    /// A packed list of ints, read in place.
    Packed(&'v Ints),
    /// Widened to i64.
    Owned(Vec<i64>),
}

impl<'v> TokenSeq<'v> {
    /// The ids of a tensor or (nested, packed) list; `None` for any other value.
    pub fn of(v: &'v Value) -> Option<TokenSeq<'v>> {
        match v {
            Value::Packed(p) => match &**p {
                Packed::Ints(ints) => Some(TokenSeq::Packed(ints)),
                _ => v.to_i64s().map(TokenSeq::Owned),
            },
            Value::Tensor(_) | Value::List(_) => v.to_i64s().map(TokenSeq::Owned),
            _ => None,
        }
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        match self {
            TokenSeq::Packed(p) => p.len(),
            TokenSeq::Owned(v) => v.len(),
        }
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids in order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = i64> + '_> {
        match self {
            TokenSeq::Packed(p) => Box::new(p.iter()),
            TokenSeq::Owned(v) => Box::new(v.iter().copied()),
        }
    }

    /// The ids as i64 (a copy).
    pub fn to_vec(&self) -> Vec<i64> {
        match self {
            TokenSeq::Packed(p) => p.to_vec(),
            TokenSeq::Owned(v) => v.clone(),
        }
    }

    /// [`tokens_hash`] of the ids, without a copy.
    pub fn hash(&self) -> u64 {
        match self {
            TokenSeq::Packed(p) => tokens_hash_iter(p.iter()),
            TokenSeq::Owned(v) => tokens_hash(v),
        }
    }

    /// The sum of the ids (a mask's count of ones).
    pub fn sum(&self) -> f64 {
        self.iter().map(|x| x as f64).sum()
    }
}

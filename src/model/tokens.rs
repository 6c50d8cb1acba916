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
    let mut h = TokensHasher::new();
    for t in tokens {
        h.push(t);
    }
    h.finish()
}

/// [`tokens_hash`] computed as the ids arrive: their little-endian i64 bytes gathered into
/// blocks for xxh3's streaming state (which digests any split of the bytes alike).
pub struct TokensHasher {
    h: xxhash_rust::xxh3::Xxh3,
    buf: [u8; 8 * 512],
    n: usize,
}

impl Default for TokensHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl TokensHasher {
    /// The hash of no ids yet.
    pub fn new() -> TokensHasher {
        TokensHasher {
            h: xxhash_rust::xxh3::Xxh3::new(),
            buf: [0u8; 8 * 512],
            n: 0,
        }
    }

    /// Add one id.
    pub fn push(&mut self, t: i64) {
        self.buf[self.n..self.n + 8].copy_from_slice(&t.to_le_bytes());
        self.n += 8;
        if self.n == self.buf.len() {
            self.h.update(&self.buf);
            self.n = 0;
        }
    }

    /// Add ids in order.
    pub fn extend(&mut self, ts: &[i64]) {
        for &t in ts {
            self.push(t);
        }
    }

    /// The hash of every id added.
    pub fn finish(mut self) -> u64 {
        self.h.update(&self.buf[..self.n]);
        self.h.digest()
    }
}

/// [`tokens_hash`] of a value's token ids (a packed list hashed in place), the empty
/// sequence's when it has none.
pub fn value_tokens_hash(v: Option<&Value>) -> u64 {
    match v.and_then(Value::as_packed) {
        Some(Packed::Ints(ints)) => TokenSeq::Packed(ints).hash(),
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
            TokenSeq::Packed(p) => {
                let mut h = TokensHasher::new();
                let mut block = [0i64; 512];
                let mut at = 0;
                loop {
                    let k = p.widen_block(at, &mut block);
                    if k == 0 {
                        break h.finish();
                    }
                    h.extend(&block[..k]);
                    at += k;
                }
            }
            TokenSeq::Owned(v) => tokens_hash(v),
        }
    }

    /// Widen the ids from `start` into `out` (as many as fit); return how many were
    /// written ([`Ints::widen_block`] of a packed list).
    pub fn widen_block(&self, start: usize, out: &mut [i64]) -> usize {
        match self {
            TokenSeq::Packed(p) => p.widen_block(start, out),
            TokenSeq::Owned(v) => {
                let src = v.get(start..).unwrap_or_default();
                let n = src.len().min(out.len());
                out[..n].copy_from_slice(&src[..n]);
                n
            }
        }
    }

    /// The sum of the ids (a mask's count of ones).
    pub fn sum(&self) -> f64 {
        self.iter().map(|x| x as f64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids of every storage width, lengths around the 512-id blocks: hashing a packed
    /// list block by block gives the hash of its i64 copy, byte for byte.
    #[test]
    fn packed_lists_hash_as_their_i64_copy_across_blocks() {
        for n in [0usize, 1, 511, 512, 513, 1024, 1500] {
            let ids: Vec<i64> = (0..n as i64).map(|i| (i * 7919) % 251).collect();
            let wide: Vec<i64> = ids.iter().map(|&x| x * 1_000_003 - 5).collect();
            for (packed, plain) in [
                (Ints::U8(ids.iter().map(|&x| x as u8).collect()), &ids),
                (Ints::U16(ids.iter().map(|&x| x as u16).collect()), &ids),
                (Ints::I32(ids.iter().map(|&x| x as i32).collect()), &ids),
                (Ints::I64(wide.clone()), &wide),
            ] {
                // xxh3 of the little-endian bytes, computed here without the hasher.
                let bytes: Vec<u8> = plain.iter().flat_map(|x| x.to_le_bytes()).collect();
                let want = xxhash_rust::xxh3::xxh3_64(&bytes);
                assert_eq!(TokenSeq::Packed(&packed).hash(), want, "n {n}");
                assert_eq!(tokens_hash(plain), want, "n {n}");
                assert_eq!(tokens_hash_iter(packed.iter()), want, "n {n}");
                let mut out = vec![0i64; 300];
                let k = packed.widen_block(n.saturating_sub(100), &mut out);
                assert_eq!(&out[..k], &plain[n.saturating_sub(100)..], "n {n}");
            }
        }
    }
}

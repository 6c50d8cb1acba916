//! The content hash of a token sequence that pairs trajectories across producers and row
//! orders; it sits with the tensor type so that every layer above (readers, compare,
//! frames, tools) can use it without importing one another.

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

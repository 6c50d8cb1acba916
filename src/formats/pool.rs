//! Read buffers for the many similar files a comparison reads and drops in turn (a
//! dump's per-rank files): a file is read (`pread`) into a block of whole huge pages
//! ([`crate::alloc::Block`]) that goes back for reuse when its last tensor is dropped,
//! instead of being mapped. A map costs a page fault for every 64 KB on first touch (its
//! CRC check touches every byte), an unmap and the TLB shootdown that goes with it; a
//! reused block is faulted in once and then only copied into, and the bytes its next
//! readers see are in cache.

use std::os::unix::fs::FileExt as _;
use std::sync::Arc;

use crate::formats::Buf;

/// Files read into a block at most this long (a longer one is mapped as before: a copy
/// of it would double its pages in memory at once).
pub(crate) const MAX_POOLED: u64 = 64 << 20;

/// Files shorter than this are read into a buffer of their own, not a block (a small
/// file kept for the whole run, a loss file, must not hold a 2 MiB block).
const MIN_POOLED: usize = 1 << 20;

/// A file's bytes at the start of a block, which is kept for reuse when dropped.
#[cfg(target_os = "linux")]
struct Pooled {
    block: crate::alloc::Block,
    len: usize,
}

#[cfg(target_os = "linux")]
impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.block.bytes()[..self.len]
    }
}

/// The first `len` bytes of `file`, in a reused block from [`MIN_POOLED`] bytes on.
pub(crate) fn read_file(file: &std::fs::File, len: usize) -> std::io::Result<Buf> {
    #[cfg(target_os = "linux")]
    if len >= MIN_POOLED {
        let mut block = crate::alloc::Block::new(len)
            .ok_or_else(|| std::io::Error::other(format!("no memory for {len} bytes")))?;
        file.read_exact_at(&mut block.bytes_mut()[..len], 0)?;
        return Ok(Arc::new(Pooled { block, len }));
    }
    let mut buf = vec![0; len];
    file.read_exact_at(&mut buf, 0)?;
    Ok(Arc::new(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_reused_and_holds_only_the_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let (long, short) = (dir.path().join("long"), dir.path().join("short"));
        let n = MIN_POOLED + 5000;
        std::fs::write(&long, vec![7u8; n]).unwrap();
        let mut other = vec![9u8; MIN_POOLED + 3];
        other[..3].copy_from_slice(b"abc");
        std::fs::write(&short, &other).unwrap();
        let open = |p: &std::path::Path| std::fs::File::open(p).unwrap();
        let a = read_file(&open(&long), n).unwrap();
        assert_eq!((*a).as_ref(), &vec![7u8; n][..]);
        drop(a);
        // The next read takes a free buffer (this one, or another test's), written with
        // other bytes before, and sees only its own.
        let b = read_file(&open(&short), other.len()).unwrap();
        assert_eq!((*b).as_ref(), &other[..]);
        drop(b);
        let c = read_file(&open(&long), n).unwrap();
        assert_eq!((*c).as_ref(), &vec![7u8; n][..]);
        // A file shorter than asked for is an error, not stale bytes; so is a small one.
        assert!(read_file(&open(&short), n).is_err());
        std::fs::write(&short, b"abc").unwrap();
        assert_eq!((*read_file(&open(&short), 3).unwrap()).as_ref(), b"abc");
        assert!(read_file(&open(&short), 10).is_err());
    }
}

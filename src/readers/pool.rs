//! Reusable read buffers for the many similar files a comparison reads and drops in turn
//! (a dump's per-rank files): a file is read (`pread`) into a buffer given back when its
//! last tensor is dropped, instead of being mapped. A map costs a page fault for every
//! 64 KB on first touch (its CRC check touches every byte), an unmap and the TLB
//! shootdown that goes with it; a reused buffer is faulted in once and then only copied
//! into, and the bytes its next readers see are in cache.

use std::os::unix::fs::FileExt as _;
use std::sync::{Arc, Mutex};

use memmap2::{Advice, MmapMut, MmapOptions};

use crate::readers::Buf;

/// Buffers given back and not yet reused.
static FREE: Mutex<Vec<MmapMut>> = Mutex::new(Vec::new());

/// Bytes of free buffers kept at most; a buffer given back beyond that is unmapped.
const KEEP_BYTES: usize = 48 << 20;

/// Files read into a pooled buffer at most this long (a longer one is mapped as before:
/// a copy of it would double its pages in memory at once).
pub(crate) const MAX_POOLED: u64 = 64 << 20;

/// Files shorter than this are read into a buffer of their own, not a pooled one (a small
/// file kept for the whole run, a loss file, must not hold a large buffer).
const MIN_POOLED: usize = 1 << 20;

/// Pooled buffers are whole 2 MiB huge pages where the kernel gives them: a buffer is
/// faulted in a few times instead of once per 4 KiB page.
const HUGE: usize = 2 << 20;

/// A file's bytes in a buffer that goes back to [`FREE`] when dropped.
struct Pooled {
    /// `None` only while being dropped.
    map: Option<MmapMut>,
    len: usize,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        self.map.as_ref().map_or(&[], |m| &m[..self.len])
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(map) = self.map.take() {
            give_back(map);
        }
    }
}

/// A buffer for `len` bytes: the smallest free one that holds them and is at most twice
/// as long, else a new anonymous map of whole huge pages (asked to be backed by them).
fn take(len: usize) -> std::io::Result<MmapMut> {
    {
        let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
        let fits = (0..free.len())
            .filter(|&i| (len..=2 * len).contains(&free[i].len()))
            .min_by_key(|&i| free[i].len());
        if let Some(i) = fits {
            return Ok(free.swap_remove(i));
        }
    }
    let map = MmapOptions::new()
        .len(len.div_ceil(HUGE) * HUGE)
        .map_anon()?;
    // Only advice: without huge pages the buffer still works, page by page.
    let _ = map.advise(Advice::HugePage);
    Ok(map)
}

/// Keep `map` for a later read, unless [`KEEP_BYTES`] are kept already.
fn give_back(map: MmapMut) {
    let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
    let kept: usize = free.iter().map(|m| m.len()).sum();
    if kept + map.len() <= KEEP_BYTES {
        free.push(map);
    }
}

/// The first `len` bytes of `file`, in a pooled buffer from [`MIN_POOLED`] bytes on.
pub(crate) fn read_file(file: &std::fs::File, len: usize) -> std::io::Result<Buf> {
    if len < MIN_POOLED {
        let mut buf = vec![0; len];
        file.read_exact_at(&mut buf, 0)?;
        return Ok(Arc::new(buf));
    }
    let mut map = take(len)?;
    file.read_exact_at(&mut map[..len], 0)?;
    Ok(Arc::new(Pooled {
        map: Some(map),
        len,
    }))
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

//! Process-wide allocator tuning, called by the binaries (a library must not change
//! process state behind its caller's back).

/// Keep freed memory in the allocator instead of handing it back to the kernel; the
/// dumpdiff, losscheck and postmortem binaries call it first thing.
///
/// glibc returns freed blocks to the kernel (munmap, or madvise when a worker thread's
/// arena shrinks) and the next user faults in fresh zeroed pages. Pinning the mmap
/// threshold at its 32 MiB ceiling and raising the trim threshold lets each thread reuse
/// its freed blocks; peak RSS is unchanged (the same working set is live at once). On
/// Linux the blocks from 1 MiB on do not reach glibc at all ([`HugeBlocks`]).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn keep_freed_memory() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" {
        fn mallopt(param: std::os::raw::c_int, value: std::os::raw::c_int) -> std::os::raw::c_int;
    }
    const M_TRIM_THRESHOLD: std::os::raw::c_int = -1;
    const M_MMAP_THRESHOLD: std::os::raw::c_int = -3;
    ONCE.call_once(|| {
        // SAFETY: mallopt only adjusts glibc malloc tunables (it takes the arena locks
        // itself); both parameters and values are in the documented ranges.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 32 << 20);
            mallopt(M_TRIM_THRESHOLD, 1 << 30);
        }
    });
}

/// No-op outside glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_freed_memory() {}

/// The binaries' global allocator: allocations from 1 MiB on (a cell's decoded tensors,
/// its chain's vectors, the per-rank files read by `formats::pool`) are [`Block`]s of
/// whole 2 MiB huge pages, kept for reuse when freed; everything smaller goes to the
/// system allocator.
///
/// Why: a dumpdiff worker allocates and frees tens of MB a cell. In 4 KiB pages their
/// first touch was a fault every 4 KiB (14.9 k faults on the 12-rank benchmark tree,
/// 2.3 k with blocks); kept blocks are reused by the next cell without any.
#[cfg(target_os = "linux")]
pub struct HugeBlocks;

#[cfg(target_os = "linux")]
pub use blocks::Block;

#[cfg(target_os = "linux")]
mod blocks {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::os::raw::{c_int, c_long, c_void};
    use std::ptr::NonNull;
    use std::sync::Mutex;

    extern "C" {
        fn mmap(
            addr: *mut c_void,
            len: usize,
            prot: c_int,
            flags: c_int,
            fd: c_int,
            off: c_long,
        ) -> *mut c_void;
        fn munmap(addr: *mut c_void, len: usize) -> c_int;
        fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
    }
    const PROT_READ: c_int = 1;
    const PROT_WRITE: c_int = 2;
    const MAP_PRIVATE: c_int = 2;
    const MAP_ANONYMOUS: c_int = 0x20;
    const MADV_HUGEPAGE: c_int = 14;

    /// A huge page: blocks are whole multiples of it, aligned to it.
    const HUGE: usize = 2 << 20;
    /// Allocations from this size on are blocks.
    const BIG: usize = 1 << 20;
    /// Bytes of freed blocks kept at most (the oldest are unmapped first).
    const KEEP_BYTES: usize = 1 << 30;
    /// Freed blocks kept at most.
    const SLOTS: usize = 256;

    /// Freed blocks, oldest first: (address, length).
    struct Free {
        blocks: [(usize, usize); SLOTS],
        n: usize,
    }

    static FREE: Mutex<Free> = Mutex::new(Free {
        blocks: [(0, 0); SLOTS],
        n: 0,
    });

    fn free_list() -> std::sync::MutexGuard<'static, Free> {
        FREE.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The length of the block holding `len` bytes: its size class, a whole number of
    /// huge pages of the form 2^k or 1.5·2^k (2, 4, 6, 8, 12, 16, 24 … MiB), so that
    /// blocks freed by one file or vector are reused by the next of a similar size.
    fn block_len(len: usize) -> usize {
        let pages = len.div_ceil(HUGE).max(1);
        let pow = pages.next_power_of_two();
        let class = if pow >= 4 && pages <= pow / 4 * 3 {
            pow / 4 * 3
        } else {
            pow
        };
        class * HUGE
    }

    /// A kept block of exactly `cap` bytes, if any.
    fn take(cap: usize) -> Option<NonNull<u8>> {
        let mut free = free_list();
        let n = free.n;
        let i = (0..n).rev().find(|&i| free.blocks[i].1 == cap)?;
        let (addr, _) = free.blocks[i];
        free.blocks.copy_within(i + 1..n, i);
        free.n -= 1;
        NonNull::new(addr as *mut u8)
    }

    /// Keep a block for reuse, unmapping the oldest kept ones beyond [`KEEP_BYTES`] (a
    /// block longer than that is unmapped at once, the kept ones left as they are).
    fn give_back(ptr: NonNull<u8>, cap: usize) {
        let mut evicted = [(0usize, 0usize); SLOTS];
        let mut ne = 0;
        if cap > KEEP_BYTES {
            evicted[0] = (ptr.as_ptr() as usize, cap);
            ne = 1;
        } else {
            let mut free = free_list();
            let mut kept: usize = free.blocks[..free.n].iter().map(|b| b.1).sum();
            while free.n == SLOTS || kept + cap > KEEP_BYTES {
                evicted[ne] = free.blocks[0];
                ne += 1;
                kept -= free.blocks[0].1;
                let n = free.n;
                free.blocks.copy_within(1..n, 0);
                free.n -= 1;
            }
            let n = free.n;
            free.blocks[n] = (ptr.as_ptr() as usize, cap);
            free.n += 1;
        }
        for &(addr, len) in &evicted[..ne] {
            // SAFETY: each was one whole map of `len` bytes made by `fresh` and no longer
            // referenced (freed by its owner, then dropped from the list above).
            unsafe { munmap(addr as *mut c_void, len) };
        }
    }

    /// A block of `cap` bytes: a kept one (its bytes as last left), else a fresh map
    /// (zeroed; the flag says which).
    fn obtain(cap: usize) -> Option<(NonNull<u8>, bool)> {
        take(cap)
            .map(|p| (p, false))
            .or_else(|| fresh(cap).map(|p| (p, true)))
    }

    /// A new map of `cap` bytes (a multiple of [`HUGE`]) aligned to [`HUGE`], advised
    /// to be backed by huge pages; zeroed, as every fresh anonymous map.
    fn fresh(cap: usize) -> Option<NonNull<u8>> {
        let len = cap.checked_add(HUGE)?;
        // SAFETY: an anonymous private map at an address of the kernel's choosing
        // touches no existing memory.
        let p = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p as isize == -1 {
            return None;
        }
        let start = p as usize;
        let aligned = start.next_multiple_of(HUGE);
        let head = aligned - start;
        let tail = len - head - cap;
        // SAFETY: the head and tail are parts of the map just made, outside the block
        // kept; the advice only concerns the block itself.
        unsafe {
            if head > 0 {
                munmap(p, head);
            }
            if tail > 0 {
                munmap((aligned + cap) as *mut c_void, tail);
            }
            madvise(aligned as *mut c_void, cap, MADV_HUGEPAGE);
        }
        NonNull::new(aligned as *mut u8)
    }

    /// An owned block of whole huge pages, kept for reuse when dropped.
    pub struct Block {
        ptr: NonNull<u8>,
        cap: usize,
    }

    // SAFETY: a Block owns its memory exclusively, like a Box<[u8]>.
    unsafe impl Send for Block {}
    // SAFETY: shared references only read it.
    unsafe impl Sync for Block {}

    impl Block {
        /// A block of at least `len` bytes (not zeroed when reused); None when the map
        /// fails.
        pub fn new(len: usize) -> Option<Block> {
            let cap = block_len(len.max(1));
            let (ptr, _) = obtain(cap)?;
            Some(Block { ptr, cap })
        }

        /// Its bytes.
        pub fn bytes(&self) -> &[u8] {
            // SAFETY: the block maps `cap` readable bytes owned by it.
            unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.cap) }
        }

        /// Its bytes, to write.
        pub fn bytes_mut(&mut self) -> &mut [u8] {
            // SAFETY: as in `bytes`, and `&mut self` makes the access exclusive.
            unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.cap) }
        }
    }

    impl Drop for Block {
        fn drop(&mut self) {
            give_back(self.ptr, self.cap);
        }
    }

    /// Whether `layout` is served by a block.
    fn is_big(layout: Layout) -> bool {
        layout.size() >= BIG && layout.align() <= HUGE
    }

    // SAFETY: big layouts get blocks (aligned to HUGE, at least their size, owned until
    // `dealloc` with the same layout, whose size gives the same block length); all others
    // go to `System` unchanged.
    unsafe impl GlobalAlloc for super::HugeBlocks {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            if !is_big(layout) {
                return System.alloc(layout);
            }
            obtain(block_len(layout.size())).map_or(std::ptr::null_mut(), |(p, _)| p.as_ptr())
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            if !is_big(layout) {
                return System.alloc_zeroed(layout);
            }
            match obtain(block_len(layout.size())) {
                Some((p, fresh)) => {
                    if !fresh {
                        p.as_ptr().write_bytes(0, layout.size());
                    }
                    p.as_ptr()
                }
                None => std::ptr::null_mut(),
            }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            if !is_big(layout) {
                return System.dealloc(ptr, layout);
            }
            if let Some(p) = NonNull::new(ptr) {
                give_back(p, block_len(layout.size()));
            }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            let new = Layout::from_size_align_unchecked(new_size, layout.align());
            match (is_big(layout), is_big(new)) {
                (false, false) => System.realloc(ptr, layout, new_size),
                (true, true) if block_len(layout.size()) == block_len(new_size) => ptr,
                _ => {
                    let p = self.alloc(new);
                    if !p.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    p
                }
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::super::HugeBlocks;
        use super::*;

        #[test]
        fn sizes_fall_in_classes_of_whole_huge_pages() {
            const MB: usize = 1 << 20;
            let cases = [
                (1, 2),
                (2 * MB, 2),
                (2 * MB + 1, 4),
                (4 * MB, 4),
                (5 * MB, 6),
                (6 * MB + 1, 8),
                (9 * MB, 12),
                (12 * MB + 1, 16),
                (17 * MB, 24),
                (25 * MB, 32),
                (33 * MB, 48),
            ];
            for (len, class) in cases {
                assert_eq!(block_len(len), class * MB, "{len} bytes");
            }
        }

        /// A class of its own (17–24 MiB: no other test nor the pool's tests use it),
        /// so that the blocks freed here are the ones taken again.
        const LEN: usize = 23 << 20;

        #[test]
        fn a_freed_block_is_reused_zeroed_when_asked_and_kept_across_reallocs() {
            let a = HugeBlocks;
            let big = Layout::from_size_align(LEN, 64).unwrap();
            // SAFETY: every pointer is used within the layout it was allocated with and
            // freed once with that layout.
            unsafe {
                let p = a.alloc(big);
                assert!(!p.is_null());
                assert_eq!(p as usize % HUGE, 0, "aligned to a huge page");
                p.write_bytes(7, LEN);
                a.dealloc(p, big);
                // The same block again, its bytes as left…
                let q = a.alloc(big);
                assert_eq!(q, p);
                assert_eq!((*q, *q.add(LEN - 1)), (7, 7));
                a.dealloc(q, big);
                // …or zeroed when asked.
                let z = a.alloc_zeroed(big);
                assert_eq!(z, p);
                assert!(std::slice::from_raw_parts(z, LEN).iter().all(|&b| b == 0));
                // Growing within the class keeps the block; past it, the bytes move.
                z.write_bytes(3, 100);
                let g = a.realloc(z, big, LEN + 1000);
                assert_eq!(g, z);
                let grown = Layout::from_size_align(LEN + 1000, 64).unwrap();
                let h = a.realloc(g, grown, 40 << 20);
                assert_ne!(h, g);
                assert!(std::slice::from_raw_parts(h, 100).iter().all(|&b| b == 3));
                // Shrinking below a block hands the bytes to the system allocator.
                let moved = Layout::from_size_align(40 << 20, 64).unwrap();
                let s = a.realloc(h, moved, 50);
                assert!(std::slice::from_raw_parts(s, 50).iter().all(|&b| b == 3));
                a.dealloc(s, Layout::from_size_align(50, 64).unwrap());
            }
        }

        #[test]
        fn a_block_owned_is_given_back_when_dropped() {
            // A class of its own too (34–48 MiB).
            const OWN: usize = 45 << 20;
            let mut b = Block::new(OWN + 5).unwrap();
            assert_eq!(b.bytes().len(), 48 << 20);
            b.bytes_mut()[OWN + 4] = 9;
            let addr = b.bytes().as_ptr();
            drop(b);
            let c = Block::new(OWN).unwrap();
            assert_eq!(c.bytes().as_ptr(), addr);
            assert_eq!(c.bytes()[OWN + 4], 9);
        }
    }
}

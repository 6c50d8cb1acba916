//! Process-wide allocator tuning, called by the binaries (a library must not change
//! process state behind its caller's back).

/// Keep freed memory in the allocator instead of handing it back to the kernel; the
/// dumpdiff, losscheck and postmortem binaries call it first thing.
///
/// A cell decodes a few 8–30 MB tensors, compares them and drops them; glibc returns such
/// blocks to the kernel (munmap, or madvise when a worker thread's arena shrinks) and the
/// next cell faults in fresh zeroed pages: a third of the run was page faults and
/// `clear_page`. Pinning the mmap threshold at its 32 MiB ceiling and raising the trim
/// threshold lets each thread reuse its freed blocks; peak RSS is unchanged (the same
/// working set is live at once).
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

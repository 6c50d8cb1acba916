//! Scheduling hints for the library's own helper threads.

/// Lower the calling thread's priority to the lowest (nice 19), so that it runs on time
/// other threads leave idle: for work done ahead that nothing waits on yet. A no-op where
/// the platform has no per-thread priority (or refuses: it is only a hint).
#[cfg(target_os = "linux")]
pub fn lower_this_thread() {
    extern "C" {
        /// POSIX `setpriority(2)`; on Linux, `PRIO_PROCESS` with `who == 0` is the
        /// calling thread alone (threads have their own nice value).
        fn setpriority(
            which: std::os::raw::c_int,
            who: std::os::raw::c_uint,
            prio: std::os::raw::c_int,
        ) -> std::os::raw::c_int;
    }
    const PRIO_PROCESS: std::os::raw::c_int = 0;
    // SAFETY: setpriority takes plain integers and only changes this thread's nice value;
    // raising one's own nice value needs no privilege, and a failure changes nothing.
    let _ = unsafe { setpriority(PRIO_PROCESS, 0, 19) };
}

/// No-op off Linux.
#[cfg(not(target_os = "linux"))]
pub fn lower_this_thread() {}

//! Scheduling hints for the library's own helper threads.

/// Put the calling thread in Linux's `SCHED_IDLE` class: it runs only on time that no
/// other thread wants, and a core running it counts as idle where the scheduler places
/// woken threads. For work done ahead that nothing waits on yet. (A nice value of 19 is
/// not enough: a core busy with a niced thread is not idle, so the threads that matter
/// were seen sharing the other core.) A no-op elsewhere, or when refused: it is a hint.
#[cfg(target_os = "linux")]
pub fn lower_this_thread() {
    /// `struct sched_param` (`<sched.h>`): the static priority, 0 for `SCHED_IDLE`.
    #[repr(C)]
    struct SchedParam {
        sched_priority: std::os::raw::c_int,
    }
    extern "C" {
        /// `sched_setscheduler(2)`; on Linux, pid 0 is the calling thread alone.
        fn sched_setscheduler(
            pid: std::os::raw::c_int,
            policy: std::os::raw::c_int,
            param: *const SchedParam,
        ) -> std::os::raw::c_int;
    }
    const SCHED_IDLE: std::os::raw::c_int = 5;
    let param = SchedParam { sched_priority: 0 };
    // SAFETY: `param` is a valid `struct sched_param` for the duration of the call, which
    // only reads it; moving oneself to SCHED_IDLE needs no privilege, and a failure
    // changes nothing.
    let _ = unsafe { sched_setscheduler(0, SCHED_IDLE, &param) };
}

/// No-op off Linux.
#[cfg(not(target_os = "linux"))]
pub fn lower_this_thread() {}

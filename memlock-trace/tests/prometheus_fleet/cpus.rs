//! The starvation's scheduling: the flood pinned to one CPU, the tracer idle-class beside it
//! on the same CPU, then back to normal.

use std::path::Path;

/// Every thread of `pid` onto `cpu`, and `SCHED_IDLE` if `idle` (else back to
/// `SCHED_OTHER` on every CPU in `all`). Threads made later inherit it from their creator.
pub fn schedule(pid: u32, cpu: usize, idle: bool, all: &libc::cpu_set_t) {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    for task in tasks.flatten() {
        let tid: i32 = task.file_name().to_string_lossy().parse().unwrap();
        // SAFETY: cpu_set_t is plain data; CPU_SET writes within it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        if idle {
            // SAFETY: as above; cpu < CPU_SETSIZE (it came from our own mask).
            unsafe { libc::CPU_SET(cpu, &mut set) };
        } else {
            set = *all;
        }
        let policy = if idle {
            libc::SCHED_IDLE
        } else {
            libc::SCHED_OTHER
        };
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: both calls read the structs they are given; a thread that just exited
        // makes them fail with ESRCH, which is fine.
        let (affinity, policy) = unsafe {
            (
                libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &set),
                libc::sched_setscheduler(tid, policy, &param),
            )
        };
        if (affinity != 0 || policy != 0) && Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
        {
            panic!(
                "scheduling thread {tid} of {pid}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Only `cpu`, for the flood (normal priority: it starves the idle tracer beside it).
pub fn pin(pid: u32, cpu: usize) {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let tid: i32 = task.file_name().to_string_lossy().parse().unwrap();
        // SAFETY: as in `schedule`.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: as in `schedule`.
        let ret = unsafe {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &set)
        };
        assert_eq!(ret, 0, "pinning thread {tid} of {pid} to CPU {cpu}");
    }
}

/// The CPUs this test may use, and the one the flood and the tracer share: the last.
pub fn shared_cpu() -> (libc::cpu_set_t, usize) {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    let mut all: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut all) },
        0
    );
    // SAFETY: CPU_ISSET reads within the set.
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &all) })
        .collect();
    assert!(
        cpus.len() >= 2,
        "this test needs 2 CPUs (one shared by the tracer and the flood): {cpus:?}"
    );
    (all, *cpus.last().unwrap())
}

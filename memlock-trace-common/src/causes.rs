//! Why a fault took its time: the kernel's work inside it that its tracepoints time (reclaim,
//! compaction, reclaim throttling) and the time it spent off CPU, as the fault hooks split
//! each timed fault's latency.

/// The causes a fault's time is split into (the rest is "other"), and their names.
pub mod cause {
    /// A cause, as an index of the per-cause arrays.
    #[repr(usize)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Cause {
        /// Global direct reclaim (`vmscan:mm_vmscan_direct_reclaim_begin/end`).
        DirectReclaim,
        /// A memory cgroup's reclaim at its limit (`vmscan:mm_vmscan_memcg_reclaim_*`).
        MemcgReclaim,
        /// Compaction (`compaction:mm_compaction_begin/end`), for a huge page or another
        /// allocation of several pages.
        Compaction,
        /// Reclaim waiting for others' progress (`vmscan:mm_vmscan_throttled`, 5.16):
        /// inside a reclaim, whose time it is taken from.
        Throttled,
        /// Switched out (`sched_switch`) outside reclaim and compaction: waiting for the I/O
        /// of a swap-in or a file read, a page lock, writeback, the mmap lock, or a CPU.
        OffCpu,
    }

    pub const COUNT: usize = 5;
    /// Each cause's key in JSON and Prometheus.
    pub const KEYS: [&str; COUNT] = [
        "direct_reclaim",
        "memcg_reclaim",
        "compaction",
        "throttled",
        "off_cpu",
    ];
    /// Each cause in words.
    pub const NAMES: [&str; COUNT] = [
        "direct reclaim",
        "memcg reclaim",
        "compaction",
        "reclaim throttling",
        "off CPU",
    ];
}

/// Phases a thread keeps: the most one fault meets (a memory cgroup's charge retries its
/// reclaim up to 16 times, `MAX_RECLAIM_RETRIES`); a fault that met more has its oldest
/// left out.
pub const PHASES: usize = 16;
/// Threads with phases at once (`FAULT_PHASES`, LRU): the threads in reclaim or compaction
/// at a time, not every traced one; 256 entries of 432 bytes (1,024 took a system-wide
/// session past its 32 MiB of map memory on a 96-CPU machine).
pub const MAX_PHASE_THREADS: u32 = 256;

/// One timed piece of a cause in a thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phase {
    pub begin_ns: u64,
    pub end_ns: u64,
    /// A [`cause`].
    pub cause: u64,
}

/// A thread's open and last phases (`FAULT_PHASES`, keyed by tid): created only when a
/// traced thread begins one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadPhases {
    /// The begin time of each cause's phase in progress, 0 when none.
    pub open: [u64; cause::COUNT],
    /// A ring of the last phases ended.
    pub ended: [Phase; PHASES],
    pub next: u64,
}

pub mod names {
    pub const FAULT_PHASES: &str = "FAULT_PHASES";
    /// When any traced thread's phase last ended: a completion looks for phases only when it
    /// is after the fault's start.
    pub const PHASE_LAST_END: &str = "PHASE_LAST_END";
}

//! The mlock-family calls counted in the kernel: per process, call and outcome, at each
//! call's `sys_exit` (see `memlock-trace-ebpf/src/syscalls.rs`). The ring buffer's
//! [`crate::SyscallEvent`]s only feed `--events` lines and per-call detail: whatever it
//! drops, these counts stay exact.

/// Names of the maps the loader looks up.
pub mod names {
    pub const SYSCALL_STATS: &str = "SYSCALL_STATS";
    pub const SYSCALL_COUNTERS: &str = "SYSCALL_COUNTERS";
}

/// The architecture's numbers of the five calls (see [`crate::arch`]).
pub use crate::arch::syscall_nr as nr;

/// Entries of `SYSCALL_STATS` (shared by the CPUs, LRU): (process, call, outcome) triples. A process
/// that makes every call and fails each with two errnos takes 10.
pub const MAX_SYSCALL_KEYS: u32 = 8192;

/// Log2 latency slots: slot 0 holds 0 ns, slot `i` holds `[2^(i-1), 2^i)` ns; the last
/// one everything from 2^30 ns (1.07 s) up (the exact maximum is kept apart). A power of
/// two, so the eBPF side indexes with a mask.
pub const LATENCY_SLOTS: usize = 32;
const _: () = assert!(LATENCY_SLOTS.is_power_of_two());

/// Key of `SYSCALL_STATS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SyscallKey {
    pub tgid: u32,
    /// The system call's number (`__syscall_nr`).
    pub nr: u32,
    /// The process's start ([`crate::process::ProcessKey::start_ns`]): a reused pid is
    /// another key.
    pub start_ns: u64,
    /// 0 for a call that succeeded, else its errno.
    pub errno: u32,
    pub _pad: u32,
}

/// Per-CPU value of `SYSCALL_STATS`.
pub type SyscallStats = SyscallFigures<u32>;

/// The figures of one (process, call, outcome): per CPU with `u32` latency buckets in the
/// map, summed over the CPUs by the loader into `u64` buckets that cannot wrap.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallFigures<Bucket> {
    pub calls: u64,
    /// Base pages the calls populated (see [`crate::rss`]; where this kernel's counters
    /// are unknown, the faults stand in).
    pub pages_populated: u64,
    /// `min_flt + maj_flt` growth across the calls: the faults that populated them (one
    /// per huge page).
    pub faults_populated: u64,
    /// Growth and shrinkage of `mm->locked_vm` across the calls, in pages.
    pub pages_locked: u64,
    pub pages_unlocked: u64,
    pub max_ns: u64,
    /// See [`LATENCY_SLOTS`].
    pub latency: [Bucket; LATENCY_SLOTS],
}

indices! {
    /// Indices of the per-CPU `SYSCALL_COUNTERS`.
    pub mod syscall_counter: u32, COUNT: u32 {
        /// New keys inserted into `SYSCALL_STATS`: minus the keys present, the LRU's evictions.
        INSERTS,
        /// A call that could not be counted (the map update failed outright).
        UPDATE_FAILED,
    }
}

/// The latency slot of `ns` (no loop: the eBPF side uses it).
#[inline(always)]
pub fn latency_slot(ns: u64) -> usize {
    let slot = 64 - ns.leading_zeros() as usize;
    if slot >= LATENCY_SLOTS {
        LATENCY_SLOTS - 1
    } else {
        slot
    }
}

/// The values `[low, high)` of a latency slot.
pub fn latency_slot_range(slot: usize) -> (u64, u64) {
    match slot {
        0 => (0, 1),
        _ if slot >= LATENCY_SLOTS - 1 => (1 << (LATENCY_SLOTS - 2), u64::MAX),
        _ => (1 << (slot - 1), 1 << slot),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_powers_of_two() {
        assert_eq!(latency_slot(0), 0);
        assert_eq!(latency_slot(1), 1);
        assert_eq!(latency_slot(1023), 10);
        assert_eq!(latency_slot(1024), 11);
        assert_eq!(latency_slot(u64::MAX), LATENCY_SLOTS - 1);
        for ns in [
            0u64,
            1,
            2,
            3,
            999,
            1000,
            4096,
            (1 << 30) - 1,
            1 << 30,
            1 << 40,
        ] {
            let (low, high) = latency_slot_range(latency_slot(ns));
            assert!(low <= ns && ns < high, "{ns}: [{low}, {high})");
        }
    }

    #[test]
    fn key_has_no_hidden_padding() {
        assert_eq!(size_of::<SyscallKey>(), 24);
        assert_eq!(size_of::<SyscallStats>(), 48 + 4 * LATENCY_SLOTS);
    }
}

//! The kernel/user contract of memlock-trace.
//!
//! Everything the eBPF programs and the loader must agree on lives here: the events
//! written to the ring buffer, the load-time configuration globals, map names and sizes.
//! All types are `#[repr(C)]`, `Copy`, with explicit padding and no `bool`, so both sides
//! see the same bytes.
#![no_std]

#[macro_use]
mod macros;

pub mod arch;
pub mod causes;
pub mod diag;
pub mod faults;
pub mod mapping;
pub mod process;
pub mod rss;
pub mod stacks;
pub mod syscall_hooks;
pub mod syscalls;
pub mod vma;

/// Length of `task_struct.comm`, including the NUL.
pub const TASK_COMM_LEN: usize = 16;

/// log2 of the base page size: 12 on x86-64, the one architecture the programs read
/// registers for (`PAGE_SHIFT`, arch/x86/include/asm/page_types.h). Page addresses in the
/// records (region starts, snapshot ranges) are aligned to it.
pub const PAGE_SHIFT: u32 = 12;
/// The base page size, 4 KiB.
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;
/// Clears the offset within a page, like the kernel's `PAGE_MASK`.
pub const PAGE_MASK: u64 = !(PAGE_SIZE - 1);

/// Names of the maps and globals the loader looks up by name.
pub mod names {
    pub const EVENTS: &str = "EVENTS";
    pub const TARGET_TGIDS: &str = "TARGET_TGIDS";
    pub const COUNTERS: &str = "COUNTERS";
    pub const CONFIG: &str = "CONFIG";
    /// `u8` global, non-zero with `-v`: the programs' diagnostics are wanted.
    pub const DIAG: &str = "DIAG";
    /// `u32` per system call number: which programs handle it (see [`crate::syscall_hooks`]).
    pub const SYSCALL_HOOKS: &str = "SYSCALL_HOOKS";
    /// `u32` global: the [`crate::syscall_hooks::hook`] bits this kernel's families can set.
    pub const SYSCALL_HOOKS_POSSIBLE: &str = "SYSCALL_HOOKS_POSSIBLE";
}

/// Size of the shared ring buffer (must be a power of two multiple of the page size).
pub const EVENTS_BYTE_SIZE: u32 = 1 << 20;
/// Bytes waiting in the ring buffer past which a submit wakes the reader. Below it no
/// wakeup is sent and the reader drains on its own timer (`DRAIN_INTERVAL_MS`): a wakeup per
/// event costs the traced thread a cross-CPU wakeup on every call (see BENCHMARKS.md).
pub const EVENTS_WAKEUP_BYTES: u64 = (EVENTS_BYTE_SIZE / 16) as u64;
/// How often the reader drains the ring buffer without being woken.
pub const DRAIN_INTERVAL_MS: u64 = 20;
/// Most processes `-p`/launch mode can follow at once.
pub const MAX_TARGETS: u32 = 4096;
/// Most threads that can be inside a traced syscall at the same time (`INFLIGHT`,
/// `VMA_CALLS`, `RANGE_CHECKS`: removed at the call's exit, overwritten when a thread that
/// died inside a call has its tid reused).
pub const MAX_INFLIGHT: u32 = 8192;

indices! {
    /// Indices of the per-CPU health counters (`COUNTERS`), summed by the loader.
    pub mod counter: u32, COUNT: u32 {
        /// `bpf_ringbuf_reserve` failed: an event was dropped.
        RINGBUF_DROPPED,
        /// The in-flight syscall table was full at syscall entry: that call is not traced.
        INFLIGHT_FULL,
        /// A kernel read (`bpf_probe_read_kernel`) failed; the field was reported as 0.
        READ_FAILED,
        /// A VMA record (snapshot, store, function call) could not be reserved: dropped.
        /// Counted apart from syscall events so each family's totals stay exact.
        VMA_DROPPED,
    }
}

/// How the programs decide whether a task is traced.
pub mod filter {
    /// Every process on the system.
    pub const ALL: u32 = 0;
    /// Only thread groups whose tgid is a key of `TARGET_TGIDS`.
    pub const TGIDS: u32 = 1;
}

/// Byte offsets of the kernel struct fields the programs read, resolved by the loader from
/// the running kernel's BTF (`/sys/kernel/btf/vmlinux`), so nothing is tied to one build.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `task_struct.mm`
    pub task_mm: u32,
    /// `task_struct.min_flt`
    pub task_min_flt: u32,
    /// `task_struct.maj_flt`
    pub task_maj_flt: u32,
    /// `mm_struct.locked_vm` (pages)
    pub mm_locked_vm: u32,
    /// `mm_struct.map_count` (number of VMAs)
    pub mm_map_count: u32,
    /// `mm_struct.def_flags` (`VM_LOCKED` after `mlockall(MCL_FUTURE)`); 0 when unknown
    pub mm_def_flags: u32,
    // Why an mlock-family call failed, read at its entry. 0 means this kernel's BTF has no
    // such field (none of them is first in its struct): the figure is then unknown.
    /// `task_struct.signal`
    pub task_signal: u32,
    /// `signal_struct.rlim[RLIMIT_MEMLOCK].rlim_cur` (bytes)
    pub signal_rlim_memlock: u32,
    /// `task_struct.cred` (the subjective credentials `capable()` checks)
    pub task_cred: u32,
    /// `cred.cap_effective`: `{ u64 val }` since 6.3, `{ u32 cap[2] }` before; the first
    /// 8 bytes read little-endian are the same bits either way.
    pub cred_cap_effective: u32,
    /// `mm_struct.total_vm` (pages): what `mlockall(MCL_CURRENT)` is checked against
    pub mm_total_vm: u32,
    /// The `thread_info` word of the task that tells a 32-bit system call or task (x86
    /// `status`, arm64 `flags`; the mask is the eBPF crate's `arch`); 0 when unknown. See
    /// [`syscall_hooks`].
    pub task_thread_status: u32,
}

/// Load-time configuration (the `CONFIG` global, read-only to the programs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// One of [`filter`].
    pub filter: u32,
    /// With [`filter::ALL`], a process left out (the tracer itself); 0 for none.
    pub leave_out_tgid: u32,
    pub offsets: KernelOffsets,
}

/// What a ring-buffer record is. Every record starts with `kind: u32` holding one of these,
/// and the decoder dispatches on it ([`EventKind::from_u32`]). One enum for every hook
/// family, so no two families can pick the same tag; the values are spaced so a family can
/// add kinds next to its own.
///
/// The records keep a plain `u32` (written as `EventKind::Syscall as u32`): a `#[repr(u32)]`
/// enum field would make every other bit pattern undefined behaviour, and the bytes come
/// from the kernel.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// [`SyscallEvent`].
    Syscall = 1,
    /// [`faults::FaultEvent`].
    Fault = 16,
    /// [`vma::SnapshotEvent`].
    Snapshot = 32,
    /// [`vma::StoreEvent`].
    Store = 33,
    /// [`vma::FuncEvent`].
    Func = 34,
}

impl EventKind {
    /// Every kind, in tag order.
    pub const ALL: [Self; 5] = [
        Self::Syscall,
        Self::Fault,
        Self::Snapshot,
        Self::Store,
        Self::Func,
    ];

    /// The kind a record's first four bytes name; `None` for a tag no family writes.
    pub const fn from_u32(tag: u32) -> Option<Self> {
        Some(match tag {
            1 => Self::Syscall,
            16 => Self::Fault,
            32 => Self::Snapshot,
            33 => Self::Store,
            34 => Self::Func,
            _ => return None,
        })
    }
}

/// One completed mlock-family system call, written at `sys_exit`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallEvent {
    /// An [`EventKind`]: always [`EventKind::Syscall`].
    pub kind: u32,
    /// The architecture's system call number (`__syscall_nr`), mapped to a name by the loader.
    pub nr: u32,
    pub tgid: u32,
    pub tid: u32,
    /// `bpf_ktime_get_ns()` at entry.
    pub enter_ns: u64,
    /// Time spent inside the call.
    pub duration_ns: u64,
    /// Raw arguments, in order (unused slots are 0): `mlock(start, len)`,
    /// `mlock2(start, len, flags)`, `munlock(start, len)`, `mlockall(flags)`, `munlockall()`.
    pub args: [u64; 3],
    /// Return value: 0 or `-errno`.
    pub ret: i64,
    /// `task_struct.min_flt` / `maj_flt` growth during the call: pages the kernel faulted in
    /// on the task's behalf (mlock populating the range).
    pub min_flt: u64,
    pub maj_flt: u64,
    /// `mm_struct.locked_vm` before and after, in pages.
    pub locked_vm_before: u64,
    pub locked_vm_after: u64,
    /// `mm_struct.map_count` before and after: VMAs split or merged by the call.
    pub map_count_before: i32,
    pub map_count_after: i32,
    pub comm: [u8; TASK_COMM_LEN],
    /// The calling process's start time ([`process::ProcessKey::start_ns`]): with `tgid`,
    /// tells a process from a later one that reuses its pid.
    pub process_start_ns: u64,
    /// The process's `RLIMIT_MEMLOCK` soft limit at entry, in bytes (`u64::MAX`:
    /// `RLIM_INFINITY`); valid with [`lock_context::RLIMIT_KNOWN`].
    pub rlimit_memlock: u64,
    /// `mm_struct.total_vm` at entry, in pages; valid with [`lock_context::TOTAL_VM_KNOWN`].
    pub total_vm_before: u64,
    /// [`lock_context`] bits: which of the figures above were read, and `CAP_IPC_LOCK`.
    pub lock_context: u32,
    pub _pad: u32,
    /// `mlock`, `mlock2`, `munlock`: the first address of the page-aligned range no VMA held
    /// at entry; valid with [`lock_context::RANGE_UNMAPPED`].
    pub first_unmapped: u64,
    /// Growth of the base pages the process has mapped (RSS and hugetlb, see [`rss`])
    /// during the call: what it populated, counted in pages whatever their size; valid
    /// with [`lock_context::PAGES_MAPPED_KNOWN`].
    pub pages_mapped: i64,
}

/// Bits of [`SyscallEvent::lock_context`]: what the kernel checks an mlock against, read at
/// the call's entry. A figure whose bit is clear could not be read (or this kernel lacks the
/// field): unknown, not zero.
pub mod lock_context {
    pub const RLIMIT_KNOWN: u32 = 1;
    pub const TOTAL_VM_KNOWN: u32 = 2;
    /// Whether the task held `CAP_IPC_LOCK` in its effective set is known.
    pub const CAP_KNOWN: u32 = 4;
    /// It did (valid with [`CAP_KNOWN`]).
    pub const CAP_IPC_LOCK: u32 = 8;
    /// The range of `mlock`, `mlock2`, `munlock` was looked up at entry, VMA by VMA: either
    /// every page was mapped, or [`RANGE_UNMAPPED`] is set.
    pub const RANGE_CHECKED: u32 = 16;
    /// A page of the range was not mapped at entry: `first_unmapped` is the first.
    pub const RANGE_UNMAPPED: u32 = 32;
    /// [`crate::SyscallEvent::pages_mapped`] was read at entry and exit.
    pub const PAGES_MAPPED_KNOWN: u32 = 64;
    /// `RLIMIT_MEMLOCK` (include/uapi/asm-generic/resource.h), the index into
    /// `signal_struct.rlim`.
    pub const RLIMIT_MEMLOCK: u32 = 8;
    /// `sizeof(struct rlimit)`: `rlim_cur` then `rlim_max`, both `unsigned long`.
    pub const RLIMIT_SIZE: u32 = 16;
    /// `CAP_IPC_LOCK` (include/uapi/linux/capability.h), a bit of `cap_effective`.
    pub const CAP_IPC_LOCK_BIT: u32 = 14;
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` integers with explicit padding: every bit pattern is valid.
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::SyscallEvent {}
    unsafe impl aya::Pod for super::process::ProcessConfig {}
    unsafe impl aya::Pod for super::process::ProcessOffsets {}
    unsafe impl aya::Pod for super::process::ProcessKey {}
    unsafe impl aya::Pod for super::process::ProcessIdentity {}
    unsafe impl aya::Pod for super::syscalls::SyscallKey {}
    unsafe impl aya::Pod for super::syscalls::SyscallStats {}
    unsafe impl aya::Pod for super::faults::FaultConfig {}
    unsafe impl aya::Pod for super::faults::FaultKey {}
    unsafe impl aya::Pod for super::faults::FaultStats {}
    unsafe impl aya::Pod for super::faults::HistKey {}
    unsafe impl aya::Pod for super::faults::Hist {}
    unsafe impl aya::Pod for super::faults::RegionKey {}
    unsafe impl aya::Pod for super::faults::RegionValue {}
    unsafe impl aya::Pod for super::faults::RegionSlot {}
    unsafe impl aya::Pod for super::faults::FaultEntry {}
    unsafe impl aya::Pod for super::faults::FaultEvent {}
    unsafe impl aya::Pod for super::faults::StackKey {}
    unsafe impl aya::Pod for super::mapping::MappingConfig {}
    unsafe impl aya::Pod for super::mapping::MappingInfo {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_event_stays_8_byte_aligned() {
        // The ring buffer hands out 8-byte aligned slots; the loader reads it as `Pod`.
        assert_eq!(core::mem::size_of::<SyscallEvent>() % 8, 0);
        assert_eq!(core::mem::align_of::<SyscallEvent>(), 8);
        assert_eq!(core::mem::size_of::<SyscallEvent>(), 168);
    }

    #[test]
    fn event_kind_round_trips_and_rejects_other_tags() {
        for kind in EventKind::ALL {
            assert_eq!(EventKind::from_u32(kind as u32), Some(kind));
        }
        // Every tag `from_u32` accepts is in `ALL`, and no two kinds share one.
        let accepted: usize = (0..=256)
            .chain([u32::MAX])
            .filter(|&tag| EventKind::from_u32(tag).is_some())
            .count();
        assert_eq!(accepted, EventKind::ALL.len());
        assert_eq!(EventKind::from_u32(0), None);
        assert_eq!(EventKind::from_u32(u32::MAX), None);
    }

    #[test]
    fn counter_slots_keep_the_numbers_both_sides_agree_on() {
        // The programs and the loader index the same maps and arrays with the `indices!`
        // constants: written out once here, so a reordering in a list shows.
        use crate::{faults, process, stacks, syscalls};
        assert_eq!([counter::RINGBUF_DROPPED, counter::INFLIGHT_FULL], [0, 1]);
        assert_eq!(
            [counter::READ_FAILED, counter::VMA_DROPPED, counter::COUNT],
            [2, 3, 4]
        );
        use faults::fault_counter as fc;
        assert_eq!(
            [
                fc::STATS_INSERTS,
                fc::HIST_INSERTS,
                fc::REGION_INSERTS,
                fc::UPDATE_FAILED,
                fc::SAMPLE_SEQ,
                fc::EVENTS_DROPPED,
                fc::COUNT,
            ],
            [0, 1, 2, 3, 4, 5, 6]
        );
        use process::counter as pc;
        assert_eq!(
            [
                pc::CHILDREN_NOT_FOLLOWED,
                pc::CHILDREN_FOLLOWED,
                pc::TARGETS_EXITED,
                pc::EXECS,
                pc::COUNT,
            ],
            [0, 1, 2, 3, 4]
        );
        use stacks::counter as sc;
        assert_eq!(
            [
                sc::DROPPED,
                sc::FRAME_POINTERS,
                sc::SEEN,
                sc::SAMPLES,
                sc::COUNT
            ],
            [0, 1, 2, 3, 4]
        );
        use syscalls::syscall_counter as yc;
        assert_eq!([yc::INSERTS, yc::UPDATE_FAILED, yc::COUNT], [0, 1, 2]);
    }

    #[test]
    fn fault_indices_keep_their_numbers() {
        use crate::faults;
        use faults::stat;
        assert_eq!(
            [
                stat::USER_MINOR,
                stat::USER_MAJOR,
                stat::POPULATED_MINOR,
                stat::POPULATED_MAJOR,
                stat::RETRIED,
                stat::FAILED,
                stat::LATENCY_UNMATCHED,
                stat::IN_LOCKED,
                stat::IN_LOCKONFAULT,
                stat::COUNT,
            ],
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
        );
        use faults::class;
        assert_eq!(
            [
                class::USER_MINOR,
                class::USER_MAJOR,
                class::POPULATED_MINOR,
                class::POPULATED_MAJOR,
                class::FAILED,
                class::RETRIED,
                class::MAJOR_ANON_SWAP_IN,
                class::MAJOR_SHMEM_SWAP_IN,
                class::MAJOR_FILE_READ,
            ],
            [0, 1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(class::COUNT, 9);
        use faults::populate;
        assert_eq!(
            [
                populate::MLOCK,
                populate::MLOCK2,
                populate::MLOCKALL,
                populate::MMAP,
                populate::MREMAP,
                populate::BRK,
                populate::MADVISE,
                populate::MPROTECT,
                populate::PKEY_MPROTECT,
                populate::REMAP_FILE_PAGES,
                populate::EXECVE,
                populate::EXECVEAT,
                populate::OTHER,
                populate::COUNT,
            ],
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
        );
        assert_eq!(
            populate::NAMES[populate::REMAP_FILE_PAGES],
            "remap_file_pages"
        );
    }

    #[test]
    fn diag_indices_keep_their_numbers() {
        use crate::diag;
        use diag::program as dp;
        assert_eq!(
            [
                dp::SYS_ENTER_MLOCK,
                dp::SYS_ENTER_MLOCK2,
                dp::SYS_ENTER_MUNLOCK,
                dp::SYS_ENTER_MLOCKALL,
                dp::SYS_ENTER_MUNLOCKALL,
                dp::SYS_EXIT_MLOCK_FAMILY,
                dp::PROCESS_FORK,
                dp::PROCESS_EXIT,
                dp::COUNT,
            ],
            [0, 1, 2, 3, 4, 5, 6, 7, 8]
        );
        use diag::field as df;
        assert_eq!(
            [
                df::TASK_MM,
                df::TASK_MIN_FLT,
                df::TASK_MAJ_FLT,
                df::MM_LOCKED_VM,
                df::MM_MAP_COUNT,
                df::TASK_SIGNAL,
                df::SIGNAL_RLIM_MEMLOCK,
                df::TASK_CRED,
                df::CRED_CAP_EFFECTIVE,
                df::MM_TOTAL_VM,
                df::TASK_TGID,
                df::SIGNAL_LIVE,
            ],
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
        );
        assert_eq!(diag::FIELDS[df::SIGNAL_LIVE as usize], "signal_struct.live");
    }

    #[test]
    fn zero_configs_are_the_defaults() {
        assert_eq!(vma::VmaConfig::ZERO, vma::VmaConfig::default());
        assert_eq!(
            mapping::MappingConfig::ZERO,
            mapping::MappingConfig::default()
        );
        assert_eq!(rss::RssConfig::ZERO, rss::RssConfig::default());
        assert_eq!(rss::RssConfig::ZERO.layout, rss::layout::NONE);
    }

    #[test]
    fn event_kind_values_are_the_wire_tags() {
        // The numbers are the contract with records already written: never renumber.
        assert_eq!(EventKind::Syscall as u32, 1);
        assert_eq!(EventKind::Fault as u32, 16);
        assert_eq!(EventKind::Snapshot as u32, 32);
        assert_eq!(EventKind::Store as u32, 33);
        assert_eq!(EventKind::Func as u32, 34);
    }
}

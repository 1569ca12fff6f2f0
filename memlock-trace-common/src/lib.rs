//! The kernel/user contract of memlock-trace.
//!
//! Everything the eBPF programs and the loader must agree on lives here: the events
//! written to the ring buffer, the load-time configuration globals, map names and sizes.
//! All types are `#[repr(C)]`, `Copy`, with explicit padding and no `bool`, so both sides
//! see the same bytes.
#![no_std]

pub mod faults;
pub mod process;
pub mod vma;

/// Length of `task_struct.comm`, including the NUL.
pub const TASK_COMM_LEN: usize = 16;

/// Names of the maps and globals the loader looks up by name.
pub mod names {
    pub const EVENTS: &str = "EVENTS";
    pub const TARGET_TGIDS: &str = "TARGET_TGIDS";
    pub const COUNTERS: &str = "COUNTERS";
    pub const CONFIG: &str = "CONFIG";
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
/// Most threads that can be inside a traced syscall at the same time.
pub const MAX_INFLIGHT: u32 = 16384;

/// Indices of the per-CPU health counters (`COUNTERS`), summed by the loader.
pub mod counter {
    /// `bpf_ringbuf_reserve` failed: an event was dropped.
    pub const RINGBUF_DROPPED: u32 = 0;
    /// The in-flight syscall table was full at syscall entry: that call is not traced.
    pub const INFLIGHT_FULL: u32 = 1;
    /// A kernel read (`bpf_probe_read_kernel`) failed; the field was reported as 0.
    pub const READ_FAILED: u32 = 2;
    /// A VMA record (snapshot, store, function call) could not be reserved: dropped.
    /// Counted apart from syscall events so each family's totals stay exact.
    pub const VMA_DROPPED: u32 = 3;
    pub const COUNT: u32 = 4;
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
    pub _pad: u32,
}

/// Load-time configuration (the `CONFIG` global, read-only to the programs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// One of [`filter`].
    pub filter: u32,
    pub _pad: u32,
    pub offsets: KernelOffsets,
}

/// Tag in the first four bytes of every ring-buffer record; the decoder dispatches on it.
pub mod event_kind {
    pub const SYSCALL: u32 = 1;
    /// [`crate::faults::FaultEvent`]; 16 keeps clear of the kinds other hook families add.
    pub const FAULT: u32 = 16;
}

/// One completed mlock-family system call, written at `sys_exit`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallEvent {
    /// Always [`event_kind::SYSCALL`].
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
}

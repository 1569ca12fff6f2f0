//! The page-fault part of the contract: per-process statistics aggregated in the kernel,
//! the latency histogram layout both sides compute buckets with, and the sampled
//! [`FaultEvent`] streamed with `--events`.
//!
//! Counting rules follow `mm_account_fault()` in mm/memory.c, the function that increments
//! `task_struct.min_flt`/`maj_flt` (what `getrusage` reports): a fault is counted once it
//! completes without `VM_FAULT_ERROR` or `VM_FAULT_RETRY`, and is major when its result has
//! `VM_FAULT_MAJOR` or it was a retry (`FAULT_FLAG_TRIED`).
//! <https://git.kernel.org/pub/scm/linux/kernel/git/torvalds/linux.git/tree/mm/memory.c?h=v6.1#n5084>

use bytemuck::Zeroable;

pub use self::buckets::{HIST_BUCKETS, Hist, bucket_of, bucket_range};

mod buckets;

/// Names of the maps and globals of the fault hooks.
pub mod names {
    pub const FAULT_CONFIG: &str = "FAULT_CONFIG";
    pub const FAULT_STATS: &str = "FAULT_STATS";
    pub const FAULT_HIST: &str = "FAULT_HIST";
    pub const FAULT_REGIONS: &str = "FAULT_REGIONS";
    pub const FAULT_MAPPINGS: &str = "FAULT_MAPPINGS";
    pub const FAULT_ENTRY: &str = "FAULT_ENTRY";
    pub const FAULT_COUNTERS: &str = "FAULT_COUNTERS";
    pub const POPULATE_INFLIGHT: &str = "POPULATE_INFLIGHT";
    pub const FAULT_EVENTS: &str = "FAULT_EVENTS";
    pub const FAULT_SOLE_TGID: &str = "FAULT_SOLE_TGID";
    pub const FAULT_SOLE_STATS: &str = "FAULT_SOLE_STATS";
    pub const FAULT_SOLE_HIST: &str = "FAULT_SOLE_HIST";
    pub const FAULT_REGION_RUN: &str = "FAULT_REGION_RUN";
    pub const FAULT_REGION_SLOTS: &str = "FAULT_REGION_SLOTS";
}

/// Size of the fault event ring buffer, apart from the syscall events' so that a fault storm
/// cannot crowd them out (a power of two multiple of the page size).
pub const FAULT_EVENTS_BYTE_SIZE: u32 = 4 << 20;

/// System-wide sizes of the maps the CPUs share (the loader sets smaller ones for a few
/// processes), the same on any CPU count. Each process or thread with faults takes a
/// `FAULT_STATS` entry (429 bytes with the map's own) and, once a fault is timed, a
/// `FAULT_HIST` entry per class (1,111 bytes; most processes only time minor faults). The
/// sum of every map of a system-wide session stays within 32 MiB at 96 possible CPUs
/// (issue 29): 12,288 processes' counts and 8,192 histograms, so a storm of 4,000 short
/// processes keeps them all (tests/fork_storm.rs) and a longer one loses the histograms of
/// the exited processes least recently faulting first, counted as `histograms_evicted`.
pub const MAX_FAULT_KEYS: u32 = 12288;
pub const MAX_FAULT_HISTS: u32 = 8192;
/// Regions are evicted (and counted) before the process's counts; the counts never depend
/// on them.
pub const MAX_FAULT_REGIONS: u32 = 16384;
/// VMAs whose identity the fault hooks recorded (LRU, keyed like [`RegionKey`]).
pub const MAX_FAULT_MAPPINGS: u32 = 8192;
/// Traced threads the fault hooks keep state for (`FAULT_ENTRY`: the fault in progress and
/// the sampling period; fentry and kprobe sets). LRU: a thread's entry is used at each of
/// its faults, so the one evicted has not faulted for longest and has no fault in progress
/// (a new entry only restarts its sampling period).
pub const MAX_FAULT_THREADS: u32 = 8192;
/// Threads inside a populating system call at once (`POPULATE_INFLIGHT`, removed at the
/// call's exit; LRU so that an entry a lost exit left behind ages out).
pub const MAX_POPULATE_CALLS: u32 = 4096;

indices! {
    /// Indices of [`FaultStats::counts`].
    pub mod stat: usize, COUNT: usize {
        /// Completed faults taken through the page-fault exception (`regs != NULL`): the access
        /// came from user mode, or from the kernel touching user memory (`copy_to_user`).
        USER_MINOR,
        USER_MAJOR,
        /// Completed faults the kernel took on the task's behalf without an exception
        /// (get_user_pages: mlock, `MAP_POPULATE`, `MADV_POPULATE_*`, exec argument pages).
        POPULATED_MINOR,
        POPULATED_MAJOR,
        /// Faults that returned `VM_FAULT_RETRY` at least once before completing (counted once).
        RETRIED,
        /// Faults the kernel could not resolve (`VM_FAULT_ERROR`, or an exception that never
        /// reached the accounting: SIGSEGV, SIGBUS, EFAULT).
        FAILED,
        /// Completions whose start was not seen (tracing began mid-fault, or the entry table
        /// was full): counted, but without a latency.
        LATENCY_UNMATCHED,
        /// Completed faults in a VMA with `VM_LOCKED` / `VM_LOCKONFAULT` (hooks with a VMA only).
        IN_LOCKED,
        IN_LOCKONFAULT,
    }
}

indices! {
    /// Latency histogram classes (second half of [`HistKey`]); the loader merges them into the
    /// reported classes (minor = user minor + populated minor, ...).
    pub mod class: u32, COUNT: usize {
        USER_MINOR,
        USER_MAJOR,
        POPULATED_MINOR,
        POPULATED_MAJOR,
        FAILED,
        /// Retried faults, again: a retried fault is also in its final class.
        RETRIED,
        /// Timed major faults again, by what they waited for (see [`VM_BACKING`]): a page
        /// of anonymous memory read back from swap (a private file mapping's written pages
        /// among them), a shmem page read back from swap, a file's page read in.
        MAJOR_ANON_SWAP_IN,
        MAJOR_SHMEM_SWAP_IN,
        MAJOR_FILE_READ,
    }
}

indices! {
    /// System calls whose page population the tracepoint hooks measure from the task's
    /// `min_flt`/`maj_flt` deltas (index into [`FaultStats::populated_by`]).
    pub mod populate: usize, COUNT: usize {
        MLOCK,
        MLOCK2,
        MLOCKALL,
        MMAP,
        MREMAP,
        BRK,
        MADVISE,
        MPROTECT,
        PKEY_MPROTECT,
        REMAP_FILE_PAGES,
        EXECVE,
        EXECVEAT,
        /// Populated outside the calls above (seen only by the fentry/kprobe hooks).
        OTHER,
    }
    /// The hooked calls, in index order.
    pub const NAMES: [&str; COUNT] = [
        "mlock",
        "mlock2",
        "mlockall",
        "mmap",
        "mremap",
        "brk",
        "madvise",
        "mprotect",
        "pkey_mprotect",
        "remap_file_pages",
        "execve",
        "execveat",
        "other",
    ];
}

indices! {
    /// Indices of the per-CPU `FAULT_COUNTERS` (the fault hooks' own health).
    pub mod fault_counter: u32, COUNT: u32 {
        /// New keys inserted into `FAULT_STATS`: minus the keys present, that is how many the
        /// LRU evicted (processes whose counts were lost to the map's bound).
        STATS_INSERTS,
        HIST_INSERTS,
        REGION_INSERTS,
        /// A map update failed outright (not an eviction): that fault was not counted.
        UPDATE_FAILED,
        /// Sequence for `--sample N` (per CPU).
        SAMPLE_SEQ,
        /// Sampled fault events lost because the ring buffer was full.
        EVENTS_DROPPED,
    }
}

/// Load-time configuration of the fault hooks (the `FAULT_CONFIG` global). No implicit
/// padding: every 8-byte field starts at a multiple of 8 (checked below).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultConfig {
    /// Non-zero: statistics are keyed by thread, not only by process.
    pub per_thread: u32,
    /// Non-zero: record start times and latency histograms (zero: counts only).
    pub latency: u32,
    /// Non-zero: stream sampled [`FaultEvent`]s.
    pub events: u32,
    /// Keep one fault event in this many (1 = all).
    pub sample_every: u32,
    /// `enum vm_fault_reason` values, from the running kernel's BTF.
    pub vm_fault_major: u32,
    pub vm_fault_retry: u32,
    /// `VM_FAULT_ERROR`: OOM | SIGBUS | SIGSEGV | HWPOISON | HWPOISON_LARGE | FALLBACK.
    pub vm_fault_error: u32,
    /// `enum fault_flag` `FAULT_FLAG_TRIED`.
    pub fault_flag_tried: u32,
    /// `FAULT_FLAG_USER`: the fault came from user mode.
    pub fault_flag_user: u32,
    /// `VM_FAULT_OOM`: a failure that is not signalled.
    pub vm_fault_oom: u32,
    /// Possible CPUs (per-CPU maps have a value for each).
    pub nr_cpus: u32,
    /// Non-zero (`--stacks`): count faults per user call stack (see [`StackKey`]).
    pub stacks: u32,
    /// `vm_area_struct.vm_flags` / `.vm_start` offsets.
    pub vma_vm_flags: u32,
    pub vma_vm_start: u32,
    /// Without a VMA, runs of faults within `1 << region_shift` bytes are counted together.
    pub region_shift: u32,
    /// Slots of `FAULT_REGION_SLOTS` in use, minus one (a power of two, at most
    /// [`REGION_SLOTS`]).
    pub region_slots_mask: u32,
    /// This architecture's syscall numbers of the [`populate`] calls, by index
    /// (`u32::MAX` where the architecture has no such call).
    pub populate_nrs: [u32; populate::COUNT],
    /// Non-zero (`--latency-sample N`, N > 1): the completion programs run for one fault in N
    /// and only time it; the exception faults are counted by the perf events themselves, read
    /// by the loader, and their mappings by the start hook, which sees every one.
    pub counted_by_perf: u32,
    /// `--latency-sample N`: one fault in N is timed (1: every one). The tracepoint set's
    /// programs do not read it (the completion events' sample period is N); fentry/kprobe
    /// count each thread's faults down to the next timed one.
    pub latency_period: u32,
    /// `task_struct.pid`: the thread a context switch puts on the CPU.
    pub task_pid: u32,
}

const _: () = assert!(size_of::<FaultConfig>().is_multiple_of(8));
const _: () = assert!(
    core::mem::offset_of!(FaultConfig, populate_nrs) + 4 * populate::COUNT + 12
        == size_of::<FaultConfig>()
);

/// Key of `FAULT_STATS`: a process, or one of its threads with `--per-thread`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FaultKey {
    pub tgid: u32,
    /// 0 unless statistics are per thread.
    pub tid: u32,
    /// The process's start ([`crate::process::ProcessKey::start_ns`]), so that a process
    /// that reuses a pid counts apart from the one before it.
    pub start_ns: u64,
}

/// Length of the [`FaultStats`] arrays indexed at run time: a power of two, so the eBPF side
/// indexes with `& (SLOTS - 1)`, a bound every kernel's verifier can follow (6.1's cannot
/// follow a plain `< 13` comparison through the index arithmetic LLVM emits).
pub const SLOTS: usize = 16;
const _: () = assert!(populate::COUNT <= SLOTS && class::COUNT <= SLOTS);

/// Value of `FAULT_STATS`, shared by the CPUs (and this CPU's of `FAULT_SOLE_STATS`, which
/// the loader sums).
#[repr(C)]
#[derive(Clone, Copy, Debug, Zeroable, PartialEq, Eq)]
pub struct FaultStats {
    /// See [`stat`].
    pub counts: [u64; stat::COUNT],
    /// Populated pages by the call that populated them (see [`populate`]).
    pub populated_by: [u64; SLOTS],
    /// Largest latency per [`class`], exact (the histogram has bucket resolution).
    pub max_ns: [u64; SLOTS],
    /// The timed faults' time in each [`cause`](crate::causes::cause).
    pub cause_ns: [u64; crate::causes::cause::COUNT],
    /// The slowest timed fault with a cause (of any class): its latency, and its time in each
    /// cause (u32, saturated at 4.29 s: 16 bytes less in each of `MAX_FAULT_KEYS` entries
    /// kept a system-wide session within its 32 MiB of map memory).
    pub slowest_cause_ns: [u32; crate::causes::cause::COUNT],
    pub slowest_ns: u32,
    pub comm: [u8; crate::TASK_COMM_LEN],
}

zeroed_default!(FaultStats);

/// Key of `FAULT_HIST`: one latency class of one process (or thread).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HistKey {
    pub key: FaultKey,
    pub class: u32,
    pub _pad: u32,
}

/// Key of `FAULT_REGIONS`: where a process's faults land.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionKey {
    pub tgid: u32,
    /// One of [`region_kind`]: what `start` is.
    pub exact: u32,
    pub start: u64,
}

/// [`RegionKey::exact`].
pub mod region_kind {
    /// `start` is the page of the first fault of a run of faults within
    /// `1 << region_shift` bytes: no VMA was found (tracepoint hooks, lookup failed).
    pub const PAGE: u32 = 0;
    /// `start` is the faulting VMA's `vm_start`, its identity in `FAULT_MAPPINGS`.
    pub const VMA: u32 = 1;
    /// Pages a populating call faulted in across VMAs the tracepoint hooks cannot tell
    /// apart (`mlockall`, an `mlock` over several VMAs): `start` is the call's
    /// [`populate`](super::populate) index.
    pub const CALL: u32 = 2;
}

/// Slots of the per-CPU region table `FAULT_REGION_SLOTS` (the most; the loader may use
/// fewer on machines with many CPUs).
pub const REGION_SLOTS: u32 = 4096;

/// One slot of `FAULT_REGION_SLOTS` (or the run in `FAULT_REGION_RUN`): faults this CPU
/// counted under one [`RegionKey`] and has not moved to `FAULT_REGIONS` yet; the loader adds
/// what the slots and runs still hold.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegionSlot {
    pub key: RegionKey,
    pub value: RegionValue,
}

/// The kinds a timed major fault is told as, in one table for every output: its class, its
/// `--events` flag, its key (JSON `major_kind`, Prometheus `kind`) and its latency row.
pub mod major_kind {
    use super::{class, fault_flags};

    pub const CLASSES: [u32; 3] = [
        class::MAJOR_ANON_SWAP_IN,
        class::MAJOR_SHMEM_SWAP_IN,
        class::MAJOR_FILE_READ,
    ];
    pub const FLAGS: [u32; 3] = [
        fault_flags::ANON_SWAP_IN,
        fault_flags::SHMEM_SWAP_IN,
        fault_flags::FILE_READ,
    ];
    pub const KEYS: [&str; 3] = ["anon_swap_in", "shmem_swap_in", "file_read"];
    pub const ROWS: [&str; 3] = [
        "major_anon_swap_in",
        "major_shmem_swap_in",
        "major_file_read",
    ];
}

/// Or'ed into the `vm_flags` the fault hooks count a region with when the faulting thread's
/// user stack pointer was inside that VMA: the VMA is a stack, a thread's or the main one.
/// A thread's stack is an ordinary anonymous mapping to `/proc/PID/maps`, and a thread
/// that lives a few milliseconds is gone before anyone reads it; this is seen at the fault.
/// The hooks clear the bit from the kernel's own flags first, so it means only this.
pub const VM_HELD_SP: u64 = 1 << 62;

/// Or'ed into the same `vm_flags` when the VMA maps a file ([`VM_FILE_BACKED`]), and when
/// that file is shmem's ([`VM_SHMEM_BACKED`]: tmpfs, memfd, SysV shm, a shared anonymous
/// mapping): read once per VMA with its identity, what a major fault's kind is told by.
/// Cleared from the kernel's own flags first, as [`VM_HELD_SP`];
/// [`VM_BACKING_KNOWN`]: the two were read (a VMA whose identity was not has none).
pub const VM_BACKING_KNOWN: u64 = 1 << 59;
pub const VM_FILE_BACKED: u64 = 1 << 60;
pub const VM_SHMEM_BACKED: u64 = 1 << 61;
pub const VM_BACKING: u64 = VM_BACKING_KNOWN | VM_FILE_BACKED | VM_SHMEM_BACKED;
/// Every bit the hooks add to the kernel's `vm_flags`.
pub const VM_OURS: u64 = VM_HELD_SP | VM_BACKING;

/// Per-CPU value of `FAULT_REGIONS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegionValue {
    pub faults: u64,
    /// Of `faults`, the major ones. Counted where a fault is counted at its completion, with
    /// its class; not where the region is counted at the fault's start
    /// ([`FaultConfig::counted_by_perf`]), where whether it is major is not known yet.
    pub majors: u64,
    /// OR of the `vm_flags` seen (0 when the hook has no VMA).
    pub vm_flags: u64,
}

/// User frames kept per stack, innermost first: the kernel's own limit for its
/// frame-pointer walk (`sysctl kernel.perf_event_max_stack`, 127).
pub const STACK_DEPTH: usize = 127;

/// Faults of one process (or thread) with this user call stack, summed in user space from
/// the kept stacks (`--stacks`). For pages the kernel populated inside a system call, the
/// stack is the call's user call site.
#[repr(C)]
#[derive(Clone, Copy, Debug, Zeroable, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackKey {
    pub tgid: u32,
    /// 0 unless statistics are per thread.
    pub tid: u32,
    /// Instruction pointers, innermost first, zero after the last frame.
    pub ips: [u64; STACK_DEPTH],
}

zeroed_default!(StackKey);

/// Per-thread state in `FAULT_ENTRY`: the fault in progress, so its completion can be
/// timed and a fault that never completes can be counted as failed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultEntry {
    pub tgid: u32,
    /// 1 while a fault is between its start and its completion.
    pub pending: u32,
    pub start_ns: u64,
    pub address: u64,
    /// fentry/kprobe only: `handle_mm_fault` flags and the VMA's `vm_flags` / `vm_start`.
    pub flags: u32,
    /// Non-zero: `regs` was NULL (get_user_pages), i.e. a populated fault.
    pub no_regs: u32,
    pub vm_flags: u64,
    pub vm_start: u64,
    /// Non-zero: this fault already returned `VM_FAULT_RETRY` once.
    pub retried: u32,
    /// `--latency-sample`: faults this thread takes untimed before the next timed one.
    pub untimed_left: u32,
}

/// A populating system call in progress (`POPULATE_INFLIGHT`, keyed by tid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PopulateCall {
    /// Index in [`populate`].
    pub index: u32,
    pub _pad: u32,
    pub start_ns: u64,
    pub min_flt: u64,
    pub maj_flt: u64,
    /// Faults taken through the exception (kernel touching user memory) during the call:
    /// already counted as `USER_*`, so subtracted from the delta.
    pub exception_min: u64,
    pub exception_maj: u64,
    /// The range's start and length (first two arguments), for attributing the pages to a
    /// mapping.
    pub address: u64,
    pub len: u64,
}

/// Bits of [`FaultEvent::flags`].
pub mod fault_flags {
    pub const MAJOR: u32 = 1 << 0;
    pub const POPULATED: u32 = 1 << 1;
    pub const RETRIED: u32 = 1 << 2;
    pub const FAILED: u32 = 1 << 3;
    /// `latency_ns` is meaningful.
    pub const HAS_LATENCY: u32 = 1 << 4;
    pub const VM_LOCKED: u32 = 1 << 5;
    pub const VM_LOCKONFAULT: u32 = 1 << 6;
    /// The hook saw the VMA, so the two bits above are known.
    pub const HAS_VMA: u32 = 1 << 7;
    /// A timed major fault's kind (see `class::MAJOR_*`), when told.
    pub const ANON_SWAP_IN: u32 = 1 << 8;
    pub const SHMEM_SWAP_IN: u32 = 1 << 9;
    pub const FILE_READ: u32 = 1 << 10;
}

/// One fault (or, for tracepoint hooks, the pages one call populated), sampled with
/// `--events --sample N`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultEvent {
    /// An [`EventKind`](crate::EventKind): always
    /// [`EventKind::Fault`](crate::EventKind::Fault).
    pub kind: u32,
    /// See [`fault_flags`].
    pub flags: u32,
    pub tgid: u32,
    pub tid: u32,
    pub address: u64,
    /// The user instruction pointer: the faulting instruction, or where a populating call
    /// was made (its return address); 0 when it could not be read.
    pub ip: u64,
    pub latency_ns: u64,
    /// `bpf_ktime_get_ns()` at completion.
    pub time_ns: u64,
    /// Faults this record stands for: 1, or the pages a populating call faulted in.
    pub count: u64,
    /// Index in [`populate`] of the call that populated, `u32::MAX` when none.
    pub syscall: u32,
    pub cpu: u32,
    /// The fault's time in each [`cause`](crate::causes::cause).
    pub cause_ns: [u64; crate::causes::cause::COUNT],
    pub comm: [u8; crate::TASK_COMM_LEN],
}

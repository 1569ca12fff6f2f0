//! Page faults. Three hook sets feed one accounting body ([`account`]); the loader attaches
//! the best set the kernel allows:
//!
//! 1. fentry/fexit on `handle_mm_fault` (or 2. kprobe/kretprobe there): every fault, with its
//!    flags, VMA, `regs` (NULL for get_user_pages, i.e. populated) and result.
//! 3. `exceptions:page_fault_{user,kernel}` marks the start (with specific targets, the
//!    `PAGE_FAULTS` perf software event on each target thread instead), the perf software events
//!    `PAGE_FAULTS_MIN`/`MAJ` (emitted by `mm_account_fault()` for faults with `regs`) the
//!    completion; pages populated without an exception are the task's `min_flt`/`maj_flt`
//!    growth across the populating system calls (`populate_*`).
//!
//! Hot-path discipline: nothing per fault goes to the ring buffer unless `--events` asks;
//! counts and latency histograms are aggregated in the kernel (see [`hist::record_latency`] for
//! why slots rather than streaming), in maps the CPUs share, with atomic adds (see
//! [`FAULT_STATS`] for why not per CPU).
//!
//! This file is the accounting body and its maps; around it:
//! - [`hooks`]: the programs each hook set attaches, thin;
//! - [`events`]: the sampled fault records of `--events`;
//! - [`hist`]: the latency histograms, by class (a major fault's kind among them);
//! - [`causes`]: what a timed fault's time went to, and what a major fault waited for;
//! - [`inflight`]: a fault between its start and its completion, for each hook set;
//! - [`regions`]: where faults are counted by region (the per-CPU region table);
//! - [`mappings`]: the faulting VMA, looked up at the fault (tracepoint set) or handed to
//!   the hook, and its identity recorded for user space;
//! - [`populate`]: the populating system calls, and failed faults seen as signals.

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::bpf_get_current_comm,
    macros::map,
    maps::{Array, LruHashMap, PerCpuArray},
};
use memlock_trace_common::{
    TASK_COMM_LEN,
    causes::cause,
    faults::{
        FaultConfig, FaultKey, FaultStats, MAX_FAULT_KEYS, SLOTS, class, fault_counter,
        fault_flags, stat,
    },
    vma::{VM_LOCKED, VM_LOCKONFAULT},
};

use self::{
    events::{NO_LATENCY, emit},
    hist::{record_kind_latency, record_latency},
    regions::count_region,
};
use crate::{
    shared::{add, add_shared, current_process_start_ns, is_target},
    stacks,
};

/// Reads one field of [`FAULT_CONFIG`] (volatile: a plain read of the static would be folded
/// to its compile-time value, not the one the loader wrote).
macro_rules! config {
    ($field:ident) => {
        // SAFETY: a read of a field of a static, which outlives the program.
        unsafe { core::ptr::read_volatile(&raw const $crate::faults::FAULT_CONFIG.$field) }
    };
}

mod causes;
mod events;
mod hist;
mod hooks;
mod inflight;
pub mod mappings;
pub mod populate;
mod regions;

/// Set by the loader before load; read field by field with volatile reads (a whole-struct
/// `Global::load` would copy ~150 bytes on every fault).
#[unsafe(no_mangle)]
static FAULT_CONFIG: FaultConfig = FaultConfig {
    per_thread: 0,
    latency: 0,
    events: 0,
    sample_every: 1,
    vm_fault_major: 0,
    vm_fault_retry: 0,
    vm_fault_error: 0,
    fault_flag_tried: 0,
    fault_flag_user: 0,
    vm_fault_oom: 0,
    nr_cpus: 1,
    stacks: 0,
    vma_vm_flags: 0,
    vma_vm_start: 0,
    region_shift: 16,
    region_slots_mask: 0,
    populate_nrs: [u32::MAX; memlock_trace_common::faults::populate::COUNT],
    counted_by_perf: 0,
    latency_period: 1,
    task_pid: 0,
};

/// Per process (or thread) counters; LRU, so a machine with more processes than slots keeps
/// the active ones (the loader reports how many were evicted from `STATS_INSERTS`).
///
/// Why one value the CPUs share, added to atomically, rather than one per CPU: a per-CPU
/// map holds a value for each possible CPU of every entry, so its memory grew with the CPUs
/// (33 MiB for 12,264 processes on 2 CPUs; at 96 possible CPUs the same budget held 256
/// processes, and a fork storm lost counts). A process's faults run on one CPU at a time
/// nearly always, so the atomic add meets no contention; it costs a locked instruction.
#[map]
static FAULT_STATS: LruHashMap<FaultKey, FaultStats> =
    LruHashMap::with_max_entries(MAX_FAULT_KEYS, 0);

/// The fast path for the commonest use, one process traced (`-p PID` or a launched command,
/// without `--per-thread`, `--follow-children`, `--comm` or `--cgroup`): the loader writes
/// its tgid here, and its statistics live in `FAULT_SOLE_STATS`. An array lookup is inlined
/// by the verifier, where a hash lookup is a helper call that hashes the key; with both
/// hash lookups gone (the target filter at the start, the stats at completion) the two
/// programs went from 138 + 190 to 105 + 150 ns per run (bpf_stats, 256 MiB first touch).
/// 0: several targets, use the maps.
#[map]
static FAULT_SOLE_TGID: Array<u32> = Array::with_max_entries(1, 0);

#[map]
static FAULT_SOLE_STATS: PerCpuArray<FaultStats> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn sole_tgid() -> u32 {
    FAULT_SOLE_TGID.get(0).copied().unwrap_or(0)
}

/// With one target, another process's fault leaves at this compare with its tgid (an
/// inlined array read), before any hash lookup, kernel read or clock read.
#[inline(always)]
fn not_the_sole_target(tgid: u32) -> bool {
    let sole = sole_tgid();
    sole != 0 && tgid != sole
}

/// Whether process `tgid` is traced: the sole target, or one of the target set.
#[inline(always)]
fn traced(tgid: u32) -> bool {
    let sole = sole_tgid();
    if sole != 0 {
        tgid == sole
    } else {
        is_target(tgid)
    }
}

#[map]
static FAULT_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(fault_counter::COUNT, 0);

/// A new entry's zeroes, and its `comm`: nothing else of it is ever written.
#[map]
static STATS_SCRATCH: PerCpuArray<FaultStats> = PerCpuArray::with_max_entries(1, 0);

const NO_SYSCALL: u32 = u32::MAX;

/// A fault's latency, as its completion knows it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Latency {
    /// From its start to its completion (`ns`), which was at `end_ns`.
    Timed { ns: u64, end_ns: u64 },
    /// Not timed: `--latency-sample` skipped it, or no latency was asked.
    Untimed,
    /// Its start was not seen: counted in `LATENCY_UNMATCHED` when latency is asked.
    Unmatched,
}

/// Who counts a fault: this completion, or another program that saw it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CountedBy {
    /// This completion: its class, its region and the rest.
    Here,
    /// A failed user fault: `fault_signal` counts it (as it counts those refused before
    /// `handle_mm_fault`); only its latency, region and flags are recorded here.
    Signal,
    /// A sampled completion (`counted_by_perf`): the perf events count it and its start
    /// counted its region; only its latency is recorded here.
    PerfEvents,
}

/// Counts one in `FAULT_COUNTERS[index]` (see [`fault_counter`]); returns the count before.
#[inline(always)]
fn bump(index: u32) -> u64 {
    add(&FAULT_COUNTERS, index, 1)
}

/// A fault-map update failed (counted in `UPDATE_FAILED`); with `-v`, which map. Not
/// inlined (a BPF-to-BPF call on the failure path only), so that its log code cannot change
/// the register allocation of the per-fault path around it.
#[inline(never)]
fn update_failed(map: &'static str) {
    let before = bump(fault_counter::UPDATE_FAILED);
    if crate::diag::wanted(before) {
        aya_log_ebpf::warn!(
            &(),
            target: "page-fault hooks",
            "map {} update failed (full?): a fault not fully counted ({} on this CPU)",
            map,
            before + 1
        );
    }
}

/// A sampled fault event lost to a full ring buffer; with `-v`, said. Not inlined, as
/// [`update_failed`].
#[inline(never)]
fn event_dropped(tid: u32) {
    let before = bump(fault_counter::EVENTS_DROPPED);
    if crate::diag::wanted(before) {
        aya_log_ebpf::warn!(
            &(),
            target: "page-fault hooks",
            "ring buffer FAULT_EVENTS full: a fault event of tid {} dropped ({} on this CPU)",
            tid,
            before + 1
        );
    }
}

/// `--stacks`: the counted faults' user stack (see `stacks.rs`), with the region they were
/// counted in (a `region_kind` and start).
#[inline(always)]
fn record_stack<C: EbpfContext>(ctx: &C, tgid: u32, tid: u32, count: u64, region: (u32, u64)) {
    let tid = if config!(per_thread) != 0 { tid } else { 0 };
    stacks::record(ctx, tgid, tid, count, region);
}

/// The stats slot of a task, created on its first fault if it is traced, and the process
/// start time of its key: `None` when it is the sole target's (this CPU's value, see
/// [`FAULT_SOLE_TGID`]), whose key is not needed. Looked up before the target filter: only
/// traced tasks have one, so a traced task's fault skips the filter.
#[inline(always)]
fn stats_for(tgid: u32, tid: u32, known_target: bool) -> Option<(*mut FaultStats, Option<u64>)> {
    let sole = sole_tgid();
    if sole != 0 {
        if tgid != sole {
            return None;
        }
        let stats = FAULT_SOLE_STATS.get_ptr_mut(0)?;
        // SAFETY: this CPU's value of a per-CPU map, valid while the program runs; a program
        // runs to completion on its CPU, so nothing else uses it meanwhile.
        unsafe {
            if (*stats).comm[0] == 0 {
                (*stats).comm = bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]);
                // Once per CPU: the loader finds the process's start time here.
                crate::process::note_process(tgid, current_process_start_ns());
            }
        }
        return Some((stats, None));
    }
    let key = FaultKey {
        tgid,
        tid: if config!(per_thread) != 0 { tid } else { 0 },
        start_ns: current_process_start_ns(),
    };
    if let Some(stats) = FAULT_STATS.get_ptr_mut(key) {
        return Some((stats, Some(key.start_ns)));
    }
    if !known_target && !is_target(tgid) {
        return None;
    }
    crate::process::note_process(tgid, key.start_ns);
    let scratch = STATS_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: as above: this CPU's scratch value.
    let scratch = unsafe {
        (*scratch).comm = bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]);
        &*scratch
    };
    // NOEXIST: another CPU may have created it meanwhile; then we use theirs.
    if FAULT_STATS
        .insert(key, scratch, u64::from(BPF_NOEXIST))
        .is_ok()
    {
        bump(fault_counter::STATS_INSERTS);
    }
    let stats = FAULT_STATS.get_ptr_mut(key);
    if stats.is_none() {
        update_failed("FAULT_STATS");
    }
    stats.map(|stats| (stats, Some(key.start_ns)))
}

/// One fault, as a hook saw it.
#[derive(Clone, Copy)]
struct Fault {
    tgid: u32,
    tid: u32,
    /// A [`class`].
    cls: u32,
    counted_by: CountedBy,
    latency: Latency,
    address: u64,
    /// The VMA start (with `vm_flags`), or the page address.
    region: u64,
    /// The VMA's flags, 0 when the hook has no VMA.
    vm_flags: u64,
    /// The populating call, or [`NO_SYSCALL`].
    syscall: u32,
    retried: bool,
    /// The hook already knows the task is traced.
    known_target: bool,
}

/// Counts one completed (or failed) fault; false when the task is not traced. `ctx`: the
/// running program's context, for the sampled event's user instruction pointer (null when
/// the fault is not the program's own).
#[inline(always)]
fn account(ctx: *mut core::ffi::c_void, f: Fault) -> bool {
    let Fault {
        tgid,
        tid,
        cls,
        counted_by,
        latency,
        address,
        region,
        vm_flags,
        syscall,
        retried,
        known_target,
    } = f;
    let Some((stats, start_ns)) = stats_for(tgid, tid, known_target) else {
        return false;
    };
    // SAFETY: `stats_for` returns a valid pointer to the task's stats (this CPU's value of
    // the sole target's, or the LRU map's shared entry kept valid by RCU); its counters are
    // only added to atomically.
    let s = unsafe { &mut *stats };
    // Constant indices in every arm: nothing for the verifier to bound.
    match cls {
        _ if counted_by != CountedBy::Here => {}
        class::USER_MINOR => add_shared(&raw mut s.counts[stat::USER_MINOR], 1),
        class::USER_MAJOR => add_shared(&raw mut s.counts[stat::USER_MAJOR], 1),
        class::POPULATED_MINOR => add_shared(&raw mut s.counts[stat::POPULATED_MINOR], 1),
        class::POPULATED_MAJOR => add_shared(&raw mut s.counts[stat::POPULATED_MAJOR], 1),
        _ => add_shared(&raw mut s.counts[stat::FAILED], 1),
    }
    if retried {
        add_shared(&raw mut s.counts[stat::RETRIED], 1);
    }
    if syscall != NO_SYSCALL {
        add_shared(&raw mut s.populated_by[syscall as usize & (SLOTS - 1)], 1);
    }
    if vm_flags != 0 {
        if vm_flags & VM_LOCKED != 0 {
            add_shared(&raw mut s.counts[stat::IN_LOCKED], 1);
        }
        if vm_flags & VM_LOCKONFAULT != 0 {
            add_shared(&raw mut s.counts[stat::IN_LOCKONFAULT], 1);
        }
    }
    let major = cls == class::USER_MAJOR || cls == class::POPULATED_MAJOR;
    let mut caused = [0u64; cause::COUNT];
    let mut kind = None;
    match latency {
        Latency::Timed { ns, end_ns } => {
            if let Some(c) = causes::split(tid, end_ns.wrapping_sub(ns), end_ns) {
                for (sum, part) in s.cause_ns.iter_mut().zip(c) {
                    add_shared(sum, part);
                }
                // Not atomic, as `max_ns`.
                if ns > u64::from(s.slowest_ns) {
                    s.slowest_ns = saturated(ns);
                    s.slowest_cause_ns = c.map(saturated);
                }
                caused = c;
            }
            record_latency(s, start_ns, tgid, tid, cls, ns);
            if retried {
                record_latency(s, start_ns, tgid, tid, class::RETRIED, ns);
            }
            if major {
                kind = causes::major_kind(tid, vm_flags, end_ns.wrapping_sub(ns), end_ns);
                if let Some(kind) = kind {
                    record_kind_latency(s, start_ns, tgid, tid, kind, ns);
                }
            }
        }
        Latency::Unmatched if config!(latency) != 0 && cls != class::FAILED => {
            add_shared(&raw mut s.counts[stat::LATENCY_UNMATCHED], 1);
        }
        Latency::Unmatched | Latency::Untimed => {}
    }
    if counted_by != CountedBy::PerfEvents {
        count_region(tgid, region, vm_flags, u64::from(major));
    }
    if config!(events) != 0 {
        let mut flags = match cls {
            class::USER_MAJOR => fault_flags::MAJOR,
            class::POPULATED_MINOR => fault_flags::POPULATED,
            class::POPULATED_MAJOR => fault_flags::POPULATED | fault_flags::MAJOR,
            class::FAILED => fault_flags::FAILED,
            _ => 0,
        };
        if retried {
            flags |= fault_flags::RETRIED;
        }
        flags |= match kind {
            Some(class::MAJOR_ANON_SWAP_IN) => fault_flags::ANON_SWAP_IN,
            Some(class::MAJOR_SHMEM_SWAP_IN) => fault_flags::SHMEM_SWAP_IN,
            Some(class::MAJOR_FILE_READ) => fault_flags::FILE_READ,
            _ => 0,
        };
        let latency = match latency {
            Latency::Timed { ns, .. } => ns,
            Latency::Untimed | Latency::Unmatched => NO_LATENCY,
        };
        emit(
            ctx, tgid, tid, flags, address, latency, vm_flags, 1, syscall, caused,
        );
    }
    true
}

/// `ns` in a u32, 4.29 s at most.
#[inline(always)]
fn saturated(ns: u64) -> u32 {
    ns.min(u64::from(u32::MAX)) as u32
}

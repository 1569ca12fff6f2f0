//! Page faults. Three hook sets feed one accounting body ([`account`]); the loader attaches
//! the best set the kernel allows:
//!
//! 1. fentry/fexit on `handle_mm_fault` (or 2. kprobe/kretprobe there): every fault, with its
//!    flags, VMA, `regs` (NULL for get_user_pages, i.e. populated) and result.
//! 3. `exceptions:page_fault_{user,kernel}` marks the start, the perf software events
//!    `PAGE_FAULTS_MIN`/`MAJ` (emitted by `mm_account_fault()` for faults with `regs`) the
//!    completion; pages populated without an exception are the task's `min_flt`/`maj_flt`
//!    growth across the populating system calls (`populate_*`).
//!
//! Hot-path discipline: nothing per fault goes to the ring buffer unless `--events` asks;
//! counts and latency histograms are aggregated per CPU in the kernel (see [`record_latency`]
//! for why slots rather than streaming).

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_smp_processor_id, bpf_ktime_get_ns,
    },
    macros::{fentry, fexit, kprobe, kretprobe, map, perf_event, tracepoint},
    maps::{LruHashMap, LruPerCpuHashMap, PerCpuArray, RingBuf},
    programs::{
        FEntryContext, FExitContext, PerfEventContext, ProbeContext, RetProbeContext,
        TracePointContext,
    },
};
use memlock_trace_common::{
    TASK_COMM_LEN, event_kind,
    faults::{
        FAULT_EVENTS_BYTE_SIZE, FaultConfig, FaultEntry, FaultEvent, FaultKey, FaultStats,
        HIST_BUCKETS, Hist, HistKey, MAX_FAULT_HISTS, MAX_FAULT_KEYS, MAX_FAULT_REGIONS,
        MAX_FAULT_THREADS, PopulateCall, RegionKey, RegionValue, SLOTS, bucket_of, class,
        fault_counter, fault_flags, populate, stat,
    },
};

use crate::shared::{is_target, offsets, read_kernel};

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
    vm_locked: 0,
    vm_lockonfault: 0,
    vma_vm_flags: 0,
    vma_vm_start: 0,
    region_shift: 16,
    _pad: 0,
    populate_nrs: [u32::MAX; populate::COUNT],
    _pad2: 0,
};

macro_rules! config {
    ($field:ident) => {
        unsafe { core::ptr::read_volatile(&raw const FAULT_CONFIG.$field) }
    };
}

/// Per process (or thread) counters and region cache: per CPU, so a fault never contends
/// with another CPU's; LRU, so a machine with more processes than slots keeps the active ones
/// (the loader reports how many were evicted from `STATS_INSERTS`).
#[map]
static FAULT_STATS: LruPerCpuHashMap<FaultKey, FaultStats> =
    LruPerCpuHashMap::with_max_entries(MAX_FAULT_KEYS, 0);

#[map]
static FAULT_HIST: LruPerCpuHashMap<HistKey, Hist> =
    LruPerCpuHashMap::with_max_entries(MAX_FAULT_HISTS, 0);

/// Faults per region, per CPU like the rest (the BPF target has no atomic add in `core`),
/// flushed from the region cache only when a fault lands in a different region.
#[map]
static FAULT_REGIONS: LruPerCpuHashMap<RegionKey, RegionValue> =
    LruPerCpuHashMap::with_max_entries(MAX_FAULT_REGIONS, 0);

/// The fault each thread has in progress. Present only for traced threads, so a hit also
/// answers "is this a target?" without a `TARGET_TGIDS` lookup.
#[map]
static FAULT_ENTRY: LruHashMap<u32, FaultEntry> =
    LruHashMap::with_max_entries(MAX_FAULT_THREADS, 0);

#[map]
static POPULATE_INFLIGHT: LruHashMap<u32, PopulateCall> =
    LruHashMap::with_max_entries(MAX_FAULT_THREADS, 0);

/// Sampled fault events (`--events`): their own ring, so faults never crowd out the
/// syscall events in `EVENTS`.
#[map]
static FAULT_EVENTS: RingBuf = RingBuf::with_byte_size(FAULT_EVENTS_BYTE_SIZE, 0);

#[map]
static FAULT_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(fault_counter::COUNT, 0);

/// Zeroed values to insert from: a 1 KiB histogram does not fit the 512-byte BPF stack.
/// Nothing but `comm` of the stats scratch is ever written.
#[map]
static HIST_ZERO: PerCpuArray<Hist> = PerCpuArray::with_max_entries(1, 0);
#[map]
static STATS_SCRATCH: PerCpuArray<FaultStats> = PerCpuArray::with_max_entries(1, 0);

const NO_LATENCY: u64 = u64::MAX;
const PAGE_MASK: u64 = !0xfff;
const NO_SYSCALL: u32 = u32::MAX;

#[inline(always)]
fn bump(index: u32) -> u64 {
    match FAULT_COUNTERS.get_ptr_mut(index) {
        // Per-CPU slot: a plain increment is race-free.
        Some(slot) => unsafe {
            let old = *slot;
            *slot = old + 1;
            old
        },
        None => 0,
    }
}

#[inline(always)]
fn current_ids() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

// ---------------------------------------------------------------------------------------
// Hook set 3: tracepoints + perf software events.
// ---------------------------------------------------------------------------------------

/// `exceptions:page_fault_user` and `exceptions:page_fault_kernel`
/// (arch/x86/include/asm/trace/exceptions.h), after the 8 bytes of common fields:
///
/// ```text
/// field:unsigned long address;    offset:8;  size:8
/// field:unsigned long ip;         offset:16; size:8
/// field:unsigned long error_code; offset:24; size:8
/// ```
#[tracepoint]
pub fn fault_exception_entry(ctx: TracePointContext) -> u32 {
    let address = unsafe { ctx.read_at::<u64>(8) }.unwrap_or(0);
    start(address, 0, 0, 0, 0);
    0
}

/// `PERF_COUNT_SW_PAGE_FAULTS_MIN`, fired by `mm_account_fault()` after `min_flt++` for a
/// completed fault that has `regs`.
#[perf_event]
pub fn fault_perf_min(ctx: PerfEventContext) -> u32 {
    perf_completion(&ctx, false);
    0
}

#[perf_event]
pub fn fault_perf_maj(ctx: PerfEventContext) -> u32 {
    perf_completion(&ctx, true);
    0
}

#[inline(always)]
fn perf_completion(ctx: &PerfEventContext, major: bool) {
    let data = ctx.ctx;
    let address = unsafe { (*data).addr };
    // x86: the privilege level of the faulting code is the low two bits of CS.
    let user_mode = unsafe { (*data).regs.cs } & 3 != 0;
    let (tgid, tid) = current_ids();
    let latency = match finish(tid, address) {
        Finish::Timed(ns) => ns,
        Finish::Untimed => NO_LATENCY,
        Finish::NotTraced => {
            if !is_target(tgid) {
                return;
            }
            NO_LATENCY
        }
    };
    if !user_mode {
        // The kernel touched user memory (copy_to_user, exec's clear_user): if that happened
        // inside a populating call, its min_flt delta includes this fault; note it so the
        // delta is not counted twice.
        if let Some(call) = POPULATE_INFLIGHT.get_ptr_mut(tid) {
            unsafe {
                if major {
                    (*call).exception_maj += 1;
                } else {
                    (*call).exception_min += 1;
                }
            }
        }
    }
    let class = if major {
        class::USER_MAJOR
    } else {
        class::USER_MINOR
    };
    account(
        tgid,
        tid,
        class,
        latency,
        address,
        address & PAGE_MASK,
        0,
        NO_SYSCALL,
        false,
    );
}

// ---------------------------------------------------------------------------------------
// Hook sets 1 and 2: fentry/fexit or kprobe/kretprobe on handle_mm_fault.
// ---------------------------------------------------------------------------------------

// vm_fault_t handle_mm_fault(struct vm_area_struct *vma, unsigned long address,
//                            unsigned int flags, struct pt_regs *regs);
// https://git.kernel.org/pub/scm/linux/kernel/git/torvalds/linux.git/tree/mm/memory.c?h=v6.1#n5146

#[fentry(function = "handle_mm_fault")]
pub fn handle_mm_fault_fentry(ctx: FEntryContext) -> u32 {
    let vma: u64 = ctx.arg(0);
    let address: u64 = ctx.arg(1);
    let flags: u64 = ctx.arg(2);
    let regs: u64 = ctx.arg(3);
    hook_start(vma, address, flags as u32, regs == 0);
    0
}

#[fexit(function = "handle_mm_fault")]
pub fn handle_mm_fault_fexit(ctx: FExitContext) -> u32 {
    // fexit sees the arguments, then the return value.
    let ret: u64 = ctx.arg(4);
    hook_end(ret as u32);
    0
}

#[kprobe]
pub fn handle_mm_fault_kprobe(ctx: ProbeContext) -> u32 {
    let vma: u64 = ctx.arg(0).unwrap_or(0);
    let address: u64 = ctx.arg(1).unwrap_or(0);
    let flags: u64 = ctx.arg(2).unwrap_or(0);
    let regs: u64 = ctx.arg(3).unwrap_or(0);
    hook_start(vma, address, flags as u32, regs == 0);
    0
}

#[kretprobe]
pub fn handle_mm_fault_kretprobe(ctx: RetProbeContext) -> u32 {
    let ret: u64 = ctx.ret();
    hook_end(ret as u32);
    0
}

#[inline(always)]
fn hook_start(vma: u64, address: u64, flags: u32, no_regs: bool) {
    // Read the VMA now: after a VM_FAULT_RETRY or COMPLETED return the lock is dropped and
    // the VMA may be gone.
    let vm_flags: u64 = read_kernel(vma, config!(vma_vm_flags));
    let vm_start: u64 = read_kernel(vma, config!(vma_vm_start));
    start(address, flags, u32::from(no_regs), vm_flags, vm_start);
}

#[inline(always)]
fn hook_end(ret: u32) {
    let (tgid, tid) = current_ids();
    let Some(entry) = FAULT_ENTRY.get_ptr_mut(tid) else {
        return;
    };
    let e = unsafe { &mut *entry };
    if e.pending == 0 {
        return;
    }
    if ret & config!(vm_fault_retry) != 0 {
        // Not accounted by the kernel either: the retry will complete it. Keep the start
        // time so the latency covers every attempt.
        e.retried = 1;
        return;
    }
    e.pending = 0;
    let latency = unsafe { bpf_ktime_get_ns() }.wrapping_sub(e.start_ns);
    let retried = e.retried != 0;
    e.retried = 0;
    let (address, vm_flags, vm_start) = (e.address, e.vm_flags, e.vm_start);
    if ret & config!(vm_fault_error) != 0 {
        account(
            tgid,
            tid,
            class::FAILED,
            latency,
            address,
            vm_start,
            vm_flags,
            NO_SYSCALL,
            retried,
        );
        return;
    }
    // mm_account_fault(): major if VM_FAULT_MAJOR, or if this was a retry.
    let major = ret & config!(vm_fault_major) != 0 || e.flags & config!(fault_flag_tried) != 0;
    let (cls, syscall) = if e.no_regs != 0 {
        let index = match POPULATE_INFLIGHT.get_ptr(tid) {
            Some(call) => unsafe { (*call).index },
            None => populate::OTHER as u32,
        };
        let cls = if major {
            class::POPULATED_MAJOR
        } else {
            class::POPULATED_MINOR
        };
        (cls, index)
    } else {
        let cls = if major {
            class::USER_MAJOR
        } else {
            class::USER_MINOR
        };
        (cls, NO_SYSCALL)
    };
    account(
        tgid, tid, cls, latency, address, vm_start, vm_flags, syscall, retried,
    );
}

// ---------------------------------------------------------------------------------------
// Shared by all hook sets.
// ---------------------------------------------------------------------------------------

/// A fault begins: remember when, per thread. A thread with a fault still pending was left
/// by a fault that never completed (SIGSEGV, SIGBUS, EFAULT, an abandoned retry): failed.
#[inline(always)]
fn start(address: u64, flags: u32, no_regs: u32, vm_flags: u64, vm_start: u64) {
    let (tgid, tid) = current_ids();
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(entry) = FAULT_ENTRY.get_ptr_mut(tid) {
        let e = unsafe { &mut *entry };
        let retry_of_same = e.retried != 0 && e.address >> 12 == address >> 12;
        if e.pending != 0 && !retry_of_same {
            let (prev_addr, prev_start, prev_flags) = (e.address, e.vm_start, e.vm_flags);
            let region = if prev_flags != 0 {
                prev_start
            } else {
                prev_addr & PAGE_MASK
            };
            e.pending = 0;
            account(
                tgid,
                tid,
                class::FAILED,
                NO_LATENCY,
                prev_addr,
                region,
                prev_flags,
                NO_SYSCALL,
                false,
            );
        }
        if !(e.pending != 0 && retry_of_same) {
            e.start_ns = now;
            e.retried = 0;
        }
        e.tgid = tgid;
        e.pending = 1;
        e.address = address;
        e.flags = flags;
        e.no_regs = no_regs;
        e.vm_flags = vm_flags;
        e.vm_start = vm_start;
        return;
    }
    if !is_target(tgid) {
        return;
    }
    let entry = FaultEntry {
        tgid,
        pending: 1,
        start_ns: now,
        address,
        flags,
        no_regs,
        vm_flags,
        vm_start,
        retried: 0,
        _pad: 0,
    };
    if FAULT_ENTRY.insert(tid, entry, u64::from(BPF_ANY)).is_err() {
        bump(fault_counter::UPDATE_FAILED);
    }
}

enum Finish {
    /// The thread's start was seen: latency in ns.
    Timed(u64),
    /// A traced thread, but its start was not seen.
    Untimed,
    /// No entry: not traced, or latency is off.
    NotTraced,
}

#[inline(always)]
fn finish(tid: u32, address: u64) -> Finish {
    if config!(latency) == 0 {
        return Finish::NotTraced;
    }
    let Some(entry) = FAULT_ENTRY.get_ptr_mut(tid) else {
        return Finish::NotTraced;
    };
    let e = unsafe { &mut *entry };
    if e.pending == 0 {
        return Finish::Untimed;
    }
    e.pending = 0;
    if e.address != address {
        return Finish::Untimed;
    }
    Finish::Timed(unsafe { bpf_ktime_get_ns() }.wrapping_sub(e.start_ns))
}

/// The stats slot of a traced task, created on its first fault. Callers have already
/// established that the task is traced.
#[inline(always)]
fn stats_for(tgid: u32, tid: u32) -> Option<*mut FaultStats> {
    let key = FaultKey {
        tgid,
        tid: if config!(per_thread) != 0 { tid } else { 0 },
    };
    if let Some(stats) = FAULT_STATS.get_ptr_mut(key) {
        return Some(stats);
    }
    let scratch = STATS_SCRATCH.get_ptr_mut(0)?;
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
        bump(fault_counter::UPDATE_FAILED);
    }
    stats
}

/// Counts one completed (or failed) fault of class `cls`.
#[expect(clippy::too_many_arguments, reason = "one call per hook, all inlined")]
#[inline(always)]
fn account(
    tgid: u32,
    tid: u32,
    cls: u32,
    latency: u64,
    address: u64,
    region: u64,
    vm_flags: u64,
    syscall: u32,
    retried: bool,
) {
    let Some(stats) = stats_for(tgid, tid) else {
        return;
    };
    let s = unsafe { &mut *stats };
    // Constant indices in every arm: nothing for the verifier to bound.
    match cls {
        class::USER_MINOR => s.counts[stat::USER_MINOR] += 1,
        class::USER_MAJOR => s.counts[stat::USER_MAJOR] += 1,
        class::POPULATED_MINOR => s.counts[stat::POPULATED_MINOR] += 1,
        class::POPULATED_MAJOR => s.counts[stat::POPULATED_MAJOR] += 1,
        _ => s.counts[stat::FAILED] += 1,
    }
    if retried {
        s.counts[stat::RETRIED] += 1;
    }
    if syscall != NO_SYSCALL {
        s.populated_by[syscall as usize & (SLOTS - 1)] += 1;
    }
    if vm_flags != 0 {
        if vm_flags & config!(vm_locked) != 0 {
            s.counts[stat::IN_LOCKED] += 1;
        }
        if vm_flags & config!(vm_lockonfault) != 0 {
            s.counts[stat::IN_LOCKONFAULT] += 1;
        }
    }
    if latency == NO_LATENCY {
        if config!(latency) != 0 && cls != class::FAILED {
            s.counts[stat::LATENCY_UNMATCHED] += 1;
        }
    } else {
        record_latency(s, tgid, tid, cls, latency);
        if retried {
            record_latency(s, tgid, tid, class::RETRIED, latency);
        }
    }
    // Region cache: consecutive faults in one region cost one map update in total. With a
    // VMA the region is the VMA (`region` is its start); without, it is the 64 KiB around
    // the run's first fault, whose page address is the key: the mapping that contains it is
    // exact, where a rounded-down address could fall in the neighbouring mapping.
    let same_region = if vm_flags != 0 {
        s.region_start == region
    } else {
        s.region_start >> config!(region_shift) == region >> config!(region_shift)
    };
    if s.region_pending != 0 && same_region {
        s.region_pending += 1;
        s.region_vm_flags |= vm_flags;
    } else {
        if s.region_pending != 0 {
            flush_region(tgid, s.region_start, s.region_pending, s.region_vm_flags);
        }
        s.region_start = region;
        s.region_pending = 1;
        s.region_vm_flags = vm_flags;
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
        emit(tgid, tid, flags, address, latency, vm_flags, 1, syscall);
    }
}

/// Why per-CPU log-linear slots in the kernel rather than streaming every fault to an
/// HdrHistogram in user space: a fault costs ~1.5 us untraced here, and streaming means a
/// ring buffer reserve + submit + wakeup bookkeeping per fault plus user-space decoding that
/// competes for the same two cores; the in-kernel slot is one per-CPU hash lookup and an
/// increment. BENCHMARKS.md measures both on the same workload: `--events --sample 1` is
/// the streaming design. Slots cost resolution (1/8 of the value, max kept exact), which is
/// finer than fault latency varies between runs.
#[inline(always)]
fn record_latency(s: &mut FaultStats, tgid: u32, tid: u32, cls: u32, ns: u64) {
    let max = &mut s.max_ns[cls as usize & (SLOTS - 1)];
    if ns > *max {
        *max = ns;
    }
    let key = HistKey {
        key: FaultKey {
            tgid,
            tid: if config!(per_thread) != 0 { tid } else { 0 },
        },
        class: cls,
        _pad: 0,
    };
    let hist = match FAULT_HIST.get_ptr_mut(key) {
        Some(hist) => hist,
        None => {
            let Some(zero) = HIST_ZERO.get_ptr(0) else {
                return;
            };
            if FAULT_HIST
                .insert(key, unsafe { &*zero }, u64::from(BPF_NOEXIST))
                .is_ok()
            {
                bump(fault_counter::HIST_INSERTS);
            }
            match FAULT_HIST.get_ptr_mut(key) {
                Some(hist) => hist,
                None => {
                    bump(fault_counter::UPDATE_FAILED);
                    return;
                }
            }
        }
    };
    let bucket = bucket_of(ns) & (HIST_BUCKETS - 1);
    unsafe { (*hist).counts[bucket] += 1 };
}

#[inline(always)]
fn flush_region(tgid: u32, start: u64, faults: u64, vm_flags: u64) {
    let key = RegionKey {
        tgid,
        exact: u32::from(vm_flags != 0),
        start,
    };
    for _ in 0..2 {
        if let Some(value) = FAULT_REGIONS.get_ptr_mut(key) {
            unsafe {
                (*value).faults += faults;
                (*value).vm_flags |= vm_flags;
            }
            return;
        }
        let value = RegionValue { faults, vm_flags };
        if FAULT_REGIONS
            .insert(key, value, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            bump(fault_counter::REGION_INSERTS);
            return;
        }
        // Lost a race with another CPU's insert: add to this CPU's share of it.
    }
    bump(fault_counter::UPDATE_FAILED);
}

#[expect(clippy::too_many_arguments, reason = "the fields of one event")]
#[inline(always)]
fn emit(
    tgid: u32,
    tid: u32,
    mut flags: u32,
    address: u64,
    latency: u64,
    vm_flags: u64,
    count: u64,
    syscall: u32,
) {
    let every = u64::from(config!(sample_every));
    if every > 1 && bump(fault_counter::SAMPLE_SEQ) % every != 0 {
        return;
    }
    if latency != NO_LATENCY {
        flags |= fault_flags::HAS_LATENCY;
    }
    if vm_flags != 0 {
        flags |= fault_flags::HAS_VMA;
        if vm_flags & config!(vm_locked) != 0 {
            flags |= fault_flags::VM_LOCKED;
        }
        if vm_flags & config!(vm_lockonfault) != 0 {
            flags |= fault_flags::VM_LOCKONFAULT;
        }
    }
    let Some(mut slot) = FAULT_EVENTS.reserve::<FaultEvent>(0) else {
        bump(fault_counter::EVENTS_DROPPED);
        return;
    };
    slot.write(FaultEvent {
        kind: event_kind::FAULT,
        flags,
        tgid,
        tid,
        address,
        latency_ns: if latency == NO_LATENCY { 0 } else { latency },
        time_ns: unsafe { bpf_ktime_get_ns() },
        count,
        syscall,
        cpu: unsafe { bpf_get_smp_processor_id() },
        comm: bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]),
    });
    slot.submit(0);
}

// ---------------------------------------------------------------------------------------
// Populating system calls: the pages the kernel faulted in without an exception.
// ---------------------------------------------------------------------------------------

// sys_enter_* formats: `int __syscall_nr` at 8, then 8-byte arguments from 16 (see
// syscalls.rs); sys_exit_*: `long ret` at 16.
const NR_OFFSET: usize = 8;
const ARG0_OFFSET: usize = 16;
const RET_OFFSET: usize = 16;

/// Attached to `sys_enter_` of every [`populate`] call.
#[tracepoint]
pub fn populate_enter(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if !is_target(tgid) {
        return 0;
    }
    let nr = unsafe { ctx.read_at::<i32>(NR_OFFSET) }.unwrap_or(-1) as u32;
    let mut index = populate::OTHER as u32;
    for i in 0..populate::COUNT {
        // Volatile, element by element: a plain read of the static would be folded to its
        // compile-time value, not the one the loader wrote.
        let candidate =
            unsafe { core::ptr::read_volatile(&raw const FAULT_CONFIG.populate_nrs[i]) };
        if candidate == nr {
            index = i as u32;
            break;
        }
    }
    let (min_flt, maj_flt) = task_faults();
    let call = PopulateCall {
        index,
        _pad: 0,
        start_ns: unsafe { bpf_ktime_get_ns() },
        min_flt,
        maj_flt,
        exception_min: 0,
        exception_maj: 0,
        address: unsafe { ctx.read_at::<u64>(ARG0_OFFSET) }.unwrap_or(0),
    };
    if POPULATE_INFLIGHT
        .insert(tid, call, u64::from(BPF_ANY))
        .is_err()
    {
        bump(fault_counter::UPDATE_FAILED);
    }
    0
}

/// `sys_exit_` with the tracepoint hook set: the task's fault-counter growth during the call,
/// less the faults the perf events already counted, is what the call populated.
#[tracepoint]
pub fn populate_exit_counted(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    let Some(call) = POPULATE_INFLIGHT.get_ptr(tid) else {
        return 0;
    };
    let call = unsafe { *call };
    let _ = POPULATE_INFLIGHT.remove(tid);
    let (min_flt, maj_flt) = task_faults();
    let minor = min_flt
        .wrapping_sub(call.min_flt)
        .saturating_sub(call.exception_min);
    let major = maj_flt
        .wrapping_sub(call.maj_flt)
        .saturating_sub(call.exception_maj);
    if minor == 0 && major == 0 {
        return 0;
    }
    let Some(stats) = stats_for(tgid, tid) else {
        return 0;
    };
    let s = unsafe { &mut *stats };
    s.counts[stat::POPULATED_MINOR] += minor;
    s.counts[stat::POPULATED_MAJOR] += major;
    s.populated_by[call.index as usize & (SLOTS - 1)] += minor + major;
    // Where: mmap and mremap return the mapping; the others take it as first argument.
    let ret = unsafe { ctx.read_at::<i64>(RET_OFFSET) }.unwrap_or(-1);
    let address = if call.index == populate::MMAP as u32 || call.index == populate::MREMAP as u32 {
        if ret > 0 { ret as u64 } else { 0 }
    } else if call.index == populate::MLOCKALL as u32
        || call.index == populate::BRK as u32
        || call.index >= populate::EXECVE as u32
    {
        0
    } else {
        call.address
    };
    if address != 0 {
        flush_region(tgid, address & PAGE_MASK, minor + major, 0);
    }
    if config!(events) != 0 {
        let flags = fault_flags::POPULATED | if minor == 0 { fault_flags::MAJOR } else { 0 };
        emit(
            tgid,
            tid,
            flags,
            address,
            NO_LATENCY,
            0,
            minor + major,
            call.index,
        );
    }
    0
}

/// `sys_exit_` with the fentry/kprobe hook sets, which count populated faults one by one and
/// only use the in-flight entry to name the call.
#[tracepoint]
pub fn populate_exit(_ctx: TracePointContext) -> u32 {
    let (_, tid) = current_ids();
    let _ = POPULATE_INFLIGHT.remove(tid);
    0
}

#[inline(always)]
fn task_faults() -> (u64, u64) {
    let off = offsets();
    let task = unsafe { bpf_get_current_task() };
    (
        read_kernel(task, off.task_min_flt),
        read_kernel(task, off.task_maj_flt),
    )
}

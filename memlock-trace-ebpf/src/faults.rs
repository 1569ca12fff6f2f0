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
    EbpfContext,
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_map_lookup_percpu_elem,
    },
    macros::{btf_tracepoint, fentry, fexit, kprobe, kretprobe, map, perf_event, tracepoint},
    maps::{Array, LruHashMap, LruPerCpuHashMap, PerCpuArray, RingBuf},
    programs::{
        BtfTracePointContext, FEntryContext, FExitContext, PerfEventContext, ProbeContext,
        RetProbeContext, TracePointContext,
    },
};
use memlock_trace_common::{
    EventKind, TASK_COMM_LEN,
    faults::{
        FAULT_EVENTS_BYTE_SIZE, FaultConfig, FaultEntry, FaultEvent, FaultKey, FaultStats,
        HIST_BUCKETS, Hist, HistKey, MAX_FAULT_HISTS, MAX_FAULT_KEYS, MAX_FAULT_REGIONS,
        MAX_FAULT_THREADS, PopulateCall, REGION_SLOTS, RegionKey, RegionSlot, RegionValue, SLOTS,
        bucket_of, class, fault_counter, fault_flags, populate, stat,
    },
};

use crate::{
    shared::{is_target, offsets, read_kernel},
    stacks,
};

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
    vm_locked: 0,
    vm_lockonfault: 0,
    vma_vm_flags: 0,
    vma_vm_start: 0,
    region_shift: 16,
    region_slots_mask: 0,
    populate_nrs: [u32::MAX; populate::COUNT],
    _pad2: 0,
};

macro_rules! config {
    ($field:ident) => {
        unsafe { core::ptr::read_volatile(&raw const FAULT_CONFIG.$field) }
    };
}

/// Per process (or thread) counters and latency histogram: per CPU, so a fault never contends
/// with another CPU's; LRU, so a machine with more processes than slots keeps the active ones
/// (the loader reports how many were evicted from `STATS_INSERTS`).
#[map]
static FAULT_STATS: LruPerCpuHashMap<FaultKey, FaultStats> =
    LruPerCpuHashMap::with_max_entries(MAX_FAULT_KEYS, 0);

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

#[map]
static FAULT_HIST: LruPerCpuHashMap<HistKey, Hist> =
    LruPerCpuHashMap::with_max_entries(MAX_FAULT_HISTS, 0);

/// Faults per region, per CPU like the rest (the BPF target has no atomic add in `core`),
/// moved here from `FAULT_REGION_SLOTS` when a slot is needed for another region.
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
    record_start(address);
    0
}

/// The same two tracepoints as BTF-typed raw tracepoints, preferred where the kernel allows
/// them: no record is formatted for the program, which roughly halves the hook's cost.
/// `TP_PROTO(unsigned long address, struct pt_regs *regs, unsigned long error_code)`.
#[btf_tracepoint(function = "page_fault_user")]
pub fn fault_entry_user_btf(ctx: BtfTracePointContext) -> i32 {
    record_start(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "page_fault_kernel")]
pub fn fault_entry_kernel_btf(ctx: BtfTracePointContext) -> i32 {
    record_start(ctx.arg(0));
    0
}

/// A traced task's fault starts: its start goes in this CPU's ring.
#[inline(always)]
fn record_start(address: u64) {
    let (tgid, tid) = current_ids();
    let sole = sole_tgid();
    if sole != 0 {
        if tgid != sole {
            return;
        }
    } else if !is_target(tgid) {
        return;
    }
    if let Some(ring) = FAULT_SLOTS.get_ptr_mut(0) {
        let r = unsafe { &mut *ring };
        let i = r.next as usize & (START_SLOTS - 1);
        r.next = r.next.wrapping_add(1);
        r.slots[i] = StartSlot {
            tid,
            _pad: 0,
            address,
            start_ns: unsafe { bpf_ktime_get_ns() },
        };
    }
}

/// A fault's start, until its completion on the same CPU (tracepoint hook set).
#[repr(C)]
#[derive(Clone, Copy)]
struct StartSlot {
    tid: u32,
    _pad: u32,
    address: u64,
    start_ns: u64,
}

/// Why a per-CPU ring of start slots rather than a per-thread hash entry: a fault starts and
/// completes on one CPU unless it sleeps, so a per-CPU array (no hashing, hot cache lines)
/// serves nearly every fault; measured here it halved the start hook's cost. The ring keeps
/// the last few starts so a fault that sleeps (a major fault's I/O) survives a few others
/// starting meanwhile; one that migrates, or is overtaken by more, is counted in
/// `latency_unmatched` instead of getting a wrong latency.
const START_SLOTS: usize = 4;

#[repr(C)]
#[derive(Clone, Copy)]
struct StartRing {
    next: u32,
    _pad: u32,
    slots: [StartSlot; START_SLOTS],
}

#[map]
static FAULT_SLOTS: PerCpuArray<StartRing> = PerCpuArray::with_max_entries(1, 0);

/// The latency of `tid`'s fault at `address`: its start is in this CPU's ring, or, for a
/// fault that slept and woke on another CPU, in that CPU's (the only case that pays for the
/// search).
#[inline(always)]
fn slot_latency(tid: u32, address: u64) -> Option<u64> {
    let ring = FAULT_SLOTS.get_ptr_mut(0)?;
    if let Some(ns) = take_start(unsafe { &mut *ring }, tid, address) {
        return Some(ns);
    }
    let cpus = config!(nr_cpus).min(MAX_CPUS);
    let this_cpu = unsafe { bpf_get_smp_processor_id() };
    let key = 0u32;
    for cpu in 0..MAX_CPUS {
        if cpu >= cpus {
            break;
        }
        if cpu == this_cpu {
            continue;
        }
        // SAFETY: the helper returns NULL or a pointer to `cpu`'s value of this map.
        let other = unsafe {
            bpf_map_lookup_percpu_elem(
                (&raw const FAULT_SLOTS).cast_mut().cast(),
                (&raw const key).cast(),
                cpu,
            )
        };
        if other.is_null() {
            continue;
        }
        if let Some(ns) = take_start(unsafe { &mut *other.cast::<StartRing>() }, tid, address) {
            return Some(ns);
        }
    }
    None
}

/// CPUs searched for a migrated fault's start (a bound for the verifier).
const MAX_CPUS: u32 = 256;

#[inline(always)]
fn take_start(ring: &mut StartRing, tid: u32, address: u64) -> Option<u64> {
    for slot in &mut ring.slots {
        if slot.tid == tid && slot.address == address {
            slot.tid = 0;
            return Some(unsafe { bpf_ktime_get_ns() }.wrapping_sub(slot.start_ns));
        }
    }
    None
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
    // A start found in the ring also says the task is traced (only targets fill it).
    let latency = if config!(latency) != 0 {
        slot_latency(tid, address)
    } else {
        None
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
    let counted = account(Fault {
        tgid,
        tid,
        cls: if major {
            class::USER_MAJOR
        } else {
            class::USER_MINOR
        },
        latency: latency.unwrap_or(NO_LATENCY),
        address,
        region: address & PAGE_MASK,
        vm_flags: 0,
        syscall: NO_SYSCALL,
        retried: false,
        known_target: latency.is_some(),
    });
    if config!(stacks) != 0 && counted {
        record_stack(ctx, tgid, tid, 1);
    }
}

/// `--stacks`: the counted faults' user stack (see `stacks.rs`).
#[inline(always)]
fn record_stack<C: EbpfContext>(ctx: &C, tgid: u32, tid: u32, count: u64) {
    let tid = if config!(per_thread) != 0 { tid } else { 0 };
    stacks::record(ctx, tgid, tid, count);
}

/// The benchmark's floor (`cargo xtask bench`, `MEMLOCK_TRACE_BENCH_EMPTY_PROGRAMS`): the
/// per-fault hooks above with programs that do nothing, so the hooks' own cost (tracepoint
/// dispatch, perf overflow) can be told apart from the programs'.
#[btf_tracepoint(function = "page_fault_user")]
pub fn bench_empty_entry_user(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "page_fault_kernel")]
pub fn bench_empty_entry_kernel(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[perf_event]
pub fn bench_empty_perf_min(_ctx: PerfEventContext) -> u32 {
    0
}

#[perf_event]
pub fn bench_empty_perf_maj(_ctx: PerfEventContext) -> u32 {
    0
}

/// The benchmark's second floor (`MEMLOCK_TRACE_BENCH_EMPTY_PROGRAMS=clock`): the same hooks
/// with programs that do only what timing a fault cannot do without, a clock read at each end
/// (kept in a per-CPU slot so that neither read can be optimized away).
#[map]
static BENCH_CLOCK: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[btf_tracepoint(function = "page_fault_user")]
pub fn bench_clock_entry_user(_ctx: BtfTracePointContext) -> i32 {
    bench_clock_read();
    0
}

#[btf_tracepoint(function = "page_fault_kernel")]
pub fn bench_clock_entry_kernel(_ctx: BtfTracePointContext) -> i32 {
    bench_clock_read();
    0
}

#[perf_event]
pub fn bench_clock_perf_min(_ctx: PerfEventContext) -> u32 {
    bench_clock_read();
    0
}

#[perf_event]
pub fn bench_clock_perf_maj(_ctx: PerfEventContext) -> u32 {
    bench_clock_read();
    0
}

#[inline(always)]
fn bench_clock_read() {
    if let Some(slot) = BENCH_CLOCK.get_ptr_mut(0) {
        unsafe { *slot = bpf_ktime_get_ns().wrapping_sub(*slot) };
    }
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
    hook_end(&ctx, ret as u32);
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
    hook_end(&ctx, ret as u32);
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
fn hook_end<C: EbpfContext>(ctx: &C, ret: u32) {
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
    let latency = if config!(latency) != 0 {
        unsafe { bpf_ktime_get_ns() }.wrapping_sub(e.start_ns)
    } else {
        NO_LATENCY
    };
    let retried = e.retried != 0;
    e.retried = 0;
    let (address, vm_flags, vm_start) = (e.address, e.vm_flags, e.vm_start);
    let fault = Fault {
        tgid,
        tid,
        cls: class::FAILED,
        latency,
        address,
        region: vm_start,
        vm_flags,
        syscall: NO_SYSCALL,
        retried,
        known_target: true,
    };
    if ret & config!(vm_fault_error) != 0 {
        // A user-mode fault that fails is signalled (SIGSEGV/SIGBUS) and counted by
        // `fault_signal`, like those refused before handle_mm_fault; count here only the
        // others (EFAULT to the kernel, get_user_pages errors, OOM), timing them all.
        let signalled = e.flags & config!(fault_flag_user) != 0 && ret & config!(vm_fault_oom) == 0;
        account(Fault {
            cls: if signalled {
                FAILED_SIGNALLED
            } else {
                class::FAILED
            },
            ..fault
        });
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
    let counted = account(Fault {
        cls,
        syscall,
        ..fault
    });
    if config!(stacks) != 0 && counted {
        record_stack(ctx, tgid, tid, 1);
    }
}

// ---------------------------------------------------------------------------------------
// Shared by all hook sets.
// ---------------------------------------------------------------------------------------

/// fentry/kprobe: a fault begins; remember it per thread (it may sleep, migrate and retry
/// before it completes). A thread with a fault still pending was left by one that never
/// completed (a retry abandoned for a fatal signal): failed.
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
            account(Fault {
                tgid,
                tid,
                cls: class::FAILED,
                latency: NO_LATENCY,
                address: prev_addr,
                region,
                vm_flags: prev_flags,
                syscall: NO_SYSCALL,
                retried: false,
                known_target: true,
            });
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

/// The stats slot of a task, created on its first fault if it is traced. Looked up before
/// the target filter: only traced tasks have one, so a traced task's fault skips the filter.
#[inline(always)]
fn stats_for(tgid: u32, tid: u32, known_target: bool) -> Option<*mut FaultStats> {
    let sole = sole_tgid();
    if sole != 0 {
        if tgid != sole {
            return None;
        }
        let stats = FAULT_SOLE_STATS.get_ptr_mut(0)?;
        unsafe {
            if (*stats).comm[0] == 0 {
                (*stats).comm = bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]);
            }
        }
        return Some(stats);
    }
    let key = FaultKey {
        tgid,
        tid: if config!(per_thread) != 0 { tid } else { 0 },
    };
    if let Some(stats) = FAULT_STATS.get_ptr_mut(key) {
        return Some(stats);
    }
    if !known_target && !is_target(tgid) {
        return None;
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

/// One fault, as a hook saw it.
#[derive(Clone, Copy)]
struct Fault {
    tgid: u32,
    tid: u32,
    /// A [`class`], or [`FAILED_SIGNALLED`].
    cls: u32,
    /// ns, or [`NO_LATENCY`].
    latency: u64,
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

/// A failed fault that `fault_signal` counts: only its latency is recorded here.
const FAILED_SIGNALLED: u32 = 0x100;

/// Counts one completed (or failed) fault; false when the task is not traced.
#[inline(always)]
fn account(f: Fault) -> bool {
    let Fault {
        tgid,
        tid,
        cls,
        latency,
        address,
        region,
        vm_flags,
        syscall,
        retried,
        known_target,
    } = f;
    let Some(stats) = stats_for(tgid, tid, known_target) else {
        return false;
    };
    let s = unsafe { &mut *stats };
    // Constant indices in every arm: nothing for the verifier to bound.
    match cls {
        class::USER_MINOR => s.counts[stat::USER_MINOR] += 1,
        class::USER_MAJOR => s.counts[stat::USER_MAJOR] += 1,
        class::POPULATED_MINOR => s.counts[stat::POPULATED_MINOR] += 1,
        class::POPULATED_MAJOR => s.counts[stat::POPULATED_MAJOR] += 1,
        FAILED_SIGNALLED => {}
        _ => s.counts[stat::FAILED] += 1,
    }
    let cls = if cls == FAILED_SIGNALLED {
        class::FAILED
    } else {
        cls
    };
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
    count_region(tgid, region, vm_flags);
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
    true
}

/// Why per-CPU log-linear slots in the kernel rather than streaming every fault to an
/// HdrHistogram in user space, measured (BENCHMARKS.md, `cargo xtask bench`, first touch of
/// 256 MiB, ~1.8 us per untraced fault): streaming every fault (`--events`, the same
/// aggregation plus a ring buffer record per fault) added 501 ns per fault to the faulting
/// task against 399 ns for the slots, and its user space decodes 65536 records per 256 MiB
/// on a CPU the workload could use (the first measurement, unpinned, doubled the wall time
/// per fault). The slots cost resolution (a bucket is 1/8 of its value wide, the max is kept
/// exact), far below how much fault latency varies; so slots by default, streaming
/// (`--events --sample N`) on request.
#[inline(always)]
fn record_latency(s: &mut FaultStats, tgid: u32, tid: u32, cls: u32, ns: u64) {
    let max = &mut s.max_ns[cls as usize & (SLOTS - 1)];
    if ns > *max {
        *max = ns;
    }
    let bucket = bucket_of(ns) & (HIST_BUCKETS - 1);
    if cls == class::USER_MINOR {
        s.user_minor_hist[bucket] += 1;
        return;
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
            #[expect(
                clippy::needless_borrows_for_generic_args,
                reason = "by value, the 1 KiB histogram would be copied onto the 512-byte BPF stack"
            )]
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
    unsafe { (*hist).counts[bucket] += 1 };
}

/// The run of faults this CPU is counting: consecutive faults of one process in one region
/// (its VMA, or the `1 << region_shift` block of the run's first fault), keyed by the VMA
/// start or the run's first page. That page is where the run began, so the mapping holding
/// it is exact, where a rounded-down address could fall in the neighbouring mapping.
#[map]
static FAULT_REGION_RUN: PerCpuArray<RegionSlot> = PerCpuArray::with_max_entries(1, 0);

/// Where finished runs go first: a per-CPU table indexed by the region, so storing a run
/// costs an inlined array lookup. Why not straight into the hash map `FAULT_REGIONS`: a first
/// touch finishes a run every 16 pages, and each run is a new key, an LRU insert; measured
/// (bpf_stats, 256 MiB first touch) that was ~35 ns per fault, a third of the programs' cost.
/// Consecutive regions take consecutive slots, so up to `REGION_SLOTS` runs of a sequential
/// touch (256 MiB) stay in the table; a slot's occupant moves to the hash map only when
/// another run needs the slot.
#[map]
static FAULT_REGION_SLOTS: PerCpuArray<RegionSlot> = PerCpuArray::with_max_entries(REGION_SLOTS, 0);

/// Counts one fault in `region` (a VMA start when `vm_flags` is set, else a page address).
#[inline(always)]
fn count_region(tgid: u32, region: u64, vm_flags: u64) {
    let exact = u32::from(vm_flags != 0);
    let Some(run) = FAULT_REGION_RUN.get_ptr_mut(0) else {
        return;
    };
    let run = unsafe { &mut *run };
    let same = run.value.faults != 0
        && run.key.tgid == tgid
        && run.key.exact == exact
        && if exact != 0 {
            run.key.start == region
        } else {
            run.key.start >> config!(region_shift) == region >> config!(region_shift)
        };
    if same {
        run.value.faults += 1;
        run.value.vm_flags |= vm_flags;
        return;
    }
    if run.value.faults != 0 {
        stash_run(run.key, run.value);
    }
    run.key = RegionKey {
        tgid,
        exact,
        start: region,
    };
    run.value = RegionValue {
        faults: 1,
        vm_flags,
    };
}

/// A finished run into the region table: added to its slot if the slot holds the same key,
/// else it takes the slot and the previous occupant moves to `FAULT_REGIONS`.
#[inline(always)]
fn stash_run(key: RegionKey, value: RegionValue) {
    let block = if key.exact != 0 {
        key.start >> 12
    } else {
        key.start >> config!(region_shift)
    };
    let index = (block as u32 ^ key.tgid) & config!(region_slots_mask) & (REGION_SLOTS - 1);
    let Some(slot) = FAULT_REGION_SLOTS.get_ptr_mut(index) else {
        return;
    };
    let slot = unsafe { &mut *slot };
    if slot.value.faults != 0
        && slot.key.tgid == key.tgid
        && slot.key.exact == key.exact
        && slot.key.start == key.start
    {
        slot.value.faults += value.faults;
        slot.value.vm_flags |= value.vm_flags;
        return;
    }
    if slot.value.faults != 0 {
        flush_region(
            slot.key.tgid,
            slot.key.start,
            slot.value.faults,
            slot.value.vm_flags,
        );
    }
    slot.key = key;
    slot.value = value;
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
    if every > 1 && !bump(fault_counter::SAMPLE_SEQ).is_multiple_of(every) {
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
        kind: EventKind::Fault as u32,
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

/// `signal:signal_generate` (include/trace/events/signal.h), after the common fields:
///
/// ```text
/// field:int sig;   offset:8;  size:4
/// field:int errno; offset:12; size:4
/// field:int code;  offset:16; size:4
/// field:char comm[16]; offset:20; size:16
/// field:pid_t pid; offset:36; size:4
/// ```
///
/// A page fault the kernel cannot resolve for user mode ends in `force_sig_fault()` on the
/// faulting task: SIGSEGV with `SEGV_MAPERR`/`SEGV_ACCERR`/`SEGV_PKUERR`, or SIGBUS with
/// `BUS_ADRERR`/`BUS_MCEERR_AR`. That is the one place every hook set sees a failed fault,
/// including those refused before `handle_mm_fault` (no VMA, access error). Signals are rare,
/// so this costs nothing per fault.
#[tracepoint]
pub fn fault_signal(ctx: TracePointContext) -> u32 {
    const SIGBUS: i32 = 7;
    const SIGSEGV: i32 = 11;
    let sig = unsafe { ctx.read_at::<i32>(8) }.unwrap_or(0);
    let code = unsafe { ctx.read_at::<i32>(16) }.unwrap_or(0);
    let from_fault = match sig {
        // SEGV_MAPERR 1, SEGV_ACCERR 2, SEGV_PKUERR 4
        SIGSEGV => matches!(code, 1 | 2 | 4),
        // BUS_ADRERR 2, BUS_MCEERR_AR 4
        SIGBUS => matches!(code, 2 | 4),
        _ => false,
    };
    let target = unsafe { ctx.read_at::<i32>(36) }.unwrap_or(-1) as u32;
    let (tgid, tid) = current_ids();
    // Self-inflicted: the faulting task signals itself.
    if !from_fault || target != tid {
        return 0;
    }
    if let Some(stats) = stats_for(tgid, tid, false) {
        unsafe { (*stats).counts[stat::FAILED] += 1 };
    }
    if config!(events) != 0 && is_target(tgid) {
        emit(
            tgid,
            tid,
            fault_flags::FAILED,
            0,
            NO_LATENCY,
            0,
            1,
            NO_SYSCALL,
        );
    }
    0
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
    let Some(stats) = stats_for(tgid, tid, true) else {
        return 0;
    };
    let s = unsafe { &mut *stats };
    s.counts[stat::POPULATED_MINOR] += minor;
    s.counts[stat::POPULATED_MAJOR] += major;
    s.populated_by[call.index as usize & (SLOTS - 1)] += minor + major;
    if config!(stacks) != 0 {
        // The call site of the system call that populated them.
        record_stack(&ctx, tgid, tid, minor + major);
    }
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

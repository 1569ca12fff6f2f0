//! A fault between its start and its completion, for each hook set: where its start waits,
//! how its completion finds it (and so its latency), and what the completion makes of it
//! (a [`Fault`] for [`account`]).

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_ANY,
    helpers::{bpf_get_prandom_u32, bpf_map_lookup_percpu_elem},
    macros::map,
    maps::{LruHashMap, PerCpuArray},
    programs::PerfEventContext,
};
use memlock_trace_common::{
    PAGE_MASK, PAGE_SHIFT,
    faults::{FaultEntry, MAX_FAULT_THREADS, VM_OURS, class, populate},
};

use super::{
    CountedBy, Fault, Latency, NO_SYSCALL, account,
    mappings::{note_vma, resolve, with_sp},
    not_the_sole_target,
    populate::POPULATE_INFLIGHT,
    record_stack,
    regions::{count_region, region_kind_of},
    traced,
};
use crate::{
    arch::{PT_REGS_SP, USER_ADDRESS_END},
    mapping,
    shared::{current_ids, is_target, now_ns, read_kernel, this_cpu},
};

// ---------------------------------------------------------------------------------------
// Hook set 3: tracepoints + perf software events.
// ---------------------------------------------------------------------------------------

/// A traced task's fault starts: its start goes in this CPU's ring. `sp`: the faulting
/// thread's user stack pointer, 0 when not at hand (only the lookups use it).
/// `LOOKUP`: whether it finds the faulting VMA when it counts regions (`--latency-sample`),
/// by [`mapping::TREE_WALK`]: the perf event, not the tracepoints (whose faults the perf
/// completion resolves).
#[inline(always)]
pub(super) fn record_start<const LOOKUP: bool>(address: u64, sp: u64) {
    let (tgid, tid) = current_ids();
    if !traced(tgid) {
        return;
    }
    // Sampled latency: the completion runs for one fault in N, so the mappings are counted
    // here, where every fault passes (user addresses only: a kernel-mode fault on kernel
    // memory has no mapping).
    if config!(counted_by_perf) != 0 && address < USER_ADDRESS_END {
        let vma = if LOOKUP {
            resolve::<{ mapping::TREE_WALK }>(tgid, address, sp)
        } else {
            None
        };
        let (region, vm_flags) = vma.unwrap_or((address & PAGE_MASK, 0));
        count_region(tgid, region, vm_flags, 0);
    }
    if let Some(ring) = FAULT_SLOTS.get_ptr_mut(0) {
        // SAFETY: this CPU's value of a per-CPU map, valid while the program runs; a program
        // runs to completion on its CPU, so nothing else uses it meanwhile.
        let r = unsafe { &mut *ring };
        let i = r.next as usize & (START_SLOTS - 1);
        r.next = r.next.wrapping_add(1);
        r.on_cpu = tid;
        r.slots[i] = StartSlot {
            tid,
            _pad: 0,
            address,
            start_ns: now_ns(),
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
    /// The traced thread whose fault runs on this CPU, 0 for none, on every hook set (kept
    /// here, not in a map of its own, so a start pays no second lookup): set when a fault
    /// starts, or resumes here after a sleep; cleared when it completes. A fault with no
    /// completion (one `--latency-sample` does not time) leaves its thread here until the
    /// next start: that thread's switches then time phases no fault's window takes, a cost
    /// that counts nothing.
    on_cpu: u32,
    slots: [StartSlot; START_SLOTS],
}

#[map]
static FAULT_SLOTS: PerCpuArray<StartRing> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's [`StartRing::on_cpu`], for the context switch to read and hand on.
#[inline(always)]
pub(super) fn fault_on_this_cpu() -> Option<*mut u32> {
    let ring = FAULT_SLOTS.get_ptr_mut(0)?;
    // SAFETY: this CPU's value of a per-CPU map, valid while the program runs.
    Some(unsafe { &raw mut (*ring).on_cpu })
}

/// Thread `tid`'s fault completes on this CPU. Only timed faults are split into causes, so
/// a count-only session's faults skip the lookup.
#[inline(always)]
fn fault_done_on_cpu(tid: u32) {
    if config!(latency) == 0 {
        return;
    }
    if let Some(on_cpu) = fault_on_this_cpu() {
        // SAFETY: this CPU's value, which a program running here has to itself.
        unsafe {
            if *on_cpu == tid {
                *on_cpu = 0;
            }
        }
    }
}

/// The latency of `tid`'s fault at `address`: its start is in this CPU's ring, or, for a
/// fault that slept and woke on another CPU, in that CPU's (the only case that pays for the
/// search).
/// `ACROSS_CPUS`: search the other CPUs' rings too (`bpf_map_lookup_percpu_elem`, 5.19; a
/// program calling a helper the kernel lacks does not load).
#[inline(always)]
fn slot_latency<const ACROSS_CPUS: bool>(tid: u32, address: u64) -> Option<Latency> {
    let ring = FAULT_SLOTS.get_ptr_mut(0)?;
    // SAFETY: as in `record_start`: this CPU's ring, used by nothing else meanwhile.
    if let Some(ns) = take_start(unsafe { &mut *ring }, tid, address) {
        return Some(ns);
    }
    if !ACROSS_CPUS {
        return None;
    }
    let cpus = config!(nr_cpus).min(MAX_CPUS);
    let this_cpu = this_cpu();
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
        // SAFETY: not NULL, so a valid pointer to `cpu`'s ring. That CPU may write it at the
        // same time (a start of its own): plain integers, so the worst a race does is make the
        // tid and address check miss, and the fault counts as unmatched.
        if let Some(ns) = take_start(unsafe { &mut *other.cast::<StartRing>() }, tid, address) {
            return Some(ns);
        }
    }
    None
}

/// CPUs searched for a migrated fault's start (a bound for the verifier).
const MAX_CPUS: u32 = 256;

#[inline(always)]
fn take_start(ring: &mut StartRing, tid: u32, address: u64) -> Option<Latency> {
    for slot in &mut ring.slots {
        if slot.tid == tid && slot.address == address {
            slot.tid = 0;
            let end_ns = now_ns();
            return Some(Latency::Timed {
                ns: end_ns.wrapping_sub(slot.start_ns),
                end_ns,
            });
        }
    }
    None
}

#[inline(always)]
pub(super) fn perf_completion<const ACROSS_CPUS: bool>(ctx: &PerfEventContext, major: bool) {
    let data = ctx.ctx;
    // SAFETY: `ctx.ctx` is the `bpf_perf_event_data` the kernel hands this program, valid
    // for its whole run.
    let address = unsafe { (*data).addr };
    // SAFETY: as above.
    let user_sp = crate::arch::perf_user_sp(unsafe { &(*data).regs });
    let (user_mode, sp) = (user_sp.is_some(), user_sp.unwrap_or(0));
    let (tgid, tid) = current_ids();
    // A start found in the ring also says the task is traced (only targets fill it).
    let latency = if config!(latency) != 0 {
        slot_latency::<ACROSS_CPUS>(tid, address)
    } else {
        None
    };
    if latency.is_some() {
        fault_done_on_cpu(tid);
    }
    if !user_mode {
        // The kernel touched user memory (copy_to_user, exec's clear_user): if that happened
        // inside a populating call, its min_flt delta includes this fault; note it so the
        // delta is not counted twice.
        if let Some(call) = POPULATE_INFLIGHT.get_ptr_mut(tid) {
            // SAFETY: a valid pointer to this thread's own entry (keyed by tid), which only
            // this thread's programs touch, one at a time.
            unsafe {
                if major {
                    (*call).exception_maj += 1;
                } else {
                    (*call).exception_min += 1;
                }
            }
        }
    }
    let cls = if major {
        class::USER_MAJOR
    } else {
        class::USER_MINOR
    };
    let counted_by = if config!(counted_by_perf) != 0 {
        CountedBy::PerfEvents
    } else {
        CountedBy::Here
    };
    // The fault's VMA, looked up now for the region it is counted in (not for a sampled
    // completion, whose region the start counted). A start found says the task is traced;
    // else the same test as `stats_for`'s, so no other process pays for a lookup.
    let vma = if counted_by == CountedBy::Here && (latency.is_some() || traced(tgid)) {
        // A walk, not bpf_find_vma (see `mapping::TREE_WALK`): with the helper, a
        // system-wide session halved fork+exec's rate. A kernel-mode fault's sp is the
        // kernel's: in no user VMA.
        resolve::<{ mapping::TREE_WALK }>(tgid, address, sp)
    } else {
        None
    };
    let (region, vm_flags) = vma.unwrap_or((address & PAGE_MASK, 0));
    let fault = Fault {
        tgid,
        tid,
        cls,
        counted_by,
        latency: latency.unwrap_or(Latency::Unmatched),
        address,
        region,
        vm_flags,
        syscall: NO_SYSCALL,
        retried: false,
        known_target: latency.is_some(),
    };
    let counted = account(ctx.as_ptr(), fault);
    if config!(stacks) != 0 && counted {
        record_stack(ctx, tgid, tid, 1, (region_kind_of(vm_flags), region));
    }
}

// ---------------------------------------------------------------------------------------
// Hook sets 1 and 2: fentry/fexit or kprobe/kretprobe on handle_mm_fault.
// ---------------------------------------------------------------------------------------

/// The fault each thread has in progress. Present only for traced threads, so a hit also
/// answers "is this a target?" without a `TARGET_TGIDS` lookup.
#[map]
static FAULT_ENTRY: LruHashMap<u32, FaultEntry> =
    LruHashMap::with_max_entries(MAX_FAULT_THREADS, 0);

/// `regs`: the faulting user registers, 0 for `get_user_pages` (populated by the kernel).
#[inline(always)]
pub(super) fn hook_start(vma: u64, address: u64, flags: u32, regs: u64) {
    let (tgid, tid) = current_ids();
    // Every fault on the machine runs this.
    if not_the_sole_target(tgid) {
        return;
    }
    start(tgid, tid, vma, address, flags, regs);
}

/// The VMA's flags as the fault is counted with (see [`with_sp`]) and its backing; the user
/// stack pointer is read only for a fault of a traced thread that has registers (not one
/// populated).
#[inline(always)]
fn counted_flags(tgid: u32, vma: u64, vm_start: u64, regs: u64) -> u64 {
    let flags = read_kernel::<u64>(vma, config!(vma_vm_flags)) & !VM_OURS;
    match note_vma(tgid, vma, vm_start, flags) {
        Some((end, backing)) if regs != 0 => {
            with_sp(flags, vm_start, end, read_kernel(regs, PT_REGS_SP)) | backing
        }
        Some((_, backing)) => flags | backing,
        None => flags,
    }
}

#[inline(always)]
pub(super) fn hook_end<C: EbpfContext>(ctx: &C, ret: u32) {
    let (tgid, tid) = current_ids();
    if not_the_sole_target(tgid) {
        return;
    }
    let Some(entry) = FAULT_ENTRY.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: a valid pointer to this thread's own entry (keyed by tid): only this thread's
    // fault hooks use it, and they do not nest.
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
    fault_done_on_cpu(tid);
    let latency = if config!(latency) == 0 || e.start_ns == UNTIMED {
        Latency::Untimed
    } else {
        let end_ns = now_ns();
        Latency::Timed {
            ns: end_ns.wrapping_sub(e.start_ns),
            end_ns,
        }
    };
    let retried = e.retried != 0;
    e.retried = 0;
    let failed = ret & config!(vm_fault_error) != 0;
    // mm_account_fault(): major if VM_FAULT_MAJOR, or if this was a retry.
    let major = ret & config!(vm_fault_major) != 0 || e.flags & config!(fault_flag_tried) != 0;
    let (cls, counted_by, syscall) = if failed {
        // A user-mode fault that fails is signalled (SIGSEGV/SIGBUS) and counted by
        // `fault_signal`, like those refused before handle_mm_fault; counted here are only
        // the others (EFAULT to the kernel, get_user_pages errors, OOM), all timed.
        let signalled = e.flags & config!(fault_flag_user) != 0 && ret & config!(vm_fault_oom) == 0;
        let counted_by = if signalled {
            CountedBy::Signal
        } else {
            CountedBy::Here
        };
        (class::FAILED, counted_by, NO_SYSCALL)
    } else if e.no_regs != 0 {
        let index = match POPULATE_INFLIGHT.get_ptr(tid) {
            // SAFETY: a valid pointer to this thread's own entry, read once.
            Some(call) => unsafe { (*call).index },
            None => populate::OTHER as u32,
        };
        let cls = if major {
            class::POPULATED_MAJOR
        } else {
            class::POPULATED_MINOR
        };
        (cls, CountedBy::Here, index)
    } else {
        let cls = if major {
            class::USER_MAJOR
        } else {
            class::USER_MINOR
        };
        (cls, CountedBy::Here, NO_SYSCALL)
    };
    let (region, vm_flags) = (e.vm_start, e.vm_flags);
    let fault = Fault {
        tgid,
        tid,
        cls,
        counted_by,
        latency,
        address: e.address,
        region,
        vm_flags,
        syscall,
        retried,
        known_target: true,
    };
    let counted = account(ctx.as_ptr(), fault);
    if config!(stacks) != 0 && counted && !failed {
        record_stack(ctx, tgid, tid, 1, (region_kind_of(vm_flags), region));
    }
}

/// `FaultEntry::start_ns` of a fault `--latency-sample` leaves untimed.
const UNTIMED: u64 = 0;

/// The start time of a new fault: the clock, or [`UNTIMED`] for the faults sampling skips
/// (and with no latency asked at all). One fault in `latency_period` of each thread is timed;
/// `untimed_left` counts down to it.
#[inline(always)]
fn start_time(untimed_left: &mut u32) -> u64 {
    if config!(latency) == 0 {
        return UNTIMED;
    }
    if *untimed_left > 0 {
        *untimed_left -= 1;
        return UNTIMED;
    }
    *untimed_left = config!(latency_period).saturating_sub(1);
    now_ns()
}

/// fentry/kprobe: a fault begins; remember it per thread (it may sleep, migrate and retry
/// before it completes). A thread with a fault still pending was left by one that never
/// completed (a retry abandoned for a fatal signal): failed.
#[inline(always)]
fn start(tgid: u32, tid: u32, vma: u64, address: u64, flags: u32, regs: u64) {
    let no_regs = u32::from(regs == 0);
    if let Some(entry) = FAULT_ENTRY.get_ptr_mut(tid) {
        // SAFETY: as in `hook_end`: this thread's own entry, used by nothing else meanwhile.
        let e = unsafe { &mut *entry };
        let retry_of_same = e.retried != 0 && e.address >> PAGE_SHIFT == address >> PAGE_SHIFT;
        if e.pending != 0 && !retry_of_same {
            let (prev_addr, prev_start, prev_flags) = (e.address, e.vm_start, e.vm_flags);
            let region = if prev_flags != 0 {
                prev_start
            } else {
                prev_addr & PAGE_MASK
            };
            e.pending = 0;
            let fault = Fault {
                tgid,
                tid,
                cls: class::FAILED,
                counted_by: CountedBy::Here,
                latency: Latency::Unmatched,
                address: prev_addr,
                region,
                vm_flags: prev_flags,
                syscall: NO_SYSCALL,
                retried: false,
                known_target: true,
            };
            // Found at the next fault's start: not this program's fault, no instruction pointer.
            account(core::ptr::null_mut(), fault);
        }
        // A retry keeps its first attempt's start, so the latency covers every attempt.
        if !(e.pending != 0 && retry_of_same) {
            e.start_ns = start_time(&mut e.untimed_left);
            e.retried = 0;
        }
        e.tgid = tgid;
        e.pending = 1;
        e.address = address;
        e.flags = flags;
        e.no_regs = no_regs;
        // Read the VMA now: after a VM_FAULT_RETRY or COMPLETED return the lock is dropped
        // and the VMA may be gone.
        e.vm_start = read_kernel(vma, config!(vma_vm_start));
        e.vm_flags = counted_flags(tgid, vma, e.vm_start, regs);
        mark_on_cpu(tid);
        return;
    }
    if !is_target(tgid) {
        return;
    }
    // A new thread's first timed fault comes at a random place in its first period, so that
    // threads that live for a few faults are not timed at their first one only.
    let period = config!(latency_period).max(1);
    // SAFETY: the helper has no preconditions.
    let mut untimed_left = unsafe { bpf_get_prandom_u32() } % period;
    let vm_start = read_kernel(vma, config!(vma_vm_start));
    let entry = FaultEntry {
        tgid,
        pending: 1,
        start_ns: start_time(&mut untimed_left),
        address,
        flags,
        no_regs,
        vm_flags: counted_flags(tgid, vma, vm_start, regs),
        vm_start,
        retried: 0,
        untimed_left,
    };
    if FAULT_ENTRY.insert(tid, entry, u64::from(BPF_ANY)).is_err() {
        super::update_failed("FAULT_ENTRY");
    }
    mark_on_cpu(tid);
}

/// Thread `tid`'s fault starts on this CPU (fentry/kprobe: the tracepoint set's start
/// marks it with the slot it writes), where its time is split into causes.
#[inline(always)]
fn mark_on_cpu(tid: u32) {
    if config!(latency) == 0 {
        return;
    }
    if let Some(on_cpu) = fault_on_this_cpu() {
        // SAFETY: this CPU's value, which a program running here has to itself.
        unsafe { *on_cpu = tid };
    }
}

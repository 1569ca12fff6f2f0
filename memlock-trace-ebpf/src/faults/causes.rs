//! Why a fault took its time. The vmscan and compaction tracepoints time each phase of
//! reclaim, compaction and throttling a traced thread goes through; a timed fault's
//! completion takes the phases that began and ended within it ([`split`]). They fire only
//! under memory pressure, and a thread not traced leaves at once; a completion looks for
//! phases only when one ended after its fault began, an array read otherwise.
//!
//! Time off CPU is timed at every context switch ([`cause_off_cpu`]), so the switch pays
//! only array reads unless a fault is involved: the thread switched out is checked against
//! this CPU's fault in flight ([`fault_on_this_cpu`]), the one switched in only while some
//! fault is off CPU.
//!
//! And what a major fault waited for ([`major_kind`]): told by its VMA's backing, and for a
//! private file mapping, whose written pages swap like anonymous memory, by whether the
//! fault read a page into the page cache (`filemap:mm_filemap_add_to_page_cache`).

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::{btf_tracepoint, map, tracepoint},
    maps::{Array, LruHashMap, PerCpuArray},
    programs::{BtfTracePointContext, TracePointContext},
};
use memlock_trace_common::{
    causes::{
        MAX_PHASE_THREADS, PHASES, Phase, ThreadPhases,
        cause::{self, Cause},
    },
    faults::{VM_BACKING_KNOWN, VM_FILE_BACKED, VM_SHMEM_BACKED, class},
    vma::VM_MAYSHARE,
};

use super::{inflight::fault_on_this_cpu, traced};
use crate::shared::{add_shared, current_ids, now_ns, read_kernel, tp_field};

#[map]
static FAULT_PHASES: LruHashMap<u32, ThreadPhases> =
    LruHashMap::with_max_entries(MAX_PHASE_THREADS, 0);

/// A new thread's entry, never written: 432 bytes, too many for the BPF stack.
#[map]
static PHASES_ZERO: PerCpuArray<ThreadPhases> = PerCpuArray::with_max_entries(1, 0);

#[map]
static PHASE_LAST_END: Array<u64> = Array::with_max_entries(1, 0);

/// A traced thread begins a phase of `cause`.
#[inline(always)]
fn begin(cause: Cause) {
    let (tgid, tid) = current_ids();
    if !traced(tgid) {
        return;
    }
    if let Some(t) = phases_of(tid) {
        // SAFETY: this thread's own entry (keyed by tid), which only its programs touch,
        // one at a time.
        unsafe { (*t).open[cause as usize] = now_ns() };
    }
}

/// Thread `tid`'s entry, made if it has none.
#[inline(always)]
fn phases_of(tid: u32) -> Option<*mut ThreadPhases> {
    if FAULT_PHASES.get_ptr(tid).is_none() {
        let zero = PHASES_ZERO.get_ptr(0)?;
        #[expect(
            clippy::needless_borrows_for_generic_args,
            reason = "by value, the entry would be copied onto the 512-byte BPF stack"
        )]
        // SAFETY: this CPU's value of PHASES_ZERO, which nothing writes.
        let _ = FAULT_PHASES.insert(tid, unsafe { &*zero }, u64::from(BPF_NOEXIST));
    }
    FAULT_PHASES.get_ptr_mut(tid)
}

/// The thread's phase of `cause` ends (a thread that began none has no entry).
#[inline(always)]
fn end(cause: Cause) {
    let (_, tid) = current_ids();
    let Some(t) = FAULT_PHASES.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: as in `begin`.
    let t = unsafe { &mut *t };
    let begin_ns = t.open[cause as usize];
    if begin_ns == 0 {
        return;
    }
    t.open[cause as usize] = 0;
    push(t, begin_ns, now_ns(), cause);
}

#[inline(always)]
fn push(t: &mut ThreadPhases, begin_ns: u64, end_ns: u64, cause: Cause) {
    t.ended[t.next as usize & (PHASES - 1)] = Phase {
        begin_ns,
        end_ns,
        cause: cause as u64,
    };
    t.next = t.next.wrapping_add(1);
    if let Some(last) = PHASE_LAST_END.get_ptr_mut(0) {
        // SAFETY: the array's one value; a plain store (a racing one is as recent).
        unsafe { *last = end_ns };
    }
}

/// The time in each cause of the fault of thread `tid` that began at `start_ns` and ended at
/// `end_ns`; None when no phase ended within it. Throttling happens inside a reclaim: its
/// time is taken from the reclaim's.
#[inline(always)]
pub(super) fn split(tid: u32, start_ns: u64, end_ns: u64) -> Option<[u64; cause::COUNT]> {
    let last = PHASE_LAST_END.get(0).copied().unwrap_or(0);
    if last < start_ns {
        return None;
    }
    let t = FAULT_PHASES.get_ptr(tid)?;
    let mut out = [0u64; cause::COUNT];
    let mut any = false;
    for i in 0..PHASES {
        // SAFETY: as in `begin`; read only.
        let p = unsafe { (*t).ended[i] };
        if p.begin_ns >= start_ns
            && p.end_ns <= end_ns
            && p.end_ns >= p.begin_ns
            && let Some(sum) = out.get_mut(p.cause as usize)
        {
            *sum += p.end_ns - p.begin_ns;
            any = true;
        }
    }
    if !any {
        return None;
    }
    let mut throttled = out[Cause::Throttled as usize];
    for reclaim in [Cause::DirectReclaim as usize, Cause::MemcgReclaim as usize] {
        let taken = throttled.min(out[reclaim]);
        out[reclaim] -= taken;
        throttled -= taken;
    }
    Some(out)
}

/// A program that begins or ends a cause's phase at its tracepoint (named by the loader).
macro_rules! phase_edge {
    ($($name:ident => $edge:ident($cause:ident);)*) => {$(
        #[tracepoint]
        pub fn $name(_ctx: TracePointContext) -> u32 {
            $edge(Cause::$cause);
            0
        }
    )*};
}

phase_edge! {
    cause_direct_reclaim_begin => begin(DirectReclaim);
    cause_direct_reclaim_end => end(DirectReclaim);
    cause_memcg_reclaim_begin => begin(MemcgReclaim);
    cause_memcg_reclaim_end => end(MemcgReclaim);
    cause_compaction_begin => begin(Compaction);
    cause_compaction_end => end(Compaction);
}

/// `vmscan:mm_vmscan_throttled` (5.16), after the sleep, after the 8 bytes of common fields:
///
/// ```text
/// field:int nid;          offset:8;  size:4
/// field:int usec_timeout; offset:12; size:4
/// field:int usec_delayed; offset:16; size:4
/// ```
#[tracepoint]
pub fn cause_throttled(ctx: TracePointContext) -> u32 {
    let (_, tid) = current_ids();
    let Some(t) = FAULT_PHASES.get_ptr_mut(tid) else {
        return 0;
    };
    let delayed_ns = u64::from(tp_field::<u32>(&ctx, 16).unwrap_or(0)) * 1000;
    let now = now_ns();
    // SAFETY: as in `begin`.
    push(
        unsafe { &mut *t },
        now.saturating_sub(delayed_ns),
        now,
        Cause::Throttled,
    );
    0
}

/// Faults off CPU now: the switch looks up the thread it puts on the CPU only when some are.
/// An entry the LRU evicts with its phase open leaves it high for good: the switches then pay
/// that lookup, and count nothing wrong.
#[map]
static OFF_CPU_NOW: Array<u64> = Array::with_max_entries(1, 0);

/// `sched_switch(preempt, prev, next)`, run by the thread switched out. A fault of its
/// switched out begins a phase off CPU; the thread switched in ends its phase, unless a
/// reclaim or compaction it is in has the time (a throttled reclaim sleeps), and its fault,
/// in flight again, is on this CPU.
#[btf_tracepoint(function = "sched_switch")]
pub fn cause_off_cpu(ctx: BtfTracePointContext) -> i32 {
    let Some(on_cpu) = fault_on_this_cpu() else {
        return 0;
    };
    let (_, prev) = current_ids();
    // SAFETY: this CPU's value, which a program running here has to itself.
    if unsafe { *on_cpu } == prev && prev != 0 {
        // SAFETY: as above.
        unsafe { *on_cpu = 0 };
        switched_out(prev);
    }
    if OFF_CPU_NOW.get(0).copied().unwrap_or(0) == 0 {
        return 0;
    }
    // Argument 2 of sched_switch: `struct task_struct *next`.
    let next_task: u64 = ctx.arg(2);
    let next = read_kernel::<u32>(next_task, config!(task_pid));
    let Some(t) = FAULT_PHASES.get_ptr_mut(next) else {
        return 0;
    };
    // SAFETY: thread `next`'s entry: it is not running, so none of its programs is.
    let t = unsafe { &mut *t };
    let begin_ns = t.open[Cause::OffCpu as usize];
    if begin_ns == 0 {
        return 0;
    }
    t.open[Cause::OffCpu as usize] = 0;
    // Switched out inside a reclaim or compaction (none begins or ends off CPU): its time.
    if !t.open[..Cause::OffCpu as usize].iter().any(|&b| b != 0) {
        push(t, begin_ns, now_ns(), Cause::OffCpu);
    }
    if let Some(now) = OFF_CPU_NOW.get_ptr_mut(0) {
        add_shared(now, u64::MAX);
    }
    // SAFETY: as above.
    unsafe { *on_cpu = next };
    0
}

#[inline(always)]
fn switched_out(tid: u32) {
    let Some(t) = phases_of(tid) else {
        return;
    };
    // SAFETY: this thread's own entry, as in `begin`.
    let t = unsafe { &mut *t };
    if t.open[Cause::OffCpu as usize] != 0 {
        return;
    }
    // Opened inside a reclaim or compaction too, so that the switch in hands the fault on to
    // its CPU, where it may sleep again after.
    t.open[Cause::OffCpu as usize] = now_ns();
    if let Some(now) = OFF_CPU_NOW.get_ptr_mut(0) {
        add_shared(now, 1);
    }
}

/// When each traced thread last read a page into the page cache.
#[map]
static FAULT_PAGE_READS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_PHASE_THREADS, 0);

/// `filemap:mm_filemap_add_to_page_cache`: a traced thread reads a page in (a fault's, or its
/// readahead's, or a `read` call's: only a fault's window makes it one).
#[tracepoint]
pub fn cause_page_read(_ctx: TracePointContext) -> u32 {
    let (tgid, tid) = current_ids();
    if !traced(tgid) {
        return 0;
    }
    let now = now_ns();
    match FAULT_PAGE_READS.get_ptr_mut(tid) {
        // SAFETY: this thread's own entry, which only its programs touch, one at a time.
        Some(at) => unsafe { *at = now },
        None => {
            let _ = FAULT_PAGE_READS.insert(tid, now, 0);
        }
    }
    0
}

/// The class a timed major fault of thread `tid` between `start_ns` and `end_ns`, in a VMA
/// with `vm_flags`, is also counted in; None when its VMA's backing is not known. No file:
/// anonymous memory, swapped. A shmem file: shmem, swapped (a private mapping's written
/// pages counted there too). A shared mapping of another file: its page read in. A private
/// one: read in if the fault read a page into the page cache, else a written page's swap-in
/// (or a wait for a read another fault began: counted as a swap-in).
#[inline(always)]
pub(super) fn major_kind(tid: u32, vm_flags: u64, start_ns: u64, end_ns: u64) -> Option<u32> {
    if vm_flags & VM_BACKING_KNOWN == 0 {
        return None;
    }
    if vm_flags & VM_FILE_BACKED == 0 {
        return Some(class::MAJOR_ANON_SWAP_IN);
    }
    if vm_flags & VM_SHMEM_BACKED != 0 {
        return Some(class::MAJOR_SHMEM_SWAP_IN);
    }
    let read_in = || {
        FAULT_PAGE_READS
            .get_ptr(tid)
            // SAFETY: as in `cause_page_read`; read only.
            .is_some_and(|at| (start_ns..=end_ns).contains(unsafe { &*at }))
    };
    if vm_flags & VM_MAYSHARE != 0 || read_in() {
        Some(class::MAJOR_FILE_READ)
    } else {
        Some(class::MAJOR_ANON_SWAP_IN)
    }
}

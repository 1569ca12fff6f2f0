//! Latency histograms: per-CPU log-linear slots in the kernel, per process (or thread) and
//! class, a timed fault's latency added to its class's (see [`record_latency`] for why).

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use memlock_trace_common::faults::{
    FaultKey, FaultStats, HIST_BUCKETS, Hist, HistKey, MAX_FAULT_HISTS, SLOTS, bucket_of, class,
    fault_counter,
};

use super::{bump, update_failed};
use crate::shared::{add_shared_u32, current_process_start_ns};

/// Latency histograms per process (or thread) and class, shared by the CPUs like
/// [`FAULT_STATS`].
#[map]
static FAULT_HIST: LruHashMap<HistKey, Hist> = LruHashMap::with_max_entries(MAX_FAULT_HISTS, 0);

/// The sole target's minor-fault latency histogram, per CPU like its statistics: one value,
/// and an inlined array lookup on the commonest fault, where `FAULT_HIST` is a hash lookup.
#[map]
static FAULT_SOLE_HIST: PerCpuArray<Hist> = PerCpuArray::with_max_entries(1, 0);

/// Zeroed values to insert from: a 1 KiB histogram does not fit the 512-byte BPF stack.
#[map]
static HIST_ZERO: PerCpuArray<Hist> = PerCpuArray::with_max_entries(1, 0);

/// Why per-CPU log-linear slots in the kernel rather than streaming every fault to an
/// HdrHistogram in user space, measured (BENCHMARKS.md, `cargo xtask bench`, first touch of
/// 256 MiB, ~1.8 us per untraced fault): streaming every fault (`--events`, the same
/// aggregation plus a ring buffer record per fault) added 501 ns per fault to the faulting
/// task against 399 ns for the slots, and its user space decodes 65536 records per 256 MiB
/// on a CPU the workload could use (the first measurement, unpinned, doubled the wall time
/// per fault). The slots cost resolution (a bucket is 1/8 of its value wide, the max is kept
/// exact), far below how much fault latency varies; so slots by default, streaming
/// (`--events --sample N`) on request. `start_ns`: the start time of `s`'s key, as
/// [`stats_for`] gives it; `None`, `s` is the sole target's, whose minor faults go to
/// [`FAULT_SOLE_HIST`].
#[inline(always)]
pub(super) fn record_latency(
    s: &mut FaultStats,
    start_ns: Option<u64>,
    tgid: u32,
    tid: u32,
    cls: u32,
    ns: u64,
) {
    note_max(s, cls, ns);
    let bucket = bucket_of(ns) & (HIST_BUCKETS - 1);
    if cls == class::USER_MINOR && start_ns.is_none() {
        if let Some(hist) = FAULT_SOLE_HIST.get_ptr_mut(0) {
            // SAFETY: this CPU's value of a per-CPU map, used by nothing else meanwhile.
            unsafe { (*hist).counts[bucket] += 1 };
        }
        return;
    }
    let key = hist_key(start_ns, tgid, tid, cls);
    add_to_hist(&key, bucket);
}

/// The histogram key of a task's class; `start_ns` as [`record_latency`] takes it.
#[inline(always)]
fn hist_key(start_ns: Option<u64>, tgid: u32, tid: u32, cls: u32) -> HistKey {
    HistKey {
        key: FaultKey {
            tgid,
            tid: if config!(per_thread) != 0 { tid } else { 0 },
            start_ns: start_ns.unwrap_or_else(current_process_start_ns),
        },
        class: cls,
        _pad: 0,
    }
}

/// One more fault in `bucket` of the histogram of `key`, created if new.
#[inline(always)]
fn add_to_hist(key: &HistKey, bucket: usize) {
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
                // SAFETY: this CPU's value of HIST_ZERO, which nothing writes.
                .insert(key, unsafe { &*zero }, u64::from(BPF_NOEXIST))
                .is_ok()
            {
                bump(fault_counter::HIST_INSERTS);
            }
            match FAULT_HIST.get_ptr_mut(key) {
                Some(hist) => hist,
                None => {
                    update_failed("FAULT_HIST");
                    return;
                }
            }
        }
    };
    // SAFETY: the shared histogram entry, valid (RCU) while the program runs; an aligned u32
    // added to atomically (the result unused: the add every kernel verifies).
    add_shared_u32(
        unsafe { &raw mut (*hist).counts[bucket & (HIST_BUCKETS - 1)] },
        1,
    );
}

/// The longest latency of `cls` so far. Not atomic (no atomic max before 5.12): two CPUs
/// timing one process's faults at once may keep the smaller of their two maxima.
#[inline(always)]
fn note_max(s: &mut FaultStats, cls: u32, ns: u64) {
    let max = &mut s.max_ns[cls as usize & (SLOTS - 1)];
    if ns > *max {
        *max = ns;
    }
}

/// A timed major fault's latency again under its kind (`class::MAJOR_*`), as
/// [`record_latency`] (never the sole target's fast path: not a minor fault).
#[inline(always)]
pub(super) fn record_kind_latency(
    s: &mut FaultStats,
    start_ns: Option<u64>,
    tgid: u32,
    tid: u32,
    kind: u32,
    ns: u64,
) {
    note_max(s, kind, ns);
    record_kind(&hist_key(start_ns, tgid, tid, kind), bucket_of(ns) as u32);
}

/// Not inlined: a third inlined histogram update in every completion left the verifier
/// reading a register never written (`R9 !read_ok`, 6.18).
#[inline(never)]
fn record_kind(key: &HistKey, bucket: u32) {
    add_to_hist(key, bucket as usize);
}

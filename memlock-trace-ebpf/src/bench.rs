//! Programs for `cargo xtask bench` only, never attached by the tracer: the floors the
//! fault hooks' cost is measured against.

use aya_ebpf::{
    macros::{btf_tracepoint, map, perf_event},
    maps::PerCpuArray,
    programs::{BtfTracePointContext, PerfEventContext},
};

use crate::shared::now_ns;

/// The benchmark's floor (`cargo xtask bench`, hidden flag `--bench-floor empty`): the
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

/// The benchmark's second floor (`--bench-floor clock`): the same hooks
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
        // SAFETY: this CPU's value of a per-CPU map, valid while the program runs; a program
        // runs to completion on its CPU, so nothing else uses it meanwhile.
        unsafe { *slot = now_ns().wrapping_sub(*slot) };
    }
}

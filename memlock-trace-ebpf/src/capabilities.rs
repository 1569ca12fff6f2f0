//! Empty programs of each kind, loaded and attached once by `memlock-trace probe` to learn
//! what the running kernel allows. They do nothing when they run.

use aya_ebpf::{
    macros::{btf_tracepoint, fentry, kprobe, perf_event, tracepoint},
    programs::{
        BtfTracePointContext, FEntryContext, PerfEventContext, ProbeContext, TracePointContext,
    },
};

#[fentry(function = "handle_mm_fault")]
pub fn can_fentry(_ctx: FEntryContext) -> i32 {
    0
}

#[kprobe]
pub fn can_kprobe(_ctx: ProbeContext) -> u32 {
    0
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn can_tp_btf(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[tracepoint]
pub fn can_tracepoint(_ctx: TracePointContext) -> u32 {
    0
}

#[perf_event]
pub fn can_perf_event(_ctx: PerfEventContext) -> u32 {
    0
}

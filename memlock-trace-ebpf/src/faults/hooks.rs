//! The programs of the three fault hook sets, thin: each reads what its hook hands it and
//! calls the body in [`super::inflight`]. The loader attaches one set and looks the programs
//! up by these names.

use aya_ebpf::{
    macros::{btf_tracepoint, fentry, fexit, kprobe, kretprobe, perf_event, tracepoint},
    programs::{
        BtfTracePointContext, FEntryContext, FExitContext, PerfEventContext, ProbeContext,
        RetProbeContext, TracePointContext,
    },
};

use super::inflight::{hook_end, hook_start, perf_completion, record_start};
use crate::shared::tp_field;

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
    let address = tp_field::<u64>(&ctx, 8).unwrap_or(0);
    record_start::<false>(address, 0);
    0
}

/// The same two tracepoints as BTF-typed raw tracepoints, preferred where the kernel allows
/// them: no record is formatted for the program, which roughly halves the hook's cost.
/// `TP_PROTO(unsigned long address, struct pt_regs *regs, unsigned long error_code)`.
#[btf_tracepoint(function = "page_fault_user")]
pub fn fault_entry_user_btf(ctx: BtfTracePointContext) -> i32 {
    record_start::<false>(ctx.arg(0), 0);
    0
}

#[btf_tracepoint(function = "page_fault_kernel")]
pub fn fault_entry_kernel_btf(ctx: BtfTracePointContext) -> i32 {
    record_start::<false>(ctx.arg(0), 0);
    0
}

/// `PERF_COUNT_SW_PAGE_FAULTS`, counted at the top of `do_user_addr_fault()` (before the
/// VMA lookup and `handle_mm_fault()`) for every fault on a user address, from user or
/// kernel mode: the start, when the loader opens it on each target thread (period 1), so
/// that processes not traced never run a program at their faults' start. The address is
/// the event's sample address.
///
/// With `--latency-sample` it also counts every fault's region, keyed by the VMA it finds
/// by a walk of the VMA tree (`mapping::TREE_WALK`).
#[perf_event]
pub fn fault_perf_start(ctx: PerfEventContext) -> u32 {
    record_start::<true>(perf_address(&ctx), perf_user_sp(&ctx));
    0
}

/// The event's sample address: the faulting address.
#[inline(always)]
fn perf_address(ctx: &PerfEventContext) -> u64 {
    // SAFETY: `ctx.ctx` is the `bpf_perf_event_data` the kernel hands this program, valid
    // for its whole run.
    unsafe { (*ctx.ctx).addr }
}

/// The faulting thread's stack pointer, for a fault in user mode (a kernel-mode fault's sp
/// is the kernel's); 0 otherwise.
#[inline(always)]
fn perf_user_sp(ctx: &PerfEventContext) -> u64 {
    // SAFETY: as in `perf_address`.
    let regs = unsafe { &(*ctx.ctx).regs };
    crate::arch::perf_user_sp(regs).unwrap_or(0)
}

/// `PERF_COUNT_SW_PAGE_FAULTS_MIN`, fired by `mm_account_fault()` after `min_flt++` for a
/// completed fault that has `regs`.
#[perf_event]
pub fn fault_perf_min(ctx: PerfEventContext) -> u32 {
    perf_completion::<true>(&ctx, false);
    0
}

#[perf_event]
pub fn fault_perf_maj(ctx: PerfEventContext) -> u32 {
    perf_completion::<true>(&ctx, true);
    0
}

/// [`fault_perf_min`] for kernels without `bpf_map_lookup_percpu_elem` (5.19): a fault's
/// start is looked for on this CPU only (one that migrated counts as unmatched).
#[perf_event]
pub fn fault_perf_min_local(ctx: PerfEventContext) -> u32 {
    perf_completion::<false>(&ctx, false);
    0
}

/// [`fault_perf_maj`] for kernels without `bpf_map_lookup_percpu_elem` (5.19).
#[perf_event]
pub fn fault_perf_maj_local(ctx: PerfEventContext) -> u32 {
    perf_completion::<false>(&ctx, true);
    0
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
    hook_start(vma, address, flags as u32, regs);
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
    hook_start(vma, address, flags as u32, regs);
    0
}

#[kretprobe]
pub fn handle_mm_fault_kretprobe(ctx: RetProbeContext) -> u32 {
    let ret: u64 = ctx.ret();
    hook_end(&ctx, ret as u32);
    0
}

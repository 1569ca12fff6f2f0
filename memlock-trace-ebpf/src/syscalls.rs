//! mlock-family system calls: `sys_enter_*` records the arguments and the task's counters,
//! `sys_exit_*` emits one [`SyscallEvent`] with the deltas.
//!
//! Tracepoint formats (`/sys/kernel/tracing/events/syscalls/<name>/format`), after the
//! 8 bytes of common fields:
//!
//! ```text
//! sys_enter_mlock2:   field:int __syscall_nr; offset:8;  size:4
//!                     field:unsigned long start; offset:16; size:8
//!                     field:size_t len;    offset:24; size:8
//!                     field:int flags;     offset:32; size:8
//! sys_enter_mlock, sys_enter_munlock: start at 16, len at 24
//! sys_enter_mlockall: field:int flags;     offset:16; size:8
//! sys_enter_munlockall: no arguments
//! sys_exit_*:         field:int __syscall_nr; offset:8;  size:4
//!                     field:long ret;      offset:16; size:8
//! ```

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_current_comm, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use memlock_trace_common::{EventKind, MAX_INFLIGHT, SyscallEvent, counter};

use crate::shared::{EVENTS, TaskCounters, count, is_target, task_counters};

const NR_OFFSET: usize = 8;
const FIRST_ARG_OFFSET: usize = 16;
const RET_OFFSET: usize = 16;

/// A call between its entry and exit, keyed by tid.
#[derive(Clone, Copy)]
#[repr(C)]
struct InFlight {
    nr: u32,
    _pad: u32,
    enter_ns: u64,
    args: [u64; 3],
    before: TaskCountersRepr,
}

/// [`TaskCounters`] with a fixed layout, for storage in a map.
#[derive(Clone, Copy)]
#[repr(C)]
struct TaskCountersRepr {
    min_flt: u64,
    maj_flt: u64,
    locked_vm: u64,
    map_count: i32,
    _pad: u32,
}

impl From<TaskCounters> for TaskCountersRepr {
    fn from(c: TaskCounters) -> Self {
        Self {
            min_flt: c.min_flt,
            maj_flt: c.maj_flt,
            locked_vm: c.locked_vm,
            map_count: c.map_count,
            _pad: 0,
        }
    }
}

#[map]
static INFLIGHT: HashMap<u32, InFlight> = HashMap::with_max_entries(MAX_INFLIGHT, 0);

#[tracepoint]
pub fn sys_enter_mlock(ctx: TracePointContext) -> u32 {
    enter::<2>(&ctx)
}

#[tracepoint]
pub fn sys_enter_mlock2(ctx: TracePointContext) -> u32 {
    enter::<3>(&ctx)
}

#[tracepoint]
pub fn sys_enter_munlock(ctx: TracePointContext) -> u32 {
    enter::<2>(&ctx)
}

#[tracepoint]
pub fn sys_enter_mlockall(ctx: TracePointContext) -> u32 {
    enter::<1>(&ctx)
}

#[tracepoint]
pub fn sys_enter_munlockall(ctx: TracePointContext) -> u32 {
    enter::<0>(&ctx)
}

/// Attached to all five `sys_exit_*` tracepoints: the exit record has the same layout for each.
#[tracepoint]
pub fn sys_exit_mlock_family(ctx: TracePointContext) -> u32 {
    exit(&ctx);
    0
}

/// Records entry state; `ARGS` is how many 8-byte argument slots this tracepoint has, so we
/// never read past the end of its record.
#[inline(always)]
fn enter<const ARGS: usize>(ctx: &TracePointContext) -> u32 {
    if !is_target(ctx.tgid()) {
        return 0;
    }
    let mut args = [0u64; 3];
    for (i, arg) in args.iter_mut().enumerate().take(ARGS) {
        *arg = unsafe { ctx.read_at::<u64>(FIRST_ARG_OFFSET + 8 * i) }.unwrap_or(0);
    }
    let entry = InFlight {
        nr: unsafe { ctx.read_at::<i32>(NR_OFFSET) }.unwrap_or(-1) as u32,
        _pad: 0,
        enter_ns: unsafe { bpf_ktime_get_ns() },
        args,
        before: task_counters().into(),
    };
    if INFLIGHT.insert(ctx.pid(), entry, 0).is_err() {
        count(counter::INFLIGHT_FULL);
    }
    0
}

#[inline(always)]
fn exit(ctx: &TracePointContext) {
    let tid = ctx.pid();
    let Some(entry) = INFLIGHT.get_ptr(&tid) else {
        return;
    };
    let entry = unsafe { *entry };
    let _ = INFLIGHT.remove(&tid);
    let now = unsafe { bpf_ktime_get_ns() };
    let after = task_counters();
    let ret = unsafe { ctx.read_at::<i64>(RET_OFFSET) }.unwrap_or(0);

    let Some(mut slot) = EVENTS.reserve::<SyscallEvent>(0) else {
        count(counter::RINGBUF_DROPPED);
        return;
    };
    slot.write(SyscallEvent {
        kind: EventKind::Syscall as u32,
        nr: entry.nr,
        tgid: ctx.tgid(),
        tid,
        enter_ns: entry.enter_ns,
        duration_ns: now - entry.enter_ns,
        args: entry.args,
        ret,
        min_flt: after.min_flt.wrapping_sub(entry.before.min_flt),
        maj_flt: after.maj_flt.wrapping_sub(entry.before.maj_flt),
        locked_vm_before: entry.before.locked_vm,
        locked_vm_after: after.locked_vm,
        map_count_before: entry.before.map_count,
        map_count_after: after.map_count,
        comm: bpf_get_current_comm().unwrap_or_default(),
        process_start_ns: crate::process::current_process_start_ns(),
    });
    slot.submit(crate::shared::submit_flags());
}

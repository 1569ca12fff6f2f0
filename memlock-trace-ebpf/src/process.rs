//! Process lifecycle: `--follow-children` (fork) and removal of exited targets (exit), which
//! keep the target set in step with the processes it names; at exit, also the name a process
//! ended with (`EXIT_COMMS`). The per-process filters
//! (`--comm`, `--cgroup`) and the process start time live in `shared.rs`, beside the
//! target check every family calls.
//!
//! BTF-typed tracepoints (`tp_btf`), because the classic `sched:sched_process_fork` record
//! carries only the child's pid, which cannot tell a new process from a new thread:
//!
//! ```text
//! include/trace/events/sched.h (v6.1):
//! TRACE_EVENT(sched_process_fork,
//!     TP_PROTO(struct task_struct *parent, struct task_struct *child), ...)
//! DEFINE_EVENT(sched_process_template, sched_process_exit,
//!     TP_PROTO(struct task_struct *p), ...)
//! ```

use aya_ebpf::{
    macros::{btf_tracepoint, map},
    maps::{LruHashMap, PerCpuArray},
    programs::BtfTracePointContext,
};
use memlock_trace_common::{
    TASK_COMM_LEN,
    diag::{field, program},
    process::{EXIT_COMMS_MAX, ProcessKey, counter},
};

use crate::shared::{
    PROCESS_CONFIG, Prog, TARGET_TGIDS, add, current_ids, current_leader, current_process_start_ns,
    read_field, read_kernel,
};

/// The group leader's comm when a traced process exits: its name after any exec, which
/// /proc can no longer tell once it is reaped.
#[map]
static EXIT_COMMS: LruHashMap<ProcessKey, [u8; TASK_COMM_LEN]> =
    LruHashMap::with_max_entries(EXIT_COMMS_MAX, 0);

/// See [`counter`].
#[map]
static PROCESS_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

#[inline(always)]
fn count(index: u32) {
    add(&PROCESS_COUNTERS, index, 1);
}

const FORK: Prog = Prog {
    slot: program::PROCESS_FORK,
    name: "process_fork",
};
const EXIT: Prog = Prog {
    slot: program::PROCESS_EXIT,
    name: "process_exit",
};

/// Runs in the parent. A child of a target becomes a target itself.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn process_fork(ctx: BtfTracePointContext) -> i32 {
    let config = PROCESS_CONFIG.load();
    if config.follow_children == 0 {
        return 0;
    }
    let (parent_tgid, _) = current_ids();
    if TARGET_TGIDS.get_ptr(parent_tgid).is_none() {
        return 0;
    }
    let child: u64 = ctx.arg(1);
    let child_tgid: u32 = read_field(child, config.offsets.task_tgid, FORK, field::TASK_TGID);
    crate::diag::report_reads(FORK);
    // A new thread shares the parent's tgid and is already traced.
    if child_tgid == 0 || child_tgid == parent_tgid {
        return 0;
    }
    if TARGET_TGIDS.insert(child_tgid, 1, 0).is_err() {
        let before = add(&PROCESS_COUNTERS, counter::CHILDREN_NOT_FOLLOWED, 1);
        if crate::diag::wanted(before) {
            aya_log_ebpf::warn!(
                &ctx,
                target: "process_fork",
                "map TARGET_TGIDS full (--max-targets): child {} of {} not followed ({} on this CPU)",
                child_tgid,
                parent_tgid,
                before + 1
            );
        }
    } else {
        count(counter::CHILDREN_FOLLOWED);
    }
    0
}

/// Runs in each exiting thread. When the last thread of a traced group exits, its tgid
/// leaves the filter, so a process that later reuses the pid is not traced by mistake.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn process_exit(ctx: BtfTracePointContext) -> i32 {
    let (tgid, _) = current_ids();
    if TARGET_TGIDS.get_ptr(tgid).is_none() {
        return 0;
    }
    let off = PROCESS_CONFIG.load().offsets;
    let task: u64 = ctx.arg(0);
    let signal: u64 = read_field(task, off.task_signal, EXIT, field::TASK_SIGNAL);
    // do_exit() decrements signal->live before this tracepoint: 0 means the whole group is
    // exiting (kernel/exit.c, `group_dead = atomic_dec_and_test(&tsk->signal->live)`).
    let live: i32 = read_field(signal, off.signal_live, EXIT, field::SIGNAL_LIVE);
    crate::diag::report_reads(EXIT);
    if signal != 0 && live == 0 && TARGET_TGIDS.remove(tgid).is_ok() {
        count(counter::TARGETS_EXITED);
        let key = ProcessKey {
            tgid,
            _pad: 0,
            start_ns: current_process_start_ns(),
        };
        let comm: [u8; TASK_COMM_LEN] = read_kernel(current_leader(&off), off.task_comm);
        let _ = EXIT_COMMS.insert(key, comm, 0);
        // Once per traced process: not on any per-fault or per-call path.
        aya_log_ebpf::info!(
            &ctx,
            target: "process_exit",
            "pid {} left the target set (its last thread exited)",
            tgid
        );
    }
    0
}

//! Process lifecycle and the per-process filters: `--follow-children` (fork), removal of
//! exited targets (exit), `--comm`, `--cgroup`, and the process start time that keys a
//! process for its whole life.
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
    Global,
    helpers::bpf_get_current_ancestor_cgroup_id,
    macros::{btf_tracepoint, map},
    maps::PerCpuArray,
    programs::BtfTracePointContext,
};
use memlock_trace_common::{
    TASK_COMM_LEN,
    process::{ProcessConfig, ProcessOffsets, counter},
};

use crate::shared::{TARGET_TGIDS, add, current_ids, current_task, read_field, read_kernel};

/// Set by the loader before load: which filters are on, and this kernel's offsets.
#[unsafe(no_mangle)]
static PROCESS_CONFIG: Global<ProcessConfig> = Global::new(ProcessConfig {
    follow_children: 0,
    match_comm: 0,
    comm: [0; TASK_COMM_LEN],
    match_cgroup: 0,
    cgroup_level: 0,
    cgroup_id: 0,
    offsets: ProcessOffsets {
        task_tgid: 0,
        task_group_leader: 0,
        task_start_boottime: 0,
        task_comm: 0,
        task_signal: 0,
        signal_live: 0,
    },
});

/// See [`counter`].
#[map]
static PROCESS_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

#[inline(always)]
fn count(index: u32) {
    add(&PROCESS_COUNTERS, index, 1);
}

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
    let child_tgid: u32 = read_field(
        child,
        config.offsets.task_tgid,
        "process_fork",
        "task_struct.tgid",
    );
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
    let signal: u64 = read_field(task, off.task_signal, "process_exit", "task_struct.signal");
    // do_exit() decrements signal->live before this tracepoint: 0 means the whole group is
    // exiting (kernel/exit.c, `group_dead = atomic_dec_and_test(&tsk->signal->live)`).
    let live: i32 = read_field(
        signal,
        off.signal_live,
        "process_exit",
        "signal_struct.live",
    );
    if signal != 0 && live == 0 && TARGET_TGIDS.remove(tgid).is_ok() {
        count(counter::TARGETS_EXITED);
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

/// The current task's group leader (the process, as `/proc/PID` sees it).
#[inline(always)]
fn current_leader(off: &ProcessOffsets) -> u64 {
    read_kernel(current_task(), off.task_group_leader)
}

/// Whether the current task passes `--comm` and `--cgroup` (true when they are off).
#[inline(always)]
pub fn matches_filters() -> bool {
    let config = PROCESS_CONFIG.load();
    if config.match_cgroup != 0 {
        // The ancestor at the filter cgroup's depth is the filter cgroup itself exactly when
        // the task is in it or below it.
        // SAFETY: the helper has no preconditions; a level deeper than the task's cgroup
        // yields 0, which matches no filter.
        let ancestor = unsafe { bpf_get_current_ancestor_cgroup_id(config.cgroup_level as i32) };
        if ancestor != config.cgroup_id {
            return false;
        }
    }
    if config.match_comm != 0 {
        // The group leader's comm, so renamed threads of a matching process still match.
        let leader = current_leader(&config.offsets);
        // Compared as two u64 words: BPF has no memcmp.
        let comm: [u64; 2] = read_kernel(leader, config.offsets.task_comm);
        // SAFETY: `[u8; 16]` and `[u64; 2]` have the same size, and any bytes are valid u64s.
        let want: [u64; 2] = unsafe { core::mem::transmute(config.comm) };
        if comm != want {
            return false;
        }
    }
    true
}

/// The current process's start time (its group leader's `start_boottime`), which with the
/// tgid identifies it for its whole life.
#[inline(always)]
pub fn current_process_start_ns() -> u64 {
    let off = PROCESS_CONFIG.load().offsets;
    read_kernel(current_leader(&off), off.task_start_boottime)
}

//! Process lifecycle: `--follow-children` (fork) and removal of exited targets (exit), which
//! keep the target set in step with the processes it names; at exit, also the name a process
//! ended with (`EXIT_COMMS`). Every process a family counts has an identity
//! (`PROCESS_IDENTITY`, by pid and start time): its name after its last exec
//! (`sched_process_exec`) and its cgroup v2. The per-process filters
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
//! TRACE_EVENT(sched_process_exec,
//!     TP_PROTO(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm), ...)
//! ```
//!
//! `sched_process_exec` fires in `exec_binprm()` after the new program's `comm` is set
//! (`begin_new_exec()` -> `__set_task_comm()`), in the task that exec'd, which `de_thread()`
//! has made the group leader with the old leader's start time: the key stays the same.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_get_current_cgroup_id,
    macros::{btf_tracepoint, map},
    maps::{LruHashMap, PerCpuArray},
    programs::BtfTracePointContext,
};
use memlock_trace_common::{
    TASK_COMM_LEN,
    diag::{field, program},
    process::{
        EXIT_COMMS_MAX, PROCESS_IDENTITY_MAX, ProcessIdentity, ProcessKey, ProcessOffsets, counter,
        identity,
    },
};

use crate::shared::{
    PROCESS_CONFIG, Prog, TARGET_TGIDS, add, current_ids, current_leader, current_process_comm,
    current_process_start_ns, is_target, read_field, read_kernel,
};

/// Who each counted process is: see [`ProcessIdentity`]. Plain (not per-CPU): one writer
/// at a time in practice (the first event, exec and exit of one process), and a torn name
/// is impossible as each write replaces the whole value.
#[map]
static PROCESS_IDENTITY: LruHashMap<ProcessKey, ProcessIdentity> =
    LruHashMap::with_max_entries(PROCESS_IDENTITY_MAX, 0);

/// The current process as it is now: its leader's name and its cgroup.
#[inline(always)]
fn current_identity(flags: u32) -> ProcessIdentity {
    ProcessIdentity {
        comm: current_process_comm(),
        // SAFETY: the helper has no preconditions (tracing programs may call it since 4.18).
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        flags,
        _pad: 0,
        exit_faults: 0,
    }
}

/// Called by a family when it creates a process's first entry: records who the process is,
/// unless its exec already did. `start_ns`: [`current_process_start_ns`].
#[inline(always)]
pub fn note_process(tgid: u32, start_ns: u64) {
    let key = ProcessKey {
        tgid,
        _pad: 0,
        start_ns,
    };
    if PROCESS_IDENTITY.get_ptr(key).is_none() {
        let _ = PROCESS_IDENTITY.insert(key, current_identity(0), u64::from(BPF_NOEXIST));
    }
}

/// Runs in the task that exec'd, once the new program's name is set: a traced process is
/// named after it from now on, in every family's figures.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn process_exec(_ctx: BtfTracePointContext) -> i32 {
    let (tgid, _) = current_ids();
    if !is_target(tgid) {
        return 0;
    }
    count(counter::EXECS);
    let key = ProcessKey {
        tgid,
        _pad: 0,
        start_ns: current_process_start_ns(),
    };
    let _ = PROCESS_IDENTITY.insert(key, current_identity(identity::EXECED), 0);
    0
}

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

/// The faults of a whole thread group whose last thread (`task`) is exiting: those of its
/// released threads (`signal_struct.min_flt`/`maj_flt`, added by `__exit_signal()`), the
/// exiting thread's own, and the group leader's if it exited first (a zombie keeps its
/// counts until the group is reaped). What `wait4()` hands the parent (kernel/exit.c,
/// `wait_task_zombie()`: `p->min_flt + sig->min_flt + sig->cmin_flt`, children excluded).
#[inline(always)]
fn group_faults(task: u64, signal: u64, off: &ProcessOffsets) -> u64 {
    let own = |t: u64| -> u64 {
        read_kernel::<u64>(t, off.task_min_flt) + read_kernel::<u64>(t, off.task_maj_flt)
    };
    let mut faults = read_kernel::<u64>(signal, off.signal_min_flt)
        + read_kernel::<u64>(signal, off.signal_maj_flt)
        + own(task);
    let leader: u64 = read_kernel(task, off.task_group_leader);
    if leader != task {
        faults += own(leader);
    }
    faults
}

/// Runs in each exiting thread. When the last thread of a traced group exits, its tgid
/// leaves the filter, so a process that later reuses the pid is not traced by mistake; the
/// last thread of any counted process leaves its final name in `PROCESS_IDENTITY`.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn process_exit(ctx: BtfTracePointContext) -> i32 {
    let (tgid, _) = current_ids();
    let off = PROCESS_CONFIG.load().offsets;
    let task: u64 = ctx.arg(0);
    let signal: u64 = read_field(task, off.task_signal, EXIT, field::TASK_SIGNAL);
    // do_exit() decrements signal->live before this tracepoint: 0 means the whole group is
    // exiting (kernel/exit.c, `group_dead = atomic_dec_and_test(&tsk->signal->live)`).
    let live: i32 = read_field(signal, off.signal_live, EXIT, field::SIGNAL_LIVE);
    crate::diag::report_reads(EXIT);
    if signal == 0 || live != 0 {
        return 0;
    }
    // A counted process keeps its last name and cgroup (system-wide as well).
    let key = ProcessKey {
        tgid,
        _pad: 0,
        start_ns: current_process_start_ns(),
    };
    if let Some(known) = PROCESS_IDENTITY.get_ptr(key) {
        // SAFETY: a valid pointer to the map's value, read before it is replaced.
        let flags = unsafe { (*known).flags };
        let mut last = current_identity(flags | identity::EXITED);
        last.exit_faults = group_faults(task, signal, &off);
        let _ = PROCESS_IDENTITY.insert(key, last, 0);
    }
    if TARGET_TGIDS.remove(tgid).is_ok() {
        count(counter::TARGETS_EXITED);
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

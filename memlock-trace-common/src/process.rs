//! Process identity and the filters beyond "these tgids": the contract of the eBPF
//! `process` module (fork/exit tracking, comm and cgroup filters) and the loader's
//! `filter` module.

use crate::TASK_COMM_LEN;

/// Names of this module's globals and counters, looked up by the loader.
pub mod names {
    pub const PROCESS_CONFIG: &str = "PROCESS_CONFIG";
    pub const PROCESS_COUNTERS: &str = "PROCESS_COUNTERS";
    pub const EXIT_COMMS: &str = "EXIT_COMMS";
    pub const PROCESS_IDENTITY: &str = "PROCESS_IDENTITY";
}

/// Entries of `PROCESS_IDENTITY`: every process the families counted (its first event
/// creates the entry), so it is sized like the largest per-process map. LRU: a machine
/// with more processes than this loses the names of the oldest, not their counts.
pub const PROCESS_IDENTITY_MAX: u32 = 16384;

/// What the kernel says a process is, kept for its whole life and after it (value of
/// `PROCESS_IDENTITY`, keyed by [`ProcessKey`]): its name after its last exec, and its
/// cgroup v2.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessIdentity {
    /// The group leader's comm: at the first event, then at each exec (`sched_process_exec`)
    /// and at exit.
    pub comm: [u8; TASK_COMM_LEN],
    /// `bpf_get_current_cgroup_id()`: the kernfs id of the task's cgroup v2 directory (its
    /// inode number on the cgroup2 mount), as of the last of those moments.
    pub cgroup_id: u64,
    /// [`identity`] bits.
    pub flags: u32,
    pub _pad: u32,
    /// With [`identity::EXITED`]: the faults (minor + major) the kernel counted for the whole
    /// process over its life, as `getrusage` would report them to its parent; what the
    /// tracer counted for it can be checked against this.
    pub exit_faults: u64,
}

/// Bits of [`ProcessIdentity::flags`].
pub mod identity {
    /// The name was taken at an exec: it is the program's own, not its parent's.
    pub const EXECED: u32 = 1;
    /// The process has exited: the name and cgroup are its last.
    pub const EXITED: u32 = 2;
}

/// Entries of `EXIT_COMMS`: the name each traced process had when it exited (after any
/// exec), for the summary of a process /proc no longer shows. LRU: the oldest go first.
pub const EXIT_COMMS_MAX: u32 = 4096;

indices! {
    /// Indices of the per-CPU counters of fork/exit tracking (`PROCESS_COUNTERS`).
    pub mod counter: u32, COUNT: u32 {
        /// `--follow-children`: a child of a target could not be added because `TARGET_TGIDS`
        /// was full; that child is not traced.
        CHILDREN_NOT_FOLLOWED,
        /// Children of targets added to `TARGET_TGIDS`.
        CHILDREN_FOLLOWED,
        /// Targets removed from `TARGET_TGIDS` when their last thread exited.
        TARGETS_EXITED,
        /// Execs of traced processes seen (`sched_process_exec`).
        EXECS,
    }
}

/// Byte offsets of the kernel fields fork/exit tracking and the filters read, from the
/// running kernel's BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessOffsets {
    /// `task_struct.tgid`
    pub task_tgid: u32,
    /// `task_struct.group_leader`
    pub task_group_leader: u32,
    /// `task_struct.start_boottime` (ns since boot, suspend included: the clock of
    /// `/proc/PID/stat` field 22)
    pub task_start_boottime: u32,
    /// `task_struct.comm`
    pub task_comm: u32,
    /// `task_struct.signal`
    pub task_signal: u32,
    /// `signal_struct.live` (an `atomic_t`: threads of the group not yet exiting)
    pub signal_live: u32,
    /// `signal_struct.min_flt` / `maj_flt`: the faults of the group's released threads
    pub signal_min_flt: u32,
    pub signal_maj_flt: u32,
    /// `task_struct.min_flt` / `maj_flt`
    pub task_min_flt: u32,
    pub task_maj_flt: u32,
    /// Non-zero where the kernel has `bpf_get_current_task_btf` (5.11): the current task's
    /// start time is then read with two loads the verifier checks against BTF, not two
    /// `bpf_probe_read_kernel` calls (it runs on every fault of a system-wide session).
    pub task_btf: u32,
}

/// Load-time configuration of the process filters (the `PROCESS_CONFIG` global). Each
/// filter that is on must match, on top of `Config::filter`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessConfig {
    /// Non-zero: add the children (fork/clone without `CLONE_THREAD`) of traced processes to
    /// `TARGET_TGIDS`.
    pub follow_children: u32,
    /// Non-zero: only processes whose group leader's comm equals `comm`.
    pub match_comm: u32,
    /// NUL-padded.
    pub comm: [u8; TASK_COMM_LEN],
    /// The bytes of `comm` to compare, through its terminating NUL: older kernels (5.10 among them)
    /// set a comm at exec with `strlcpy`, which leaves the old name's tail after the NUL.
    pub comm_mask: [u8; TASK_COMM_LEN],
    /// Non-zero: only tasks in the cgroup v2 `cgroup_id` or below it.
    pub match_cgroup: u32,
    /// Depth of that cgroup below the root (the root is level 0), for
    /// `bpf_get_current_ancestor_cgroup_id`.
    pub cgroup_level: u32,
    /// The cgroup's id: its kernfs node id, the directory's file handle on cgroup2.
    pub cgroup_id: u64,
    pub offsets: ProcessOffsets,
    pub cgroup_offsets: CgroupOffsets,
}

/// Where a task's cgroup v2 ancestors are, for kernels whose tracing programs may not call
/// `bpf_get_current_ancestor_cgroup_id` (5.10 refuses it): before 6.0 every cgroup keeps
/// its ancestors' ids in `ancestor_ids[]`, indexed by level. All 0 on 6.0 and later, where
/// the helper is used.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupOffsets {
    /// `task_struct.cgroups` (a `struct css_set *`)
    pub task_cgroups: u32,
    /// `css_set.dfl_cgrp`: the task's cgroup on the v2 hierarchy
    pub css_set_dfl_cgrp: u32,
    /// `cgroup.level`
    pub cgroup_level: u32,
    /// `cgroup.ancestor_ids`; 0 when the kernel has none (6.0 and later)
    pub cgroup_ancestor_ids: u32,
}

/// Identifies a process for its whole life: pids are reused, (tgid, start time) is not.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcessKey {
    pub tgid: u32,
    pub _pad: u32,
    /// The group leader's `start_boottime`, in ns.
    pub start_ns: u64,
}

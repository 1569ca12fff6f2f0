//! One process's figures in a summary: what every hook family counted for it, by (pid, start
//! time), with its name and cgroup. Its own file so that the summary and the parts that
//! group or fold processes (groups.rs, fold.rs) all build on it without building on each
//! other.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    faults::FaultSummary,
    output::Outside,
    process::cgroup::CgroupInfo,
    syscalls::{ProcessSyscalls, SyscallSummary, stacks::CallSite, stats::ThreadLatencies},
};

#[derive(Clone, Debug, Serialize)]
pub struct ProcessSummary {
    pub pid: u32,
    /// Process start, ns since boot (`/proc/PID/stat` field 22 is this in clock ticks).
    pub start_ns: u64,
    pub comm: Outside,
    /// Its cgroup v2, as the kernel saw it (at its first event, exec or exit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<CgroupInfo>,
    pub syscalls: BTreeMap<&'static str, SyscallSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults: Option<FaultSummary>,
    /// An exited process traced from its start: the faults the kernel counted for it over
    /// its life (what `getrusage` gives its parent), and how many of them the summary lacks
    /// (the fault maps had to evict its counts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_faults: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults_missing: Option<u64>,
    /// `--per-thread`: each thread's call latencies, for `--hist`.
    #[serde(skip)]
    pub thread_latencies: ThreadLatencies,
    /// `--stacks`: the top user call sites of the process's mlock-family calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_sites: Option<Vec<CallSite>>,
}

impl ProcessSummary {
    /// A process with nothing counted yet: each hook family adds its part.
    pub fn new(pid: u32, start_ns: u64, comm: Outside) -> Self {
        Self {
            pid,
            start_ns,
            comm,
            cgroup: None,
            syscalls: BTreeMap::new(),
            faults: None,
            kernel_faults: None,
            faults_missing: None,
            thread_latencies: BTreeMap::new(),
            call_sites: None,
        }
    }
}

impl From<ProcessSyscalls> for ProcessSummary {
    /// A process as the syscall family counted it; the other families add theirs.
    fn from(p: ProcessSyscalls) -> Self {
        Self {
            syscalls: p.syscalls,
            thread_latencies: p.threads,
            ..Self::new(p.pid, p.start_ns, p.comm)
        }
    }
}

//! One run's figures per mapping, split at the start-up window: the tracer's per-interval
//! fault counts per mapping, weighed by each interval's mean fault latency, joined with
//! what the samples saw of each mapping (resident and locked bytes, permissions, lifetimes).

use std::collections::BTreeMap;

use anyhow::Result;
use serde::Serialize;

use super::{
    observe::{Latency, Run, Site},
    sample::{LimitsSeen, Seen, mem_available},
};

mod mappings;
mod phases;

#[cfg(test)]
pub(super) use self::mappings::{mark_stack_sized, merge_grown};

/// How the start-up window was set.
#[derive(Clone, Debug, Serialize)]
pub struct Startup {
    /// Seconds from the trace's start.
    pub secs: f64,
    pub how: StartupHow,
}

/// Where the start-up window's end came from (in JSON: `detected`, `flag`, `none`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StartupHow {
    /// The last executable file mapping.
    Detected,
    /// --startup SECS.
    Flag,
    /// A running process: all steady state.
    None,
}

/// One phase's faults: counts as the kernel classes them, and the time spent in them.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Phase {
    pub minor: u64,
    pub major: u64,
    pub user: u64,
    pub populated: u64,
    /// Faults x the interval's mean latency, added up (user faults, and populated ones where
    /// the hooks time them).
    pub fault_ns: u64,
    /// The same for faults taken through the exception (the program's own code stalls).
    pub user_fault_ns: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct MappingFigures {
    pub mapping: String,
    pub start: u64,
    pub end: u64,
    pub size_bytes: u64,
    pub perms: Option<String>,
    /// Most bytes resident in any sample.
    pub resident_bytes: Option<u64>,
    /// Most bytes out on swap in any sample (smaps `Swap:`): its pages were resident,
    /// evicted, and its faults since are swap-ins.
    pub swap_bytes: Option<u64>,
    pub faults_startup: u64,
    pub faults_after: u64,
    pub fault_ns_startup: u64,
    pub fault_ns_after: u64,
    pub locked: bool,
    /// Times the samples saw it appear at this place (2 or more: unmapped and mapped again).
    pub lifetimes: u32,
    /// A stack: the kernel saw a faulting thread's stack pointer inside it, or a sample saw a
    /// thread stack's shape (a one-page guard right below it), or it is anonymous and of the
    /// size of one of those ([`mark_stack_sized`]).
    pub stack: bool,
    /// When it was first seen, seconds from the trace's start.
    pub first_seen_secs: Option<f64>,
    /// `--stacks`: the code that faulted most in it (the whole run's sampled faults).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<Site>,
}

impl MappingFigures {
    pub fn pages(&self) -> u64 {
        self.size_bytes.div_ceil(crate::procfs::PAGE_SIZE).max(1)
    }

    pub fn faults(&self) -> u64 {
        self.faults_startup + self.faults_after
    }

    /// Some of its pages were seen on swap.
    pub fn swapped(&self) -> bool {
        self.swap_bytes.is_some_and(|b| b > 0)
    }

    pub fn anonymous(&self) -> bool {
        matches!(
            self.mapping.as_str(),
            "anonymous" | "[heap]" | "unmapped" | "unknown"
        ) || self.shared_anonymous()
    }

    /// `MAP_SHARED | MAP_ANONYMOUS` memory shows as the deleted `/dev/zero` in smaps.
    pub fn shared_anonymous(&self) -> bool {
        self.mapping.starts_with("/dev/zero")
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Table {
    pub pid: u32,
    pub comm: String,
    pub described: crate::output::Outside,
    pub launched: bool,
    /// The launched command's exit status; null for a running process (`-p`), which advise
    /// did not launch and which did not exit because of it.
    pub exit_code: Option<i32>,
    /// `-p`: the process was still running when the trace ended (it was left running).
    pub running_at_end: bool,
    /// From the tracer's attach (or the launched command's start) to the trace's end.
    pub traced_secs: f64,
    pub wall_ns: Option<u64>,
    pub startup: Startup,
    pub during_startup: Phase,
    pub after_startup: Phase,
    /// The whole run's fault latency by class (`minor`, `major`, `user`, ...).
    pub latency_ns: BTreeMap<String, Latency>,
    /// How fault time was measured: each fault timed, or scaled from a sample.
    pub time_basis: String,
    /// The limits and the process's largest figures, as the samples saw them.
    #[serde(flatten)]
    pub limits: LimitsSeen,
    pub mem_available_bytes: Option<u64>,
    /// Bytes the kernel counted locked by the process's mlock-family calls (exact, where
    /// the samples may miss a short-lived lock).
    pub locked_by_calls_bytes: u64,
    /// minflt + majflt the process itself counted (/proc/PID/stat): in its whole life, from
    /// its fork (a command), from the tracer's attach to the trace's end (`-p`).
    pub own_faults: Option<u64>,
    /// `-p`: minflt + majflt the process had counted before the tracer attached, which the
    /// trace did not see.
    pub own_faults_before_attach: Option<u64>,
    /// glibc's malloc is the allocator (libc.so.6 mapped, no other allocator library).
    pub glibc_malloc: bool,
    pub mappings: Vec<MappingFigures>,
    pub others: Vec<(u32, String, u64)>,
    pub lost: u64,
    pub preload_log: Vec<String>,
    /// `--stacks`: the command that draws the fault stacks as a flame graph.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flamegraph_command: Option<crate::output::Outside>,
}

/// Builds the table of `run`; `startup_flag`: --startup SECS.
pub fn build(run: &Run, startup_flag: Option<f64>) -> Result<Table> {
    // Start-up counts from the launched process's start; a running process's trace from
    // its first interval.
    let t0 = run.started_ns.unwrap_or_else(|| {
        run.intervals
            .first()
            .map_or(run.session_window.start_ns, |i| i.window.start_ns)
    });
    let startup = phases::startup(run, startup_flag, t0);
    let (during, after, mappings) = mappings::count(run, t0, &startup);
    let s = &run.samples;
    let (own_faults, own_faults_before_attach) = own_faults(run, t0);
    Ok(Table {
        pid: run.pid,
        comm: run.comm.clone(),
        described: run.described.clone(),
        launched: run.launched,
        exit_code: run.exit_code,
        running_at_end: run.running_at_end,
        // Not the tracer's loading before: nothing was traced then.
        traced_secs: run
            .session_window
            .end_ns
            .saturating_sub(run.session_window.start_ns.max(t0)) as f64
            / 1e9,
        wall_ns: run.wall_ns,
        startup,
        during_startup: during,
        after_startup: after,
        latency_ns: run.session.latency_ns.clone(),
        time_basis: phases::time_basis(run),
        limits: s.limits.clone(),
        mem_available_bytes: mem_available(),
        locked_by_calls_bytes: run.locked_by_calls,
        own_faults,
        own_faults_before_attach,
        glibc_malloc: glibc_malloc(&s.seen),
        mappings,
        others: run.others.clone(),
        lost: run.lost,
        preload_log: run.preload_log.clone(),
        flamegraph_command: run.flamegraph_command.clone(),
    })
}

/// The faults the process counted itself while traced, and (`-p`) before: for a command,
/// its whole life (from its fork: the last reading, at most 10 ms before its exit; the pages
/// a call populated count too); for a running process, from the tracer's
/// attach (`attached_ns`, the first interval's start) to the trace's end, and before it.
fn own_faults(run: &Run, attached_ns: u64) -> (Option<u64>, Option<u64>) {
    let s = &run.samples;
    if run.launched {
        return (s.stat.last().map(|&(_, faults)| faults), None);
    }
    let before = s.faults_at(attached_ns);
    let end = s.faults_at(run.session_window.end_ns);
    (before.zip(end).map(|(b, e)| e.saturating_sub(b)), before)
}

/// glibc's malloc is the allocator: libc.so.6 mapped, and no other allocator's library.
fn glibc_malloc(seen: &[Seen]) -> bool {
    let names = || seen.iter().map(|m| m.name.to_str_lossy());
    names().any(|n| n.ends_with("/libc.so.6"))
        && !names().any(|n| {
            ["jemalloc", "tcmalloc", "mimalloc"]
                .iter()
                .any(|a| n.contains(a))
        })
}

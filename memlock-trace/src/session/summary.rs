//! The summary of a session (or of one interval): every hook family's per-process figures
//! put together, with the tracer's health, as text or as the documented JSON line.

use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use memlock_trace_common::process::ProcessKey;

pub use super::process_summary::ProcessSummary;
use super::{fold::Folded, groups::CgroupSummary};
use crate::{
    faults::{self, FaultHealth, FaultHooks, FaultSummary},
    output::{JSON_SCHEMA, Outside, TextStyle},
    syscalls::{self, ProcessSyscalls, read::SyscallHealth},
    tracer::Health,
};

/// The final (or periodic) report; serialises to the documented JSON summary line.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub schema: u32,
    /// When the record was made: CLOCK_REALTIME, ns.
    pub time_ns: u64,
    /// What it covers: the interval, or the whole session.
    pub window: Window,
    pub processes: Vec<ProcessSummary>,
    pub dropped_events: u64,
    pub health: Health,
    /// The page-fault hook set used, and why better ones were refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault_hooks: Option<FaultHooks>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault_health: Option<FaultHealth>,
    /// `--by cgroup`: the processes added up per cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroups: Option<Vec<CgroupSummary>>,
    /// What the kernel's per-process call counts could not keep.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscall_health: Option<SyscallHealth>,
    /// `--stacks`: mlock-family calls whose call site could not be kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_site_health: Option<CallSiteHealth>,
    /// The processes beyond `--max-processes`, folded by name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub folded: Option<Folded>,
}

/// `--stacks`: what the kept stacks lost, and how they were unwound (calls and faults).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CallSiteHealth {
    /// Calls whose user stack was lost to a full ring buffer.
    pub dropped: u64,
    /// Always 0 since call sites are summed in user space (kept for the JSON schema).
    pub evicted: u64,
    /// Every kept stack, calls and faults: how it was unwound.
    pub unwinding: crate::unwind::StackHealth,
}

/// The span of time a summary covers, CLOCK_REALTIME ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Window {
    pub start_ns: u64,
    pub end_ns: u64,
}

impl Summary {
    /// The syscall family's processes and the tracer's health; the fault family adds its
    /// part with [`Summary::add_faults`].
    pub fn new(kind: &'static str, syscalls: Vec<ProcessSyscalls>, health: Health) -> Self {
        Self {
            kind,
            schema: JSON_SCHEMA,
            time_ns: crate::output::WallClock::now_ns(),
            window: Window::default(),
            processes: syscalls.into_iter().map(ProcessSummary::from).collect(),
            dropped_events: health.dropped_events,
            health,
            fault_hooks: None,
            fault_health: None,
            cgroups: None,
            syscall_health: None,
            call_site_health: None,
            folded: None,
        }
    }

    pub fn process(&self, pid: u32) -> Option<&ProcessSummary> {
        self.processes.iter().find(|p| p.pid == pid)
    }

    /// Adds each process's faults, creating the processes that faulted without making a
    /// traced syscall. The fault comm (from /proc or the kernel) fills in missing ones.
    pub fn add_faults(
        &mut self,
        hooks: FaultHooks,
        health: FaultHealth,
        faults: BTreeMap<ProcessKey, (Outside, FaultSummary)>,
    ) {
        for (key, (comm, summary)) in faults {
            // A start time of 0: a process counted only by pid (its start was not recorded).
            let same = |p: &ProcessSummary| {
                p.pid == key.tgid && (p.start_ns == key.start_ns || key.start_ns == 0)
            };
            match self.processes.iter_mut().find(|p| same(p)) {
                Some(p) => p.faults = Some(summary),
                None => self.processes.push(ProcessSummary {
                    faults: Some(summary),
                    ..ProcessSummary::new(key.tgid, key.start_ns, comm)
                }),
            }
        }
        self.processes.sort_by_key(|p| (p.pid, p.start_ns));
        self.fault_hooks = Some(hooks);
        self.fault_health = Some(health);
    }
}

/// The text summary. The hook sets are not repeated here: the session prints them once on
/// stderr at start.
pub fn summary_text(summary: &Summary, style: TextStyle) -> String {
    let unit = style.unit;
    let mut out = String::new();
    if summary.processes.is_empty() {
        out.push_str("no mlock-family calls or page faults traced\n");
    }
    if let Some(groups) = &summary.cgroups {
        super::groups::text(&mut out, groups, unit);
    }
    if summary.processes.len() > 1 && summary.cgroups.is_none() {
        out.push_str(&totals_line(summary));
    }
    // `--by cgroup` replaces the per-process blocks.
    for p in by_activity(&summary.processes)
        .into_iter()
        .filter(|_| summary.cgroups.is_none())
    {
        process_text(&mut out, p, summary, style);
    }
    if let Some(folded) = &summary.folded {
        out.push_str(&super::fold::folded_text(folded));
    }
    health_text(&mut out, summary);
    out
}

/// One process's block: who it is, its faults (and its threads'), its calls and their
/// call sites.
fn process_text(out: &mut String, p: &ProcessSummary, summary: &Summary, style: TextStyle) {
    let unit = style.unit;
    // A reused pid: the start time tells the processes apart.
    let started = if summary.processes.iter().filter(|q| q.pid == p.pid).count() > 1 {
        format!(", started {:.3}s after boot", p.start_ns as f64 / 1e9)
    } else {
        String::new()
    };
    let cgroup = match &p.cgroup {
        // The root cgroup says nothing.
        Some(c) if c.path.as_deref() != Some("/") => {
            format!(" cgroup {}", Outside::from(c.label()))
        }
        _ => String::new(),
    };
    let _ = writeln!(out, "pid {} ({}){started}{cgroup}", p.pid, p.comm);
    if let (Some(missing @ 1..), Some(kernel)) = (p.faults_missing, p.kernel_faults) {
        let _ = writeln!(
            out,
            "  page faults missing: {missing} of the {kernel} the kernel counted (the \
             fault maps evicted them: too many processes at once)"
        );
    }
    if let Some(f) = &p.faults {
        faults::render::faults_text(out, f, "  ", style);
        if let Some(stacks) = &f.stacks {
            faults::render::stacks_text(out, stacks, "  ");
        }
        for t in &f.threads {
            let _ = writeln!(out, "  thread {} ({})", t.tid, t.comm);
            faults::render::faults_text(out, &t.faults, "    ", style);
        }
    }
    syscalls::render::table(out, &p.syscalls, unit);
    if style.hist {
        let calls = p
            .syscalls
            .iter()
            .map(|(name, s)| (*name, s.latency_values.clone()))
            .collect();
        syscalls::render::hists(out, &calls, unit, "  ");
        for (tid, calls) in &p.thread_latencies {
            let _ = writeln!(out, "  thread {tid}");
            syscalls::render::hists(out, calls, unit, "    ");
        }
    }
    if let Some(sites) = &p.call_sites {
        syscalls::render::call_sites_text(out, sites, "  ");
    }
}

/// What the tracer lost or could not do, under the blocks.
fn health_text(out: &mut String, summary: &Summary) {
    let h = &summary.health;
    // Each interval shows its health lines only when something was lost, as bcc's tools
    // print "Possibly lost N samples" only then; the session's summary always ends with them.
    let every = summary.kind != "interval";
    let lost = h.dropped_events + h.untracked_calls + h.failed_reads + h.dropped_vma_records;
    if every || lost > 0 {
        let _ = writeln!(
            out,
            "dropped events: {}{}{}",
            h.dropped_events,
            // The counts above are the kernel's: only event lines and per-call detail are lost.
            if h.dropped_events > 0 {
                " (event lines and last-failure detail only: the counts above are exact)"
            } else {
                ""
            },
            if h.untracked_calls + h.failed_reads + h.dropped_vma_records > 0 {
                format!(
                    " (calls not tracked: {}, failed kernel reads: {}, VMA records dropped: {})",
                    h.untracked_calls, h.failed_reads, h.dropped_vma_records
                )
            } else {
                String::new()
            }
        );
    }
    if h.unreadable_mappings > 0 {
        let _ = writeln!(
            out,
            "unreadable mappings: {} reads of /proc/PID/smaps failed (see the warnings above)",
            h.unreadable_mappings
        );
    }
    let p = &h.processes;
    if p.children_not_followed + p.evicted_processes > 0 {
        let _ = writeln!(
            out,
            "children not followed (target map full): {}, processes evicted from this summary \
             (--max-processes): {}",
            p.children_not_followed, p.evicted_processes
        );
    }
    if let Some(s) = summary
        .syscall_health
        .filter(|s| s.evicted + s.update_failed > 0)
    {
        let _ = writeln!(
            out,
            "call counts: {} (process, call, outcome) entries evicted from the kernel map, {} \
             calls not counted",
            s.evicted, s.update_failed
        );
    }
    if let Some(c) = summary.call_site_health.as_ref().filter(|c| {
        let u = &c.unwinding;
        every || c.dropped + u.frame_pointer_walks + u.frames_dropped + u.no_module > 0
    }) {
        let u = &c.unwinding;
        let _ = writeln!(
            out,
            "stacks: {} mlock-family calls' stacks lost (ring buffer full); {} unwound, {} \
             frame-pointer walks (no registers), {} cut at a frame outside executable \
             mappings, {} not in any module",
            c.dropped, u.unwound, u.frame_pointer_walks, u.frames_dropped, u.no_module
        );
    }
    fault_health_text(out, summary, every);
}

/// What the fault maps and the fault stacks lost: every time in the session's summary
/// (`every`), in an interval's only when something was lost.
fn fault_health_text(out: &mut String, summary: &Summary, every: bool) {
    if let Some(f) = summary.fault_health.as_ref().filter(|f| {
        every
            || f.stats_evicted
                + f.histograms_evicted
                + f.regions_evicted
                + f.update_failed
                + f.events_dropped
                + f.stacks_dropped.unwrap_or(0)
                > 0
    }) {
        let _ = writeln!(
            out,
            "fault maps: {} processes evicted, {} histograms evicted, {} regions evicted, {} updates failed, {} fault events dropped",
            f.stats_evicted,
            f.histograms_evicted,
            f.regions_evicted,
            f.update_failed,
            f.events_dropped
        );
        if let (Some(dropped), Some(every)) = (f.stacks_dropped, f.stacks_sample_every) {
            let _ = writeln!(
                out,
                "fault stacks: one fault in {every} keeps its stack (--stack-sample); \
                 {dropped} sampled faults' stacks lost (ring buffer full)"
            );
        }
    }
}

/// A process's mlock-family calls and page faults.
fn activity(p: &ProcessSummary) -> (u64, u64) {
    let calls = p.syscalls.values().map(|s| s.count).sum();
    let faults = p.faults.as_ref().map_or(0, |f| f.minor + f.major);
    (calls, faults)
}

/// The processes busiest first, as top(1) lists them: mlock-family callers first (by calls),
/// then by page faults; pid order breaks ties. (The JSON keeps pid order.)
fn by_activity(processes: &[ProcessSummary]) -> Vec<&ProcessSummary> {
    let mut ordered: Vec<&ProcessSummary> = processes.iter().collect();
    ordered.sort_by_key(|p| {
        let (calls, faults) = activity(p);
        (
            std::cmp::Reverse(calls),
            std::cmp::Reverse(faults),
            p.pid,
            p.start_ns,
        )
    });
    ordered
}

/// What a summary of several processes covers, before their blocks: how long, how many
/// processes, calls and faults in all.
fn totals_line(summary: &Summary) -> String {
    let (mut calls, mut callers, mut faults, mut major) = (0, 0, 0, 0);
    for p in &summary.processes {
        let (c, f) = activity(p);
        calls += c;
        callers += u64::from(c > 0);
        faults += f;
        major += p.faults.as_ref().map_or(0, |f| f.major);
    }
    let w = summary.window;
    let span = match w.end_ns.checked_sub(w.start_ns) {
        Some(ns) if w.start_ns > 0 => format!(" in {:.1} s", ns as f64 / 1e9),
        _ => String::new(),
    };
    let faults = match &summary.fault_hooks {
        Some(_) => format!(", {faults} page faults ({major} major)"),
        None => String::new(),
    };
    let calls = match calls {
        0 => "no mlock-family calls".to_string(),
        _ => format!("{calls} mlock-family calls by {callers} of them"),
    };
    format!(
        "{} processes{span}: {calls}{faults}; busiest first\n",
        summary.processes.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{Syscall, SyscallRecord},
        syscalls::Aggregator,
    };

    fn rec(syscall: Syscall, tgid: u32, ret: i64, duration_ns: u64, pages: u64) -> SyscallRecord {
        SyscallRecord::fixture(
            syscall,
            tgid,
            ret,
            duration_ns,
            pages,
            if ret == 0 { pages } else { 0 },
            "work",
        )
    }

    #[test]
    fn counts_errors_pages_and_latency_per_process_and_call() {
        let mut agg = Aggregator::default();
        for i in 1..=100 {
            agg.record_syscall(&rec(Syscall::Mlock, 7, 0, i * 1000, 4));
        }
        agg.record_syscall(&rec(Syscall::Mlock, 7, -12, 500, 0));
        agg.record_syscall(&rec(Syscall::Mlock, 7, -1, 500, 0));
        agg.record_syscall(&rec(Syscall::Munlockall, 8, 0, 10, 0));
        let s = Summary::new(
            "summary",
            agg.summaries(),
            Health {
                dropped_events: 3,
                ..Default::default()
            },
        );
        assert_eq!(s.dropped_events, 3);
        assert_eq!(s.processes.len(), 2);
        let mlock = &s.process(7).unwrap().syscalls["mlock"];
        assert_eq!(mlock.count, 102);
        assert_eq!(mlock.errors["ENOMEM"], 1);
        assert_eq!(mlock.errors["EPERM"], 1);
        assert_eq!(mlock.pages_populated, 400);
        assert_eq!(mlock.pages_locked, 400);
        // 102 samples (two of 500 ns, then 1..=100 us): the median is the 51st, 49 us.
        // 3 significant digits: within 0.1 %.
        assert!(
            mlock.latency_ns.p50.abs_diff(49_000) <= 49,
            "{:?}",
            mlock.latency_ns
        );
        assert!(
            mlock.latency_ns.max.abs_diff(100_000) <= 100,
            "{:?}",
            mlock.latency_ns
        );
        assert_eq!(s.process(8).unwrap().syscalls["munlockall"].count, 1);
        assert_eq!(s.process(7).unwrap().comm, "work");
    }

    #[test]
    fn summary_json_has_the_documented_shape() {
        let mut agg = Aggregator::default();
        agg.record_syscall(&rec(Syscall::Mlock, 7, -12, 500, 0));
        let v = serde_json::to_value(Summary::new("summary", agg.summaries(), Health::default()))
            .unwrap();
        assert_eq!(v["type"], "summary");
        assert_eq!(v["dropped_events"], 0);
        let m = &v["processes"][0]["syscalls"]["mlock"];
        assert_eq!(v["processes"][0]["pid"], 7);
        assert_eq!(m["count"], 1);
        assert_eq!(m["errors"]["ENOMEM"], 1);
        for k in ["p50", "p90", "p99", "max"] {
            assert!(m["latency_ns"][k].is_u64(), "{k}");
        }
        assert_eq!(m["pages_populated"], 0);
        assert_eq!(m["pages_locked"], 0);
    }

    #[test]
    fn several_processes_are_listed_busiest_first_under_their_totals() {
        let mut agg = Aggregator::default();
        agg.record_syscall(&rec(Syscall::Mlock, 9, 0, 500, 0));
        for _ in 0..2 {
            agg.record_syscall(&rec(Syscall::Munlock, 30, 0, 500, 0));
        }
        let summary = Summary::new("summary", agg.summaries(), Health::default());
        let text = summary_text(&summary, TextStyle::default());
        assert!(
            text.starts_with("2 processes: 3 mlock-family calls by 2 of them; busiest first\n"),
            "{text}"
        );
        let at = |pid: &str| text.find(&format!("pid {pid} (")).unwrap();
        assert!(at("30") < at("9"), "{text}");
        // The JSON keeps pid order.
        assert_eq!(summary.processes[0].pid, 9);
    }
}

//! One run's figures per mapping, split at the start-up window: the tracer's per-interval
//! fault counts per mapping, weighed by each interval's mean fault latency, joined with
//! what the samples saw of each mapping (resident and locked bytes, permissions, lifetimes).

use std::collections::BTreeMap;

use anyhow::Result;
use serde::Serialize;

use super::{
    observe::{Faults, Interval, Latency, Run, Site},
    sample::{MemlockLimit, Seen, mem_available},
};
use crate::process::memory_cgroup::MemoryCgroup;

/// Names the tracer gives faults no current mapping holds.
const UNATTRIBUTED: [&str; 2] = ["unmapped", "unknown"];

/// A row of the table as the faults were counted: start, end, name.
type MappingKey = (u64, u64, String);

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
    pub exit_code: i32,
    pub traced_secs: f64,
    pub wall_ns: Option<u64>,
    pub startup: Startup,
    pub during_startup: Phase,
    pub after_startup: Phase,
    /// The whole run's fault latency by class (`minor`, `major`, `user`, ...).
    pub latency_ns: BTreeMap<String, Latency>,
    /// How fault time was measured: each fault timed, or scaled from a sample.
    pub time_basis: String,
    pub memlock_limit: Option<MemlockLimit>,
    pub cap_ipc_lock: Option<bool>,
    pub mem_available_bytes: Option<u64>,
    /// The process's memory cgroup and its limits, at its fullest (`None`: no memory
    /// controller, or the process was never sampled).
    pub memory_cgroup: Option<MemoryCgroup>,
    pub threads_max: u32,
    pub locked_max_bytes: u64,
    /// Most bytes the process had on swap (`VmSwap:`), and its largest footprint
    /// (resident and swapped in one sample).
    pub swap_max_bytes: u64,
    pub footprint_max_bytes: u64,
    /// Swap the process could have used at the least (free swap and its own).
    pub swap_room_bytes: Option<u64>,
    /// Bytes the kernel counted locked by the process's mlock-family calls (exact, where
    /// the samples may miss a short-lived lock).
    pub locked_by_calls_bytes: u64,
    /// minflt + majflt the process itself counted while it was sampled (/proc/PID/stat).
    pub own_faults: Option<u64>,
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
    let startup = match (startup_flag, run.launched, run.samples.last_exec_mapping_ns) {
        (Some(secs), _, _) => Startup {
            secs,
            how: StartupHow::Flag,
        },
        (None, true, Some(last)) => {
            // Up to the end of the interval the last executable mapping appeared in.
            let end = run
                .intervals
                .iter()
                .map(|i| i.window.end_ns)
                .find(|&end| end >= last)
                .unwrap_or(last);
            Startup {
                secs: end.saturating_sub(t0) as f64 / 1e9,
                how: StartupHow::Detected,
            }
        }
        _ => Startup {
            secs: 0.0,
            how: StartupHow::None,
        },
    };
    let boundary = t0 + (startup.secs * 1e9) as u64;
    let mut during = Phase::default();
    let mut after = Phase::default();
    let mut rows: BTreeMap<MappingKey, MappingFigures> = BTreeMap::new();
    let tail = tail(run);
    // What the intervals counted per row, taken away from the tail's whole-session counts.
    let mut counted: Option<Vec<(MappingKey, u64)>> = None;
    for interval in run.intervals.iter().chain(tail.as_ref()) {
        let w = interval.window;
        let in_startup = w.start_ns + (w.end_ns - w.start_ns) / 2 < boundary;
        let phase = if in_startup { &mut during } else { &mut after };
        let f = &interval.faults;
        let mean = mean_ns(f, &["minor", "major"]) * timed_share(f);
        add_phase(phase, f);
        let is_tail = tail.as_ref().is_some_and(|t| std::ptr::eq(interval, t));
        let mut per_key: BTreeMap<MappingKey, (u64, bool, bool, Vec<Site>)> = BTreeMap::new();
        for row in &f.by_mapping {
            let slot = per_key
                .entry(attribute(row, interval, &run.samples.seen))
                .or_default();
            slot.0 += row.faults;
            slot.1 |= row.locked == Some(true);
            slot.2 |= row.stack;
            // The tail's rows are the whole run's: their stacks are every sampled fault's.
            if is_tail {
                merge_sites(&mut slot.3, &row.stacks);
            }
        }
        if is_tail {
            counted = Some(rows.iter().map(|(k, f)| (k.clone(), f.faults())).collect());
        }
        for (key, (faults, locked, stack, sites)) in per_key {
            let faults = match counted.as_mut() {
                Some(counted) => take_counted(counted, &key, faults),
                None => faults,
            };
            let figures = rows
                .entry(key.clone())
                .or_insert_with(|| figures_of(&key, &run.samples.seen, t0));
            let ns = (faults as f64 * mean) as u64;
            if in_startup {
                figures.faults_startup += faults;
                figures.fault_ns_startup += ns;
            } else {
                figures.faults_after += faults;
                figures.fault_ns_after += ns;
            }
            figures.locked |= locked;
            figures.stack |= stack;
            merge_sites(&mut figures.sites, &sites);
        }
    }
    let mut mappings = merge_grown(rows.into_values().collect());
    mark_stack_sized(&mut mappings);
    mappings.sort_by(|a, b| {
        (b.fault_ns_after, b.faults())
            .cmp(&(a.fault_ns_after, a.faults()))
            .then(a.start.cmp(&b.start))
    });
    let s = &run.samples;
    let sampled = run
        .session
        .latency_ns
        .get("minor")
        .zip(run.session.latency_ns.get("major"))
        .map(|(a, b)| a.count + b.count);
    let timed = sampled.unwrap_or_else(|| {
        run.session
            .latency_ns
            .values()
            .map(|l| l.count)
            .max()
            .unwrap_or(0)
    });
    let faults = run.session.minor + run.session.major;
    let time_basis = if timed == 0 {
        "not timed".to_string()
    } else if timed + timed / 20 >= faults {
        "each fault timed".to_string()
    } else {
        format!("{timed} of {faults} faults timed; the rest scaled from their mean")
    };
    let names = || s.seen.iter().map(|m| m.name.to_str_lossy());
    Ok(Table {
        pid: run.pid,
        comm: run.comm.clone(),
        described: run.described.clone(),
        launched: run.launched,
        exit_code: run.exit_code,
        traced_secs: run
            .session_window
            .end_ns
            .saturating_sub(run.session_window.start_ns) as f64
            / 1e9,
        wall_ns: run.wall_ns,
        startup,
        during_startup: during,
        after_startup: after,
        latency_ns: run.session.latency_ns.clone(),
        time_basis,
        memlock_limit: s.memlock_limit,
        cap_ipc_lock: s.cap_ipc_lock,
        mem_available_bytes: mem_available(),
        memory_cgroup: s.memory_cgroup.clone(),
        threads_max: s.threads_max,
        locked_max_bytes: s.locked_max_bytes,
        swap_max_bytes: s.swap_max_bytes,
        footprint_max_bytes: s.footprint_max_bytes,
        swap_room_bytes: s.swap_room_bytes,
        locked_by_calls_bytes: run.locked_by_calls,
        own_faults: s
            .stat_first
            .zip(s.stat_last)
            .map(|(a, b)| (b.0 + b.1).saturating_sub(a.0 + a.1)),
        glibc_malloc: names().any(|n| n.ends_with("/libc.so.6"))
            && !names().any(|n| {
                ["jemalloc", "tcmalloc", "mimalloc"]
                    .iter()
                    .any(|a| n.contains(a))
            }),
        mappings,
        others: run.others.clone(),
        lost: run.lost,
        preload_log: run.preload_log.clone(),
        flamegraph_command: run.flamegraph_command.clone(),
    })
}

/// One row for a mapping seen at several extents (a heap or an arena growing, a VMA
/// merged with a neighbour): rows of one name whose ranges overlap are one, their union.
pub(super) fn merge_grown(mut rows: Vec<MappingFigures>) -> Vec<MappingFigures> {
    rows.sort_by(|a, b| a.mapping.cmp(&b.mapping).then(a.start.cmp(&b.start)));
    let mut out: Vec<MappingFigures> = Vec::with_capacity(rows.len());
    for m in rows {
        match out.last_mut() {
            Some(prev) if prev.mapping == m.mapping && m.start < prev.end => {
                prev.end = prev.end.max(m.end);
                prev.size_bytes = prev.end - prev.start;
                prev.faults_startup += m.faults_startup;
                prev.faults_after += m.faults_after;
                prev.fault_ns_startup += m.fault_ns_startup;
                prev.fault_ns_after += m.fault_ns_after;
                prev.resident_bytes = prev.resident_bytes.max(m.resident_bytes);
                prev.swap_bytes = prev.swap_bytes.max(m.swap_bytes);
                prev.locked |= m.locked;
                prev.lifetimes = prev.lifetimes.max(m.lifetimes);
                prev.stack |= m.stack;
                prev.first_seen_secs = match (prev.first_seen_secs, m.first_seen_secs) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                merge_sites(&mut prev.sites, &m.sites);
            }
            _ => out.push(m),
        }
    }
    out
}

/// Adds `more` to a mapping's top stacks: the same functions are one site; the top
/// [`crate::faults::stacks::MAPPING_STACKS`] stay.
fn merge_sites(sites: &mut Vec<Site>, more: &[Site]) {
    for site in more {
        match sites.iter_mut().find(|s| s.frames == site.frames) {
            Some(s) => s.faults += site.faults,
            None => sites.push(site.clone()),
        }
    }
    sites.sort_by_key(|s| std::cmp::Reverse(s.faults));
    sites.truncate(crate::faults::stacks::MAPPING_STACKS);
}

/// A tail row's faults less what the intervals counted of the same mapping: the row of the
/// same extent first, then rows of the same name it overlaps (an interval before the
/// samples saw a mapping keys its faults by their own range), each count taken once.
/// Before, such faults were counted twice (23,838 for a 16,384-page table, once in 7 runs).
fn take_counted(counted: &mut [(MappingKey, u64)], key: &MappingKey, mut faults: u64) -> u64 {
    let overlaps =
        |k: &MappingKey| k.2 == key.2 && k.0 < key.1.max(key.0 + 1) && key.0 < k.1.max(k.0 + 1);
    for exact in [true, false] {
        for (k, n) in counted.iter_mut() {
            if (exact && k == key) || (!exact && overlaps(k)) {
                let taken = faults.min(*n);
                *n -= taken;
                faults -= taken;
            }
        }
    }
    faults
}

/// What happened after the last interval line (the command exited mid-interval): the
/// session's counts and latency totals less the intervals'. Its mapping rows are the
/// session's own (whole-run) counts, from which the caller takes away what the intervals
/// had.
fn tail(run: &Run) -> Option<Interval> {
    // A command shorter than one interval has only the summary.
    let last = run
        .intervals
        .last()
        .map_or(run.session_window.start_ns, |i| i.window.end_ns);
    let s = &run.session;
    let sum = |f: fn(&Faults) -> u64| run.intervals.iter().map(|i| f(&i.faults)).sum::<u64>();
    let mut latency_ns = BTreeMap::new();
    for (class, l) in &s.latency_ns {
        let (mut total, mut count) = (l.total, l.count);
        for i in &run.intervals {
            if let Some(x) = i.faults.latency_ns.get(class) {
                total = total.saturating_sub(x.total);
                count = count.saturating_sub(x.count);
            }
        }
        latency_ns.insert(class.clone(), Latency { count, total, ..*l });
    }
    let faults = Faults {
        minor: s.minor.saturating_sub(sum(|f| f.minor)),
        major: s.major.saturating_sub(sum(|f| f.major)),
        user: s.user.saturating_sub(sum(|f| f.user)),
        populated: s.populated.saturating_sub(sum(|f| f.populated)),
        latency_ns,
        by_mapping: s.by_mapping.clone(),
    };
    Some(Interval {
        window: super::observe::Window {
            start_ns: last,
            end_ns: run.session_window.end_ns.max(last),
        },
        faults,
    })
}

/// An anonymous mapping of the size of one told a stack is a stack too: a program's threads
/// share a stack size, and the kernel's flag can still be missing on a stack named by smaps
/// alone, or whose every lookup met a busy mmap lock when its waiting page was dropped (more
/// than 256 blocks of one process waiting at once).
pub fn mark_stack_sized(mappings: &mut [MappingFigures]) {
    let sizes: std::collections::BTreeSet<u64> = mappings
        .iter()
        .filter(|m| m.stack && m.mapping == "anonymous")
        .map(|m| m.size_bytes)
        .collect();
    for m in mappings.iter_mut().filter(|m| m.mapping == "anonymous") {
        m.stack |= sizes.contains(&m.size_bytes);
    }
}

/// The mean latency of the timed faults of `classes`, ns (0 when none was timed).
fn mean_ns(f: &Faults, classes: &[&str]) -> f64 {
    let (total, count) = classes
        .iter()
        .filter_map(|c| f.latency_ns.get(*c))
        .fold((0u64, 0u64), |(t, n), l| (t + l.total, n + l.count));
    if count == 0 {
        0.0
    } else {
        total as f64 / count as f64
    }
}

/// The share of an interval's faults whose time the hooks measured: all of them, or, on the
/// tracepoint hook set (which times no page the kernel populates inside a call: that time
/// is the call's), those the program's code took. A mapping's faults are not split by class,
/// so its time is its faults x the mean latency x this share.
fn timed_share(f: &Faults) -> f64 {
    let populated_timed = f.latency_ns.get("populated").is_some_and(|l| l.count > 0);
    let all = f.user + f.populated;
    if populated_timed || f.populated == 0 || all == 0 {
        1.0
    } else {
        f.user as f64 / all as f64
    }
}

fn add_phase(phase: &mut Phase, f: &Faults) {
    phase.minor += f.minor;
    phase.major += f.major;
    phase.user += f.user;
    phase.populated += f.populated;
    let user_ns = f.user as f64 * mean_ns(f, &["user"]);
    phase.user_fault_ns += user_ns as u64;
    // Pages populated untimed add nothing: their time is in the call that populated them.
    phase.fault_ns += (user_ns + f.populated as f64 * mean_ns(f, &["populated"])) as u64;
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

/// The mapping a row's faults belong to: the row's own when the tracer named it; for faults
/// no mapping held when the summary was made, the mapping the samples saw at that address
/// around the interval (the most recent one), else the row as it is.
fn attribute(row: &super::observe::MappingRow, interval: &Interval, seen: &[Seen]) -> MappingKey {
    let start = hex(&row.start).unwrap_or(0);
    let end = hex(&row.end).unwrap_or(start);
    if !UNATTRIBUTED.contains(&row.mapping.as_str()) {
        return (start, end, row.mapping.clone());
    }
    let slack = 200_000_000;
    let w = interval.window;
    let holds = |m: &&Seen| m.start <= start && start < m.end;
    let around = |m: &&Seen| m.first_ns <= w.end_ns + slack && m.last_ns + slack >= w.start_ns;
    seen.iter()
        .filter(holds)
        .filter(around)
        .max_by_key(|m| m.first_ns)
        .or_else(|| seen.iter().filter(holds).max_by_key(|m| m.last_ns))
        .map_or((start, end, row.mapping.clone()), |m| {
            (m.start, m.end, m.name.to_str_lossy().into_owned())
        })
}

fn figures_of(key: &MappingKey, seen: &[Seen], t0: u64) -> MappingFigures {
    let (start, end, name) = key;
    let found = seen
        .iter()
        .find(|m| m.start == *start && m.end == *end && m.name == name.as_str())
        .or_else(|| seen.iter().find(|m| m.start == *start && m.end == *end));
    MappingFigures {
        mapping: name.clone(),
        start: *start,
        end: *end,
        size_bytes: end.saturating_sub(*start),
        perms: found.map(|m| m.perms.clone()),
        resident_bytes: found.map(|m| m.rss_max_bytes),
        swap_bytes: found.map(|m| m.swap_max_bytes),
        faults_startup: 0,
        faults_after: 0,
        fault_ns_startup: 0,
        fault_ns_after: 0,
        locked: found.is_some_and(|m| m.locked_max_bytes > 0),
        lifetimes: found.map_or(0, |m| m.lifetimes),
        stack: found.is_some_and(|m| m.guarded),
        first_seen_secs: found.map(|m| m.first_ns.saturating_sub(t0) as f64 / 1e9),
        sites: Vec::new(),
    }
}

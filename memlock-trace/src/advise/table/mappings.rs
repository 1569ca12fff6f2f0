//! Each mapping's figures, interval by interval: the tracer's fault counts per mapping
//! (faults no mapping held given to the one the samples saw there), timed by the interval's
//! mean fault latency, split at the start-up window, joined with what the samples saw of
//! the mapping; rows of one mapping seen at several extents made one.

use std::collections::BTreeMap;

use super::{
    MappingFigures, Phase, Startup,
    phases::{add_phase, mean_ns, tail, timed_share},
};
use crate::advise::{
    observe::{Interval, MappingRow, Run, Site},
    sample::Seen,
};

/// Names the tracer gives faults no current mapping holds.
const UNATTRIBUTED: [&str; 2] = ["unmapped", "unknown"];

/// A row of the table as the faults were counted: start, end, name.
type MappingKey = (u64, u64, String);

/// A mapping's faults in one interval, its rows (by range) added up.
#[derive(Default)]
struct Rows {
    faults: u64,
    locked: bool,
    stack: bool,
    /// The tail's only: its rows are the whole run's, their stacks every sampled fault's.
    sites: Vec<Site>,
}

/// Each phase's faults and each mapping's figures, most fault time after start-up first.
pub(super) fn count(run: &Run, t0: u64, startup: &Startup) -> (Phase, Phase, Vec<MappingFigures>) {
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
        if is_tail {
            counted = Some(rows.iter().map(|(k, f)| (k.clone(), f.faults())).collect());
        }
        for (key, found) in by_mapping(interval, &run.samples.seen, is_tail) {
            let faults = match counted.as_mut() {
                Some(counted) => take_counted(counted, &key, found.faults),
                None => found.faults,
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
            figures.locked |= found.locked;
            figures.stack |= found.stack;
            merge_sites(&mut figures.sites, &found.sites);
        }
    }
    let mut mappings = merge_grown(rows.into_values().collect());
    mark_stack_sized(&mut mappings);
    mappings.sort_by(|a, b| {
        (b.fault_ns_after, b.faults())
            .cmp(&(a.fault_ns_after, a.faults()))
            .then(a.start.cmp(&b.start))
    });
    (during, after, mappings)
}

/// An interval's rows, each given to its mapping ([`attribute`]).
fn by_mapping(interval: &Interval, seen: &[Seen], is_tail: bool) -> BTreeMap<MappingKey, Rows> {
    let mut per_key: BTreeMap<MappingKey, Rows> = BTreeMap::new();
    for row in &interval.faults.by_mapping {
        let slot = per_key.entry(attribute(row, interval, seen)).or_default();
        slot.faults += row.faults;
        slot.locked |= row.locked == Some(true);
        slot.stack |= row.stack;
        // The tail's rows are the whole run's: their stacks are every sampled fault's.
        if is_tail {
            merge_sites(&mut slot.sites, &row.stacks);
        }
    }
    per_key
}
/// One row for a mapping seen at several extents (a heap or an arena growing, a VMA
/// merged with a neighbour): rows of one name whose ranges overlap are one, their union.
pub(in crate::advise) fn merge_grown(mut rows: Vec<MappingFigures>) -> Vec<MappingFigures> {
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

/// An anonymous mapping of the size of one told a stack is a stack too: a program's threads
/// share a stack size, and the kernel's flag can still be missing on a stack named by smaps
/// alone, or whose every lookup met a busy mmap lock when its waiting page was dropped (more
/// than 256 blocks of one process waiting at once).
pub(in crate::advise) fn mark_stack_sized(mappings: &mut [MappingFigures]) {
    let sizes: std::collections::BTreeSet<u64> = mappings
        .iter()
        .filter(|m| m.stack && m.mapping == "anonymous")
        .map(|m| m.size_bytes)
        .collect();
    for m in mappings.iter_mut().filter(|m| m.mapping == "anonymous") {
        m.stack |= sizes.contains(&m.size_bytes);
    }
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

/// The mapping a row's faults belong to: the row's own when the tracer named it; for faults
/// no mapping held when the summary was made, the mapping the samples saw at that address
/// around the interval (the most recent one), else the row as it is.
fn attribute(row: &MappingRow, interval: &Interval, seen: &[Seen]) -> MappingKey {
    let start = hex(&row.start).unwrap_or(0);
    let end = hex(&row.end).unwrap_or(start);
    if !UNATTRIBUTED.contains(&row.mapping.as_str()) {
        let name = path_of(&row.mapping, start, seen).unwrap_or_else(|| row.mapping.clone());
        return (start, end, name);
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

/// The path of a file the tracer named by its name alone (its mapping was gone when the
/// summary was made: an image an exec replaced, a library unloaded), as the samples saw it:
/// the mapping at `start` of that name, else the one path of that name. So a file has one
/// name in the table (before, `libc.so.6` beside `/usr/lib/x86_64-linux-gnu/libc.so.6`).
fn path_of(name: &str, start: u64, seen: &[Seen]) -> Option<String> {
    if name.contains('/') {
        return None;
    }
    let ends = [format!("/{name}"), format!("/{name} (deleted)")];
    let of_name = |m: &&Seen| {
        let path = m.name.to_str_lossy();
        ends.iter().any(|e| path.ends_with(e.as_str()))
    };
    let path = |m: &Seen| m.name.to_str_lossy().into_owned();
    if let Some(here) = seen
        .iter()
        .filter(of_name)
        .find(|m| m.start <= start && start < m.end)
    {
        return Some(path(here));
    }
    let paths: std::collections::BTreeSet<String> = seen.iter().filter(of_name).map(path).collect();
    (paths.len() == 1)
        .then(|| paths.into_iter().next())
        .flatten()
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

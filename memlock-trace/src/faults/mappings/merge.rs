//! One row per mapping region, and what a top-N table leaves out.
//!
//! The fault hooks key a VMA's faults, and record its identity, by the VMA's start at the
//! fault, so a VMA whose start moves comes back under several keys, each identity at the
//! extent it had when last met: an anonymous VMA the kernel extends downwards as each new
//! slab is mapped just below it (memcached's ten 1 MiB slabs: ten rows sharing an end), a
//! region merged into the neighbour below it, a region an mlock split after its first faults
//! (a row from before the mlock, a row after). To the reader they are one region.
//!
//! Why here and not in the kernel: rekeying a VMA's earlier identities as it grows would need
//! hooks on the kernel's VMA merges and work on the per-fault path; here it is one pass over
//! a process's rows, once per summary.
//!
//! The rule: rows of one process that are the same kind of memory (the same name; for a file
//! the kernel identified, the same file at the same place in it, `start - offset`, which a
//! file VMA keeps when it grows or is split) and that share a start or an end are one row
//! (transitively): the union of their ranges, their faults and sampled stacks summed, named
//! as the lowest one. A VMA keeps one edge when it grows at the other, is merged with a
//! neighbour there, or has its other part split off. Overlap alone is not enough, and an
//! edge is not either where the process still lives: mmap places a fresh mapping at the top
//! of the gap an unmapped one left, so it shares that one's end (the fault accuracy test's
//! `onfault` region, whose row took the faults of the steps before it). So for a live
//! process, whose mappings are read for the summary, a row joins only where those mappings
//! cover it without a gap and the mapping at its start is locked as the row was; an exited
//! one's last read may predate its last faults, and its rows join by edge alone. Rows that
//! only touch stay apart: two VMAs side by side. A row is `locked` when any part of it was,
//! and `partly_locked` when its parts disagree (the mlock after the first faults).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::{MappingFaults, add_sampled};
use crate::procfs::Mapping;

/// Rows a top-N table left out, and their faults: `... 14 more mappings, 3201 faults, 4
/// major`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LeftOut {
    pub mappings: u64,
    pub faults: u64,
    /// As [`MappingFaults::majors`]: `None` where not measured.
    pub majors: Option<u64>,
}

impl Default for LeftOut {
    fn default() -> Self {
        Self {
            mappings: 0,
            faults: 0,
            majors: Some(0),
        }
    }
}

/// A row's range, when it has one (not `populated by ...`, not a lone address).
pub(super) fn range_of(row: &MappingFaults) -> Option<(u64, u64)> {
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    Some((hex(&row.start)?, hex(&row.end)?)).filter(|(start, end)| start < end)
}

/// What must be equal for two rows sharing an edge to be one region: the name, and for a file
/// the kernel identified, its device, inode and where the file would start in memory.
fn kind_of(row: &MappingFaults, start: u64) -> (&[u8], Option<(&str, u64, u64)>) {
    let file = row
        .file
        .as_ref()
        .map(|f| (f.dev.as_str(), f.inode, start.wrapping_sub(f.offset)));
    (row.mapping.as_bytes(), file)
}

/// The rows of one process with the rows of the same kind they share a start or an end
/// with made one (see the module). `live`: the mappings of a live process, read for this
/// summary, and whether they say which are locked; a row they do not cover, or whose lock
/// state is not that of the mapping at its start, is left alone.
pub fn regions(rows: Vec<MappingFaults>, live: Option<(&[Mapping], bool)>) -> Vec<MappingFaults> {
    let mut out = Vec::new();
    let mut ranged = Vec::with_capacity(rows.len());
    for row in rows {
        match range_of(&row) {
            Some(range) => ranged.push((range, row)),
            None => out.push(row),
        }
    }
    let runs = live.map(|(maps, flags)| runs(maps, flags));
    // Each row joins the first row of its kind met at its start or its end, transitively.
    let mut parent: Vec<usize> = (0..ranged.len()).collect();
    let mut edges = HashMap::new();
    for (i, (range, row)) in ranged.iter().enumerate() {
        let run = match &runs {
            Some(runs) => match run_of(runs, *range) {
                Some((run, flags)) if flags.is_none_or(|flags| alike(row, flags)) => Some(run),
                _ => continue,
            },
            None => None,
        };
        // Only rows alike in VM_LOCKONFAULT join: the fault hooks read it from the VMA itself,
        // where smaps shows it only from 6.2, and a lock-on-fault mapping placed over a locked
        // one's addresses shares its edge (6.1 arm64: the fault accuracy test's `onfault`
        // region took the 110 faults of the locked steps before it).
        let lock_on_fault = row.lockonfault;
        for edge in [(false, range.0), (true, range.1)] {
            let key = (kind_of(row, range.0), lock_on_fault, run, edge);
            let first = *edges.entry(key).or_insert(i);
            let (a, b) = (root(&mut parent, i), root(&mut parent, first));
            parent[a] = b;
        }
    }
    let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..ranged.len() {
        groups.entry(root(&mut parent, i)).or_default().push(i);
    }
    let mut ranged: Vec<Option<((u64, u64), MappingFaults)>> =
        ranged.into_iter().map(Some).collect();
    for members in groups.into_values() {
        let mut members: Vec<((u64, u64), MappingFaults)> =
            members.iter().filter_map(|&i| ranged[i].take()).collect();
        // Named as the lowest: a file's offset is its start's.
        members.sort_by_key(|((start, _), _)| *start);
        let mut members = members.into_iter();
        let Some(((_, mut last), mut region)) = members.next() else {
            continue;
        };
        for ((_, end), row) in members {
            last = last.max(end);
            join(&mut region, row);
        }
        region.end = format!("{last:#x}");
        out.push(region);
    }
    out
}

/// A live process's mapping: start, end, the start of the run of mappings without a gap
/// between them that it is part of, and its lock flags (when the file read says).
type Run = (u64, u64, u64, Option<LockFlags>);

/// A mapping's `VM_LOCKED`, and its `VM_LOCKONFAULT` where known.
type LockFlags = (bool, Option<bool>);

/// A live process's mappings as [`Run`]s, in address order.
fn runs(maps: &[Mapping], flags: bool) -> Vec<Run> {
    let mut ranges: Vec<(u64, u64, Option<LockFlags>)> = maps
        .iter()
        .map(|m| (m.start, m.end, flags.then_some((m.locked, m.lockonfault))))
        .collect();
    ranges.sort_unstable();
    let mut runs: Vec<Run> = Vec::with_capacity(ranges.len());
    for (start, end, locked) in ranges {
        let run = match runs.last() {
            Some(&(_, last_end, run, _)) if last_end == start => run,
            _ => start,
        };
        runs.push((start, end, run, locked));
    }
    runs
}

/// The run of mappings that covers `(start, end)` whole, by its start, and the lock flags of
/// the mapping at `start`; none where a gap or nothing is (a region unmapped since, another
/// mapped over part of it).
fn run_of(runs: &[Run], (start, end): (u64, u64)) -> Option<(u64, Option<LockFlags>)> {
    let i = runs.partition_point(|m| m.1 <= start);
    let &(first, _, run, locked) = runs.get(i)?;
    if first > start {
        return None;
    }
    let last = runs.partition_point(|m| m.0 < end).checked_sub(1)?;
    (runs.get(last)?.2 == run && runs[last].1 >= end).then_some((run, locked))
}

/// The row was locked as the mapping at its start is, where both are known: a fresh mapping
/// over an unmapped one's addresses is often not.
fn alike(row: &MappingFaults, (locked, lockonfault): LockFlags) -> bool {
    row.locked.is_none_or(|l| l == locked)
        && row.lockonfault.zip(lockonfault).is_none_or(|(a, b)| a == b)
}

fn root(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

/// Adds `row` to `region`, which starts at or below it.
fn join(region: &mut MappingFaults, row: MappingFaults) {
    region.faults += row.faults;
    region.majors = region.majors.zip(row.majors).map(|(a, b)| a + b);
    let disagree = matches!((region.locked, row.locked), (Some(a), Some(b)) if a != b);
    region.partly_locked |= row.partly_locked || disagree;
    region.locked = either(region.locked, row.locked);
    region.lockonfault = either(region.lockonfault, row.lockonfault);
    if region.locked_source == "unknown" {
        region.locked_source = row.locked_source;
    }
    region.stack |= row.stack;
    add_sampled(&mut region.sampled, &row.sampled);
}

/// Set where either part says so; unknown where neither knows.
fn either(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    (a.is_some() || b.is_some()).then_some(a == Some(true) || b == Some(true))
}

/// The top `top` rows by faults (most first, then by address), and what the rest held.
pub fn top(mut rows: Vec<MappingFaults>, top: usize) -> (Vec<MappingFaults>, LeftOut) {
    rows.sort_by(|a, b| b.faults.cmp(&a.faults).then_with(|| a.start.cmp(&b.start)));
    let rest = rows.split_off(top.min(rows.len()));
    let left_out = LeftOut {
        mappings: rest.len() as u64,
        faults: rest.iter().map(|r| r.faults).sum(),
        majors: rest.iter().map(|r| r.majors).sum(),
    };
    (rows, left_out)
}

#[cfg(test)]
mod tests;

//! Rows that are one VMA over time made one row, one name per file, and what a top-N table
//! leaves out.
//!
//! The hooks key a VMA's faults by the VMA's start at the fault, so a VMA that grew (an
//! anonymous VMA the kernel extends downwards as each new 1 MiB slab is mapped below it, as
//! memcached's are) or that an mlock split after its first faults (a row before the mlock,
//! a row after) comes back as several rows sharing an end or a start. They are one mapping
//! to the reader: one row, at its widest, with their faults summed (`/proc/PID/maps` and
//! perf's mmap events name the VMA, not each size it had).

use std::collections::HashMap;

use serde::Serialize;

use super::{MappingFaults, add_sampled};
use crate::output::Outside;

/// Rows a top-N table left out, and their faults: `... and 12 more mappings, 3,456 faults`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LeftOut {
    pub mappings: u64,
    pub faults: u64,
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

/// What makes two rows the same mapping: the same file (device, inode) at the same place
/// in it (a grown file VMA keeps `start - offset`), or, for memory no file backs, the same
/// name (`anonymous`, `[heap]`, ...).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Identity {
    File(String, u64, u64),
    Named(Outside),
}

fn identity(row: &MappingFaults, start: u64) -> Identity {
    match &row.file {
        Some(f) => Identity::File(f.dev.clone(), f.inode, start.wrapping_sub(f.offset)),
        None => Identity::Named(row.mapping.clone()),
    }
}

/// Gives every row of one file (device, inode) one name: the longest any row has (the path
/// `/proc/PID/smaps` gave, over the last component the kernel keeps, `libc.so.6`), so one
/// file is never two names in one table.
pub fn one_name_per_file(rows: &mut [MappingFaults]) {
    let mut names: HashMap<(String, u64), Outside> = HashMap::new();
    for row in rows.iter() {
        if let Some(f) = &row.file {
            let name = names
                .entry((f.dev.clone(), f.inode))
                .or_insert_with(|| row.mapping.clone());
            if row.mapping.as_bytes().len() > name.as_bytes().len() {
                name.clone_from(&row.mapping);
            }
        }
    }
    for row in rows.iter_mut() {
        if let Some(name) = row
            .file
            .as_ref()
            .and_then(|f| names.get(&(f.dev.clone(), f.inode)))
        {
            row.mapping.clone_from(name);
        }
    }
}

fn root(parent: &mut [usize], mut i: usize) -> usize {
    while parent[i] != i {
        parent[i] = parent[parent[i]];
        i = parent[i];
    }
    i
}

/// Merges the rows that are one VMA over time: the same identity, sharing a start or an
/// end (two non-empty ranges that do, overlap), transitively. The merged row is the one
/// with the most faults, widened to the union of their ranges, with every row's faults,
/// sampled stacks and lock flags (locked if any of them saw it locked). Rows without a
/// range (`populated by ...`, a lone address) stay as they are.
pub fn same_vma(rows: Vec<MappingFaults>) -> Vec<MappingFaults> {
    let ranges: Vec<Option<(u64, u64)>> = rows
        .iter()
        .map(|r| Some((hex(&r.start)?, hex(&r.end)?)).filter(|(s, e)| s < e))
        .collect();
    let mut parent: Vec<usize> = (0..rows.len()).collect();
    let mut seen: HashMap<(Identity, bool, u64), usize> = HashMap::new();
    for (i, range) in ranges.iter().enumerate() {
        let Some((start, end)) = *range else {
            continue;
        };
        let id = identity(&rows[i], start);
        for (is_end, edge) in [(false, start), (true, end)] {
            let key = (id.clone(), is_end, edge);
            match seen.get(&key) {
                Some(&j) => {
                    let (a, b) = (root(&mut parent, i), root(&mut parent, j));
                    parent[a] = b;
                }
                None => {
                    seen.insert(key, i);
                }
            }
        }
    }
    let mut groups: HashMap<usize, Vec<usize>> = HashMap::new();
    for i in 0..rows.len() {
        let r = root(&mut parent, i);
        groups.entry(r).or_default().push(i);
    }
    let mut rows: Vec<Option<MappingFaults>> = rows.into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(groups.len());
    let mut roots: Vec<usize> = groups.keys().copied().collect();
    roots.sort_unstable();
    for r in roots {
        let members = &groups[&r];
        let Some(&base) = members
            .iter()
            .max_by_key(|&&i| (rows[i].as_ref().map_or(0, |m| m.faults), usize::MAX - i))
        else {
            continue;
        };
        let mut merged = rows[base].take().expect("each row merged once");
        if members.len() > 1 {
            let (mut start, mut end) = ranges[base].expect("merged rows have a range");
            for &i in members.iter().filter(|&&i| i != base) {
                let other = rows[i].take().expect("each row merged once");
                let (s, e) = ranges[i].expect("merged rows have a range");
                (start, end) = (start.min(s), end.max(e));
                merged.faults += other.faults;
                merged.stack |= other.stack;
                merged.locked = or(merged.locked, other.locked);
                merged.lockonfault = or(merged.lockonfault, other.lockonfault);
                if merged.locked_source == "unknown" {
                    merged.locked_source = other.locked_source;
                }
                add_sampled(&mut merged.sampled, &other.sampled);
            }
            let old_start = ranges[base].map_or(start, |(s, _)| s);
            // The place in the file of the widened start.
            if let Some(f) = &mut merged.file {
                f.offset = f.offset.saturating_sub(old_start - start);
            }
            merged.start = format!("{start:#x}");
            merged.end = format!("{end:#x}");
        }
        out.push(merged);
    }
    out
}

fn or(a: Option<bool>, b: Option<bool>) -> Option<bool> {
    match (a, b) {
        (None, None) => None,
        _ => Some(a == Some(true) || b == Some(true)),
    }
}

/// The top `top` rows by faults (most first, then by address), and what the rest held.
pub fn top(mut list: Vec<MappingFaults>, top: usize) -> (Vec<MappingFaults>, LeftOut) {
    list.sort_by(|a, b| b.faults.cmp(&a.faults).then_with(|| a.start.cmp(&b.start)));
    let rest = list.split_off(top.min(list.len()));
    let left_out = LeftOut {
        mappings: rest.len() as u64,
        faults: rest.iter().map(|r| r.faults).sum(),
    };
    (list, left_out)
}

#[cfg(test)]
mod tests;

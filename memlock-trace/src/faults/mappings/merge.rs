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
//! hooks on the kernel's VMA merges and work on the per-fault path; here it is one interval
//! union over a process's rows, once per summary.
//!
//! The rule: rows of one process that are the same kind of memory (the same name; for a file
//! the kernel identified, the same file at the same place in it, `start - offset`, which a
//! file VMA keeps when it grows or is split) and whose ranges overlap are one row: the union
//! of their ranges, their faults and sampled stacks summed, named as the lowest one. Rows that
//! only touch stay apart: two VMAs side by side, each met at one extent (a VMA split before
//! its faults, two mappings next to each other). A row is `locked` when any part of it was,
//! and `partly_locked` when its parts disagree (the mlock after the first faults).

use serde::Serialize;

use super::{MappingFaults, add_sampled};

/// Rows a top-N table left out, and their faults: `... 14 more mappings, 3201 faults`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LeftOut {
    pub mappings: u64,
    pub faults: u64,
}

/// A row's range, when it has one (not `populated by ...`, not a lone address).
pub(super) fn range_of(row: &MappingFaults) -> Option<(u64, u64)> {
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    Some((hex(&row.start)?, hex(&row.end)?)).filter(|(start, end)| start < end)
}

/// What must be equal for two overlapping rows to be one region: the name, and for a file
/// the kernel identified, its device, inode and where the file would start in memory.
fn kind_of(row: &MappingFaults, start: u64) -> (&[u8], Option<(&str, u64, u64)>) {
    let file = row
        .file
        .as_ref()
        .map(|f| (f.dev.as_str(), f.inode, start.wrapping_sub(f.offset)));
    (row.mapping.as_bytes(), file)
}

/// The rows of one process with overlapping rows of the same kind made one (see the module).
pub fn regions(rows: Vec<MappingFaults>) -> Vec<MappingFaults> {
    let mut out = Vec::new();
    let mut ranged = Vec::with_capacity(rows.len());
    for row in rows {
        match range_of(&row) {
            Some(range) => ranged.push((range, row)),
            None => out.push(row),
        }
    }
    ranged.sort_by(|(a, ra), (b, rb)| {
        kind_of(ra, a.0)
            .cmp(&kind_of(rb, b.0))
            .then(a.0.cmp(&b.0))
            .then(b.1.cmp(&a.1))
    });
    // Sorted by kind then start: a row is part of the region before it when it is of the
    // same kind and starts before that region's end.
    let mut merged: Vec<((u64, u64), MappingFaults)> = Vec::with_capacity(ranged.len());
    for ((start, end), row) in ranged {
        match merged.last_mut() {
            Some(((first, last), region))
                if start < *last && kind_of(region, *first) == kind_of(&row, start) =>
            {
                *last = (*last).max(end);
                join(region, row);
                region.end = format!("{last:#x}");
            }
            _ => merged.push(((start, end), row)),
        }
    }
    out.extend(merged.into_iter().map(|(_, row)| row));
    out
}

/// Adds `row` to `region`, which starts at or below it.
fn join(region: &mut MappingFaults, row: MappingFaults) {
    region.faults += row.faults;
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
    };
    (rows, left_out)
}

#[cfg(test)]
mod tests;

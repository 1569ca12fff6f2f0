//! Faults attributed to the process's mappings. A region the fault hooks keyed by its VMA is
//! named from what the kernel read at the fault (range, file name, `[heap]`, ...), the path
//! completed from `/proc/PID/smaps` when the same mapping is still there; a region keyed by
//! page (no VMA found at the fault) is matched to `/proc/PID/smaps` (or, for an exited
//! process, to the last mappings read and the VMAs mlock-family calls saw), with
//! neighbouring runs outside every mapping merged into one row.

use std::collections::{BTreeMap, HashMap as StdHashMap};

use memlock_trace_common::{
    faults::{RegionKey, RegionValue, VM_HELD_SP, region_kind},
    mapping::MappingInfo,
    vma::{VM_LOCKED, VM_LOCKONFAULT},
};
use serde::Serialize;

mod merge;
mod place;

use super::{sizing::REGION_SHIFT, stacks::StackFaults};
use crate::{
    output::Outside,
    procfs::{Mapping, MapsFile, ThpMode},
    unwind::Stack,
};
pub use merge::LeftOut;
use merge::range_of;
use place::{Placer, row};

/// A mapping's share of a process's faults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MappingFaults {
    /// `[heap]`, `[stack]`, a file path (or, when smaps no longer has it, the file's name),
    /// `anonymous`; `populated by mlockall` for pages a call populated across VMAs the hooks
    /// cannot tell apart; `unmapped` when no current mapping holds the address any more,
    /// `unknown` when the process's mappings could not be read (it exited before a snapshot)
    /// or the address is outside the last ones read before it exited. Neighbouring runs
    /// outside every mapping are one row, `start` to `end`.
    pub mapping: Outside,
    pub start: String,
    pub end: String,
    pub faults: u64,
    /// Of `faults`, the major ones; `None` (JSON null, text `-`) where the hooks count a
    /// region at the fault's start (`--latency-sample`), before it is known to be major.
    pub majors: Option<u64>,
    /// `VM_LOCKED` / `VM_LOCKONFAULT` of the VMA: as the fault hook saw it (`"vma"`), or from
    /// `/proc/PID/smaps` when the summary was made (`"smaps"`), or, for an exited process's
    /// VMA known only from an mlock-family call, as that call left it (`"call"`), or unknown.
    pub locked: Option<bool>,
    pub lockonfault: Option<bool>,
    pub locked_source: &'static str,
    /// `locked` for some of the row and not for the rest: a region whose VMAs, or whose VMA
    /// over time, were locked in part (an mlock after its first faults); see [`merge`].
    pub partly_locked: bool,
    /// A faulting thread's user stack pointer was inside this VMA at one of its faults (the
    /// hooks with a VMA only): a stack, a thread's or the main one. A thread's stack is an
    /// ordinary anonymous mapping to `/proc/PID/maps`.
    pub stack: bool,
    /// Who named the mapping: `"fault"` (the kernel, at the fault or populating call),
    /// `"smaps"`, `"maps"` (system-wide, where smaps would cost too much: see
    /// [`MapsFile::Maps`]; the lock flags are then unknown), `"call"` (an mlock-family call's
    /// VMA), or `"none"`.
    pub named_by: &'static str,
    /// The mapped file's device (`major:minor`) and inode, as the kernel read them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<FileIdentity>,
    /// `--stacks`: the sampled faults of this row per stack, unwound, not yet symbolized.
    #[serde(skip)]
    pub sampled: BTreeMap<Stack, u64>,
    /// `--stacks`: the stacks that faulted most in this mapping (from `sampled`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stacks: Option<Vec<StackFaults>>,
    /// The pages backing the row's range, from the last `/proc/PID/smaps` read that held it
    /// (absent where none did: a region mapped and unmapped between two reads).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pages: Option<RowPages>,
}

/// What pages back a row: its page size and how much of it is in huge pages. A fault that
/// maps a huge page maps 512 base pages (2 MiB) at once: zeroing them, and compacting memory
/// to find them, make it another kind of fault than a 4 KiB one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RowPages {
    /// The kernel's page size for the mapping: 4096, or a hugetlb mapping's huge page size.
    pub page_bytes: u64,
    pub hugetlb: bool,
    /// A fault here may map a transparent huge page (THP on for it: `always`, or
    /// `madvise` with `MADV_HUGEPAGE`).
    pub thp_eligible: bool,
    /// Resident in transparent huge pages (`AnonHugePages` and the like).
    pub thp_bytes: u64,
    /// Resident in all: `Rss`, and the hugetlb pages smaps counts apart from it.
    pub rss_bytes: u64,
}

impl RowPages {
    /// The smaps mappings overlapping `[start, end)` added up (a row can span VMAs that were
    /// split after its faults).
    fn of(maps: &[Mapping], (start, end): (u64, u64), mode: ThpMode) -> Option<Self> {
        let mut pages: Option<Self> = None;
        for m in maps
            .iter()
            .filter(|m| m.overlaps((start, end.max(start + 1))))
        {
            let p = &m.pages;
            let row = pages.get_or_insert(Self {
                page_bytes: 0,
                hugetlb: false,
                thp_eligible: false,
                thp_bytes: 0,
                rss_bytes: 0,
            });
            row.page_bytes = row.page_bytes.max(p.kernel_page_kb * 1024);
            row.hugetlb |= p.hugetlb;
            row.thp_eligible |= p.thp_eligible(mode);
            row.thp_bytes += p.thp_kb * 1024;
            row.rss_bytes += (p.rss_kb + p.hugetlb_kb) * 1024;
        }
        // Read from `maps` (no page size): nothing known.
        pages.filter(|p| p.page_bytes > 0)
    }

    /// Backed by pages larger than the base page (now, or eligible to be).
    pub fn huge(&self) -> bool {
        self.hugetlb || self.thp_bytes > 0
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FileIdentity {
    pub dev: String,
    pub inode: u64,
    /// `vm_pgoff`: where in the file the mapping starts, bytes.
    pub offset: u64,
}

/// The sampled faults of one region per stack (`--stacks`).
pub type RegionSites<'a> = (&'a RegionKey, &'a BTreeMap<Stack, u64>);

/// Attributes region counts to the process's mappings, one row per mapping region (rows
/// that are one region over time made one: [`merge`]), and returns the top `top` by faults
/// and what the rest held.
/// `kernel`: the VMAs the fault hooks identified, by start. `read`: the process's mappings
/// and the file they were read from (without flags from `maps`). `exited`: those are the
/// last seen before the process exited, so an address outside them is unknown (mapped after
/// they were read), not unmapped, unless a VMA an mlock-family call saw since holds it
/// (`noted`, newest last). `sites`: the process's sampled fault stacks per region, each
/// added to the row its region's faults went to (`MappingFaults::sampled`).
pub fn by_mapping(
    regions: &[(RegionKey, RegionValue)],
    sites: &[RegionSites<'_>],
    kernel: &BTreeMap<u64, MappingInfo>,
    read: Option<(&[Mapping], MapsFile)>,
    exited: Option<&[Mapping]>,
    top: usize,
) -> (Vec<MappingFaults>, LeftOut) {
    let maps = read.map(|(maps, _)| maps);
    let placer = Placer {
        kernel,
        maps,
        file: read.map_or(MapsFile::Smaps, |(_, file)| file),
        exited,
        unattributed: if maps.is_none() || exited.is_some() {
            "unknown"
        } else {
            "unmapped"
        },
    };
    let mut rows = Rows::default();
    for (key, value) in regions {
        rows.count(&placer, key, value);
    }
    let sampled_outside = rows.add_sites(&placer, sites);
    let mut list: Vec<MappingFaults> = rows.per_mapping.into_values().collect();
    list.extend(
        spans(rows.outside)
            .into_iter()
            .map(|span| outside_row(span, placer.unattributed, &sampled_outside)),
    );
    // Current only while the process lives: an exited one's last read may predate its
    // last faults.
    let live = read
        .filter(|_| exited.is_none())
        .map(|(maps, file)| (maps, file.has_flags()));
    merge::top(merge::regions(list, live), top)
}

/// The rows being added up, by the range they merge by.
#[derive(Default)]
struct Rows {
    per_mapping: StdHashMap<(u64, u64), MappingFaults>,
    /// The widest extent of each row the kernel named.
    extents: StdHashMap<(u64, u64), (u64, u64)>,
    /// Runs no mapping holds (first page, faults, majors), merged later into spans of
    /// neighbours.
    outside: Vec<(u64, u64, u64)>,
}

impl Rows {
    /// Adds one region's faults to its row.
    fn count(&mut self, placer: &Placer<'_>, key: &RegionKey, value: &RegionValue) {
        let Some((range, mut entry, identified)) = placer.place(key) else {
            self.outside.push((key.start, value.faults, value.majors));
            return;
        };
        let exact = key.exact == region_kind::VMA;
        if exact {
            // The hook read the VMA's own flags at fault time: better than a later snapshot.
            entry.locked = Some(value.vm_flags & VM_LOCKED != 0);
            entry.lockonfault = Some(value.vm_flags & VM_LOCKONFAULT != 0);
            entry.locked_source = "vma";
            entry.stack |= value.vm_flags & VM_HELD_SP != 0;
        }
        if let Some(info) = identified.filter(|_| entry.named_by == "fault") {
            // A row that grew shows its widest extent.
            let extent = self.extents.entry(range).or_insert((info.start, info.end));
            *extent = (extent.0.min(info.start), extent.1.max(info.end));
            entry.start = format!("{:#x}", extent.0);
            entry.end = format!("{:#x}", extent.1);
        }
        let slot = self
            .per_mapping
            .entry(range)
            .or_insert_with(|| entry.clone());
        slot.start.clone_from(&entry.start);
        slot.end.clone_from(&entry.end);
        slot.faults += value.faults;
        slot.majors = slot.majors.map(|m| m + value.majors);
        if exact {
            let locked = value.vm_flags & VM_LOCKED != 0;
            // The stack's and the heap's VMAs over time share a row: locked at some faults only.
            slot.partly_locked |= slot.locked.is_some_and(|was| was != locked);
            slot.locked = Some(slot.locked == Some(true) || locked);
            slot.lockonfault =
                Some(slot.lockonfault == Some(true) || value.vm_flags & VM_LOCKONFAULT != 0);
        }
        slot.stack |= entry.stack;
    }

    /// Adds each region's sampled stacks to its row; returns those of runs outside every
    /// mapping, by page, for the spans.
    fn add_sites<'s>(
        &mut self,
        placer: &Placer<'_>,
        sites: &[RegionSites<'s>],
    ) -> Vec<(u64, &'s BTreeMap<Stack, u64>)> {
        let mut sampled_outside = Vec::new();
        for &(key, stacks) in sites {
            let Some((range, ..)) = placer.place(key) else {
                sampled_outside.push((key.start, stacks));
                continue;
            };
            // A region none of whose faults were counted (the sample outlived its count).
            if let Some(slot) = self.per_mapping.get_mut(&range) {
                add_sampled(&mut slot.sampled, stacks);
            }
        }
        sampled_outside
    }
}

/// The row of a span of runs outside every mapping, with the stacks sampled in it.
fn outside_row(
    (start, end, faults, majors): (u64, u64, u64, u64),
    unattributed: &'static str,
    sampled_outside: &[(u64, &BTreeMap<Stack, u64>)],
) -> MappingFaults {
    let mut entry = row(
        unattributed.into(),
        format!("{start:#x}"),
        format!("{end:#x}"),
        "none",
    );
    entry.faults = faults;
    entry.majors = Some(majors);
    for (_, stacks) in sampled_outside
        .iter()
        .filter(|(page, _)| (start..end).contains(page))
    {
        add_sampled(&mut entry.sampled, stacks);
    }
    entry
}

/// Says what pages back each row, from the mappings last read (`maps`), or, for a row none
/// of them overlaps, from the last read that saw its mapping before it was unmapped
/// (`unmapped`): a program often unmaps its large regions just before it exits, after the
/// tracer's last read while they were mapped. `mode`: the system's THP mode.
pub fn add_pages(
    rows: &mut [MappingFaults],
    maps: &[Mapping],
    unmapped: &[Mapping],
    mode: ThpMode,
) {
    for row in rows {
        if let Some(range) = range_of(row) {
            row.pages =
                RowPages::of(maps, range, mode).or_else(|| RowPages::of(unmapped, range, mode));
        }
    }
}

fn add_sampled(into: &mut BTreeMap<Stack, u64>, stacks: &BTreeMap<Stack, u64>) {
    for (stack, n) in stacks {
        *into.entry(Stack::clone(stack)).or_default() += n;
    }
}

/// Runs of faults (first page, faults) outside every known mapping, as (start, end, faults)
/// spans: a run in the same or the next `1 << REGION_SHIFT` window as the span before it
/// continues that span (an 8 MiB region touched in order is one span, not 128 rows). The end
/// is the end of the last run's window.
fn spans(mut runs: Vec<(u64, u64, u64)>) -> Vec<(u64, u64, u64, u64)> {
    let window = 1u64 << REGION_SHIFT;
    runs.sort_unstable();
    let mut spans: Vec<(u64, u64, u64, u64)> = Vec::new();
    for (start, faults, majors) in runs {
        let window_end = (start & !(window - 1)) + window;
        match spans.last_mut() {
            Some(span) if start < span.1 + window => {
                span.1 = span.1.max(window_end);
                span.2 += faults;
                span.3 += majors;
            }
            _ => spans.push((start, window_end, faults, majors)),
        }
    }
    spans
}

#[cfg(test)]
mod tests;

//! Faults attributed to the process's mappings. A region the fault hooks keyed by its VMA is
//! named from what the kernel read at the fault (range, file name, `[heap]`, ...), the path
//! completed from `/proc/PID/smaps` when the same mapping is still there; a region keyed by
//! page (no VMA found at the fault) is matched to `/proc/PID/smaps` (or, for an exited
//! process, to the last mappings read and the VMAs mlock-family calls saw), with
//! neighbouring runs outside every mapping merged into one row.

use std::collections::{BTreeMap, HashMap as StdHashMap};

use memlock_trace_common::{
    faults::{RegionKey, RegionValue, VM_HELD_SP, populate, region_kind},
    mapping::{MappingInfo, kind},
    vma::{VM_LOCKED, VM_LOCKONFAULT},
};
use serde::Serialize;

use super::{sizing::REGION_SHIFT, stacks::StackFaults};
use crate::{
    output::Outside,
    procfs::{Mapping, MapsFile, ThpMode},
    unwind::Stack,
};

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
    /// `VM_LOCKED` / `VM_LOCKONFAULT` of the VMA: as the fault hook saw it (`"vma"`), or from
    /// `/proc/PID/smaps` when the summary was made (`"smaps"`), or, for an exited process's
    /// VMA known only from an mlock-family call, as that call left it (`"call"`), or unknown.
    pub locked: Option<bool>,
    pub lockonfault: Option<bool>,
    pub locked_source: &'static str,
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

/// The name `/proc/PID/maps` gives a VMA the kernel identified; the full path from `maps`
/// when a mapping there starts at the same address with a path ending in the same name.
fn kernel_name(info: &MappingInfo, maps: Option<&[Mapping]>) -> Outside {
    let end = info
        .name
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(info.name.len());
    let name = &info.name[..end];
    // `/proc/PID/maps` shows a newline in a path as `\012` (seq_file_path's escape).
    let in_maps: Vec<u8> = name.iter().fold(Vec::new(), |mut out, &b| {
        if b == b'\n' {
            out.extend_from_slice(b"\\012");
        } else {
            out.push(b);
        }
        out
    });
    match info.kind {
        kind::HEAP => "[heap]".into(),
        kind::STACK => "[stack]".into(),
        kind::SPECIAL => name.into(),
        kind::FILE => maps
            .into_iter()
            .flatten()
            .find(|m| {
                let path = m.name.as_bytes();
                let path = path.strip_suffix(b" (deleted)").unwrap_or(path);
                m.start == info.start
                    && !name.is_empty()
                    && (path.rsplit(|&b| b == b'/').next() == Some(in_maps.as_slice())
                        || path == internal(&in_maps).as_slice())
            })
            .map_or_else(|| internal_or(&in_maps), |m| m.name.clone()),
        _ => "anonymous".into(),
    }
}

/// The files of the kernel's internal mounts that back shared anonymous memory
/// (`dev/zero`), System V segments (`SYSV...`) and memfds (`memfd:...`), as
/// `/proc/PID/maps` prints them: never on a path a user could open.
fn internal(name: &[u8]) -> Vec<u8> {
    [b"/", name].concat()
}

fn internal_or(name: &[u8]) -> Outside {
    if name == b"dev/zero" || name.starts_with(b"SYSV") || name.starts_with(b"memfd:") {
        [internal(name).as_slice(), b" (deleted)"].concat().into()
    } else {
        name.into()
    }
}

/// The kernel's `dev_t` (`major << 20 | minor`) as `/proc/PID/maps` prints it.
fn dev_name(dev: u32) -> String {
    format!("{:02x}:{:02x}", dev >> 20, dev & 0xf_ffff)
}

/// Below the stack's top, where mmap places nothing: the stack grows there.
const STACK_GAP: u64 = 128 << 20;

/// The row a region's faults go to: its key (the range [`by_mapping`] merges rows by), the
/// row as this region names it, and the VMA the hooks identified for it.
type Placed<'a> = ((u64, u64), MappingFaults, Option<&'a MappingInfo>);

/// The sampled faults of one region per stack (`--stacks`).
pub type RegionSites<'a> = (&'a RegionKey, &'a BTreeMap<Stack, u64>);

/// Attributes region counts to the process's mappings and returns the top `top` by faults.
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
) -> Vec<MappingFaults> {
    let maps = read.map(|(maps, _)| maps);
    let file = read.map_or(MapsFile::Smaps, |(_, file)| file);
    let mut per_mapping: StdHashMap<(u64, u64), MappingFaults> = StdHashMap::new();
    let mut extents: StdHashMap<(u64, u64), (u64, u64)> = StdHashMap::new();
    // Runs no mapping holds, merged below into spans of neighbouring runs.
    let mut outside: Vec<(u64, u64)> = Vec::new();
    let unattributed = if maps.is_none() || exited.is_some() {
        "unknown"
    } else {
        "unmapped"
    };
    let row = |mapping: Outside, start: String, end: String, named_by| MappingFaults {
        mapping,
        start,
        end,
        faults: 0,
        locked: None,
        lockonfault: None,
        locked_source: "unknown",
        stack: false,
        named_by,
        file: None,
        sampled: BTreeMap::new(),
        stacks: None,
        pages: None,
    };
    // None: outside every known mapping (page-keyed runs only).
    let place = |key: &RegionKey| -> Option<Placed<'_>> {
        if key.exact == region_kind::CALL {
            let call = populate::NAMES
                .get(key.start as usize)
                .copied()
                .unwrap_or("a call");
            let name = format!("populated by {call} (VMAs not told apart)");
            return Some((
                (u64::MAX, key.start),
                row(name.into(), String::new(), String::new(), "call"),
                None,
            ));
        }
        let exact = key.exact == region_kind::VMA;
        let holds = |m: &&Mapping| m.start <= key.start && key.start < m.end;
        let identified = if exact {
            kernel.get(&key.start)
        } else {
            // A page no VMA was found for at the fault, inside one found at another.
            kernel
                .range(..=key.start)
                .next_back()
                .map(|(_, info)| info)
                .filter(|info| key.start < info.end)
                // Or below the stack with nothing found between, where the stack grew (a
                // lookup at the fault's start, before the kernel grew it, finds no VMA):
                // mmap places nothing within 128 MiB of the stack's top (mm/util.c, MIN_GAP).
                .or_else(|| {
                    kernel
                        .range(key.start..)
                        .next()
                        .map(|(_, info)| info)
                        .filter(|info| {
                            info.kind == kind::STACK && info.end - key.start <= STACK_GAP
                        })
                })
        };
        let alive = if exited.is_none() { maps } else { None };
        if let Some(info) =
            identified.filter(|_| exact || alive.is_none_or(|maps| !maps.iter().any(|m| holds(&m))))
        {
            // The stack grows down and the heap up: one row each, whatever their extent
            // when each fault was counted.
            // Not anonymous VMAs by their end: an mlock of a region's top half splits off
            // a VMA with the same end, and it is a row of its own.
            let range = match info.kind {
                kind::STACK => (0, info.end),
                kind::HEAP => (info.start, 0),
                _ => (info.start, info.end),
            };
            let mut entry = row(
                kernel_name(info, maps),
                format!("{:#x}", info.start),
                format!("{:#x}", info.end),
                "fault",
            );
            entry.locked = Some(info.flags & VM_LOCKED != 0);
            entry.lockonfault = Some(info.flags & VM_LOCKONFAULT != 0);
            entry.locked_source = "vma";
            // Also for pages whose own lookup failed, looked up again later.
            entry.stack = info.flags & VM_HELD_SP != 0;
            if info.kind == kind::FILE {
                entry.file = Some(FileIdentity {
                    dev: dev_name(info.dev),
                    inode: info.ino,
                    offset: info.pgoff << memlock_trace_common::PAGE_SHIFT,
                });
            }
            return Some((range, entry, identified));
        }
        let found = maps
            .and_then(|maps| {
                let m = maps.iter().find(holds)?;
                Some((m, file.name(), file.has_flags()))
            })
            .or_else(|| {
                let noted = exited?.iter().rev().find(holds)?;
                Some((noted, "call", true))
            });
        match found {
            Some((m, source, has_flags)) => {
                let mut entry = row(
                    m.name.clone(),
                    format!("{:#x}", m.start),
                    format!("{:#x}", m.end),
                    source,
                );
                if has_flags {
                    entry.locked = Some(m.locked);
                    entry.lockonfault = m.lockonfault;
                    entry.locked_source = source;
                }
                Some(((m.start, m.end), entry, identified))
            }
            None if !exact => None,
            None => Some((
                (key.start, key.start),
                row(
                    unattributed.into(),
                    format!("{:#x}", key.start),
                    String::new(),
                    "none",
                ),
                identified,
            )),
        }
    };
    for (key, value) in regions {
        let Some((range, mut entry, identified)) = place(key) else {
            outside.push((key.start, value.faults));
            continue;
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
            let extent = extents.entry(range).or_insert((info.start, info.end));
            *extent = (extent.0.min(info.start), extent.1.max(info.end));
            entry.start = format!("{:#x}", extent.0);
            entry.end = format!("{:#x}", extent.1);
        }
        let slot = per_mapping.entry(range).or_insert_with(|| entry.clone());
        slot.start.clone_from(&entry.start);
        slot.end.clone_from(&entry.end);
        slot.faults += value.faults;
        if exact {
            slot.locked = Some(slot.locked == Some(true) || value.vm_flags & VM_LOCKED != 0);
            slot.lockonfault =
                Some(slot.lockonfault == Some(true) || value.vm_flags & VM_LOCKONFAULT != 0);
        }
        slot.stack |= entry.stack;
    }
    let mut sampled_outside: Vec<(u64, &BTreeMap<Stack, u64>)> = Vec::new();
    for &(key, stacks) in sites {
        let Some((range, ..)) = place(key) else {
            sampled_outside.push((key.start, stacks));
            continue;
        };
        let slot = per_mapping.get_mut(&range);
        // A region none of whose faults were counted (the sample outlived its count).
        if let Some(slot) = slot {
            add_sampled(&mut slot.sampled, stacks);
        }
    }
    let mut list: Vec<MappingFaults> = per_mapping.into_values().collect();
    list.extend(spans(outside).into_iter().map(|(start, end, faults)| {
        let mut entry = row(
            unattributed.into(),
            format!("{start:#x}"),
            format!("{end:#x}"),
            "none",
        );
        entry.faults = faults;
        for (_, stacks) in sampled_outside
            .iter()
            .filter(|(page, _)| (start..end).contains(page))
        {
            add_sampled(&mut entry.sampled, stacks);
        }
        entry
    }));
    list.sort_by(|a, b| b.faults.cmp(&a.faults).then_with(|| a.start.cmp(&b.start)));
    list.truncate(top);
    list
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
    let hex = |s: &str| u64::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    for row in rows {
        if let (Some(start), Some(end)) = (hex(&row.start), hex(&row.end)) {
            row.pages = RowPages::of(maps, (start, end), mode)
                .or_else(|| RowPages::of(unmapped, (start, end), mode));
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
fn spans(mut runs: Vec<(u64, u64)>) -> Vec<(u64, u64, u64)> {
    let window = 1u64 << REGION_SHIFT;
    runs.sort_unstable();
    let mut spans: Vec<(u64, u64, u64)> = Vec::new();
    for (start, faults) in runs {
        let window_end = (start & !(window - 1)) + window;
        match spans.last_mut() {
            Some(span) if start < span.1 + window => {
                span.1 = span.1.max(window_end);
                span.2 += faults;
            }
            _ => spans.push((start, window_end, faults)),
        }
    }
    spans
}

#[cfg(test)]
mod tests;

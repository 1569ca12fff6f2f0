//! Where one region's faults go: the VMA the fault hooks identified (named from what the
//! kernel read), else the mapping of `/proc/PID/smaps` (or `maps`) holding it, else, for an
//! exited process, a VMA an mlock-family call saw; a page-keyed run none of them holds is
//! outside every mapping.

use std::collections::BTreeMap;

use memlock_trace_common::{
    faults::{RegionKey, VM_HELD_SP, populate, region_kind},
    mapping::{MappingInfo, kind},
    vma::{VM_LOCKED, VM_LOCKONFAULT},
};

use super::{FileIdentity, MappingFaults};
use crate::{
    output::Outside,
    procfs::{Mapping, MapsFile},
};

/// Below the stack's top, where mmap places nothing: the stack grows there.
const STACK_GAP: u64 = 128 << 20;

/// The row a region's faults go to: its key (the range [`super::by_mapping`] merges rows
/// by), the row as this region names it, and the VMA the hooks identified for it.
pub(super) type Placed<'a> = ((u64, u64), MappingFaults, Option<&'a MappingInfo>);

/// A row with nothing counted yet, its lock flags unknown.
pub(super) fn row(
    mapping: Outside,
    start: String,
    end: String,
    named_by: &'static str,
) -> MappingFaults {
    MappingFaults {
        mapping,
        start,
        end,
        faults: 0,
        majors: Some(0),
        locked: None,
        lockonfault: None,
        locked_source: "unknown",
        partly_locked: false,
        stack: false,
        named_by,
        file: None,
        sampled: BTreeMap::new(),
        stacks: None,
        pages: None,
    }
}

/// What a process's regions are placed among.
pub(super) struct Placer<'a> {
    /// The VMAs the fault hooks identified, by start.
    pub(super) kernel: &'a BTreeMap<u64, MappingInfo>,
    /// The process's mappings last read, and the file they were read from.
    pub(super) maps: Option<&'a [Mapping]>,
    pub(super) file: MapsFile,
    /// Exited: the VMAs mlock-family calls saw since (newest last).
    pub(super) exited: Option<&'a [Mapping]>,
    /// What a row outside every known mapping is called: `unmapped`, or `unknown`.
    pub(super) unattributed: &'static str,
}

impl<'a> Placer<'a> {
    /// None: outside every known mapping (page-keyed runs only).
    pub(super) fn place(&self, key: &RegionKey) -> Option<Placed<'a>> {
        if key.exact == region_kind::CALL {
            return Some(call_row(key));
        }
        let exact = key.exact == region_kind::VMA;
        let identified = self.identified(key, exact);
        let alive = if self.exited.is_none() {
            self.maps
        } else {
            None
        };
        if let Some(info) = identified
            .filter(|_| exact || alive.is_none_or(|maps| !maps.iter().any(|m| holds(m, key))))
        {
            return Some((kernel_range(info), self.kernel_row(info), identified));
        }
        match self.found(key) {
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
                    self.unattributed.into(),
                    format!("{:#x}", key.start),
                    String::new(),
                    "none",
                ),
                identified,
            )),
        }
    }

    /// The VMA the hooks identified for the region: its own (exact), or for a page none
    /// was found for at the fault, one found at another fault that holds it.
    fn identified(&self, key: &RegionKey, exact: bool) -> Option<&'a MappingInfo> {
        if exact {
            return self.kernel.get(&key.start);
        }
        // A page no VMA was found for at the fault, inside one found at another.
        self.kernel
            .range(..=key.start)
            .next_back()
            .map(|(_, info)| info)
            .filter(|info| key.start < info.end)
            // Or below the stack with nothing found between, where the stack grew (a
            // lookup at the fault's start, before the kernel grew it, finds no VMA):
            // mmap places nothing within 128 MiB of the stack's top (mm/util.c, MIN_GAP).
            .or_else(|| {
                self.kernel
                    .range(key.start..)
                    .next()
                    .map(|(_, info)| info)
                    .filter(|info| info.kind == kind::STACK && info.end - key.start <= STACK_GAP)
            })
    }

    /// The row of a VMA the kernel identified, named and flagged as it read them.
    fn kernel_row(&self, info: &MappingInfo) -> MappingFaults {
        let mut entry = row(
            kernel_name(info, self.maps),
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
        entry
    }

    /// The mapping read from /proc that holds the region, the file that named it and
    /// whether it has lock flags; else, exited, the newest VMA a call saw holding it.
    fn found(&self, key: &RegionKey) -> Option<(&'a Mapping, &'static str, bool)> {
        self.maps
            .and_then(|maps| {
                let m = maps.iter().find(|m| holds(m, key))?;
                Some((m, self.file.name(), self.file.has_flags()))
            })
            .or_else(|| {
                let noted = self.exited?.iter().rev().find(|m| holds(m, key))?;
                Some((noted, "call", true))
            })
    }
}

fn holds(m: &Mapping, key: &RegionKey) -> bool {
    m.start <= key.start && key.start < m.end
}

/// Pages a call populated across VMAs the hooks cannot tell apart: one row per call.
fn call_row<'a>(key: &RegionKey) -> Placed<'a> {
    let call = populate::NAMES
        .get(key.start as usize)
        .copied()
        .unwrap_or("a call");
    let name = format!("populated by {call} (VMAs not told apart)");
    (
        (u64::MAX, key.start),
        row(name.into(), String::new(), String::new(), "call"),
        None,
    )
}

/// The key rows of an identified VMA merge by. The stack grows down and the heap up: one
/// row each, whatever their extent when each fault was counted. Not anonymous VMAs by
/// their end: an mlock of a region's top half splits off a VMA with the same end, and it
/// is a row of its own.
fn kernel_range(info: &MappingInfo) -> (u64, u64) {
    match info.kind {
        kind::STACK => (0, info.end),
        kind::HEAP => (info.start, 0),
        _ => (info.start, info.end),
    }
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

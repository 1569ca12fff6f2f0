//! Faults attributed to the process's mappings: the kernel's per-region counts matched
//! to `/proc/PID/smaps` (or, for an exited process, to the last mappings read and the VMAs
//! mlock-family calls saw), with neighbouring runs outside every mapping merged into one row.

use std::collections::HashMap as StdHashMap;

use memlock_trace_common::{
    faults::{RegionKey, RegionValue},
    vma::{VM_LOCKED, VM_LOCKONFAULT},
};
use serde::Serialize;

use super::sizing::REGION_SHIFT;
use crate::{output::Outside, procfs::Mapping};

/// A mapping's share of a process's faults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MappingFaults {
    /// `[heap]`, `[stack]`, a file path, `anonymous`; `unmapped` when no current mapping holds
    /// the address any more, `unknown` when the process's mappings could not be read (it
    /// exited before a snapshot) or the address is outside the last ones read before it
    /// exited. Neighbouring runs outside every mapping are one row, `start` to `end`.
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
}

/// Attributes region counts to the process's mappings and returns the top `top` by faults.
/// `exited`: `maps` are the last seen before the process exited, so an address outside them
/// is unknown (mapped after they were read), not unmapped, unless a VMA an mlock-family call
/// saw since holds it (`noted`, newest last).
pub fn by_mapping(
    regions: &[(RegionKey, RegionValue)],
    maps: Option<&[Mapping]>,
    exited: Option<&[Mapping]>,
    top: usize,
) -> Vec<MappingFaults> {
    let mut per_mapping: StdHashMap<(u64, u64), MappingFaults> = StdHashMap::new();
    // Runs no mapping holds, merged below into spans of neighbouring runs.
    let mut outside: Vec<(u64, u64)> = Vec::new();
    let unattributed = if maps.is_none() || exited.is_some() {
        "unknown"
    } else {
        "unmapped"
    };
    for (key, value) in regions {
        // The key is a VMA start or the page of a run's first fault: the mapping that
        // contains it.
        let holds = |m: &&Mapping| m.start <= key.start && key.start < m.end;
        let found = maps
            .and_then(|maps| maps.iter().find(holds).map(|m| (m, "smaps")))
            .or_else(|| {
                let noted = exited?.iter().rev().find(holds)?;
                Some((noted, "call"))
            });
        let (range, mut entry) = match found {
            Some((m, source)) => (
                (m.start, m.end),
                MappingFaults {
                    mapping: m.name.clone(),
                    start: format!("{:#x}", m.start),
                    end: format!("{:#x}", m.end),
                    faults: 0,
                    locked: Some(m.locked),
                    lockonfault: m.lockonfault,
                    locked_source: source,
                },
            ),
            None if key.exact == 0 => {
                outside.push((key.start, value.faults));
                continue;
            }
            None => (
                (key.start, key.start),
                MappingFaults {
                    mapping: unattributed.into(),
                    start: format!("{:#x}", key.start),
                    end: String::new(),
                    faults: 0,
                    locked: None,
                    lockonfault: None,
                    locked_source: "unknown",
                },
            ),
        };
        if key.exact != 0 {
            // The hook read the VMA's own flags at fault time: better than a later snapshot.
            entry.locked = Some(value.vm_flags & VM_LOCKED != 0);
            entry.lockonfault = Some(value.vm_flags & VM_LOCKONFAULT != 0);
            entry.locked_source = "vma";
        }
        let slot = per_mapping.entry(range).or_insert(entry);
        slot.faults += value.faults;
        if key.exact != 0 {
            slot.locked = Some(slot.locked == Some(true) || value.vm_flags & VM_LOCKED != 0);
            slot.lockonfault =
                Some(slot.lockonfault == Some(true) || value.vm_flags & VM_LOCKONFAULT != 0);
        }
    }
    let mut list: Vec<MappingFaults> = per_mapping.into_values().collect();
    list.extend(
        spans(outside)
            .into_iter()
            .map(|(start, end, faults)| MappingFaults {
                mapping: unattributed.into(),
                start: format!("{start:#x}"),
                end: format!("{end:#x}"),
                faults,
                locked: None,
                lockonfault: None,
                locked_source: "unknown",
            }),
    );
    list.sort_by(|a, b| b.faults.cmp(&a.faults).then_with(|| a.start.cmp(&b.start)));
    list.truncate(top);
    list
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
mod tests {
    use memlock_trace_common::faults::{RegionKey, RegionValue};

    use super::*;

    fn mapping(start: u64, end: u64, name: &str, locked: bool) -> Mapping {
        Mapping {
            start,
            end,
            offset: 0,
            name: name.into(),
            locked,
            lockonfault: Some(false),
        }
    }

    #[test]
    fn regions_attribute_to_mappings() {
        let maps = [
            mapping(0x10000, 0x40000, "[heap]", false),
            mapping(0x48000, 0x58000, "/lib/x.so", true),
        ];
        let region = |start, faults| {
            let key = RegionKey {
                tgid: 1,
                exact: 0,
                start,
            };
            (
                key,
                RegionValue {
                    faults,
                    vm_flags: 0,
                },
            )
        };
        let regions = [
            region(0x10000, 16),
            region(0x20000, 4),
            // The page of a run's first fault, inside the library.
            region(0x49000, 3),
            region(0x90000, 1),
        ];
        let list = by_mapping(&regions, Some(&maps), None, 10);
        assert_eq!(list.len(), 3, "{list:?}");
        assert_eq!(
            (list[0].mapping.to_str().unwrap(), list[0].faults),
            ("[heap]", 20)
        );
        assert_eq!(
            (
                list[1].mapping.to_str().unwrap(),
                list[1].faults,
                list[1].locked
            ),
            ("/lib/x.so", 3, Some(true))
        );
        assert_eq!(
            (list[2].mapping.to_str().unwrap(), list[2].faults),
            ("unmapped", 1)
        );
        assert_eq!(by_mapping(&regions, Some(&maps), None, 1).len(), 1);
    }

    #[test]
    fn neighbouring_runs_outside_every_mapping_are_one_row_and_exited_is_not_unmapped() {
        let maps = [mapping(0x10000, 0x40000, "[heap]", false)];
        let run = |start, faults| {
            let key = RegionKey {
                tgid: 1,
                exact: 0,
                start,
            };
            let value = RegionValue {
                faults,
                vm_flags: 0,
            };
            (key, value)
        };
        // 8 MiB touched in order (runs of 16 pages, one per 64 KiB window, the first one
        // starting mid-window), then a lone run far away.
        let base = 0x7f00_0000_0000u64;
        let mut regions: Vec<_> = (0..128)
            .map(|i| run(base + 0x3000 + i * 0x10000, 16))
            .collect();
        regions.push(run(base + 0x1000_0000, 2));
        for (exited, label) in [(None, "unmapped"), (Some(&[][..]), "unknown")] {
            let list = by_mapping(&regions, Some(&maps), exited, 10);
            let rows: Vec<_> = list
                .iter()
                .map(|m| {
                    (
                        m.mapping.to_str().unwrap(),
                        m.faults,
                        m.start.as_str(),
                        m.end.as_str(),
                    )
                })
                .collect();
            assert_eq!(
                rows,
                [
                    (label, 2048, "0x7f0000003000", "0x7f0000800000"),
                    (label, 2, "0x7f0010000000", "0x7f0010010000"),
                ]
            );
        }
    }

    #[test]
    fn an_exited_process_region_known_from_an_mlock_call_is_named_by_it() {
        let maps = [mapping(0x10000, 0x40000, "[heap]", false)];
        let run = |start| {
            let key = RegionKey {
                tgid: 1,
                exact: 0,
                start,
            };
            let value = RegionValue {
                faults: 16,
                vm_flags: 0,
            };
            (key, value)
        };
        let regions = [run(0x100000), run(0x110000), run(0x900000)];
        // Locked, then unlocked: the newest state counts.
        let noted = [
            mapping(0x100000, 0x200000, "VMA seen by mlock2", true),
            mapping(0x100000, 0x200000, "VMA seen by munlock", false),
        ];
        let list = by_mapping(&regions, Some(&maps), Some(&noted), 10);
        let rows: Vec<_> = list
            .iter()
            .map(|m| {
                (
                    m.mapping.to_str().unwrap(),
                    m.faults,
                    m.locked,
                    m.locked_source,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("VMA seen by munlock", 32, Some(false), "call"),
                ("unknown", 16, None, "unknown"),
            ]
        );
    }

    #[test]
    fn exact_regions_use_the_vma_flags() {
        let maps = [mapping(0x10000, 0x40000, "anonymous", false)];
        let regions = [(
            RegionKey {
                tgid: 1,
                exact: 1,
                start: 0x10000,
            },
            RegionValue {
                faults: 5,
                vm_flags: VM_LOCKED | 0x3,
            },
        )];
        let list = by_mapping(&regions, Some(&maps), None, 10);
        assert_eq!(list[0].locked, Some(true));
        assert_eq!(list[0].locked_source, "vma");
    }
}

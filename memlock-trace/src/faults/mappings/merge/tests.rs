use std::collections::BTreeMap;

use memlock_trace_common::{
    faults::{RegionKey, RegionValue},
    mapping::kind,
    vma::VM_LOCKED,
};

use super::super::{
    by_mapping,
    tests::{attribute, identified, info, mapping, smaps, table, vma_region},
};
use super::*;

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// An exact region counted in a VMA the hook saw locked.
fn locked_region(start: u64, faults: u64) -> (RegionKey, RegionValue) {
    let (key, value) = vma_region(start, faults);
    let vm_flags = value.vm_flags | VM_LOCKED;
    (key, RegionValue { vm_flags, ..value })
}

/// memcached's slab VMA: each 1 MiB slab mapped just below the VMA, which the kernel
/// extends down to it; the hooks met it at each start, the identities share an end.
#[test]
fn a_vma_grown_downwards_is_one_row_at_its_widest() {
    let end = 0x7f7b_977f_f000;
    let starts: Vec<u64> = (1..=10).map(|i| end - i * MIB).collect();
    let kernel = identified(starts.iter().map(|&s| info(s, end, kind::ANONYMOUS, "")));
    let regions: Vec<_> = starts.iter().map(|&s| vma_region(s, 256)).collect();
    let list = attribute(&regions, &kernel, None, Some(&[]));
    assert_eq!(
        table(&list),
        [(
            "anonymous",
            2560,
            "0x7f7b96dff000",
            "0x7f7b977ff000",
            "fault"
        )]
    );
    assert_eq!(
        (list[0].locked, list[0].partly_locked),
        (Some(false), false)
    );
}

/// Touched, then its top half mlocked: the VMA met before the mlock (the whole region) and
/// the locked half after it are one row, partly locked; the lower half, met again after the
/// split, only touches the locked half, and is a row of its own.
#[test]
fn a_region_locked_after_its_first_faults_is_one_row_partly_locked() {
    let (start, half, end) = (0x10_0000, 0x11_0000, 0x12_0000);
    let kernel = identified([info(start, end, kind::ANONYMOUS, ""), {
        let mut locked = info(half, end, kind::ANONYMOUS, "");
        locked.flags |= VM_LOCKED;
        locked
    }]);
    let regions = [vma_region(start, 24), locked_region(half, 8)];
    let list = attribute(&regions, &kernel, None, Some(&[]));
    assert_eq!(
        table(&list),
        [("anonymous", 32, "0x100000", "0x120000", "fault")]
    );
    assert_eq!((list[0].locked, list[0].partly_locked), (Some(true), true));
    assert_eq!(list[0].locked_source, "vma");

    // The lower half faulted after the split: its identity is the half's now.
    let kernel = identified([info(start, half, kind::ANONYMOUS, ""), {
        let mut locked = info(half, end, kind::ANONYMOUS, "");
        locked.flags |= VM_LOCKED;
        locked
    }]);
    let list = attribute(&regions, &kernel, None, Some(&[]));
    assert_eq!(
        table(&list),
        [
            ("anonymous", 24, "0x100000", "0x110000", "fault"),
            ("anonymous", 8, "0x110000", "0x120000", "fault"),
        ]
    );
    assert!(list.iter().all(|m| !m.partly_locked));
}

/// Only rows of the same kind that share an edge are one: not a file's beside anonymous
/// memory over the same range (a file mapped where anonymous memory was), not one file
/// mapped at two places, not a region mapped over part of an unmapped one (overlapping, no
/// edge shared), not two VMAs side by side.
#[test]
fn rows_of_other_kinds_or_that_share_no_edge_stay_apart() {
    let file = |start, end, offset_pages| {
        let mut info = info(start, end, kind::FILE, "data.bin");
        info.pgoff = offset_pages;
        info
    };
    let kernel = identified([
        info(0x10_0000, 0x20_0000, kind::ANONYMOUS, ""),
        info(0x20_0000, 0x30_0000, kind::ANONYMOUS, ""),
        // Mapped inside the first one's addresses after it was unmapped.
        info(0x14_0000, 0x18_0000, kind::ANONYMOUS, ""),
        file(0x18_0000, 0x28_0000, 0),
        // The same file, a page further in, a page further on, to the same end: its VMA
        // after an mprotect split its first page off.
        file(0x18_1000, 0x28_0000, 1),
        // The same file from its start again, overlapping: another mapping of it.
        file(0x19_0000, 0x1a_0000, 0),
    ]);
    let regions = [
        vma_region(0x10_0000, 6),
        vma_region(0x20_0000, 4),
        vma_region(0x14_0000, 5),
        vma_region(0x18_0000, 3),
        vma_region(0x18_1000, 2),
        vma_region(0x19_0000, 1),
    ];
    let list = attribute(&regions, &kernel, None, Some(&[]));
    assert_eq!(
        table(&list),
        [
            ("anonymous", 6, "0x100000", "0x200000", "fault"),
            ("anonymous", 5, "0x140000", "0x180000", "fault"),
            ("data.bin", 5, "0x180000", "0x280000", "fault"),
            ("anonymous", 4, "0x200000", "0x300000", "fault"),
            ("data.bin", 1, "0x190000", "0x1a0000", "fault"),
        ]
    );
    assert_eq!(list[2].file.as_ref().map(|f| f.offset), Some(0));
}

/// The top rows, and what the rest held: after merging, so a grown VMA is one of the rows
/// left out, not ten.
#[test]
fn top_counts_the_rows_left_out_after_merging() {
    let end = 0x7000_0000;
    let mut vmas: Vec<_> = (1..=10)
        .map(|i| info(end - i * MIB, end, kind::ANONYMOUS, ""))
        .collect();
    vmas.push(info(
        0x1000_0000,
        0x1000_0000 + 64 * PAGE,
        kind::ANONYMOUS,
        "",
    ));
    vmas.push(info(
        0x2000_0000,
        0x2000_0000 + 64 * PAGE,
        kind::ANONYMOUS,
        "",
    ));
    let kernel = identified(vmas);
    let mut regions: Vec<_> = (1..=10).map(|i| vma_region(end - i * MIB, 1)).collect();
    regions.push(vma_region(0x1000_0000, 64));
    regions.push(vma_region(0x2000_0000, 7));
    let (top, left_out) = by_mapping(&regions, &[], &kernel, None, Some(&[]), 1);
    assert_eq!(
        table(&top),
        [("anonymous", 64, "0x10000000", "0x10040000", "fault")]
    );
    assert_eq!(
        left_out,
        LeftOut {
            mappings: 2,
            faults: 17,
            majors: Some(0)
        }
    );
    let empty: BTreeMap<u64, _> = BTreeMap::new();
    assert_eq!(
        by_mapping(&regions, &[], &empty, None, Some(&[]), 0).1,
        LeftOut {
            mappings: 12,
            faults: 81,
            majors: Some(0)
        },
        "without identities every exact region is an unknown row of its own"
    );
}

/// A live process's mappings, read for the summary, tell a region that came apart from one
/// that grew or was split: rows sharing an edge are one only where the mappings cover them
/// without a gap, each with the lock state of the mapping at its start. A fresh 64-page
/// mapping placed at the top of the gap an unmapped 1000-page one left (the fault accuracy
/// test's `onfault` after its `touch 1000`), or over an older one's addresses, stays its own
/// row; a grown VMA and a VMA split by an mlock after its first faults are one.
#[test]
fn a_live_process_mappings_keep_a_region_mapped_over_an_unmapped_one_apart() {
    let (old, fresh, end) = (
        0x7000_0000,
        0x7000_0000 + 936 * PAGE,
        0x7000_0000 + 1000 * PAGE,
    );
    let kernel = identified([
        info(old, end, kind::ANONYMOUS, ""),
        info(fresh, end, kind::ANONYMOUS, ""),
    ]);
    let locked = [vma_region(old, 1000), locked_region(fresh, 64)];
    let apart = [
        ("anonymous", 1000, "0x70000000", "0x703e8000", "fault"),
        ("anonymous", 64, "0x703a8000", "0x703e8000", "fault"),
    ];
    let maps = [mapping(fresh, end, "anonymous", true)];
    assert_eq!(
        table(&attribute(&locked, &kernel, smaps(&maps), None)),
        apart
    );
    // The fresh mapping the larger, over a smaller older one's addresses: not locked alike.
    let maps = [mapping(old, end, "anonymous", true)];
    let older = [vma_region(fresh, 64), locked_region(old, 1000)];
    let list = attribute(&older, &kernel, smaps(&maps), None);
    assert_eq!(list.len(), 2, "{list:?}");
    // Exited: nothing to tell them apart by.
    assert_eq!(
        attribute(&locked, &kernel, smaps(&maps), Some(&[])).len(),
        1
    );
    // Grown down to `old`, or split at `fresh` by an mlock: covered, locked alike.
    let unlocked = [vma_region(old, 1000), vma_region(fresh, 64)];
    let grown = [mapping(old, end, "anonymous", false)];
    let split = [
        mapping(old, fresh, "anonymous", false),
        mapping(fresh, end, "anonymous", true),
    ];
    for (regions, maps) in [(&unlocked, &grown[..]), (&locked, &split[..])] {
        let list = attribute(regions, &kernel, smaps(maps), None);
        assert_eq!(
            table(&list),
            [("anonymous", 1064, "0x70000000", "0x703e8000", "fault")]
        );
    }
}

/// A lock-on-fault region mapped where a locked one was unmapped shares its end, as a grown
/// VMA would, but is another region: rows apart in VM_LOCKONFAULT stay apart (smaps shows
/// the flag only from 6.2, so the live check cannot tell them apart there).
#[test]
fn a_lock_on_fault_region_over_a_locked_ones_addresses_is_its_own_row() {
    use memlock_trace_common::vma::VM_LOCKONFAULT;
    let end = 0x20_0000;
    let (old, new) = (end - 0x8_0000, end - 0x4_0000);
    let onfault = |mut i: memlock_trace_common::mapping::MappingInfo| {
        i.flags |= VM_LOCKED | VM_LOCKONFAULT;
        i
    };
    let mut locked_info = info(old, end, kind::ANONYMOUS, "");
    locked_info.flags |= VM_LOCKED;
    let kernel = identified([locked_info, onfault(info(new, end, kind::ANONYMOUS, ""))]);
    let (key, value) = vma_region(new, 64);
    let vm_flags = value.vm_flags | VM_LOCKED | VM_LOCKONFAULT;
    let regions = [
        locked_region(old, 110),
        (key, RegionValue { vm_flags, ..value }),
    ];
    let list = attribute(&regions, &kernel, None, Some(&[]));
    let rows: Vec<(u64, Option<bool>)> = list.iter().map(|r| (r.faults, r.lockonfault)).collect();
    assert_eq!(rows, [(110, Some(false)), (64, Some(true))], "{list:#?}");
}

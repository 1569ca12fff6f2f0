use memlock_trace_common::{
    faults::{RegionKey, RegionValue, populate},
    mapping::kind,
};

use super::*;

pub(super) fn mapping(start: u64, end: u64, name: &str, locked: bool) -> Mapping {
    Mapping {
        start,
        end,
        offset: 0,
        name: name.into(),
        locked,
        lockonfault: Some(false),
        pages: crate::procfs::PageSizes::default(),
    }
}

/// A region of `exact` kind (`region_kind`) with `faults` counted, no VMA flags.
pub(super) fn counted(exact: u32, start: u64, faults: u64) -> (RegionKey, RegionValue) {
    let key = RegionKey {
        tgid: 1,
        exact,
        start,
    };
    let value = RegionValue {
        faults,
        majors: 0,
        vm_flags: 0,
    };
    (key, value)
}

/// The mappings as read from `/proc/PID/smaps`.
pub(super) fn smaps(maps: &[Mapping]) -> Option<(&[Mapping], MapsFile)> {
    Some((maps, MapsFile::Smaps))
}

/// [`by_mapping`] without sampled stacks, the top 10 rows.
pub(super) fn attribute(
    regions: &[(RegionKey, RegionValue)],
    kernel: &BTreeMap<u64, MappingInfo>,
    read: Option<(&[Mapping], MapsFile)>,
    exited: Option<&[Mapping]>,
) -> Vec<MappingFaults> {
    by_mapping(regions, &[], kernel, read, exited, 10).0
}

/// Each row's name, faults, range and who named it.
pub(super) fn table(list: &[MappingFaults]) -> Vec<(&str, u64, &str, &str, &'static str)> {
    list.iter()
        .map(|m| {
            (
                m.mapping.to_str().unwrap(),
                m.faults,
                m.start.as_str(),
                m.end.as_str(),
                m.named_by,
            )
        })
        .collect()
}

#[test]
fn regions_attribute_to_mappings() {
    let maps = [
        mapping(0x10000, 0x40000, "[heap]", false),
        mapping(0x48000, 0x58000, "/lib/x.so", true),
    ];
    let region = |start, faults| counted(0, start, faults);
    let regions = [
        region(0x10000, 16),
        region(0x20000, 4),
        // The page of a run's first fault, inside the library.
        region(0x49000, 3),
        region(0x90000, 1),
    ];
    let list = attribute(&regions, &BTreeMap::new(), smaps(&maps), None);
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
    // The top row only: the other two, 4 faults, left out.
    let (top, left_out) = by_mapping(&regions, &[], &BTreeMap::new(), smaps(&maps), None, 1);
    assert_eq!(top.len(), 1);
    assert_eq!(
        left_out,
        LeftOut {
            mappings: 2,
            faults: 4,
            majors: Some(0)
        }
    );
    // Read from /proc/PID/maps (system-wide): the same rows, named by maps, flags unknown.
    let list = attribute(
        &regions,
        &BTreeMap::new(),
        Some((&maps[..], MapsFile::Maps)),
        None,
    );
    assert_eq!(
        (
            list[1].mapping.to_str().unwrap(),
            list[1].faults,
            list[1].named_by,
            list[1].locked,
            list[1].lockonfault,
            list[1].locked_source
        ),
        ("/lib/x.so", 3, "maps", None, None, "unknown")
    );
}

#[test]
fn major_faults_add_up_per_row_and_per_span_outside_every_mapping() {
    let maps = [mapping(0x10000, 0x40000, "[heap]", false)];
    let region = |start, faults, majors| {
        let (key, value) = counted(0, start, faults);
        (key, RegionValue { majors, ..value })
    };
    let regions = [
        region(0x10000, 16, 5),
        region(0x20000, 4, 4),
        // Two neighbouring runs outside every mapping: one span.
        region(0x90000, 3, 1),
        region(0x91000, 2, 2),
    ];
    let list = attribute(&regions, &BTreeMap::new(), smaps(&maps), None);
    let rows: Vec<_> = list
        .iter()
        .map(|m| (m.mapping.to_str().unwrap(), m.faults, m.majors))
        .collect();
    assert_eq!(
        rows,
        [("[heap]", 20, Some(9)), ("unmapped", 5, Some(3))],
        "{list:?}"
    );
}

#[test]
fn neighbouring_runs_outside_every_mapping_are_one_row_and_exited_is_not_unmapped() {
    let maps = [mapping(0x10000, 0x40000, "[heap]", false)];
    let run = |start, faults| counted(0, start, faults);
    // 8 MiB touched in order (runs of 16 pages, one per 64 KiB window, the first one
    // starting mid-window), then a lone run far away.
    let base = 0x7f00_0000_0000u64;
    let mut regions: Vec<_> = (0..128)
        .map(|i| run(base + 0x3000 + i * 0x10000, 16))
        .collect();
    regions.push(run(base + 0x1000_0000, 2));
    for (exited, label) in [(None, "unmapped"), (Some(&[][..]), "unknown")] {
        let list = attribute(&regions, &BTreeMap::new(), smaps(&maps), exited);
        assert_eq!(
            table(&list),
            [
                (label, 2048, "0x7f0000003000", "0x7f0000800000", "none"),
                (label, 2, "0x7f0010000000", "0x7f0010010000", "none"),
            ]
        );
    }
}

#[test]
fn an_exited_process_region_known_from_an_mlock_call_is_named_by_it() {
    let maps = [mapping(0x10000, 0x40000, "[heap]", false)];
    let run = |start| counted(0, start, 16);
    let regions = [run(0x100000), run(0x110000), run(0x900000)];
    // Locked, then unlocked: the newest state counts.
    let noted = [
        mapping(0x100000, 0x200000, "VMA seen by mlock2", true),
        mapping(0x100000, 0x200000, "VMA seen by munlock", false),
    ];
    let list = attribute(&regions, &BTreeMap::new(), smaps(&maps), Some(&noted));
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
            majors: 0,
            vm_flags: VM_LOCKED | 0x3,
        },
    )];
    let list = attribute(&regions, &BTreeMap::new(), smaps(&maps), None);
    assert_eq!(list[0].locked, Some(true));
    assert_eq!(list[0].locked_source, "vma");
}

pub(super) fn info(start: u64, end: u64, kind: u32, name: &str) -> MappingInfo {
    let mut info = MappingInfo {
        start,
        end,
        flags: 0x73,
        kind,
        ino: 42,
        dev: (8 << 20) | 1,
        ..MappingInfo::default()
    };
    info.name[..name.len()].copy_from_slice(name.as_bytes());
    info
}

pub(super) fn vma_region(start: u64, faults: u64) -> (RegionKey, RegionValue) {
    let (key, value) = counted(region_kind::VMA, start, faults);
    let vm_flags = 0x73;
    (key, RegionValue { vm_flags, ..value })
}

/// The VMAs the fault hooks identified, by start.
pub(super) fn identified(
    vmas: impl IntoIterator<Item = MappingInfo>,
) -> BTreeMap<u64, MappingInfo> {
    vmas.into_iter().map(|i| (i.start, i)).collect()
}

#[test]
fn vmas_identified_at_the_fault_are_named_by_the_kernel_and_completed_from_smaps() {
    let kernel = identified([
        info(0x1000, 0x9000, kind::FILE, "libc.so.6"),
        // Unmapped before any smaps read.
        info(0x20000, 0x40000, kind::FILE, "gone.bin"),
        info(0x50000, 0x60000, kind::FILE, "dev/zero"),
        // The stack, met twice as it grew down.
        info(0x7000_0000, 0x7000_8000, kind::STACK, ""),
        info(0x6fff_f000, 0x7000_8000, kind::STACK, ""),
        info(0x9000_0000, 0x9000_1000, kind::SPECIAL, "[vdso]"),
    ]);
    let maps = [mapping(0x1000, 0x9000, "/usr/lib/libc.so.6", false)];
    let mut regions = vec![
        vma_region(0x1000, 5),
        vma_region(0x20000, 7),
        vma_region(0x50000, 3),
        vma_region(0x7000_0000, 2),
        vma_region(0x6fff_f000, 4),
        vma_region(0x9000_0000, 1),
    ];
    regions.push(counted(region_kind::CALL, populate::MLOCKALL as u64, 100));
    let list = attribute(&regions, &kernel, smaps(&maps), None);
    assert_eq!(
        table(&list),
        [
            (
                "populated by mlockall (VMAs not told apart)",
                100,
                "",
                "",
                "call"
            ),
            ("gone.bin", 7, "0x20000", "0x40000", "fault"),
            ("[stack]", 6, "0x6ffff000", "0x70008000", "fault"),
            ("/usr/lib/libc.so.6", 5, "0x1000", "0x9000", "fault"),
            ("/dev/zero (deleted)", 3, "0x50000", "0x60000", "fault"),
            ("[vdso]", 1, "0x90000000", "0x90001000", "fault"),
        ]
    );
    let file = list[1].file.as_ref().unwrap();
    assert_eq!((file.dev.as_str(), file.inode), ("08:01", 42));
    assert_eq!(list[1].locked, Some(false));
    assert_eq!(list[1].locked_source, "vma");
}

/// `--latency-sample` looks the VMA up at the fault's start, before the kernel grows the
/// stack: a page just below the stack found no VMA, and is the stack's, even once exited.
#[test]
fn a_page_below_the_stack_with_nothing_between_is_where_it_grew() {
    let kernel = identified([
        info(0x1000, 0x9000, kind::FILE, "libc.so.6"),
        info(0x7000_0000, 0x7000_8000, kind::STACK, ""),
    ]);
    let page = |start, faults| counted(region_kind::PAGE, start, faults);
    let regions = [
        page(0x6fff_e000, 3),
        page(0x6fff_f000, 2),
        page(0x2_0000, 1),
    ];
    let list = attribute(&regions, &kernel, None, Some(&[]));
    let rows: Vec<_> = list
        .iter()
        .map(|m| (m.mapping.to_str().unwrap(), m.faults))
        .collect();
    assert_eq!(rows, [("[stack]", 5), ("unknown", 1)]);
}

/// `--stacks`: a sampled stack goes to the row its region's faults went to: the stack's
/// VMA (met twice as it grew, one row), the mapping holding a page, the span of runs no
/// mapping holds, the call that populated across VMAs; a region with no counted faults
/// adds nothing.
#[test]
fn sampled_stacks_go_to_the_row_of_their_region() {
    let kernel = identified([
        info(0x7000_0000, 0x7000_8000, kind::STACK, ""),
        info(0x6fff_f000, 0x7000_8000, kind::STACK, ""),
    ]);
    let maps = [mapping(0x10000, 0x40000, "[heap]", false)];
    let page = |start| counted(region_kind::PAGE, start, 0).0;
    let call = counted(region_kind::CALL, populate::MLOCKALL as u64, 0).0;
    let regions = vec![
        vma_region(0x7000_0000, 2),
        vma_region(0x6fff_f000, 4),
        counted(region_kind::PAGE, 0x10000, 16),
        counted(region_kind::PAGE, 0x90000, 8),
        counted(region_kind::PAGE, 0xa0000, 8),
        counted(region_kind::CALL, populate::MLOCKALL as u64, 100),
    ];
    let stack = |ips: &[u64]| -> Stack { ips.into() };
    let (grow, fill, scan, lock) = (
        stack(&[0x401000]),
        stack(&[0x402000, 0x403000]),
        stack(&[0x404000]),
        stack(&[0x405000]),
    );
    let sampled = |pairs: &[(&Stack, u64)]| -> BTreeMap<Stack, u64> {
        pairs.iter().map(|(s, n)| (Stack::clone(s), *n)).collect()
    };
    let sites: Vec<(RegionKey, BTreeMap<Stack, u64>)> = vec![
        (vma_region(0x7000_0000, 0).0, sampled(&[(&grow, 1)])),
        (vma_region(0x6fff_f000, 0).0, sampled(&[(&grow, 3)])),
        // A page inside the heap, not the run's first page.
        (page(0x23000), sampled(&[(&fill, 10), (&scan, 2)])),
        // Two pages of one span outside every mapping.
        (page(0x93000), sampled(&[(&scan, 5)])),
        (page(0xa1000), sampled(&[(&scan, 4)])),
        (call, sampled(&[(&lock, 90)])),
        // Nothing counted there.
        (vma_region(0x5000_0000, 0).0, sampled(&[(&fill, 7)])),
    ];
    let sites: Vec<RegionSites<'_>> = sites.iter().map(|(k, s)| (k, s)).collect();
    let (list, _) = by_mapping(&regions, &sites, &kernel, smaps(&maps), None, 10);
    let row = |name: &str| {
        let row = list
            .iter()
            .find(|m| m.mapping.to_str().unwrap().starts_with(name))
            .unwrap_or_else(|| panic!("{name}: {list:?}"));
        row.sampled.clone()
    };
    assert_eq!(row("[stack]"), sampled(&[(&grow, 4)]));
    assert_eq!(row("[heap]"), sampled(&[(&fill, 10), (&scan, 2)]));
    assert_eq!(row("unmapped"), sampled(&[(&scan, 9)]));
    assert_eq!(row("populated by mlockall"), sampled(&[(&lock, 90)]));
    assert_eq!(list.iter().map(|m| m.sampled.len()).sum::<usize>(), 5);
}

#[test]
fn a_row_unmapped_before_the_last_read_has_the_pages_an_earlier_read_saw() {
    let hugetlb = |start, end| Mapping {
        pages: crate::procfs::PageSizes {
            kernel_page_kb: 2048,
            hugetlb: true,
            hugetlb_kb: 8192,
            ..Default::default()
        },
        ..mapping(start, end, "anon_hugepage (deleted)", false)
    };
    let base = |start, end, rss_kb| Mapping {
        pages: crate::procfs::PageSizes {
            kernel_page_kb: 4,
            rss_kb,
            ..Default::default()
        },
        ..mapping(start, end, "[heap]", false)
    };
    let row = |start: u64, end: u64| MappingFaults {
        mapping: "anon_hugepage".into(),
        start: format!("{start:#x}"),
        end: format!("{end:#x}"),
        faults: 4,
        majors: Some(0),
        locked: None,
        lockonfault: None,
        locked_source: "vma",
        partly_locked: false,
        stack: false,
        named_by: "fault",
        file: None,
        sampled: BTreeMap::new(),
        stacks: None,
        pages: None,
    };
    // The hugetlb region was unmapped before the last read. The heap is still mapped: the
    // last read's figures for it win over an older read's.
    let now = [base(0x1000, 0x9000, 32)];
    let unmapped = [hugetlb(0x200000, 0xa00000), base(0x1000, 0x5000, 4)];
    let mut rows = [
        row(0x200000, 0xa00000),
        row(0x1000, 0x9000),
        row(0xa00000, 0xb00000),
    ];
    add_pages(&mut rows, &now, &unmapped, ThpMode::Madvise);
    let pages: Vec<_> = rows
        .iter()
        .map(|r| r.pages.map(|p| (p.page_bytes, p.hugetlb, p.rss_bytes)))
        .collect();
    assert_eq!(
        pages,
        [
            Some((2 << 20, true, 8 << 20)),
            Some((4096, false, 32 << 10)),
            // Never read while mapped: nothing known.
            None,
        ]
    );
}

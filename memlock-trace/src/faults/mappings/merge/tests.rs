use memlock_trace_common::faults::{RegionKey, RegionValue};

use super::super::*;

const ANON: u32 = kind::ANONYMOUS;

fn info(start: u64, end: u64, kind: u32, name: &str, pgoff: u64) -> MappingInfo {
    let mut info = MappingInfo {
        start,
        end,
        flags: 0x73,
        kind,
        ino: if kind == kind::FILE { 42 } else { 0 },
        dev: (8 << 20) | 1,
        pgoff,
        ..MappingInfo::default()
    };
    info.name[..name.len()].copy_from_slice(name.as_bytes());
    info
}

fn vma_region(start: u64, faults: u64, vm_flags: u64) -> (RegionKey, RegionValue) {
    let key = RegionKey {
        tgid: 1,
        exact: region_kind::VMA,
        start,
    };
    (key, RegionValue { faults, vm_flags })
}

fn rows(list: &[MappingFaults]) -> Vec<(String, u64, String, String, Option<bool>)> {
    list.iter()
        .map(|m| {
            (
                m.mapping.to_str().unwrap().to_string(),
                m.faults,
                m.start.clone(),
                m.end.clone(),
                m.locked,
            )
        })
        .collect()
}

fn row(
    name: &str,
    faults: u64,
    start: &str,
    end: &str,
    locked: bool,
) -> (String, u64, String, String, Option<bool>) {
    (name.into(), faults, start.into(), end.into(), Some(locked))
}

/// memcached's slab VMA: each new 1 MiB slab is mapped just below the last and the kernel
/// extends the VMA downwards, so its faults came keyed by four starts sharing one end; python3
/// gave three rows sharing an end the same way. One row, at its widest, the faults summed.
/// And a region whose top half was locked after its first faults (a row before the mlock, a
/// row after, sharing the end): one row, locked (some of its faults saw it locked), beside
/// another anonymous VMA that shares neither edge.
#[test]
fn one_vma_over_time_is_one_row_at_its_widest() {
    let mib = 1 << 20;
    let end = 0x7f7b_977f_f000;
    let split = 0x7f00_0010_0000;
    let kernel: BTreeMap<u64, MappingInfo> = [
        info(end - mib, end, ANON, "", 0),
        info(end - 2 * mib, end, ANON, "", 0),
        info(end - 3 * mib, end, ANON, "", 0),
        info(end - 4 * mib, end, ANON, "", 0),
        // Faulted, then its top half locked (split off) and faulted again.
        info(0x7f00_0000_0000, 0x7f00_0020_0000, ANON, "", 0),
        info(split, 0x7f00_0020_0000, ANON, "", 0),
        // Another anonymous VMA, just above: its own row.
        info(0x7f00_0020_1000, 0x7f00_0030_0000, ANON, "", 0),
        // A file VMA that grew at its start: the place in the file says it is the same.
        info(0x5000_2000, 0x5000_9000, kind::FILE, "data.bin", 2),
        info(0x5000_1000, 0x5000_9000, kind::FILE, "data.bin", 1),
    ]
    .into_iter()
    .map(|i| (i.start, i))
    .collect();
    let regions = [
        vma_region(end - mib, 257, 0x73),
        vma_region(end - 2 * mib, 257, 0x73),
        vma_region(end - 3 * mib, 257, 0x73),
        vma_region(end - 4 * mib, 100, 0x73),
        vma_region(0x7f00_0000_0000, 64, 0x73),
        vma_region(split, 10, VM_LOCKED | 0x73),
        vma_region(0x7f00_0020_1000, 5, 0x73),
        vma_region(0x5000_2000, 3, 0x73),
        vma_region(0x5000_1000, 2, 0x73),
    ];
    let (list, left_out) = by_mapping(
        &regions,
        &[],
        &kernel,
        Some((&[], MapsFile::Smaps)),
        None,
        10,
    );
    assert_eq!(
        rows(&list),
        [
            row("anonymous", 871, "0x7f7b953ff000", "0x7f7b977ff000", false),
            row("anonymous", 74, "0x7f0000000000", "0x7f0000200000", true),
            row("data.bin", 5, "0x50001000", "0x50009000", false),
            row("anonymous", 5, "0x7f0000201000", "0x7f0000300000", false),
        ]
    );
    assert_eq!(list[2].file.as_ref().unwrap().offset, 4096, "{:?}", list[2]);
    assert_eq!(left_out, LeftOut::default());

    // Top 2: what the table leaves out is said.
    let (list, left_out) = by_mapping(
        &regions,
        &[],
        &kernel,
        Some((&[], MapsFile::Smaps)),
        None,
        2,
    );
    assert_eq!(list.len(), 2);
    assert_eq!(
        left_out,
        LeftOut {
            mappings: 2,
            faults: 10
        }
    );
}

/// One file, one name: the VMA the kernel named `libc.so.6` at the fault was split since, so
/// no smaps mapping starts where it did; another of the file's mappings (same device and
/// inode) gives its path, the one the file's other rows have.
#[test]
fn one_file_has_one_name_in_a_table() {
    let kernel: BTreeMap<u64, MappingInfo> = [info(0x1000, 0x9000, kind::FILE, "libc.so.6", 0)]
        .into_iter()
        .map(|i| (i.start, i))
        .collect();
    let path = "/usr/lib/x86_64-linux-gnu/libc.so.6";
    let file = |start, end, offset| Mapping {
        start,
        end,
        offset,
        name: path.into(),
        locked: false,
        lockonfault: Some(false),
        pages: crate::procfs::PageSizes::default(),
        dev: libc::makedev(8, 1),
        inode: 42,
    };
    let maps = [
        file(0x2000, 0x9000, 0x1000),
        file(0x20000, 0x28000, 0x20000),
    ];
    let page = |start, faults| {
        (
            RegionKey {
                tgid: 1,
                exact: 0,
                start,
            },
            RegionValue {
                faults,
                vm_flags: 0,
            },
        )
    };
    let regions = [vma_region(0x1000, 7, 0x73), page(0x20000, 3)];
    let (list, _) = by_mapping(
        &regions,
        &[],
        &kernel,
        Some((&maps[..], MapsFile::Smaps)),
        None,
        10,
    );
    let names: Vec<&str> = list.iter().map(|m| m.mapping.to_str().unwrap()).collect();
    assert_eq!(names, [path, path], "{list:?}");
    assert_eq!(list[1].file.as_ref().map(|f| f.inode), Some(42));
}

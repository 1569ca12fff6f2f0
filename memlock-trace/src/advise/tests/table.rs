//! The table's own counting: rows of one mapping made one, each fault counted once.

use super::{MIB, mapping};
use crate::advise::table::MappingFigures;

#[test]
fn a_region_seen_growing_is_one_row() {
    let rows = vec![
        mapping("anonymous", 16 * MIB, 0, 100),
        MappingFigures {
            end: 0x7f00_0000_0000 + 32 * MIB,
            size_bytes: 32 * MIB,
            ..mapping("anonymous", 32 * MIB, 0, 50)
        },
    ];
    let merged = crate::advise::table::merge_grown(rows);
    assert_eq!(merged.len(), 1);
    assert_eq!(
        (merged[0].size_bytes, merged[0].faults_after),
        (32 * MIB, 150)
    );
}

/// An interval keyed by the part of the table faulted so far, the next and the session by
/// the whole table: every fault is counted once (before: the first interval's twice), and
/// so is every sampled stack (`--stacks`: the session's rows have the whole run's).
#[test]
fn a_mapping_known_by_two_extents_has_its_faults_counted_once() {
    use crate::advise::observe::{Faults, Interval, MappingRow, Run, Site, SiteFrame, Window};
    let table = 0x7f00_0000_0000u64;
    let site = |faults: u64, symbol: &str| Site {
        faults,
        frames: vec![SiteFrame {
            symbol: symbol.into(),
        }],
    };
    let row = |pages: u64, faults: u64| MappingRow {
        mapping: "/dev/zero (deleted)".into(),
        start: format!("{table:x}"),
        end: format!("{:x}", table + pages * 4096),
        faults,
        locked: None,
        stack: false,
        stacks: vec![site(faults / 32, "fill_table"), site(1, "main")],
    };
    let interval = |start_ns: u64, row: MappingRow| Interval {
        window: Window {
            start_ns,
            end_ns: start_ns + 100_000_000,
        },
        faults: Faults {
            minor: row.faults,
            user: row.faults,
            by_mapping: vec![row],
            ..Faults::default()
        },
    };
    let run = Run {
        flamegraph_command: None,
        pid: 1,
        comm: "python3".into(),
        described: "`python3`".into(),
        launched: true,
        exit_code: Some(0),
        running_at_end: false,
        intervals: vec![
            interval(1_000_000_000, row(7454, 7454)),
            interval(1_100_000_000, row(16384, 8930)),
        ],
        session: Faults {
            minor: 16384,
            user: 16384,
            by_mapping: vec![row(16384, 16384)],
            ..Faults::default()
        },
        session_window: Window {
            start_ns: 1_000_000_000,
            end_ns: 1_250_000_000,
        },
        samples: Default::default(),
        others: Vec::new(),
        lost: 0,
        preload_log: Vec::new(),
        locked_by_calls: 0,
        wall_ns: None,
        started_ns: None,
    };
    let t = crate::advise::table::build(&run, Some(0.0)).unwrap();
    assert_eq!(t.mappings.len(), 1, "{:?}", t.mappings);
    assert_eq!(t.mappings[0].faults(), 16384, "{:?}", t.mappings[0]);
    assert_eq!(t.mappings[0].size_bytes, 16384 * 4096);
    assert_eq!(
        t.mappings[0].sites,
        [site(512, "fill_table"), site(1, "main")],
        "{:?}",
        t.mappings[0]
    );
}

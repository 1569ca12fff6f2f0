//! The rules on hand-made tables: what each kind of advice needs to be drawn, and what
//! keeps it from being drawn.

use super::{
    rules::{ApplyStep, Kind, Verdict, advise},
    sample::MemlockLimit,
    table::{MappingFigures, Phase, Startup, StartupHow, Table},
};

const MIB: u64 = 1 << 20;

fn mapping(name: &str, size: u64, startup: u64, after: u64) -> MappingFigures {
    MappingFigures {
        mapping: name.into(),
        start: 0x7f00_0000_0000,
        end: 0x7f00_0000_0000 + size,
        size_bytes: size,
        perms: Some("rw-p".into()),
        resident_bytes: Some(size),
        swap_bytes: Some(0),
        faults_startup: startup,
        faults_after: after,
        fault_ns_startup: startup * 1500,
        fault_ns_after: after * 1500,
        locked: false,
        lifetimes: 1,
        stack: false,
        first_seen_secs: Some(0.5),
        sites: Vec::new(),
    }
}

fn table(mappings: Vec<MappingFigures>, limit: u64, cap: bool) -> Table {
    Table {
        pid: 1,
        comm: "prog".into(),
        described: "`prog`".into(),
        launched: true,
        exit_code: 0,
        traced_secs: 2.0,
        wall_ns: None,
        startup: Startup {
            secs: 0.2,
            how: StartupHow::Detected,
        },
        during_startup: Phase::default(),
        after_startup: Phase::default(),
        latency_ns: Default::default(),
        time_basis: "each fault timed".into(),
        memlock_limit: Some(MemlockLimit::Bytes(limit)),
        cap_ipc_lock: Some(cap),
        mem_available_bytes: Some(8 << 30),
        memory_cgroup: None,
        threads_max: 1,
        locked_max_bytes: 0,
        swap_max_bytes: 0,
        footprint_max_bytes: 0,
        swap_room_bytes: None,
        locked_by_calls_bytes: 0,
        own_faults: None,
        glibc_malloc: true,
        mappings,
        others: Vec::new(),
        lost: 0,
        preload_log: Vec::new(),
        flamegraph_command: None,
    }
}

#[test]
fn a_table_faulting_after_start_up_is_locked_within_the_limit() {
    let t = table(
        vec![mapping("anonymous", 64 * MIB, 0, 16384)],
        8 * MIB,
        true,
    );
    let advice = advise(&t);
    assert_eq!(advice[0].kind, Kind::Lock, "{advice:?}");
    assert_eq!(advice[0].pinned_bytes, 64 * MIB);
    assert_eq!(advice[0].faults_removed, 16384);
    assert_eq!(
        advice[0].apply,
        Some(ApplyStep::Preload(format!("lock:anon:{}", 64 * MIB)))
    );
}

#[test]
fn over_the_limit_it_is_populated_and_the_limit_named() {
    let t = table(
        vec![mapping("anonymous", 64 * MIB, 0, 16384)],
        8 * MIB,
        false,
    );
    let advice = advise(&t);
    assert_eq!(advice[0].kind, Kind::Populate, "{advice:?}");
    let refused = advice.iter().find(|a| a.kind == Kind::OverLimit).unwrap();
    assert_eq!(refused.verdict, Verdict::DoNot);
    assert!(
        refused
            .how
            .contains("RLIMIT_MEMLOCK of at least 64 MiB (RLIMIT_MEMLOCK 8 MiB now"),
        "{}",
        refused.how
    );
}

#[test]
fn memory_faulted_many_times_its_size_gets_the_allocator_setting_not_a_lock() {
    let block = 64 * MIB + 4096;
    let mut m = mapping("anonymous", block, 0, 10 * (block / 4096));
    m.lifetimes = 5;
    let advice = advise(&table(vec![m.clone()], 8 * MIB, true));
    assert_eq!(advice.len(), 1, "{advice:?}");
    assert_eq!(advice[0].kind, Kind::Allocator);
    assert_eq!(
        advice[0].apply,
        Some(ApplyStep::Tunable(
            "glibc.malloc.mmap_threshold=134217728:glibc.malloc.trim_threshold=268435456".into()
        ))
    );
    // Another allocator: no glibc tunable to give, and nothing to apply.
    let mut t = table(vec![m], 8 * MIB, true);
    t.glibc_malloc = false;
    let advice = advise(&t);
    assert_eq!(advice[0].verdict, Verdict::CannotHelp);
    assert_eq!(advice[0].apply, None);
}

#[test]
fn start_up_only_memory_is_not_to_be_locked_and_few_faults_are_no_advice() {
    let t = table(
        vec![
            mapping("/usr/lib/libbig.so", 4 * MIB, 1024, 0),
            mapping("anonymous", MIB, 0, 10),
        ],
        8 * MIB,
        true,
    );
    let advice = advise(&t);
    assert_eq!(advice.len(), 1, "{advice:?}");
    assert_eq!(advice[0].kind, Kind::TouchedOnce);
    assert_eq!(advice[0].verdict, Verdict::DoNot);
}

#[test]
fn the_heap_is_advised_but_not_applied_and_threads_get_the_stack_warning() {
    let mut t = table(vec![mapping("[heap]", 16 * MIB, 0, 4096)], 64 * MIB, false);
    t.threads_max = 8;
    let advice = advise(&t);
    assert_eq!(advice[0].kind, Kind::Lock);
    assert_eq!(advice[0].apply, None);
    assert!(
        advice[0].how.contains("--apply cannot"),
        "{}",
        advice[0].how
    );
    assert!(advice.iter().any(|a| a.kind == Kind::ThreadStacks));
}

#[test]
fn stacks_short_lived_threads_ran_on_are_never_locked_and_counted_in_the_warning() {
    // Eight 2 MiB thread stacks the kernel saw threads run on, none of them in a sample (the
    // threads came and went between two): one thread at most was seen at once.
    let mut stacks: Vec<MappingFigures> = (0..8u64)
        .map(|i| {
            let mut m = mapping("anonymous", 2 * MIB, 0, 64);
            m.start += i * 3 * MIB;
            m.end = m.start + 2 * MIB;
            m.resident_bytes = None;
            // The kernel told 7 of the 8 apart; the eighth's lookups met a busy mmap lock.
            m.stack = i < 7;
            m
        })
        .collect();
    super::table::mark_stack_sized(&mut stacks);
    let advice = advise(&table(stacks, 64 * MIB, true));
    assert!(
        advice.iter().all(|a| a.verdict != Verdict::Do),
        "{advice:?}"
    );
    let warning = advice
        .iter()
        .find(|a| a.kind == Kind::ThreadStacks)
        .unwrap();
    assert_eq!(
        warning.what,
        "8 thread stacks seen faulting (threads came and went between the samples, which saw \
         at most 1 at once), 16 MiB reserved"
    );
}

#[test]
fn mappings_over_the_limit_are_one_do_not_naming_the_limit_all_need() {
    let mut big = mapping("anonymous", 64 * MIB, 0, 16384);
    big.start += 1 << 32;
    big.end += 1 << 32;
    let t = table(
        vec![big, mapping("anonymous", 16 * MIB, 0, 4096)],
        8 * MIB,
        false,
    );
    let advice = advise(&t);
    let refused: Vec<_> = advice
        .iter()
        .filter(|a| a.kind == Kind::OverLimit)
        .collect();
    assert_eq!(refused.len(), 1, "{advice:?}");
    assert!(
        refused[0].what.starts_with("2 mappings"),
        "{}",
        refused[0].what
    );
    assert!(
        refused[0]
            .how
            .contains("at least 80 MiB (RLIMIT_MEMLOCK 8 MiB now"),
        "{}",
        refused[0].how
    );
}

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
    let merged = super::table::merge_grown(rows);
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
    use super::observe::{Faults, Interval, MappingRow, Run, Site, SiteFrame, Window};
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
        exit_code: 0,
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
    let t = super::table::build(&run, Some(0.0)).unwrap();
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

#[test]
fn a_mapping_malloc_made_is_applied_by_its_blocks_sizes_one_rule_each() {
    // Two merged runs of 1 MiB slabs (1 MiB + malloc's header: two pages over) and a table
    // of 512 KiB, as the preload library logged them in the watching run.
    let mut slabs = mapping("anonymous", 48 * MIB, 0, 12_000);
    slabs.start = 0x7f10_0000_0000;
    slabs.end = slabs.start + 48 * MIB;
    let mut more = mapping("anonymous", 16 * MIB, 0, 4_000);
    more.start = 0x7f20_0000_0000;
    more.end = more.start + 16 * MIB;
    let mut t = table(vec![slabs, more], 8 * MIB, false);
    t.preload_log = (0..48)
        .map(|i| {
            format!(
                "alloc 0x{:x} 1048576",
                0x7f10_0000_0010u64 + i * (MIB + 4096)
            )
        })
        .chain(["alloc 0x7f20_0000_0010 1048576".replace('_', "")])
        .chain(["alloc 0x7f30_0000_0010 524288".replace('_', "")])
        .collect();
    let advice = advise(&t);
    let done: Vec<_> = advice.iter().filter(|a| a.verdict == Verdict::Do).collect();
    assert_eq!(done.len(), 2, "{advice:?}");
    for a in &done {
        assert_eq!(a.kind, Kind::Populate, "over 8 MiB: {a:?}");
        assert_eq!(
            a.apply,
            Some(ApplyStep::Preload("populate:alloc:1048576".into())),
            "{a:?}"
        );
    }
    assert!(
        done[0].how.contains("malloc made it (48 x 1 MiB blocks"),
        "{}",
        done[0].how
    );
    let steps: Vec<ApplyStep> = done.iter().filter_map(|a| a.apply.clone()).collect();
    assert_eq!(
        super::apply::preload_rules(&steps),
        ["populate:alloc:1048576"],
        "one rule for both"
    );
    // A size one mapping locks and another populates: populated, the limit was weighed
    // per mapping.
    let mixed = [
        ApplyStep::Preload("lock:alloc:1048576;lock:anon:8192".into()),
        ApplyStep::Preload("populate:alloc:1048576".into()),
    ];
    assert_eq!(
        super::apply::preload_rules(&mixed),
        ["populate:alloc:1048576", "lock:anon:8192"]
    );
}

/// A memory cgroup limited at `limit_mib` with `used_mib` charged, its parent unlimited.
fn in_cgroup(t: &mut Table, limit_mib: u64, used_mib: u64) {
    use crate::process::memory_cgroup::{MemoryCgroup, MemoryLimit, Version};
    t.memory_cgroup = Some(MemoryCgroup {
        version: Version::V2,
        path: "/app.slice/app.service".into(),
        limits: vec![MemoryLimit {
            path: "/app.slice".into(),
            file: "memory.max",
            limit_bytes: limit_mib * MIB,
            usage_bytes: used_mib * MIB,
        }],
    });
}

#[test]
fn past_the_memory_cgroup_s_room_nothing_is_locked_nor_populated() {
    // 256 MiB mapped, 64 MiB of it resident: locking charges 192 MiB more.
    let mut m = mapping("anonymous", 256 * MIB, 0, 16384);
    m.resident_bytes = Some(64 * MIB);
    let mut t = table(vec![m], 8 * MIB, true);
    in_cgroup(&mut t, 160, 80);
    let advice = advise(&t);
    assert!(
        !advice.iter().any(|a| a.verdict == Verdict::Do),
        "nothing ranked: {advice:?}"
    );
    let refused = advice.iter().find(|a| a.kind == Kind::OverCgroup).unwrap();
    assert_eq!(refused.verdict, Verdict::DoNot);
    assert!(
        refused.how.contains(
            "would charge 192 MiB more to the memory cgroup /app.slice/app.service, past \
             /app.slice's memory.max 160 MiB (80 MiB used at the process's fullest, 80 MiB left)"
        ),
        "{}",
        refused.how
    );
    // Without CAP_IPC_LOCK and over RLIMIT_MEMLOCK: populating charges as much, refused too.
    t.cap_ipc_lock = Some(false);
    let advice = advise(&t);
    assert!(
        !advice.iter().any(|a| a.kind == Kind::Populate),
        "{advice:?}"
    );
    assert!(
        advice.iter().any(|a| a.kind == Kind::OverCgroup),
        "{advice:?}"
    );
}

#[test]
fn within_the_memory_cgroup_s_room_the_lock_says_what_it_charges() {
    let mut m = mapping("anonymous", 256 * MIB, 0, 16384);
    m.resident_bytes = Some(64 * MIB);
    let mut t = table(vec![m.clone()], 8 * MIB, true);
    in_cgroup(&mut t, 1024, 80);
    let advice = advise(&t);
    assert_eq!(advice[0].kind, Kind::Lock, "{advice:?}");
    assert!(
        advice[0]
            .how
            .contains("charges 192 MiB more to the memory cgroup /app.slice/app.service, within"),
        "{}",
        advice[0].how
    );
    // Two mappings that fit alone but not together: the second is refused.
    let mut second = m;
    second.start += 512 * MIB;
    second.end += 512 * MIB;
    second.fault_ns_after /= 2;
    let mut t = table(vec![t.mappings[0].clone(), second], 8 * MIB, true);
    in_cgroup(&mut t, 400, 80);
    let advice = advise(&t);
    let kinds: Vec<Kind> = advice.iter().map(|a| a.kind).collect();
    assert_eq!(kinds, [Kind::Lock, Kind::OverCgroup], "{advice:?}");
}

/// Issue 44, item 4: a table whose pages went to swap and came back is advised locked as
/// swap-ins, weighed against the memory cgroup; its majors are not a file's reads.
#[test]
fn a_swapped_table_is_locked_against_swap_ins_and_weighed_against_the_cgroup() {
    use crate::process::memory_cgroup::{MemoryCgroup, MemoryLimit, Version};
    let mut m = mapping("anonymous", 16 * MIB, 4096, 3 * 4096);
    m.swap_bytes = Some(16 * MIB);
    let mut t = table(vec![m], 8 * MIB, true);
    t.after_startup.major = 3 * 4096;
    t.latency_ns.insert(
        "major".into(),
        super::observe::Latency {
            count: 3 * 4096,
            p50: 5_000,
            p99: 300_000,
            max: 1_000_000,
            total: 3 * 4096 * 40_000,
        },
    );
    t.swap_max_bytes = 40 * MIB;
    t.footprint_max_bytes = 100 * MIB;
    t.swap_room_bytes = Some(400 * MIB);
    t.memory_cgroup = Some(MemoryCgroup {
        version: Version::V1,
        path: "/pressed".into(),
        limits: vec![MemoryLimit {
            path: "/pressed".into(),
            file: "memory.limit_in_bytes",
            limit_bytes: 96 * MIB,
            usage_bytes: 96 * MIB,
        }],
    });
    let advice = advise(&t);
    assert_eq!(advice[0].kind, Kind::SwapIns, "{advice:?}");
    assert_eq!(advice[0].verdict, Verdict::Do);
    assert!(
        advice[0].what.contains("12,288 of them swap-ins"),
        "{}",
        advice[0].what
    );
    assert!(
        advice[0].what.contains("491.5 ms in swap-ins"),
        "{}",
        advice[0].what
    );
    assert!(advice[0].how.contains("leaves 80 MiB"), "{}", advice[0].how);
    assert!(
        advice[0].how.contains("4 MiB of it must live on swap"),
        "{}",
        advice[0].how
    );
    assert!(
        !advice.iter().any(|a| a.kind == Kind::MajorFaults),
        "{advice:?}"
    );
    // No swap to take the rest: locking would OOM-kill.
    t.swap_room_bytes = Some(MIB);
    let advice = advise(&t);
    assert_eq!(advice[0].kind, Kind::OverCgroup, "{advice:?}");
    assert_eq!(advice[0].verdict, Verdict::DoNot);
    assert!(advice[0].how.contains("OOM-kills"), "{}", advice[0].how);
    // Never on swap: its majors are a file's reads, and locking cannot help.
    t.mappings[0].swap_bytes = Some(0);
    let advice = advise(&t);
    let majors = advice.iter().find(|a| a.kind == Kind::MajorFaults).unwrap();
    assert!(
        majors.what.contains("pages read from a file"),
        "{}",
        majors.what
    );
    assert!(!majors.what.contains("swap-ins"), "{}", majors.what);
}

//! Advice weighed against the memory cgroup's room, and swapped memory locked against its
//! swap-ins.

use super::{MIB, mapping, table};
use crate::advise::{
    rules::{Kind, Verdict, advise},
    table::Table,
};

/// A memory cgroup limited at `limit_mib` with `used_mib` charged, its parent unlimited.
fn in_cgroup(t: &mut Table, limit_mib: u64, used_mib: u64) {
    use crate::process::memory_cgroup::{MemoryCgroup, MemoryLimit, Version};
    t.limits.memory_cgroup = Some(MemoryCgroup {
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
    t.limits.cap_ipc_lock = Some(false);
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
        crate::advise::observe::Latency {
            count: 3 * 4096,
            p50: 5_000,
            p99: 300_000,
            max: 1_000_000,
            total: 3 * 4096 * 40_000,
        },
    );
    t.limits.swap_max_bytes = 40 * MIB;
    t.limits.footprint_max_bytes = 100 * MIB;
    t.limits.swap_room_bytes = Some(400 * MIB);
    t.limits.memory_cgroup = Some(MemoryCgroup {
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
    t.limits.swap_room_bytes = Some(MIB);
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

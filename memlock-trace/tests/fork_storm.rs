//! Runs on: host, 5.10: user space on top of the hooks; on the guest that boots with 96 possible
//! CPUs (LARGE_MACHINE), where per-CPU sizing would show
//!
//! A fork storm at default settings loses nothing: thousands of children, all alive at once
//! and followed from their fork, each making one mlock call; the summary counts every call,
//! and every page fault the kernel handed their parent when it reaped them
//! (`getrusage(RUSAGE_CHILDREN)`), and no row says faults are missing. And the maps of a
//! system-wide session take at most 32 MiB on any CPU count (`cargo xtask test --max-cpus
//! 96` runs these in a guest with 96 possible CPUs), and short processes add little to its
//! user memory.

mod common;
mod support;

use std::process::Command;

use common::require_privileges;
use support::{BIN, Tracer, map_memory, status_kb, summary};

/// The most kernel map memory a system-wide session may take at start (issue 29).
const MAP_MEMORY_LIMIT: u64 = 32 << 20;

/// Rounds of the `children` workload, one after the other, each with [`PER_ROUND`] children
/// alive at once: more processes than the fault statistics map held before it was sized for
/// storms (3,066 entries on 2 CPUs).
const ROUNDS: u64 = 4;
const PER_ROUND: u64 = 1000;
const CHILDREN: u64 = ROUNDS * PER_ROUND;

/// The storm and the memory test each run a system-wide tracer or a storm of processes: one
/// at a time, or the memory test's session would count the storm's 4,000 children too.
static ONE_STORM_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn every_fault_and_call_of_a_fork_storm_is_counted() {
    require_privileges();
    let _alone = ONE_STORM_AT_A_TIME.lock();
    storm();
}

#[test]
fn a_system_wide_session_starts_with_at_most_32_mib_of_map_memory() {
    require_privileges();
    let mut tracer = Tracer::spawn(&["--json"]);
    tracer.wait_for_stderr("memlock-trace: tracing");
    let maps = map_memory(tracer.pid());
    tracer.signal(libc::SIGINT);
    let done = tracer.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let total: u64 = maps.iter().map(|m| m.1).sum();
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    eprintln!(
        "{} maps, {:.1} MiB on CPUs {} (possible):",
        maps.len(),
        total as f64 / f64::from(1 << 20),
        cpus.trim()
    );
    for (name, bytes) in &maps {
        eprintln!(
            "  {name:<16} {:>8.2} MiB",
            *bytes as f64 / f64::from(1 << 20)
        );
    }
    assert!(
        total <= MAP_MEMORY_LIMIT,
        "{total} bytes of map memory at start, more than {MAP_MEMORY_LIMIT}"
    );
}

/// User memory follows what the options bound, not how many processes came and went: a
/// thousand short processes that each make one mlock call, all kept by the call statistics,
/// add at most 6 MiB to a system-wide session's anonymous
/// memory (issue 29: 3,000 distinct processes at most 16 MiB; one HdrHistogram per process
/// and call made it ~50 KiB each). Anonymous memory alone, and never beside the storm: a CI
/// run on 5.10 read VmRSS 28.9 -> 42.8 MiB with the storm's children in the same
/// system-wide session; alone, 8.4 -> 10.2 MiB anonymous there and 13.5 -> 15.3 on the host.
#[test]
fn a_thousand_short_processes_add_little_to_the_tracers_memory() {
    require_privileges();
    let _alone = ONE_STORM_AT_A_TIME.lock();
    // Every process on a row of its own, so the summary shows the children's calls.
    let mut tracer = Tracer::spawn(&["--json", "--max-processes", "4096"]);
    tracer.wait_for_stderr("memlock-trace: tracing");
    // Warm-up: the first refreshes, and a first storm for what the first processes'
    // events allocate once (CI on 5.10 once read 8.5 -> 19.9 MiB where runs alone read
    // 8.4 -> 10.2 time after time; what grew was not recorded then, hence the breakdown).
    children(200);
    std::thread::sleep(std::time::Duration::from_secs(3));
    let pid = tracer.pid();
    let (before, file_before) = (
        status_kb(pid, "RssAnon:") << 10,
        status_kb(pid, "RssFile:") << 10,
    );
    let mappings_before = resident_kb_by_mapping(pid);
    children(1000);
    // The tracer drains its ring every 20 ms and refreshes every second or so.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let (after, file_after) = (
        status_kb(pid, "RssAnon:") << 10,
        status_kb(pid, "RssFile:") << 10,
    );
    let mut grew_where = String::new();
    for (mapping, kb) in resident_kb_by_mapping(pid) {
        let was = mappings_before.get(&mapping).copied().unwrap_or(0);
        if kb.abs_diff(was) >= 256 {
            grew_where += &format!("\n  {mapping}: {was} -> {kb} KiB");
        }
    }
    tracer.signal(libc::SIGINT);
    let done = tracer.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let calls = summary(&done.stdout)["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["syscalls"]["mlock"]["count"].as_u64().is_some())
        .count();
    let grown = after.saturating_sub(before);
    // Anonymous memory is what the tracer keeps; its file-backed pages are its own code,
    // faulted in as paths run for the first time (a debug build's text is tens of MiB).
    eprintln!(
        "anonymous {:.1} -> {:.1} MiB, file-backed {:.1} -> {:.1} MiB over 1,000 processes \
         ({calls} rows with mlock){grew_where}",
        mib(before),
        mib(after),
        mib(file_before),
        mib(file_after)
    );
    assert!(
        calls >= 1200,
        "{calls} processes with their mlock call kept"
    );
    assert!(
        grown <= 6 << 20,
        "{grown} bytes more anonymous memory; resident memory that moved, by mapping:{grew_where}"
    );
}

/// `count` children alive at once, each making one mlock call.
fn children(count: u32) {
    let status = Command::new(BIN)
        .args(["workload", "children", "--count", &count.to_string()])
        .args(["--calls", "1", "--report", "/dev/null"])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Resident KiB of each mapping of `pid` (smaps), by name and start.
fn resident_kb_by_mapping(pid: i32) -> std::collections::BTreeMap<String, u64> {
    memlock_trace::procfs::read_smaps(&format!("/proc/{pid}/smaps"), false)
        .unwrap()
        .into_iter()
        .map(|e| {
            let name = format!("{} {:#x}", e.mapping.name, e.mapping.start);
            (name, e.rss_kb)
        })
        .collect()
}

/// Runs the storm under a session following it and checks that every fault and call was
/// counted.
fn storm() {
    let dir = std::env::temp_dir().join(format!("memlock-trace-storm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "for i in $(seq {ROUNDS}); do {BIN} workload children --count {PER_ROUND} \
         --calls 1 --report {}/$i.json || exit 1; done",
        dir.display()
    );
    // Every child listed on a row of its own (by default the summary lists the 1024 most
    // active and folds the rest by name): what is checked is that the kernel lost nothing.
    let args = [
        "--json",
        "--follow-children",
        "--max-processes",
        "8192",
        "--",
        "sh",
        "-c",
        &script,
    ];
    let out = support::run(&args);
    let (mut children, mut children_faults) = (Vec::new(), 0);
    for round in 1..=ROUNDS {
        let path = dir.join(format!("{round}.json"));
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        children.extend(
            report["children"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_u64().unwrap()),
        );
        children_faults += report["children_faults"].as_u64().unwrap();
    }
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(children.len() as u64, CHILDREN);
    let s = summary(&String::from_utf8_lossy(&out.stdout));
    let rows: Vec<&serde_json::Value> = s["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| children.contains(&p["pid"].as_u64().unwrap()))
        .collect();
    // A pid may come back in a later round: rows are by (pid, start time).
    assert_eq!(rows.len() as u64, CHILDREN, "one row per child");
    let faults: u64 = rows
        .iter()
        .map(|p| p["faults"]["minor"].as_u64().unwrap() + p["faults"]["major"].as_u64().unwrap())
        .sum();
    let calls: u64 = rows
        .iter()
        .map(|p| p["syscalls"]["mlock"]["count"].as_u64().unwrap_or(0))
        .sum();
    eprintln!(
        "{CHILDREN} children: {faults} faults counted, the kernel's {children_faults}; \
         {calls} mlock calls"
    );
    assert_eq!(calls, CHILDREN, "one mlock per child");
    assert_eq!(faults, children_faults, "{}", s["fault_health"]);
    for p in &rows {
        // Each child was counted from its fork: the kernel's own count at its exit agrees.
        assert_eq!(p["faults_missing"], 0, "{p}");
    }
    assert_eq!(
        s["fault_health"]["stats_evicted"], 0,
        "{}",
        s["fault_health"]
    );
    assert_eq!(
        s["fault_health"]["histograms_evicted"], 0,
        "{}",
        s["fault_health"]
    );
    assert_eq!(s["syscall_health"]["evicted"], 0);
    assert_eq!(s["health"]["processes"]["children_not_followed"], 0);
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

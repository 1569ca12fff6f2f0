//! A fork storm at default settings loses nothing: thousands of children, all alive at once
//! and followed from their fork, each making one mlock call; the summary counts every call,
//! and every page fault the kernel handed their parent when it reaped them
//! (`getrusage(RUSAGE_CHILDREN)`), and no row says faults are missing.

mod common;
mod support;

use common::require_privileges;
use support::{BIN, run, summary};

/// Rounds of the `children` workload, one after the other, each with [`PER_ROUND`] children
/// alive at once: more processes than the fault statistics map held before it was sized for
/// storms (3,066 entries on 2 CPUs).
const ROUNDS: u64 = 4;
const PER_ROUND: u64 = 1000;
const CHILDREN: u64 = ROUNDS * PER_ROUND;

#[test]
fn every_fault_and_call_of_a_fork_storm_is_counted() {
    require_privileges();
    let dir = std::env::temp_dir().join(format!("memlock-trace-storm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "for i in $(seq {ROUNDS}); do {BIN} workload children --count {PER_ROUND} --calls 1 \
         --report {}/$i.json || exit 1; done",
        dir.display()
    );
    // Every child listed on a row of its own (by default the summary lists the 1024 most
    // active and folds the rest by name): what is checked is that the kernel lost nothing.
    let out = run(&[
        "--json",
        "--follow-children",
        "--max-processes",
        "8192",
        "--",
        "sh",
        "-c",
        &script,
    ]);
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
    assert_eq!(s["syscall_health"]["evicted"], 0);
    assert_eq!(s["health"]["processes"]["children_not_followed"], 0);
}

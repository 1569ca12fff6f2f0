//! The bundled workloads (`memlock-trace workload ...`) as commands to trace, and what
//! they report.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use super::{BIN, poll_within};

/// `memlock-trace workload NAME --report REPORT`: a bundled workload as the command to
/// trace, writing what it did (its own count of calls and faults) to REPORT.
pub fn workload<'a>(name: &'a str, report: &'a str) -> [&'a str; 5] {
    [BIN, "workload", name, "--report", report]
}

/// The arguments of `memlock-trace workload flood`: `threads` threads making `calls`
/// failing mlock calls each, then `extra` (`--munlock`, `--wait-stdin`, `--report PATH`).
pub fn flood_args(threads: u64, calls: u64, extra: &[&str]) -> Vec<String> {
    let counts = [threads, calls].map(|n| n.to_string());
    [
        "workload",
        "flood",
        "--threads",
        &counts[0],
        "--calls",
        &counts[1],
    ]
    .iter()
    .chain(extra)
    .map(|a| a.to_string())
    .collect()
}

/// `memlock-trace workload flood` started with [`flood_args`] `--wait-stdin`: its threads
/// wait at the start line until a byte arrives on its (piped) stdin; its report is dropped.
pub fn waiting_flood(threads: u64, calls: u64) -> Child {
    Command::new(BIN)
        .args(flood_args(threads, calls, &["--wait-stdin"]))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start the flood")
}

/// The thread ids of process `pid` once it has at least `n` threads (the main one too):
/// threads a process starts appear in `/proc/PID/task` a moment later.
pub fn threads_of(pid: u32, n: usize) -> Vec<u32> {
    let task = format!("/proc/{pid}/task");
    poll_within(Duration::from_secs(30), Duration::from_millis(10), || {
        let tids: Vec<u32> = std::fs::read_dir(&task)
            .unwrap_or_else(|e| panic!("{task}: {e}"))
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        if tids.len() >= n {
            Ok(tids)
        } else {
            Err(format!("{pid}'s threads: {tids:?}"))
        }
    })
}

/// The pids of the children `memlock-trace workload children --report REPORT` started, in
/// order, from its report (which is then removed).
pub fn workload_children(report: &std::path::Path) -> Vec<u32> {
    let r: Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    std::fs::remove_file(report).ok();
    r["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap() as u32)
        .collect()
}

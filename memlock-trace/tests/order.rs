//! Runs on: host, 5.10: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! `--events` is one stream in time order: syscall, VMA and fault records, which the kernel
//! hands over in two ring buffers, merged by their kernel stamps.

mod common;

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use common::require_privileges;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_memlock-trace");

#[test]
fn events_from_both_rings_are_in_time_order() {
    require_privileges();
    // The launch itself (execve populates pages), faults the workload takes, an mlock that
    // populates 64 pages, more faults: records of both rings interleave in time.
    let mut child = Command::new(BIN)
        .args(["--json", "--events", "--sample", "1", "--"])
        .args([BIN, "workload", "faults"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run memlock-trace");
    // The command is in the filter before it runs: its input can be given all at once.
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"touch 20\nmlock 64\ntouch 20\nexit\n")
        .unwrap();
    let out = child.wait_with_output().expect("memlock-trace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    assert!(!stderr.contains("too late"), "{stderr}");
    let records: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &Value| !v["type"].as_str().unwrap().ends_with("summary"))
        .collect();
    let time = |v: &Value| v["time_ns"].as_u64().unwrap_or_else(|| panic!("{v}"));
    for pair in records.windows(2) {
        assert!(
            time(&pair[0]) <= time(&pair[1]),
            "out of order:\n{}\n{}",
            pair[0],
            pair[1]
        );
    }
    // A call sorts by its entry: the pages it populated follow its line.
    let mlock = records
        .iter()
        .position(|v| v["type"] == "syscall" && v["syscall"] == "mlock")
        .expect("the mlock event");
    let populated = records
        .iter()
        .position(|v| v["type"] == "fault" && v["populated"] == true && v["syscall"] == "mlock")
        .expect("the pages mlock populated");
    assert!(
        mlock < populated,
        "mlock at {mlock}, its pages at {populated}"
    );
    assert!(
        records[..mlock]
            .iter()
            .any(|v| v["type"] == "fault" && v["populated"] == false),
        "the first touches' faults come before the mlock"
    );
}

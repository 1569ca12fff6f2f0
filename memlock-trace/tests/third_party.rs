//! Runs on: host, 6.1: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! Packages: python3
//!
//! Real programs under the tracer: python3 with ctypes calling mlock, mlock2, mlockall and
//! munlockall from several threads (tests/third_party/ctypes_threads.py). Its own account
//! (thread ids, calls per thread, `VmLck` from /proc/self/status around mlockall) is checked
//! against the tracer's.
//!
//! `cargo xtask test` installs Debian's python3 when missing, and the guests' initramfs
//! carries it with its standard library (less the test suite, GUIs and byte code) and the
//! libraries it and its extension modules load, so this runs on every kernel.

mod common;
mod support;

use std::{collections::BTreeMap, path::Path, process::Command};

use common::require_privileges;
use serde_json::Value;
use support::{BIN, json_lines};

const PYTHON: &str = "/usr/bin/python3";
const SCRIPT: &str = include_str!("third_party/ctypes_threads.py");

#[test]
fn python_ctypes_threads_are_counted_exactly() {
    require_privileges();
    assert!(
        Path::new(PYTHON).is_file(),
        "{PYTHON} is missing (`cargo xtask test` installs Debian's python3 package and carries \
         it into the guests, or: apt-get install python3)"
    );
    let dir = std::env::temp_dir().join(format!("memlock-trace-python-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("ctypes_threads.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let trace = dir.join("trace.json");
    let out = Command::new(BIN)
        .args(["--json", "--events", "--per-thread", "-o"])
        .arg(&trace)
        .args(["--", PYTHON])
        .arg(&script)
        .output()
        .expect("memlock-trace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    // The tracer writes to the file; the program's own stdout is its account.
    let own: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("python's report: {e}: {:?}", out.stdout));
    let traced = std::fs::read_to_string(&trace).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let lines = json_lines(&traced);
    let pid = own["pid"].as_u64().unwrap();
    let main_tid = own["main_tid"].as_u64().unwrap();

    // Calls per thread and name, from the event lines.
    let mut per_thread: BTreeMap<(u64, String), u64> = BTreeMap::new();
    for l in lines.iter().filter(|l| l["type"] == "syscall") {
        assert_eq!(l["pid"], pid, "only python's calls: {l}");
        assert_eq!(l["errno"], Value::Null, "every call succeeded: {l}");
        let key = (
            l["tid"].as_u64().unwrap(),
            l["syscall"].as_str().unwrap().to_string(),
        );
        *per_thread.entry(key).or_default() += 1;
    }
    let mut expected: BTreeMap<(u64, String), u64> = BTreeMap::new();
    expected.insert((main_tid, "mlockall".into()), 1);
    expected.insert((main_tid, "munlockall".into()), 1);
    for t in own["threads"].as_array().unwrap() {
        let tid = t["tid"].as_u64().unwrap();
        for name in ["mlock", "munlock", "mlock2"] {
            let n = t[name].as_u64().unwrap();
            if n > 0 {
                expected.insert((tid, name.into()), n);
            }
        }
    }
    assert_eq!(per_thread, expected, "calls per (tid, syscall)\n{own}");

    // The summary's table: the same totals per syscall.
    let summary = lines.iter().rev().find(|l| l["type"] == "summary").unwrap();
    for name in ["mlock", "munlock", "mlock2", "mlockall", "munlockall"] {
        let made: u64 = expected
            .iter()
            .filter(|((_, n), _)| n == name)
            .map(|(_, c)| c)
            .sum();
        assert_eq!(
            support::calls_of(summary, pid as u32, name),
            made,
            "{name} in the summary: {summary}"
        );
    }

    // mlockall/munlockall: VM_LOCKED bytes = locked_vm pages = the VmLck python read.
    let vmlck: Vec<u64> = own["vmlck_kib"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let find = |kind: &str, name: &str| {
        lines
            .iter()
            .find(|l| l["type"] == kind && l["syscall"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}: {traced}"))
    };
    let (mlockall, munlockall) = (find("syscall", "mlockall"), find("syscall", "munlockall"));
    let (vma_lock, vma_unlock) = (find("vma_call", "mlockall"), find("vma_call", "munlockall"));
    let page_kib = own["page_size"].as_u64().unwrap() / 1024;
    assert_eq!(vmlck[0], 0, "nothing locked before: {own}");
    assert_eq!(
        mlockall["locked_vm_after"].as_u64().unwrap() * page_kib,
        vmlck[1],
        "locked_vm after mlockall vs VmLck: {mlockall}"
    );
    assert_eq!(
        vma_lock["counts"]["locked_bytes"].as_u64().unwrap() / 1024,
        vmlck[1] - vmlck[0],
        "VM_LOCKED set by mlockall vs VmLck: {vma_lock}\n{stderr}"
    );
    assert_eq!(
        vma_unlock["counts"]["unlocked_bytes"].as_u64().unwrap() / 1024,
        vmlck[1] - vmlck[2],
        "VM_LOCKED cleared by munlockall vs VmLck: {vma_unlock}"
    );
    eprintln!(
        "VmLck {vmlck:?} KiB; locked_vm after mlockall {} pages; VM_LOCKED set {} B, cleared {} B",
        mlockall["locked_vm_after"],
        vma_lock["counts"]["locked_bytes"],
        vma_unlock["counts"]["unlocked_bytes"]
    );
    let _ = munlockall;
}

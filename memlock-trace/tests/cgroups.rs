//! Runs on: host, 6.1: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! Every process carries its cgroup v2: a process the test moves into a fresh cgroup (a
//! directory made under the cgroup2 mount, its pid written to `cgroup.procs`) is reported
//! with that path, the unit its name makes, and `--by cgroup` adds the summary up by it.

mod common;
mod support;

use std::path::PathBuf;

use common::require_privileges;
use support::{BIN, cgroup2_mount, run, summary, syscall_table_header, workload};

/// A fresh cgroup `/memlock-trace-test-PID/probe.service`, removed on drop.
struct FreshCgroup {
    top: PathBuf,
    dir: PathBuf,
}

impl FreshCgroup {
    fn new() -> Self {
        let top = cgroup2_mount().join(format!("memlock-trace-test-{}", std::process::id()));
        let dir = top.join("probe.service");
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Self { top, dir }
    }

    /// As `/proc/PID/cgroup` shows it (for a tracer in the root cgroup namespace).
    fn path(&self) -> String {
        format!(
            "/{}/probe.service",
            self.top.file_name().unwrap().to_string_lossy()
        )
    }
}

impl Drop for FreshCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
        let _ = std::fs::remove_dir(&self.top);
    }
}

#[test]
fn a_process_in_a_fresh_cgroup_is_reported_with_its_path() {
    require_privileges();
    let cgroup = FreshCgroup::new();
    // The shell takes its first faults where the test runs, then moves itself and execs the
    // workload: the exec (and the exit) record where it is now.
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec {BIN} workload syscalls --report /dev/null",
        cgroup.dir.display()
    );
    let out = run(&["--json", "--by", "cgroup", "--", "sh", "-c", &script]);
    let s = summary(&String::from_utf8_lossy(&out.stdout));
    let processes = s["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "{s}");
    let p = &processes[0];
    assert_eq!(p["comm"], "memlock-trace", "named after its exec: {p}");
    assert_eq!(p["cgroup"]["path"], cgroup.path().as_str(), "{p}");
    assert_eq!(p["cgroup"]["unit"], "probe.service", "{p}");
    // The id is the directory's: its inode number on cgroup2.
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&cgroup.dir).unwrap());
    assert_eq!(p["cgroup"]["id"], ino, "{p}");
    let groups = s["cgroups"]
        .as_array()
        .expect("--by cgroup: a cgroups list");
    assert_eq!(groups.len(), 1, "{s}");
    assert_eq!(groups[0]["cgroup"]["path"], cgroup.path().as_str());
    assert_eq!(groups[0]["processes"], 1);
    // The syscalls workload makes one of each call, mlock twice.
    assert_eq!(
        groups[0]["syscalls"]["mlock"]["count"],
        p["syscalls"]["mlock"]["count"]
    );

    // The same in text: the cgroup's block instead of the process's.
    let out = run(&["--by", "cgroup", "--", "sh", "-c", &script]);
    let text = String::from_utf8_lossy(&out.stdout);
    let header = format!(
        "cgroup {} (unit probe.service): 1 process (memlock-trace)",
        cgroup.path()
    );
    assert!(text.lines().any(|l| l == header), "{header:?} in\n{text}");
    assert!(!text.contains("\npid "), "no per-process blocks:\n{text}");
}

/// `--by cgroup`'s table in the units of every other table: latency as the syscall table
/// shows it (`us`/`ms`, not raw ns), page counts named pages. The workload stays in the
/// test's own cgroup (no cgroup is made).
#[test]
fn cgroup_tables_use_the_units_of_the_others() {
    require_privileges();
    let syscalls = workload("syscalls", "/dev/null");
    let out = run(&[
        &["--by", "cgroup", "--fault-hooks", "off", "--"][..],
        &syscalls,
    ]
    .concat());
    let text = String::from_utf8_lossy(&out.stdout);
    syscall_table_header(&text);
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("mlock "))
        .collect();
    assert!(!rows.is_empty(), "{text}");
    for row in rows {
        // syscall, calls, populated, locked, max latency, errors...
        let latency = row.split_whitespace().nth(4).unwrap();
        assert!(
            (latency.ends_with("us") || latency.ends_with("ms"))
                && latency[..latency.len() - 2].parse::<f64>().is_ok(),
            "{row}"
        );
    }
}

//! Runs on: host, 5.10: the unit's memory limit, on the guest that boots with 96 possible CPUs
//! (LARGE_MACHINE), where per-CPU maps would need more
//!
//! Issue 29 item 3: a system-wide session starts and stays exact inside a memory cgroup at
//! the limit the unit (`MemoryMax` in dist/memlock-trace.service) and the DaemonSet
//! (dist/kubernetes/, kept equal to the unit's by test:kubernetes_manifest) give it. A memory cgroup charges more than the tracer's resident
//! memory: its BPF maps and what the kernel allocates to verify and load its programs
//! (an 80 MiB cgroup once refused the maps). The session runs with `--prometheus` (the
//! refreshes are its largest user allocations) while 2,000 short processes each make one
//! mlock call; it must count every call, never reach the limit (the cgroup's failure
//! count stays 0: not even reclaim was needed) and write its summary at SIGINT.

mod common;
mod support;

use std::process::Command;

use common::require_privileges;
use support::{
    BIN, Tracer,
    memory_cgroup::{self, Controller},
    summary,
};

/// Rounds of `workload children` (at most 1,024 alive at once each).
const ROUNDS: u64 = 2;
const PER_ROUND: u64 = 1000;
const CHILDREN: u64 = ROUNDS * PER_ROUND;

/// The unit's `MemoryMax`, in bytes (`NNNM`).
fn unit_limit() -> u64 {
    let value = &support::unit_values("MemoryMax")[0];
    let mib: u64 = value
        .strip_suffix('M')
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("MemoryMax={value}: expected NNNM"));
    mib << 20
}

/// `memlock-trace-test-limit-PID` under the memory controller, removed on drop.
struct Limited {
    memory: Controller,
    dir: std::path::PathBuf,
}

impl Limited {
    fn new(bytes: u64) -> Self {
        let memory = Controller::find();
        let dir = memory.make(
            &memory.point,
            &format!("memlock-trace-test-limit-{}", std::process::id()),
        );
        memory.limit(&dir, bytes);
        Self { memory, dir }
    }

    fn read(&self, file: &str) -> String {
        let path = self.dir.join(file);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Times the cgroup's usage reached its limit: v1's `memory.failcnt`, v2's `max` event.
    fn hit_limit(&self) -> u64 {
        if self.memory.v1 {
            self.read("memory.failcnt").trim().parse().unwrap()
        } else {
            self.read("memory.events")
                .lines()
                .find_map(|l| l.strip_prefix("max "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap()
        }
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        memory_cgroup::remove(&self.dir);
    }
}

#[test]
fn a_system_wide_session_counts_exactly_within_the_units_memory_limit() {
    require_privileges();
    let limit = unit_limit();
    let cgroup = Limited::new(limit);
    let mut tracer = Tracer::spawn_command(Command::new("sh").args([
        "-c",
        &format!(
            "echo $$ > {}/cgroup.procs && exec {BIN} --json --prometheus 127.0.0.1:0 \
             --max-processes 8192",
            cgroup.dir.display()
        ),
    ]));
    tracer.wait_for_stderr("memlock-trace: tracing");
    let dir = std::env::temp_dir().join(format!("memlock-trace-limit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for round in 1..=ROUNDS {
        let report = dir.join(format!("{round}.json"));
        let status = Command::new(BIN)
            .args(["workload", "children", "--count", &PER_ROUND.to_string()])
            .args(["--calls", "1", "--report", report.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(status.success());
    }
    // A few metrics refreshes (each second) with the children in the kernel's maps.
    std::thread::sleep(std::time::Duration::from_secs(4));
    tracer.signal(libc::SIGINT);
    let done = tracer.finish();
    // cgroup v2 keeps a peak from 5.19 on (`memory.peak`); before, what is charged now.
    let (what, file) = match cgroup.memory.peak_file() {
        file if cgroup.dir.join(file).exists() => ("peak", file),
        _ => ("now (this kernel keeps no peak)", "memory.current"),
    };
    let charged: u64 = cgroup.read(file).trim().parse().unwrap();
    eprintln!(
        "memory cgroup: {what} {:.1} MiB of the limit {} MiB",
        charged as f64 / f64::from(1 << 20),
        limit >> 20
    );
    assert!(done.status.success(), "{}", done.stderr);
    assert_eq!(
        cgroup.hit_limit(),
        0,
        "the session reached its memory limit"
    );
    let children: Vec<u64> = (1..=ROUNDS)
        .flat_map(|round| {
            let text = std::fs::read_to_string(dir.join(format!("{round}.json"))).unwrap();
            let report: serde_json::Value = serde_json::from_str(&text).unwrap();
            report["children"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_u64().unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(children.len() as u64, CHILDREN);
    let s = summary(&done.stdout);
    let calls: u64 = s["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| children.contains(&p["pid"].as_u64().unwrap()))
        .map(|p| p["syscalls"]["mlock"]["count"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(calls, CHILDREN, "one mlock per child");
    assert_eq!(s["syscall_health"]["evicted"], 0);
}

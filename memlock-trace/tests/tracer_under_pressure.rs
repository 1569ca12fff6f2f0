//! Runs on: host, 6.12: the tracer inside the pressured cgroup it traces: on the kernel whose LRU
//! is the multi-generational one, beside the host's classic LRU (the pressure itself, and the
//! counts under it, on every guest: test:memory_pressure and test:verify)
//!
//! Packages: python3
//!
//! Issue 44, item 6: the tracer itself under memory pressure. An agent runs inside a memory
//! limit on a node short of memory: here the tracer and the memory-pressure experiment it
//! launches share one memory cgroup below their working set, with swap, so the tracer's own
//! pages are pushed out too. Its counts of the experiment's process must still be the
//! kernel's (`wait4` at the process's exit, read by a python3 wrapper that launches it), and
//! what it cost itself (peak RSS, swapped, its own faults) is stated.
#![cfg(feature = "lab")]

mod common;

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use common::require_privileges;
use memlock_trace::lab::pressure::Pressure;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_memlock-trace");
const PYTHON: &str = "/usr/bin/python3";
/// Launches argv[1:], and prints its pid, its JSON result and its rusage from wait4.
const WRAPPER: &str = r#"
import json, os, subprocess, sys
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE)
out = p.stdout.read()
_, status, ru = os.wait4(p.pid, 0)
print(json.dumps({"pid": p.pid, "status": status, "result": json.loads(out),
                  "minflt": ru.ru_minflt, "majflt": ru.ru_majflt}))
"#;
const MIB: u64 = 1 << 20;
const LIMIT_MIB: u64 = 128;

/// A `/proc/PID/status` field in kB, or a `/proc/PID/stat` field by number.
fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

fn stat_field(pid: u32, n: usize) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the comm's closing parenthesis start at number 3.
    text.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(n - 3)?
        .parse()
        .ok()
}

#[test]
fn the_tracer_in_the_pressured_cgroup_still_counts_as_the_kernel_does() {
    require_privileges();
    // The tracer's own maps are kernel memory charged to the cgroup (53 MiB of kmem with
    // --follow-children here, measured under a 64 MiB limit that then OOM-killed it): the
    // limit leaves room for them, and the pressure is twice the limit.
    let pressure = Pressure::set_up(LIMIT_MIB * MIB, 1024 * MIB).expect("swap and a memory cgroup");
    let trace = std::env::temp_dir().join(format!("memlock-trace-upp-{}.json", std::process::id()));
    let mut command = Command::new(BIN);
    command
        .args(["--json", "-q", "--follow-children", "-o"])
        .arg(&trace)
        .args([
            "--",
            PYTHON,
            "-c",
            WRAPPER,
            BIN,
            "scenario",
            "memory-pressure",
        ])
        .args(["--variant", "measure"])
        .args(["--pressure-region-mib", "8", "--pressure-limit-mib"])
        .arg(LIMIT_MIB.to_string())
        .args(["--pressure-mib", &(2 * LIMIT_MIB).to_string()])
        .env("MEMLOCK_TRACE_PRESSURE_CGROUP", &pressure.cgroup.dir)
        .stderr(Stdio::inherit());
    // Watch the tracer's own cost while it runs, from outside its cgroup.
    let watching = std::sync::Arc::new(std::sync::Mutex::new((0u64, 0u64, 0u64, 0u64)));
    let seen = watching.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let pid_file = pressure.cgroup.procs_file();
    let watcher = std::thread::spawn(move || {
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
            // The tracer is the cgroup's first process.
            let Some(pid) = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|p| p.lines().next()?.parse::<u32>().ok())
            else {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            if let (Some(hwm), Some(swap), Some(min), Some(maj)) = (
                status_kb(pid, "VmHWM"),
                status_kb(pid, "VmSwap"),
                stat_field(pid, 10),
                stat_field(pid, 12),
            ) {
                let mut s = seen.lock().unwrap();
                *s = (hwm, s.1.max(swap), min, maj);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let output = pressure
        .run(&mut command)
        .expect("the traced experiment")
        .output;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    watcher.join().unwrap();
    let stat = pressure.cgroup.stat().unwrap();
    // v1 keeps the kernel memory charged (the tracer's maps among it) apart; v2 in memory.stat.
    let kmem_peak =
        std::fs::read_to_string(pressure.cgroup.dir.join("memory.kmem.max_usage_in_bytes"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .or_else(|| stat.get("kernel").copied());
    drop(pressure);
    assert!(output.status.success(), "{:?}", output.status);
    let wrapped: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&output.stdout));
    });
    let workload = &wrapped["result"];
    // The pressure was real: the unlocked regions went to swap, the locked one did not.
    assert_eq!(workload["pushed_out"]["mlock"]["swap_kb"], 0, "{workload}");
    assert!(
        workload["pushed_out"]["lazy"]["swap_kb"].as_u64() > Some(0),
        "{workload}"
    );
    assert_eq!(workload["touched_again"]["mlock"]["faults"]["majflt"], 0);

    let lines = std::fs::read_to_string(&trace).unwrap();
    std::fs::remove_file(&trace).ok();
    let summary: Value = lines
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .rfind(|v| v["type"] == "summary")
        .expect("a summary");
    let pid = &wrapped["pid"];
    let traced = summary["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == *pid)
        .unwrap_or_else(|| panic!("no process {pid} in {summary}"));
    assert_eq!(traced["faults"]["major"], wrapped["majflt"], "{traced}");
    assert_eq!(traced["faults"]["minor"], wrapped["minflt"], "{traced}");
    // The keys' page and the locked region; the region unlocked once.
    assert_eq!(traced["syscalls"]["mlock"]["count"], 2, "{traced}");
    assert_eq!(traced["syscalls"]["munlock"]["count"], 1, "{traced}");
    assert_eq!(summary["health"]["dropped_events"], 0, "{summary}");
    let (hwm, swapped, minflt, majflt) = *watching.lock().unwrap();
    eprintln!(
        "the tracer under a {LIMIT_MIB} MiB limit: peak RSS {hwm} kB, up to {swapped} kB of it \
         in swap, {minflt} minor and {majflt} major faults of its own; the cgroup's kernel \
         memory (the maps among it) at most {} kB; pgmajfault {}",
        kmem_peak.map_or_else(|| "unknown".into(), |b| (b / 1024).to_string()),
        stat.get("pgmajfault").unwrap_or(&0)
    );
    assert!(hwm > 0, "the tracer's own cost was never read");
}

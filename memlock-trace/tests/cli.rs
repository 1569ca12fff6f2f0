//! Runs on: host, 5.10: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! The `memlock-trace` binary as a user runs it: launching a command, JSON output, errors.

mod common;
mod support;

use std::process::Command;

use common::require_privileges;
use serde_json::Value;
use support::{BIN, json_lines, succeeded};

#[test]
fn launched_workload_is_traced_exactly_and_summarised_in_json() {
    require_privileges();
    let dir = std::env::temp_dir().join(format!("memlock-trace-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("workload.json");
    let out = Command::new(BIN)
        .args(["--json", "--events", "--"])
        .arg(BIN)
        .args(["workload", "syscalls", "--report"])
        .arg(&report)
        .output()
        .expect("run memlock-trace");
    let stdout = succeeded("memlock-trace", &out);
    let calls: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let lines = json_lines(&stdout);

    let events: Vec<&Value> = lines.iter().filter(|l| l["type"] == "syscall").collect();
    assert_eq!(
        events.len(),
        calls.len(),
        "one event per call the workload made"
    );
    for (event, call) in events.iter().zip(&calls) {
        assert_eq!(event["syscall"], call["syscall"]);
        let errno = event["errno"].as_str().unwrap_or("0");
        assert_eq!(errno, call["result"].as_str().unwrap());
        assert_eq!(event["min_flt"], call["faults"]["minflt"], "{event}");
    }

    let summary = lines.last().expect("a summary line");
    assert_eq!(summary["type"], "summary");
    assert_eq!(summary["dropped_events"], 0);
    let processes = summary["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "only the launched command is traced");
    let syscalls = &processes[0]["syscalls"];
    for name in ["mlock", "mlock2", "munlock", "mlockall", "munlockall"] {
        let made: Vec<&Value> = calls.iter().filter(|c| c["syscall"] == name).collect();
        let s = &syscalls[name];
        assert_eq!(s["count"], made.len(), "{name} count");
        let populated: u64 = made
            .iter()
            .map(|c| {
                c["faults"]["minflt"].as_u64().unwrap() + c["faults"]["majflt"].as_u64().unwrap()
            })
            .sum();
        // getrusage counts faults; one fault maps more than a page where the kernel maps
        // around it (a file's fault-around) or a huge page.
        assert_eq!(
            s["faults_populated"], populated,
            "{name} faults populated vs getrusage"
        );
        assert!(
            s["pages_populated"].as_u64().unwrap() >= populated,
            "{name} pages populated, at least one per fault: {s}"
        );
        assert!(
            s["latency_ns"]["max"].as_u64().unwrap() >= s["latency_ns"]["p50"].as_u64().unwrap()
        );
        assert!(
            s["latency_ns"]["p50"].as_u64().unwrap() > 0,
            "{name} latency"
        );
    }
    assert_eq!(syscalls["mlock"]["errors"]["ENOMEM"], 1);
    assert_eq!(syscalls["mlock"]["pages_locked"], 24);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn text_summary_names_every_call() {
    require_privileges();
    let out = Command::new(BIN)
        .arg("--")
        .arg(BIN)
        .args(["workload", "syscalls", "--report", "/dev/null"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for name in [
        "mlock ",
        "mlock2",
        "munlock ",
        "mlockall",
        "munlockall",
        "ENOMEM x1",
        "dropped events: 0",
    ] {
        assert!(text.contains(name), "{name:?} missing from:\n{text}");
    }
}

#[test]
fn no_such_pid_is_a_usage_error() {
    require_privileges();
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let missing = (pid_max + 1).to_string();
    let out = Command::new(BIN).args(["-p", &missing]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("no process with pid {missing}")),
        "{stderr}"
    );
}

#[test]
fn unknown_command_is_a_clear_error() {
    require_privileges();
    let out = Command::new(BIN)
        .args(["--", "/nonexistent/memlock-trace-no-such-command"])
        .output()
        .unwrap();
    // As env(1) and timeout(1): 127 for a command not found.
    assert_eq!(out.status.code(), Some(127));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("command not found"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn missing_capabilities_are_named() {
    use std::os::unix::process::CommandExt as _;
    // Become nobody before exec: leaving uid 0 clears every capability.
    let mut cmd = Command::new(BIN);
    cmd.args(["-p", "1"]);
    // SAFETY: only async-signal-safe libc calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(65534, 65534, 65534) != 0
                || libc::setresuid(65534, 65534, 65534) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("run memlock-trace as nobody");
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("CAP_BPF") && stderr.contains("CAP_PERFMON"),
        "{stderr}"
    );
    // Everything needed in the first message: granting what it names must be enough.
    let tracefs_closed = std::fs::metadata("/sys/kernel/tracing")
        .is_ok_and(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o001 == 0);
    if tracefs_closed {
        assert!(
            stderr.contains("CAP_DAC_READ_SEARCH")
                && stderr.contains("setcap cap_bpf,cap_perfmon,cap_dac_read_search+ep"),
            "{stderr}"
        );
    }
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn traced_pid_ends_the_session_when_it_exits() {
    require_privileges();
    let mut sleeper = Command::new("sleep").arg("1").spawn().unwrap();
    let out = Command::new(BIN)
        .args(["--json", "-p", &sleeper.id().to_string()])
        .output()
        .unwrap();
    sleeper.wait().unwrap();
    assert!(out.status.success(), "{out:?}");
    let lines = json_lines(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(lines.last().unwrap()["type"], "summary");
}

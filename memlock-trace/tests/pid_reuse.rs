//! Runs on: host, 6.12: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! A traced process exits and another one gets its pid: the two never mix, whether they
//! make mlock-family calls or only take page faults. The pid is reused on purpose through
//! `/proc/sys/kernel/ns_last_pid`.

mod common;
mod support;

use common::{drain_syscalls, require_privileges};
use memlock_trace::{
    process::{
        Targets,
        launch::{self, Launched},
    },
    session::summary::{ProcessSummary, Summary},
    syscalls::Aggregator,
    tracer::{Health, Tracer},
};
use support::{BIN, Tracer as Cli, summary};

/// Forks `memlock-trace workload ARGS` (it stops at its exec trap); with `pid`, retries until the
/// child gets exactly that pid.
fn spawn_workload(args: &[&str], pid: Option<u32>) -> Launched {
    let argv: Vec<String> = [BIN, "workload"]
        .iter()
        .chain(args)
        .map(|s| s.to_string())
        .collect();
    for _ in 0..50 {
        if let Some(pid) = pid {
            std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
                .expect("write ns_last_pid");
        }
        let held = launch::spawn(&argv, None).expect("fork");
        if pid.is_none_or(|p| p == held.pid) {
            return held;
        }
        // Another process on the machine took the pid first: let this one run untraced.
        let other = held.pid;
        held.wait_exec(BIN).unwrap().resume().unwrap();
        launch::wait_exit(other).unwrap();
    }
    panic!("could not get pid {pid:?} back in 50 tries");
}

fn run(held: Launched) {
    let pid = held.pid;
    held.wait_exec(BIN).expect("exec").resume().expect("resume");
    assert_eq!(launch::wait_exit(pid).unwrap(), 0);
}

/// Field 22 of /proc/PID/stat: start time in clock ticks since boot.
fn start_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The comm may contain spaces: count fields after its closing parenthesis.
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    after_comm
        .split_whitespace()
        .nth(22 - 3)
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_reused_pid_is_a_new_process_and_an_exited_target_leaves_the_filter() {
    require_privileges();
    let mut tracer = Tracer::load(&Targets::Tgids(Vec::new())).expect("load");
    let mut ring = tracer.take_events().expect("ring");
    let ticks_per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;

    // 1. A traced process: one of each call (9).
    let first = spawn_workload(&["syscalls", "--report", "/dev/null"], None);
    let pid = first.pid;
    tracer.add_target(pid).unwrap();
    let first_ticks = start_ticks(pid);
    run(first);

    // 2. Same pid, not added: the exit hook removed the first one from the filter.
    let stranger = spawn_workload(
        &[
            "flood",
            "--threads",
            "1",
            "--calls",
            "3",
            "--report",
            "/dev/null",
        ],
        Some(pid),
    );
    run(stranger);

    // 3. Same pid again, added: 5 failing mlock calls.
    let second = spawn_workload(
        &[
            "flood",
            "--threads",
            "1",
            "--calls",
            "5",
            "--report",
            "/dev/null",
        ],
        Some(pid),
    );
    tracer.add_target(pid).unwrap();
    let second_ticks = start_ticks(pid);
    run(second);

    let events = drain_syscalls(&mut ring);
    let mut aggregator = Aggregator::default();
    for rec in events.iter().filter(|r| r.raw.tgid == pid) {
        aggregator.record_syscall(rec);
    }
    let summary = Summary::new("summary", aggregator.summaries(), Health::default());
    let entries: Vec<_> = summary.processes.iter().filter(|p| p.pid == pid).collect();
    assert_eq!(
        entries.len(),
        2,
        "two processes with pid {pid}, the untraced one not among them: {entries:#?}"
    );
    let (a, b) = (entries[0], entries[1]);
    assert!(a.start_ns < b.start_ns);
    let count = |p: &ProcessSummary| p.syscalls.values().map(|s| s.count).sum::<u64>();
    assert_eq!(count(a), 9, "the first process: one of each call");
    assert_eq!(
        (count(b), b.syscalls["mlock"].errors["ENOMEM"]),
        (5, 5),
        "the second: 5 failing mlocks only"
    );
    // The key is the kernel's own start time: /proc/PID/stat field 22, in ticks.
    assert_eq!(a.start_ns / (1_000_000_000 / ticks_per_sec), first_ticks);
    assert_eq!(b.start_ns / (1_000_000_000 / ticks_per_sec), second_ticks);
}

/// Runs `argv` as a child that gets pid `pid` (retrying while another process takes it),
/// to its exit.
fn run_as(pid: u32, argv: &[&str]) {
    for _ in 0..50 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
            .expect("write ns_last_pid");
        let mut child = std::process::Command::new(argv[0])
            .args(&argv[1..])
            .spawn()
            .expect("spawn");
        let got = child.id();
        assert!(child.wait().unwrap().success(), "{argv:?}");
        if got == pid {
            return;
        }
    }
    panic!("could not get pid {pid} back in 50 tries");
}

/// System-wide, two programs that only fault run one after the other with the same pid:
/// two entries, each under its own name, each with its own exec.
#[test]
fn fault_only_processes_that_share_a_pid_are_two_entries() {
    require_privileges();
    let mut tracer = Cli::spawn(&["--json"]);
    tracer.wait_for_stderr("memlock-trace: tracing");
    // A pid well past the current one, so the first try usually gets it.
    let probe = std::process::Command::new("true").spawn().unwrap();
    let pid = probe.id() + 100;
    let _ = { probe }.wait();
    run_as(pid, &["/bin/true"]);
    run_as(pid, &["/bin/cat", "/dev/null"]);
    tracer.signal(libc::SIGINT);
    let done = tracer.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let s = summary(&done.stdout);
    let entries: Vec<_> = s["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["pid"] == pid)
        .collect();
    let comms: Vec<&str> = entries
        .iter()
        .map(|p| p["comm"].as_str().unwrap())
        .collect();
    // A failed try leaves an earlier `true` with another pid, never with this one.
    assert_eq!(comms, ["true", "cat"], "{entries:#?}");
    assert!(entries[0]["start_ns"].as_u64() < entries[1]["start_ns"].as_u64());
    for p in entries {
        assert!(p["faults"]["minor"].as_u64().unwrap() > 0, "{p}");
    }
}

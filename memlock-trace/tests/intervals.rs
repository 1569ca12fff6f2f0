//! Runs on: host, 6.12: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! `--interval` blocks that show only their own window, the libbpf-tools positionals
//! `INTERVAL COUNT`, and `-t TID`: real programs, exact figures.

mod common;
mod support;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::Command,
    time::Duration,
};

use common::require_privileges;
use serde_json::Value;
use support::{BIN, faults_workload, json_lines, run, threads_of, waiting_flood};

/// Waits for the tracer's "tracing" line. Loading takes long in an emulated guest on a
/// busy machine: this is a hang guard, not a timing check.
fn wait_tracing(tracer: &support::Tracer) {
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    while !tracer.stderr().contains("memlock-trace: tracing") {
        assert!(
            std::time::Instant::now() < deadline,
            "no \"tracing\" within 600 s:\n{}",
            tracer.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `-p` target that outlives any run of these tests, so only COUNT ends a run; killed
/// when dropped.
struct Sleeper(std::process::Child);

impl Sleeper {
    fn start() -> Self {
        Self(Command::new("sleep").arg("3600").spawn().unwrap())
    }

    fn pid(&self) -> String {
        self.0.id().to_string()
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn interval_count_positionals_print_exactly_count_blocks() {
    require_privileges();
    let mut sleeper = Sleeper::start();
    let pid = sleeper.pid();
    let out = run(&["0.3", "2", "-p", &pid, "--json"]);
    let lines = json_lines(&String::from_utf8_lossy(&out.stdout));
    let kinds: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["interval", "interval", "summary"], "{lines:?}");
    // Text: two interval headers and the session's.
    let out = run(&["0.3", "2", "-p", &pid]);
    let text = String::from_utf8_lossy(&out.stdout);
    let headers: Vec<&str> = text.lines().filter(|l| l.starts_with("--- ")).collect();
    assert_eq!(headers.len(), 3, "{text}");
    // The hook sets went to stderr once, not into each block.
    assert!(
        !text.contains("refused") && !text.contains("hooks"),
        "{text}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("memlock-trace: faults: ").count(),
        1,
        "{stderr}"
    );
    for (header, title) in headers
        .iter()
        .zip(["interval", "interval", "session summary"])
    {
        // `--- HH:MM:SS.mmm TITLE (N.N s) ---`
        let rest = header.strip_prefix("--- ").unwrap();
        let (time, rest) = rest.split_once(' ').unwrap();
        assert_eq!(time.len(), 12, "{header}");
        let secs = rest
            .strip_prefix(title)
            .and_then(|r| r.strip_prefix(" ("))
            .and_then(|r| r.strip_suffix(" s) ---"))
            .unwrap_or_else(|| panic!("{header}"));
        assert!(secs.parse::<f64>().unwrap() > 0.0, "{header}");
    }
    assert!(
        sleeper.0.try_wait().unwrap().is_none(),
        "the target still runs: COUNT ended both runs"
    );
}

/// Health lines all zero are not repeated under every interval, as bcc's tools print
/// "Possibly lost N samples" only when some were: the session summary still ends with them
/// (issue 47 point 13). With `--stacks` too, whose line stood under every interval.
#[test]
fn zero_health_lines_are_printed_once_at_the_end() {
    require_privileges();
    let sleeper = Sleeper::start();
    let out = run(&["0.3", "3", "-p", &sleeper.pid(), "--stacks"]);
    drop(sleeper);
    let text = String::from_utf8_lossy(&out.stdout);
    let blocks: Vec<&str> = text.split("--- ").filter(|b| !b.is_empty()).collect();
    assert_eq!(blocks.len(), 4, "{text}");
    for block in &blocks[..3] {
        assert!(block.contains(" interval ("), "{block}");
        for health in [
            "dropped events: 0",
            "fault maps: 0 processes evicted",
            "stacks: 0 mlock-family calls' stacks lost",
        ] {
            assert!(
                !block.contains(health),
                "{health:?} in an interval:\n{text}"
            );
        }
    }
    let session = blocks[3];
    assert!(session.contains("session summary"), "{text}");
    assert!(session.contains("dropped events: 0"), "{text}");
    assert!(session.contains("fault maps: "), "{text}");
    assert!(session.contains("stacks: 0 mlock-family"), "{text}");
}

/// The faults workload, started by the test (not by the tracer), answering on a pipe.
struct FaultWorkload {
    child: std::process::Child,
    answers: BufReader<std::process::ChildStdout>,
}

impl FaultWorkload {
    fn start() -> Self {
        let mut child = faults_workload::spawn();
        let mut answers = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        answers.read_line(&mut line).unwrap();
        assert!(line.starts_with("ready"), "{line}");
        Self { child, answers }
    }

    /// Sends a command, returns the process's minflt after it.
    fn command(&mut self, cmd: &str) -> u64 {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(format!("{cmd}\n").as_bytes()).unwrap();
        let mut line = String::new();
        self.answers.read_line(&mut line).unwrap();
        assert!(line.starts_with("ok "), "{line}");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for FaultWorkload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn each_interval_shows_only_its_own_calls_and_faults() {
    require_privileges();
    let mut workload = FaultWorkload::start();
    let pid = workload.child.id();
    let output = std::env::temp_dir().join(format!(
        "memlock-trace-intervals-{}.json",
        std::process::id()
    ));
    let tracer = support::Tracer::spawn(&[
        "-i",
        "0.25",
        "--json",
        "-o",
        output.to_str().unwrap(),
        "-p",
        &pid.to_string(),
        "--fault-hooks",
        "tracepoint",
    ]);
    wait_tracing(&tracer);
    // Paced by the intervals written, not by sleeps (a slow guest's ticks come late): each
    // burst is followed by two interval ends, so the bursts cannot share an interval.
    let written = || {
        std::fs::read_to_string(&output)
            .unwrap_or_default()
            .matches("\"type\":\"interval\"")
            .count()
    };
    let two_more_intervals = || {
        let target = written() + 2;
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while written() < target {
            assert!(std::time::Instant::now() < deadline, "no interval in 120 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // Two bursts, each followed by quiet intervals: 300 pages touched, then 200 locked.
    workload.command("touch 300");
    two_more_intervals();
    workload.command("mlock 200");
    two_more_intervals();
    tracer.signal(libc::SIGINT);
    let done = tracer.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let stdout = std::fs::read_to_string(&output).unwrap();
    let _ = std::fs::remove_file(&output);
    let lines = json_lines(&stdout);
    let summary = lines.last().unwrap();
    assert_eq!(summary["type"], "summary");
    let intervals: Vec<&Value> = lines.iter().filter(|l| l["type"] == "interval").collect();
    assert!(intervals.len() >= 4, "{} intervals", intervals.len());
    let of = |record: &Value, field: &str| -> u64 {
        record["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["pid"] == pid)
            .map(|p| p["faults"][field].as_u64().unwrap_or(0))
            .sum()
    };
    let mlocks = |record: &Value| support::calls_of(record, pid, "mlock");
    // Reset per interval: the intervals add up to the session, none holds both bursts.
    for field in ["minor", "user", "populated"] {
        let sum: u64 = intervals.iter().map(|i| of(i, field)).sum();
        assert_eq!(sum, of(summary, field), "{field}: the intervals add up");
    }
    assert_eq!(of(summary, "populated"), 200, "mlock populated 200 pages");
    assert!(of(summary, "user") >= 300);
    assert_eq!(intervals.iter().map(|i| mlocks(i)).sum::<u64>(), 1);
    assert_eq!(mlocks(summary), 1);
    let busy: Vec<(u64, u64)> = intervals
        .iter()
        .map(|i| (of(i, "user"), of(i, "populated")))
        .filter(|&(u, p)| u >= 300 || p > 0)
        .collect();
    assert!(
        busy.iter().all(|&(u, p)| !(u >= 300 && p == 200)),
        "the two bursts fell in different intervals: {busy:?}"
    );
}

#[test]
fn tid_traces_one_thread() {
    require_privileges();
    // Two threads ready to make 5 failing mlock calls each, waiting for a byte on stdin.
    let mut flood = waiting_flood(2, 5);
    let pid = flood.id();
    let tid = threads_of(pid, 3)
        .into_iter()
        .filter(|&t| t != pid)
        .nth(1)
        .unwrap();
    let tracer = support::Tracer::spawn(&[
        "-t",
        &tid.to_string(),
        "--json",
        "--events=syscalls",
        "--fault-hooks",
        "off",
    ]);
    wait_tracing(&tracer);
    flood.stdin.take().unwrap().write_all(b"g").unwrap();
    assert!(flood.wait().unwrap().success());
    let done = tracer.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let lines = json_lines(&done.stdout);
    let events: Vec<&Value> = lines.iter().filter(|l| l["type"] == "syscall").collect();
    assert_eq!(
        events.len(),
        5,
        "only the thread's calls, not 10: {events:?}"
    );
    assert!(events.iter().all(|e| e["tid"] == tid), "{events:?}");
    let summary = lines.last().unwrap();
    assert_eq!(support::calls_of(summary, pid, "mlock"), 5, "{summary}");

    let out = Command::new(BIN).args(["-t", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        // Refused as a value out of range, as `-p 0` is, before any thread is looked up.
        String::from_utf8_lossy(&out.stderr).contains("'--tid <TID>': give a whole number from 1"),
        "{out:?}"
    );
}

//! Runs on: host, 5.10: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! A launched command is traced from its `exec`, not from the `fork` before it: it is named
//! by its own name, and the faults the launcher takes between fork and exec (comm
//! `memlock-trace`) are not counted against it.

mod common;
mod support;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::Command,
    sync::mpsc,
    time::{Duration, Instant},
};

use common::require_privileges;
use support::{BIN, faults_workload, run, scratch, settled, summary};

#[test]
fn a_launched_command_has_its_own_name_every_time() {
    require_privileges();
    // The name used to be whichever comm came first: `memlock-trace` on some runs.
    for attempt in 0..3 {
        let out = run(&["--json", "--", "true"]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let processes = summary(&stdout)["processes"].as_array().unwrap().clone();
        assert!(!processes.is_empty(), "run {attempt}: {stdout}");
        for p in &processes {
            assert_eq!(p["comm"], "true", "run {attempt}: {p}");
        }
        assert!(stderr.contains("from its exec"), "{stderr}");
    }
}

/// The `N` of the tracer's "(pid P) from its exec (N faults before it" note, and P.
fn launched_pid_and_faults_before_exec(stderr: &str) -> Option<(u32, u64)> {
    let line = stderr.lines().find(|l| l.contains("from its exec ("))?;
    let pid = line
        .split("(pid ")
        .nth(1)?
        .split(')')
        .next()?
        .parse()
        .ok()?;
    let before = line.split("from its exec (").nth(1)?.split(' ').next()?;
    Some((pid, before.parse().ok()?))
}

/// Reads lines (kept in `seen`) until one starts with `prefix`.
fn next_line(rx: &mpsc::Receiver<String>, prefix: &str, seen: &mut Vec<String>) {
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("no {prefix:?} line after {seen:?}"));
        assert!(!line.starts_with("error"), "{line}");
        let done = line.starts_with(prefix);
        seen.push(line);
        if done {
            return;
        }
    }
}

/// minflt + majflt of `pid`: /proc/PID/stat fields 10 and 12.
fn kernel_faults(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    fields[10 - 3].parse::<u64>().unwrap() + fields[12 - 3].parse::<u64>().unwrap()
}

/// The kernel's counters of a process survive `exec` (fork zeroes them, exec does not), so
/// the launched command's /proc/PID/stat counts its launcher's faults after fork too. The
/// tracer reads them at the exec trap (the N of its note) and counts from there: its count
/// plus N must be the kernel's count exactly. Counting the launcher's faults would make it
/// more, missing the command's first ones less. The workload sits in `read(0)` when both are
/// read (the tracer is stopped by SIGINT then), so neither moves.
#[test]
fn faults_before_exec_are_the_launchers_and_every_later_one_is_counted() {
    require_privileges();
    let dir = scratch("names");
    let file = dir.join("trace.json");
    let mut tracer =
        faults_workload::spawn_traced(Command::new(BIN).args(["--json", "-o"]).arg(&file));
    let mut stdin = tracer.stdin.take().unwrap();
    // The workload's answers and the tracer's notes, line by line: with -o the tracer's
    // stdout is the command's.
    let (tx, rx) = mpsc::channel::<String>();
    let (stdout, stderr) = (tracer.stdout.take().unwrap(), tracer.stderr.take().unwrap());
    let err_tx = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = err_tx.send(format!("stderr: {line}"));
        }
    });
    let mut seen = Vec::new();
    next_line(&rx, "ready", &mut seen);
    writeln!(stdin, "touch 300").unwrap();
    next_line(&rx, "ok ", &mut seen);
    if !seen.iter().any(|l| l.contains("from its exec (")) {
        next_line(&rx, "stderr: memlock-trace: tracing", &mut seen);
    }
    let (pid, before) = seen
        .iter()
        .find_map(|l| launched_pid_and_faults_before_exec(l))
        .unwrap_or_else(|| {
            panic!("the tracing note names the pid and faults before exec: {seen:?}")
        });
    assert!(before > 0, "fork's copy-on-write and execve fault");
    // Once the workload has gone quiet: its `ok` line reaches us before it is back waiting for
    // input, and the faults of getting there were traced after an early read (982 vs 979).
    let kernel = settled(|| kernel_faults(pid));
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) }, 0);
    let status = tracer.wait().unwrap();
    assert!(status.success(), "{status:?}");
    drop(stdin); // the workload exits at end of input

    let text = std::fs::read_to_string(&file).unwrap();
    let summary = summary(&text);
    let processes = summary["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "{summary}");
    let p = &processes[0];
    assert_eq!(p["pid"], pid);
    let traced = p["faults"]["minor"].as_u64().unwrap() + p["faults"]["major"].as_u64().unwrap();
    assert!(traced >= 300, "{p}");
    assert_eq!(
        traced + before,
        kernel,
        "traced {traced} + {before} before exec vs the kernel's {kernel}: {p}"
    );
    std::fs::remove_dir_all(&dir).ok();
    // Let the orphaned workload see its end of input before the next test starts.
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A shell that forks children which exec other programs and only take page faults (no
/// mlock-family call): each child is reported under the program it exec'd, never the
/// shell's name it had for its first faults (copy-on-write between fork and exec), and with
/// its own start time.
#[test]
fn forked_children_are_named_after_their_exec() {
    require_privileges();
    let script = "for i in 1 2 3 4 5; do /bin/true; /bin/cat /dev/null; done";
    let out = run(&["--json", "--follow-children", "--", "sh", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = summary(&stdout);
    let processes = summary["processes"].as_array().unwrap();
    let named = |comm: &str| {
        processes
            .iter()
            .filter(|p| p["comm"] == comm)
            .collect::<Vec<_>>()
    };
    assert_eq!(named("sh").len(), 1, "only the shell is `sh`: {summary}");
    for comm in ["true", "cat"] {
        let children = named(comm);
        assert_eq!(children.len(), 5, "five `{comm}`: {summary}");
        let mut starts: Vec<u64> = children
            .iter()
            .map(|p| p["start_ns"].as_u64().unwrap())
            .collect();
        starts.dedup();
        assert_eq!(starts.len(), 5, "each with its own start time: {summary}");
        for p in children {
            assert!(p["start_ns"].as_u64().unwrap() > 0, "{p}");
            assert!(p["faults"]["minor"].as_u64().unwrap() > 0, "{p}");
            assert!(p["syscalls"].as_object().unwrap().is_empty(), "{p}");
        }
    }
    assert_eq!(processes.len(), 11, "{summary}");
}

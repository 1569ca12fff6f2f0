//! Runs on: host, 6.1: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! What a session traces and for how long: `-p` given a thread id traces its process and
//! says so, a kernel thread is refused, and `--follow-children` lasts while a followed
//! process lives (a daemon outlives the command that started it).

mod common;
mod support;

use std::{process::Command, sync::mpsc, time::Instant};

use common::{gettid, require_privileges};
use serde_json::Value;
use support::{BIN, Tracer, calls_of, run, scratch, summary, with_syscalls};

#[test]
fn a_thread_id_given_to_p_traces_its_process_and_says_so() {
    require_privileges();
    let me = std::process::id();
    let (tid_tx, tid_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    // A thread of this process, not its leader: it makes 3 mlock calls once traced.
    let thread = std::thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        go_rx.recv().unwrap();
        let page = vec![0u8; 4096];
        for _ in 0..3 {
            // SAFETY: mlock changes no memory contents; the buffer outlives the call.
            assert_eq!(unsafe { libc::mlock(page.as_ptr().cast(), page.len()) }, 0);
        }
        // SAFETY: as above.
        unsafe { libc::munlock(page.as_ptr().cast(), page.len()) };
    });
    let tid = tid_rx.recv().unwrap();
    let mut tracer = Tracer::spawn(&["--json", "-p", &tid.to_string()]);
    tracer.wait_for_stderr("memlock-trace: tracing");
    go_tx.send(()).unwrap();
    thread.join().unwrap();
    tracer.signal(libc::SIGINT);
    let done = tracer.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let said = format!(
        "memlock-trace: -p {tid} is a thread of pid {me}: tracing pid {me} \
         (use -t {tid} for that thread alone)"
    );
    assert!(done.stderr.contains(&said), "{}", done.stderr);
    assert!(
        done.stderr.contains(&format!("tracing pid {me}\n")),
        "{}",
        done.stderr
    );
    let s = summary(&done.stdout);
    assert_eq!(calls_of(&s, me, "mlock"), 3, "{s}");
}

#[test]
fn a_kernel_thread_is_refused_with_the_reason() {
    // kthreadd is pid 2 on every Linux system.
    let out = Command::new(BIN).args(["-p", "2"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("-p 2 is a kernel thread") && stderr.contains("no mlock-family calls"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("tracing"),
        "refused before tracing: {stderr}"
    );
}

/// A classic daemon: the command forks, exits at once, and its child lives on (here 1 s,
/// then the workload's 9 calls). With `--follow-children` the session lasts until the child
/// exits, and its calls are all counted.
#[test]
fn follow_children_lasts_while_a_daemon_outlives_its_command() {
    require_privileges();
    let dir = scratch("targets");
    let report = dir.join("daemon.json");
    let script = format!(
        "(sleep 1; exec {BIN} workload syscalls --report {}) </dev/null >/dev/null 2>&1 & exit 0",
        report.display()
    );
    let started = Instant::now();
    let out = run(&["--json", "--follow-children", "--", "sh", "-c", &script]);
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The daemon wrote its report before exiting: the session waited for it.
    let calls: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(&report)
            .unwrap_or_else(|e| panic!("no report after the session ({took:?}): {e}\n{stderr}")),
    )
    .unwrap();
    assert!(
        stderr.contains("the command has exited; still tracing"),
        "{stderr}"
    );
    let s = summary(&String::from_utf8_lossy(&out.stdout));
    let daemons = with_syscalls(&s);
    assert_eq!(daemons.len(), 1, "{s}");
    let pid = daemons[0]["pid"].as_u64().unwrap() as u32;
    for syscall in ["mlock", "mlock2", "munlock", "mlockall", "munlockall"] {
        let made = calls.iter().filter(|c| c["syscall"] == syscall).count() as u64;
        assert_eq!(calls_of(&s, pid, syscall), made, "{syscall}: {s}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// System-wide, the session leaves itself out: its own faults are its reading of the maps,
/// counted while it read them, and its row disagreed with itself (614 faults, 1,645 of them
/// timed). Everything else is still traced: a workload's mlock calls, exactly.
#[test]
fn a_system_wide_session_leaves_itself_out() {
    require_privileges();
    let mut tracer = Tracer::spawn(&["--json"]);
    tracer.wait_for_stderr("memlock-trace: tracing all processes");
    // One of each call, mlock three times (one failing).
    let mut workload = Command::new(BIN)
        .args(["workload", "syscalls", "--report", "/dev/null"])
        .spawn()
        .unwrap();
    let workload_pid = workload.id();
    assert!(workload.wait().unwrap().success());
    let tracer_pid = tracer.pid();
    tracer.signal(libc::SIGINT);
    let done = tracer.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let s = summary(&done.stdout);
    assert_eq!(calls_of(&s, workload_pid, "mlock"), 3, "{s}");
    let processes = s["processes"].as_array().expect("processes");
    assert!(
        processes.iter().all(|p| p["pid"] != tracer_pid),
        "the session itself (pid {tracer_pid}) is listed: {s}"
    );
}

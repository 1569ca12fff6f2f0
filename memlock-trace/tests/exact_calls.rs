//! Runs on: host, 5.10, 6.1: the syscall family's hooks are 6.1's on 6.12, where test:syscalls
//! counts them
//!
//! The mlock-family counts are the kernel's, not the event stream's: with the tracer
//! starved (stopped while a flood runs, so its 1 MiB ring fills and the kernel drops the
//! rest), the summary and `/metrics` still say exactly how many `mlock` and `munlock` calls
//! the flood made, and the dropped records are counted and said to cost event lines only.

mod common;
mod support;

use std::{
    io::Write as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::require_privileges;
use support::{BIN, Tracer, calls_of, flood_args, line_after, process_of, summary};

const THREADS: u64 = 4;
const CALLS: u64 = 25_000;

/// The sum of the `name` samples whose labels contain every one of `labels`.
fn metric(text: &str, name: &str, labels: &[&str]) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// `/metrics`, or what went wrong: the tracer, just resumed, may still be draining a full
/// ring on a loaded machine, so the caller retries until its deadline.
fn scrape(url: &str) -> Result<String, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let mut response = agent.get(url).call().map_err(|e| e.to_string())?;
    response
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())
}

#[test]
fn a_starved_tracer_still_counts_every_call() {
    require_privileges();
    // The flood waits for a byte on stdin, so it starts only once the tracer is stopped.
    let mut flood = Command::new(BIN)
        .args(flood_args(THREADS, CALLS, &["--munlock", "--wait-stdin"]))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = flood.id();
    // By name rather than `-p`, so that the tracer outlives the flood until it is scraped
    // (a `-p` session ends when its process does); the checks below are by pid.
    let mut tracer = Tracer::spawn(&[
        "--json",
        "--prometheus",
        "127.0.0.1:0",
        "--prometheus-pid-label",
        "--comm",
        "memlock-trace",
    ]);
    let line = tracer.wait_for_stderr("serving Prometheus metrics on http://");
    let url = line.rsplit(' ').next().unwrap().to_string();
    tracer.wait_for_stderr("memlock-trace: tracing");
    // A stopped tracer reads nothing: the ring fills and the kernel counts the rest.
    tracer.signal(libc::SIGSTOP);
    flood.stdin.take().unwrap().write_all(b"go").unwrap();
    let out = flood.wait_with_output().unwrap();
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let n = THREADS * CALLS;
    assert_eq!(
        (&report["enomem"], &report["munlock_enomem"]),
        (&n.into(), &n.into()),
        "every flood call failed with ENOMEM: {report}"
    );
    tracer.signal(libc::SIGCONT);

    // /metrics: refreshed from the kernel's counts each second.
    let pid_label = format!("pid=\"{pid}\"");
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = scrape(&url).unwrap_or_else(|e| {
            assert!(Instant::now() < deadline, "GET {url}: {e}");
            String::new()
        });
        let calls = |call: &str| {
            metric(
                &text,
                "memlock_trace_syscalls_total",
                &[&pid_label, &format!("syscall=\"{call}\"")],
            )
        };
        if calls("mlock") == n && calls("munlock") == n {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "metrics never said {n} and {n}: mlock {}, munlock {}\n{text}",
            calls("mlock"),
            calls("munlock")
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    for call in ["mlock", "munlock"] {
        let labels = [
            pid_label.as_str(),
            &format!("syscall=\"{call}\""),
            "errno=\"ENOMEM\"",
        ];
        assert_eq!(
            metric(&text, "memlock_trace_syscall_errors_total", &labels),
            n,
            "{call}\n{text}"
        );
        let latency = [pid_label.as_str(), &format!("syscall=\"{call}\"")];
        assert_eq!(
            metric(
                &text,
                "memlock_trace_syscall_latency_seconds_count",
                &latency
            ),
            n,
            "{call}\n{text}"
        );
    }

    tracer.signal(libc::SIGINT);
    let done = tracer.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let s = summary(&done.stdout);
    let dropped = s["dropped_events"].as_u64().unwrap();
    eprintln!("flood: {n} mlock + {n} munlock calls, {dropped} records dropped");
    assert!(dropped > 0, "the ring never overflowed");
    assert_eq!(calls_of(&s, pid, "mlock"), n, "{s}");
    assert_eq!(calls_of(&s, pid, "munlock"), n, "{s}");
    let p = process_of(&s, pid);
    assert_eq!(p["syscalls"]["mlock"]["errors"]["ENOMEM"], n);
    assert_eq!(p["syscalls"]["munlock"]["errors"]["ENOMEM"], n);
    assert!(
        p["syscalls"]["mlock"]["latency_ns"]["max"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(s["syscall_health"]["evicted"], 0, "{s}");
}

/// The same with a one-page ring buffer and a running tracer (the hidden test option), in
/// text: the summary's counts are exact and the dropped-records line says what they cost.
#[test]
fn a_tiny_ring_buffer_loses_event_lines_only() {
    require_privileges();
    let flood = flood_args(2, 5000, &["--munlock", "--report", "/dev/null"]);
    let mut args = vec!["--test-ring-bytes", "4096", "--", BIN];
    args.extend(flood.iter().map(String::as_str));
    let out = support::run(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    // `  mlock   10000 ...`: the calls column of the table.
    let calls = |call: &str| {
        text.lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some(call)).then(|| f.next()?.parse::<u64>().ok())?
            })
            .unwrap_or_else(|| panic!("no {call} row:\n{text}"))
    };
    assert_eq!(
        (calls("mlock"), calls("munlock")),
        (10_000, 10_000),
        "{text}"
    );
    let dropped = line_after(&text, "dropped events: ");
    assert!(
        dropped.contains("event lines and last-failure detail only"),
        "{text}"
    );
    assert_ne!(dropped.split(' ').next(), Some("0"), "{text}");
}

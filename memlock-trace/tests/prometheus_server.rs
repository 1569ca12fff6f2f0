//! Runs on: host only: runs Debian's prometheus server, which the guest's initramfs does not carry
//! (the metrics it scrapes: test:prometheus, in a guest too)
//!
//! Packages: prometheus
//!
//! The fleet path with the real server: Debian's `prometheus` scrapes the tracer's
//! `/metrics` every second, and PromQL over its HTTP API returns exactly the mlock calls and
//! page faults a workload made (as the kernel itself counted them for the workload).
//!
//! Host stage only (`cargo xtask test` says so in the guest's table): the guest's initramfs
//! does not carry the server. `cargo xtask test` installs it when missing.

mod common;
mod support;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc::{Receiver, channel},
    time::{Duration, Instant},
};

use common::require_privileges;
use support::{
    BIN,
    prometheus::{Prometheus, scrape_job, served_target},
    scratch,
};

const JOB: &str = "memlock-trace";

/// Polls `promql` until it returns `want` (the tracer refreshes each second, Prometheus
/// scrapes each second); fails with the last value after 30 s.
fn wait_for(prometheus: &Prometheus, promql: &str, want: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = prometheus.one(promql);
        if got == want || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Polls `promql` until it returns the same value over 3 s (several scrapes of an idle
/// workload), and returns it.
fn settled(prometheus: &Prometheus, promql: &str) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = (prometheus.one(promql), Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = prometheus.one(promql);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() >= Duration::from_secs(3) {
            return now;
        }
        assert!(Instant::now() < deadline, "{promql} never settled");
    }
}

/// The traced workload: `memlock-trace --prometheus 127.0.0.1:0 -- memlock-trace workload
/// faults`, commanded line by line.
struct Workload {
    tracer: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Workload {
    fn start() -> (Self, String) {
        let mut tracer = Command::new(BIN)
            .args([
                "--prometheus",
                "127.0.0.1:0",
                "--",
                BIN,
                "workload",
                "faults",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run memlock-trace");
        let (tx, lines) = channel::<String>();
        let out = tracer.stdout.take().unwrap();
        let out_tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = out_tx.send(line);
            }
        });
        let err = tracer.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("tracer: {line}");
                let _ = tx.send(format!("stderr: {line}"));
            }
        });
        let stdin = tracer.stdin.take().unwrap();
        let mut w = Self {
            tracer,
            stdin,
            lines,
        };
        let target = served_target(
            &w.wait_for("stderr: memlock-trace: serving Prometheus metrics on http://"),
        );
        w.wait_for("ready");
        (w, target)
    }

    fn wait_for(&mut self, prefix: &str) -> String {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("no `{prefix}` from the traced workload"));
            assert!(!line.starts_with("error"), "{line}");
            if line.starts_with(prefix) {
                return line;
            }
        }
    }

    /// Runs one command; returns the workload's own (minflt, majflt) after it.
    fn run(&mut self, command: &str) -> (u64, u64) {
        writeln!(self.stdin, "{command}").unwrap();
        let answer = self.wait_for("ok ");
        let mut words = answer.split_whitespace().skip(1);
        let mut next = || words.next().unwrap().parse::<u64>().unwrap();
        (next(), next())
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "exit");
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(self.tracer.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.tracer.kill();
        let _ = self.tracer.wait();
    }
}

#[test]
fn promql_sums_equal_the_calls_and_faults_made() {
    require_privileges();
    let (mut workload, target) = Workload::start();
    // Fault in the code of each path once, so the measured commands fault only their pages.
    workload.run("mlock 1");
    workload.run("touch 1");
    workload.run("noop");
    let prometheus = Prometheus::start(&scratch("prometheus"), &scrape_job(JOB, &target));
    let up = wait_for(&prometheus, &format!("up{{job=\"{JOB}\"}}"), 1.0);
    assert_eq!(up, 1.0, "the target is not up:\n{}", prometheus.log());

    let sel = format!("job=\"{JOB}\"");
    let faults = format!("sum(memlock_trace_page_faults_total{{{sel}}})");
    let user = format!("sum(memlock_trace_page_faults_total{{{sel},origin=\"user\"}})");
    let major = format!("sum(memlock_trace_page_faults_total{{{sel},class=\"major\"}})");
    let timed = format!(
        "sum(memlock_trace_page_fault_latency_seconds_count{{{sel},class=\"minor\",origin=\"user\"}})"
    );
    let before = (
        settled(&prometheus, &faults),
        prometheus.one(&user),
        prometheus.one(&major),
        prometheus.one(&timed),
    );
    assert!(
        before.0 > 0.0,
        "no fault series before the measured commands"
    );

    // The measured commands: three mlocks of 64 fresh pages, two runs of 300 first touches.
    let (start_min, start_maj) = workload.run("noop");
    let mut mlocked = 0;
    let mut last = start_min;
    for _ in 0..3 {
        let (min, _) = workload.run("mlock 64");
        mlocked += min - last;
        last = min;
    }
    let mut touched = 0;
    for _ in 0..2 {
        let (min, _) = workload.run("touch 300");
        touched += min - last;
        last = min;
    }
    let (end_min, end_maj) = workload.run("noop");
    // The kernel's own count (getrusage in the workload) is the number made.
    assert_eq!((mlocked, touched), (192, 600));
    let made = (end_min + end_maj - start_min - start_maj) as f64;
    assert_eq!(made, 792.0, "faults outside the measured pages");

    // Exact sums from the server, each polled until it arrives (or 30 s).
    let calls = wait_for(
        &prometheus,
        &format!("sum(memlock_trace_syscalls_total{{{sel},syscall=\"mlock\"}})"),
        4.0,
    );
    assert_eq!(calls, 4.0, "mlock calls: 1 warm-up + 3");
    // Bytes, in pages of this machine.
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
    let populated = wait_for(
        &prometheus,
        &format!(
            "sum(memlock_trace_syscall_populated_bytes_total{{{sel},syscall=\"mlock\"}}) / {page}"
        ),
        193.0,
    );
    assert_eq!(
        populated, 193.0,
        "pages the mlock calls populated: 1 + 3 x 64"
    );
    let populated_by = wait_for(
        &prometheus,
        &format!("sum(memlock_trace_page_faults_populated_total{{{sel},syscall=\"mlock\"}})"),
        193.0,
    );
    assert_eq!(populated_by, 193.0, "faults populated by mlock");
    let total = wait_for(&prometheus, &faults, before.0 + made);
    assert_eq!(total - before.0, made, "all faults in the window");
    assert_eq!(prometheus.one(&user) - before.1, 600.0, "user faults");
    assert_eq!(prometheus.one(&major) - before.2, 0.0, "major faults");
    assert_eq!(
        prometheus.one(&timed) - before.3,
        600.0,
        "user minor faults timed in the latency histogram"
    );
    // A quantile from the histogram: a real latency, within its 256 ns .. 134 ms buckets.
    let p99 = prometheus.one(
        &format!(
            "histogram_quantile(0.99, sum by (le) (memlock_trace_page_fault_latency_seconds_bucket{{{sel},origin=\"user\"}}))"
        ),
    );
    assert!(p99 > 0.0 && p99 < 0.134, "p99 fault latency {p99} s");
    eprintln!(
        "PromQL: mlock calls {calls}, pages populated {populated} (by mlock {populated_by}), \
         faults {} -> {total} (+{made}), user +{}, timed +{}, p99 {:.1} us",
        before.0,
        prometheus.one(&user) - before.1,
        prometheus.one(&timed) - before.3,
        p99 * 1e6
    );
    // Nothing lost on the way.
    for lost in [
        "sum(memlock_trace_fault_health_total)",
        "sum(memlock_trace_dropped_events_total)",
    ] {
        assert_eq!(prometheus.one(lost), 0.0, "{lost}");
    }
    drop(prometheus);
    drop(workload);
}

//! Runs on: host, 6.12: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! `--prometheus ADDR`: a real HTTP client scrapes /metrics while the tracer runs, and the
//! parsed exposition carries exactly the calls the workload made.

mod common;
mod support;

use std::{
    io::Write as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::require_privileges;
use serde_json::Value;
use support::{
    BIN, Tracer,
    exposition::{Sample, parse, value},
    summary,
};

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 }
}

/// An HTTP client for the tracer's /metrics. Its timeout only bounds a hung server: the guests
/// run these tests in software emulation beside the host stage, where a scrape after fifty
/// processes took over 5 s; how fast the server answers is test:metrics_server's, on the host.
fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// Starts `memlock-trace --json --prometheus 127.0.0.1:0 --follow-children EXTRA --
/// sh -c "memlock-trace workload syscalls --report R; read x"`: the workload runs at once,
/// then the command waits for stdin to close (and exits 0).
fn start(extra: &[&str], report: &std::path::Path) -> (Tracer, String) {
    let script = format!(
        "{BIN} workload syscalls --report {}; read x || true",
        report.display()
    );
    let mut cmd = Command::new(BIN);
    cmd.args(["--json", "--prometheus", "127.0.0.1:0", "--follow-children"])
        .args(extra)
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::piped());
    let mut tracer = Tracer::spawn_command(&mut cmd);
    let line = tracer.wait_for_stderr("serving Prometheus metrics on http://");
    let url = line.rsplit(' ').next().unwrap().to_string();
    (tracer, url)
}

/// The workload's own record, once it is complete.
///
/// A hang guard, not a target: in a software-emulated guest on a loaded 2-core machine the
/// workload's `mlockall` populating the whole (debug) binary under the fault and VMA hooks
/// took over 30 s on 6.12 (the first of the tests, once in three runs, twice in another).
fn workload_report(path: &std::path::Path) -> Vec<Value> {
    // The wait includes loading the programs (the command is held until then): minutes in
    // an emulated guest on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Ok(Ok(v)) =
            std::fs::read_to_string(path).map(|s| serde_json::from_str::<Vec<Value>>(&s))
        {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "the workload never wrote {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Scrapes until `ready` holds (the tracer drains asynchronously), at most 120 s (guests in
/// software emulation, side by side on two CPUs, can be slow); `expected` is said if not.
fn scrape_until(
    url: &str,
    expected: &str,
    ready: impl Fn(&[Sample]) -> bool,
) -> (Vec<Sample>, String) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        // What Prometheus asks for (without it: the text format 0.0.4, test:metrics_server).
        let mut response = agent()
            .get(url)
            .header("Accept", "application/openmetrics-text;version=1.0.0")
            .call()
            .expect("GET /metrics");
        assert_eq!(response.status(), 200);
        let content_type = response
            .headers()
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let text = response.body_mut().read_to_string().unwrap();
        let samples = parse(&text);
        if ready(&samples) {
            assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
            assert!(
                content_type.starts_with("application/openmetrics-text"),
                "{content_type}"
            );
            return (samples, text);
        }
        assert!(
            Instant::now() < deadline,
            "metrics never showed the workload ({expected}):\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn scraped_metrics_count_exactly_the_calls_made() {
    require_privileges();
    let report =
        std::env::temp_dir().join(format!("memlock-trace-prom-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&report);
    let (mut tracer, url) = start(&[], &report);
    let calls = workload_report(&report);
    let labels = |syscall: &'static str| [("comm", "memlock-trace"), ("syscall", syscall)];
    // Pages the populating calls faulted in, by the workload's own getrusage around each.
    let populating = ["mlock", "mlock2", "mlockall"];
    let populated_by: Vec<f64> = populating
        .iter()
        .map(|&syscall| {
            calls
                .iter()
                .filter(|c| c["syscall"] == syscall)
                .map(|c| {
                    c["faults"]["minflt"].as_u64().unwrap()
                        + c["faults"]["majflt"].as_u64().unwrap()
                })
                .sum::<u64>() as f64
        })
        .collect();
    // The fault family's series come with the next refresh (each second). Summed over
    // `comm`: only the launched process is traced, and in a slow guest the first refresh
    // can come after it exited, when the name read for it is the pre-exec one (`sh`), a
    // known limit of the fault series' naming.
    let faults_by = |s: &[Sample], syscall: &str| -> f64 {
        s.iter()
            .filter(|x| {
                x.name == "memlock_trace_page_faults_populated_total"
                    && x.labels.get("syscall").map(String::as_str) == Some(syscall)
            })
            .map(|x| x.value)
            .sum()
    };
    let syscalls = ["mlock", "mlock2", "munlock", "mlockall", "munlockall"];
    let made = |syscall: &str| calls.iter().filter(|c| c["syscall"] == syscall).count() as f64;
    let expected = format!(
        "calls made {:?}, {} syscall records read, pages populated by {populating:?}: \
         {populated_by:?} (the workload's getrusage)",
        syscalls.map(|syscall| (syscall, made(syscall))),
        calls.len()
    );
    // The call series come from the kernel's counts at each refresh (each second), the
    // records from the ring buffer as it is drained: under load either can lag the other,
    // and a refresh can fall between two calls (the failing mlock comes after munlockall).
    let syscall_records = [("kind", "syscall")];
    let (samples, text) = scrape_until(&url, &expected, |s| {
        syscalls.iter().all(|&syscall| {
            value(s, "memlock_trace_syscalls_total", &labels(syscall)) == Some(made(syscall))
        }) && value(s, "memlock_trace_events_received_total", &syscall_records)
            == Some(calls.len() as f64)
            && populating
                .iter()
                .zip(&populated_by)
                .all(|(syscall, &n)| faults_by(s, syscall) == n)
    });
    // The fault family agrees with the syscall family and the workload, per call.
    for (syscall, &n) in populating.iter().zip(&populated_by) {
        assert_eq!(
            faults_by(&samples, syscall),
            n,
            "faults populated by {syscall}"
        );
    }
    assert!(
        populated_by[0] > 0.0 && populated_by[2] > 0.0,
        "{populated_by:?}"
    );
    let faults: f64 = samples
        .iter()
        .filter(|x| x.name == "memlock_trace_page_faults_total")
        .map(|x| x.value)
        .sum();
    assert!(faults >= populated_by.iter().sum::<f64>(), "{faults}");
    assert_eq!(
        value(
            &samples,
            "memlock_trace_fault_health_total",
            &[("counter", "update_failed")]
        ),
        Some(0.0)
    );

    for syscall in syscalls {
        let made: Vec<&Value> = calls.iter().filter(|c| c["syscall"] == syscall).collect();
        assert_eq!(
            value(&samples, "memlock_trace_syscalls_total", &labels(syscall)),
            Some(made.len() as f64),
            "{syscall}"
        );
        // The histogram holds every call, and its buckets are cumulative.
        assert_eq!(
            value(
                &samples,
                "memlock_trace_syscall_latency_seconds_count",
                &labels(syscall)
            ),
            Some(made.len() as f64)
        );
        let inf = [
            ("comm", "memlock-trace"),
            ("syscall", syscall),
            ("le", "+Inf"),
        ];
        assert_eq!(
            value(
                &samples,
                "memlock_trace_syscall_latency_seconds_bucket",
                &inf
            ),
            Some(made.len() as f64)
        );
        let sum = value(
            &samples,
            "memlock_trace_syscall_latency_seconds_sum",
            &labels(syscall),
        )
        .unwrap();
        assert!(sum > 0.0 && sum < 60.0, "{syscall} latency sum {sum}");
        let populated: u64 = made
            .iter()
            .map(|c| {
                c["faults"]["minflt"].as_u64().unwrap() + c["faults"]["majflt"].as_u64().unwrap()
            })
            .sum();
        let got = value(
            &samples,
            "memlock_trace_syscall_populated_faults_total",
            &labels(syscall),
        )
        .unwrap_or(0.0);
        assert_eq!(
            got, populated as f64,
            "{syscall} faults populated vs the workload's getrusage"
        );
        // Base pages, at least one per fault (a file's fault-around, a huge page: more).
        let bytes = value(
            &samples,
            "memlock_trace_syscall_populated_bytes_total",
            &labels(syscall),
        )
        .unwrap_or(0.0);
        assert!(
            bytes >= (populated * page_size()) as f64,
            "{syscall} bytes populated {bytes} vs {populated} faults"
        );
    }
    let buckets: Vec<f64> = samples
        .iter()
        .filter(|s| {
            s.name == "memlock_trace_syscall_latency_seconds_bucket"
                && s.labels["syscall"] == "mlock"
        })
        .map(|s| s.value)
        .collect();
    assert!(
        buckets.len() > 10 && buckets.windows(2).all(|w| w[0] <= w[1]),
        "{buckets:?}"
    );
    let enomem = [
        ("comm", "memlock-trace"),
        ("errno", "ENOMEM"),
        ("syscall", "mlock"),
    ];
    assert_eq!(
        value(&samples, "memlock_trace_syscall_errors_total", &enomem),
        Some(1.0)
    );
    // 16 + 8 pages locked by the two successful mlocks, then unlocked by the munlocks.
    assert_eq!(
        value(
            &samples,
            "memlock_trace_syscall_locked_bytes_total",
            &labels("mlock")
        ),
        Some((24 * page_size()) as f64)
    );
    assert_eq!(
        value(
            &samples,
            "memlock_trace_syscall_unlocked_bytes_total",
            &labels("munlock")
        ),
        Some((40 * page_size()) as f64)
    );
    // The tracer's health.
    assert_eq!(
        value(
            &samples,
            "memlock_trace_events_received_total",
            &syscall_records
        ),
        Some(calls.len() as f64)
    );
    for counter in [
        "dropped_events",
        "untracked_calls",
        "undecodable_records",
        "children_not_followed",
        "evicted_processes",
    ] {
        assert_eq!(
            value(&samples, &format!("memlock_trace_{counter}_total"), &[]),
            Some(0.0),
            "{counter}"
        );
    }
    assert!(
        text.contains("# TYPE memlock_trace_syscall_latency_seconds histogram"),
        "{text}"
    );
    assert!(
        text.contains("# UNIT memlock_trace_syscall_latency_seconds seconds"),
        "{text}"
    );
    assert!(
        !text.contains("pid=\""),
        "no pid label unless asked:\n{text}"
    );

    let mut missing = agent()
        .get(url.replace("/metrics", "/nope"))
        .call()
        .unwrap();
    assert_eq!(
        missing.status(),
        404,
        "{}",
        missing.body_mut().read_to_string().unwrap()
    );

    // Closing stdin ends the command, then the tracer, which still prints its summary.
    drop(tracer.child.stdin.take());
    let done = tracer.finish();
    assert!(done.status.success(), "{}", done.stderr);
    assert_eq!(support::calls_of(&summary(&done.stdout), 0, "mlock"), 0);
    std::fs::remove_file(&report).ok();
}

#[test]
fn pid_label_only_when_asked() {
    require_privileges();
    let report = std::env::temp_dir().join(format!(
        "memlock-trace-prom-pid-{}.json",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&report);
    let (mut tracer, url) = start(&["--prometheus-pid-label"], &report);
    workload_report(&report);
    // The workload's last call is its third mlock (the failing one).
    let (samples, _) = scrape_until(&url, "3 mlock calls", |s| {
        s.iter()
            .filter(|s| {
                s.name == "memlock_trace_syscalls_total"
                    && s.labels.get("syscall").map(String::as_str) == Some("mlock")
            })
            .map(|s| s.value)
            .sum::<f64>()
            == 3.0
    });
    drop(tracer.child.stdin.take());
    let done = tracer.finish();
    let s = summary(&done.stdout);
    let pid = support::with_syscalls(&s)[0]["pid"]
        .as_u64()
        .unwrap()
        .to_string();
    let pid_str = pid.as_str();
    // The workload runs in this test's cgroup v2: `0::PATH` in /proc/self/cgroup.
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let cgroup = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a cgroup v2 line");
    assert_eq!(
        value(
            &samples,
            "memlock_trace_syscalls_total",
            &[
                ("comm", "memlock-trace"),
                ("cgroup", cgroup),
                ("pid", pid_str),
                ("syscall", "mlock")
            ]
        ),
        Some(3.0)
    );
}

#[test]
fn a_taken_address_is_a_clear_error() {
    require_privileges();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(BIN)
        .args(["--prometheus", &addr, "--duration", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot serve Prometheus metrics on {addr}")),
        "{stderr}"
    );
    let _ = std::io::stderr().flush();
}

/// A fresh cgroup v2 `/memlock-trace-names-PID`, removed on drop: the tracer runs
/// system-wide and only what this test starts in it is counted.
struct FreshCgroup(std::path::PathBuf);

impl FreshCgroup {
    fn new() -> Self {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mount = info
            .lines()
            .find_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                (right.split_whitespace().next()? == "cgroup2")
                    .then(|| left.split_whitespace().nth(4))?
            })
            .expect("this test needs a cgroup2 mount (cgroup v2, or the unified hierarchy)");
        let dir =
            std::path::Path::new(mount).join(format!("memlock-trace-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Self(dir)
    }
}

impl Drop for FreshCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// 50 short processes with distinct names, one mlock and one munlock each, past
/// `--prometheus-max-names 5`: at most five names keep their own series, the others are
/// counted under `comm="other"`, and the sums are still exactly the calls made.
#[test]
fn names_past_the_cap_are_counted_under_other() {
    require_privileges();
    const NAMES: usize = 50;
    const KEPT: usize = 5;
    let cgroup = FreshCgroup::new();
    let links = std::env::temp_dir().join(format!("memlock-trace-names-{}", std::process::id()));
    std::fs::create_dir_all(&links).unwrap();
    // Each process is named after the link it was started by.
    let names: Vec<String> = (0..NAMES).map(|i| format!("name-{i:02}")).collect();
    for name in &names {
        let _ = std::fs::remove_file(links.join(name));
        std::os::unix::fs::symlink(BIN, links.join(name)).unwrap();
    }
    let cgroup_path = format!("/{}", cgroup.0.file_name().unwrap().to_string_lossy());
    let max = KEPT.to_string();
    let mut tracer = Tracer::spawn(&[
        "--prometheus",
        "127.0.0.1:0",
        "--prometheus-max-names",
        &max,
        "--cgroup",
        &cgroup_path,
    ]);
    let line = tracer.wait_for_stderr("serving Prometheus metrics on http://");
    let url = line.rsplit(' ').next().unwrap().to_string();
    tracer.wait_for_stderr("memlock-trace: tracing");
    let script = format!(
        "echo $$ > {}/cgroup.procs || exit 1; for name in {}; do {}/$name workload flood \
         --threads 1 --calls 1 --munlock >/dev/null || exit 1; done",
        cgroup.0.display(),
        names.join(" "),
        links.display()
    );
    let status = Command::new("sh").args(["-c", &script]).status().unwrap();
    assert!(status.success(), "the workloads: {status}");

    let calls = 2.0 * NAMES as f64;
    let sum = |s: &[Sample], name: &str| -> f64 {
        s.iter().filter(|x| x.name == name).map(|x| x.value).sum()
    };
    let (samples, text) = scrape_until(&url, "100 calls", |s| {
        sum(s, "memlock_trace_syscalls_total") >= calls
    });
    assert_eq!(
        sum(&samples, "memlock_trace_syscalls_total"),
        calls,
        "{text}"
    );
    // Every flood call fails with ENOMEM (page 0 is not mapped).
    assert_eq!(
        sum(&samples, "memlock_trace_syscall_errors_total"),
        calls,
        "{text}"
    );
    let comms = |name: &str| -> std::collections::BTreeSet<&str> {
        samples
            .iter()
            .filter(|x| x.name == name)
            .map(|x| x.labels["comm"].as_str())
            .filter(|&c| c != "other")
            .collect()
    };
    let kept = comms("memlock_trace_syscalls_total");
    assert!(
        kept.len() <= KEPT && kept.iter().all(|c| names.iter().any(|n| n == c)),
        "{kept:?}\n{text}"
    );
    let other = value(
        &samples,
        "memlock_trace_syscalls_total",
        &[("comm", "other"), ("syscall", "mlock")],
    );
    assert_eq!(other, Some((NAMES - kept.len()) as f64), "{text}");
    let other_labels = samples
        .iter()
        .find(|x| x.name == "memlock_trace_syscalls_total" && x.labels["comm"] == "other")
        .map(|x| x.labels.keys().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(
        other_labels,
        Some(vec!["comm", "syscall"]),
        "no cgroup for other"
    );
    // The fault series share the cap: five names in all.
    let mut all = kept.clone();
    all.extend(comms("memlock_trace_page_faults_total"));
    assert!(all.len() <= KEPT, "{all:?}\n{text}");
    // Every name whose calls went to `other` is counted once; the shell that started them
    // may be one more (its own faults).
    let folded = value(&samples, "memlock_trace_series_names_folded", &[]).unwrap();
    assert!(
        folded >= (NAMES - kept.len()) as f64 && folded <= (NAMES + 1 - all.len()) as f64,
        "folded {folded}, kept {all:?}\n{text}"
    );

    tracer.signal(libc::SIGINT);
    let done = tracer.finish();
    assert!(done.status.success(), "{}", done.stderr);
    std::fs::remove_dir_all(&links).ok();
}

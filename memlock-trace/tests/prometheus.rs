//! Runs on: host, 6.12: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! `--prometheus ADDR`: a real HTTP client scrapes /metrics while the tracer runs, and the
//! parsed exposition carries exactly the calls the workload made.

mod common;
#[path = "prometheus/scrape.rs"]
mod scrape;
mod support;

use std::{io::Write as _, process::Command};

use common::require_privileges;
use scrape::{agent, scrape_until, start, workload_report};
use serde_json::Value;
use support::{
    BIN, Tracer, cgroup2_mount,
    exposition::{Sample, value},
    line_after, summary,
};

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 }
}

/// The calls the `syscalls` workload makes, each with its own series.
const SYSCALLS: [&str; 5] = ["mlock", "mlock2", "munlock", "mlockall", "munlockall"];
/// Those of them that populate pages (and so fault them in).
const POPULATING: [&str; 3] = ["mlock", "mlock2", "mlockall"];
/// The labels of the records counted from the syscall family's ring buffer.
const SYSCALL_RECORDS: [(&str, &str); 1] = [("kind", "syscall")];

/// The labels of the workload's series of `syscall`.
fn labels(syscall: &str) -> [(&str, &str); 2] {
    [("comm", "memlock-trace"), ("syscall", syscall)]
}

/// How many `syscall` calls the workload's report lists.
fn made(calls: &[Value], syscall: &str) -> usize {
    calls.iter().filter(|c| c["syscall"] == syscall).count()
}

/// Pages the workload's `syscall` calls faulted in, by its own getrusage around each.
fn populated_by(calls: &[Value], syscall: &str) -> u64 {
    calls
        .iter()
        .filter(|c| c["syscall"] == syscall)
        .map(|c| c["faults"]["minflt"].as_u64().unwrap() + c["faults"]["majflt"].as_u64().unwrap())
        .sum()
}

/// The fault family's faults populating pages in `syscall`, summed over `comm`: only the launched
/// process is traced, and in a slow guest the first refresh can come after it exited, when
/// the name read for it is the pre-exec one (`sh`), a known limit of the fault series' naming.
fn faults_by(s: &[Sample], syscall: &str) -> f64 {
    s.iter()
        .filter(|x| {
            x.name == "memlock_trace_page_faults_populated_total"
                && x.labels.get("syscall").map(String::as_str) == Some(syscall)
        })
        .map(|x| x.value)
        .sum()
}

/// Scrapes until every call the workload made, every record of them and every page they
/// populated shows. The call series come from the kernel's counts at each refresh (each
/// second), the records from the ring buffer as it is drained: under load either can lag the
/// other, and a refresh can fall between two calls (the failing mlock comes after munlockall).
/// The fault family's series come with the next refresh (each second).
fn scrape_all_calls(url: &str, calls: &[Value], populated: &[f64; 3]) -> (Vec<Sample>, String) {
    let expected = format!(
        "calls made {:?}, {} syscall records read, pages populated by {POPULATING:?}: \
         {populated:?} (the workload's getrusage)",
        SYSCALLS.map(|syscall| (syscall, made(calls, syscall) as f64)),
        calls.len()
    );
    scrape_until(url, &expected, |s| {
        SYSCALLS.iter().all(|&syscall| {
            value(s, "memlock_trace_syscalls_total", &labels(syscall))
                == Some(made(calls, syscall) as f64)
        }) && value(s, "memlock_trace_events_received_total", &SYSCALL_RECORDS)
            == Some(calls.len() as f64)
            && POPULATING
                .iter()
                .zip(populated)
                .all(|(syscall, &n)| faults_by(s, syscall) == n)
    })
}

/// The fault family agrees with the syscall family and the workload, per call.
fn assert_fault_family(samples: &[Sample], populated: &[f64; 3]) {
    for (syscall, &n) in POPULATING.iter().zip(populated) {
        assert_eq!(
            faults_by(samples, syscall),
            n,
            "faults populated by {syscall}"
        );
    }
    assert!(populated[0] > 0.0 && populated[2] > 0.0, "{populated:?}");
    let faults: f64 = samples
        .iter()
        .filter(|x| x.name == "memlock_trace_page_faults_total")
        .map(|x| x.value)
        .sum();
    assert!(faults >= populated.iter().sum::<f64>(), "{faults}");
    assert_eq!(
        value(
            samples,
            "memlock_trace_fault_health_total",
            &[("kind", "update_failed")]
        ),
        Some(0.0)
    );
}

/// `syscall`'s series: its count, latency histogram and pages populated, against the calls
/// the workload made and the faults its getrusage saw.
fn assert_call_series(samples: &[Sample], calls: &[Value], syscall: &str) {
    let made = made(calls, syscall);
    assert_eq!(
        value(samples, "memlock_trace_syscalls_total", &labels(syscall)),
        Some(made as f64),
        "{syscall}"
    );
    // The histogram holds every call, and its buckets are cumulative.
    assert_eq!(
        value(
            samples,
            "memlock_trace_syscall_latency_seconds_count",
            &labels(syscall)
        ),
        Some(made as f64)
    );
    let inf = [
        ("comm", "memlock-trace"),
        ("syscall", syscall),
        ("le", "+Inf"),
    ];
    assert_eq!(
        value(
            samples,
            "memlock_trace_syscall_latency_seconds_bucket",
            &inf
        ),
        Some(made as f64)
    );
    let sum = value(
        samples,
        "memlock_trace_syscall_latency_seconds_sum",
        &labels(syscall),
    )
    .unwrap();
    assert!(sum > 0.0 && sum < 60.0, "{syscall} latency sum {sum}");
    let populated = populated_by(calls, syscall);
    let got = value(
        samples,
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
        samples,
        "memlock_trace_syscall_populated_bytes_total",
        &labels(syscall),
    )
    .unwrap_or(0.0);
    assert!(
        bytes >= (populated * page_size()) as f64,
        "{syscall} bytes populated {bytes} vs {populated} faults"
    );
}

/// What the workload's mlock calls did: a cumulative latency histogram, one ENOMEM, the
/// pages locked and unlocked.
fn assert_mlock_figures(samples: &[Sample]) {
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
        value(samples, "memlock_trace_syscall_errors_total", &enomem),
        Some(1.0)
    );
    // 16 + 8 pages locked by the two successful mlocks, then unlocked by the munlocks.
    assert_eq!(
        value(
            samples,
            "memlock_trace_syscall_locked_bytes_total",
            &labels("mlock")
        ),
        Some((24 * page_size()) as f64)
    );
    assert_eq!(
        value(
            samples,
            "memlock_trace_syscall_unlocked_bytes_total",
            &labels("munlock")
        ),
        Some((40 * page_size()) as f64)
    );
}

/// The tracer's health: every record received, nothing dropped or lost; the exposition's
/// metadata, and no pid label unless asked.
fn assert_health(samples: &[Sample], text: &str, records: usize) {
    assert_eq!(
        value(
            samples,
            "memlock_trace_events_received_total",
            &SYSCALL_RECORDS
        ),
        Some(records as f64)
    );
    for counter in [
        "dropped_events",
        "untracked_calls",
        "undecodable_records",
        "children_not_followed",
        "evicted_processes",
    ] {
        assert_eq!(
            value(samples, &format!("memlock_trace_{counter}_total"), &[]),
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
}

fn assert_unknown_path_is_404(url: &str) {
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
}

#[test]
fn scraped_metrics_count_exactly_the_calls_made() {
    require_privileges();
    let report =
        std::env::temp_dir().join(format!("memlock-trace-prom-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&report);
    let (mut tracer, url) = start(&[], &report);
    let calls = workload_report(&report);
    let populated = POPULATING.map(|syscall| populated_by(&calls, syscall) as f64);
    let (samples, text) = scrape_all_calls(&url, &calls, &populated);
    assert_fault_family(&samples, &populated);
    for syscall in SYSCALLS {
        assert_call_series(&samples, &calls, syscall);
    }
    assert_mlock_figures(&samples);
    assert_health(&samples, &text, calls.len());
    assert_unknown_path_is_404(&url);

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
    let cgroup = line_after(&own, "0::");
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
        let dir = cgroup2_mount().join(format!("memlock-trace-names-{}", std::process::id()));
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

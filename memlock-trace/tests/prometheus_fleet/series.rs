//! The PromQL side: polling Prometheus until a series shows, and the probe's and the
//! flood's series read back.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{Cgroups, FLOOD_CALLS, FLOOD_THREADS, JOB, N, support::prometheus::Prometheus};

/// Polls `promql` until it returns `want` or 40 s pass; returns the last value.
pub fn poll(prometheus: &Prometheus, promql: &str, want: f64) -> f64 {
    poll_until(prometheus, promql, |got| got == want)
}

/// Polls `promql` until its value passes `done` or 40 s pass; returns the last value.
pub fn poll_until(prometheus: &Prometheus, promql: &str, done: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let got = prometheus.one(promql);
        if done(got) || Instant::now() > deadline {
            eprintln!("{promql} = {got}");
            return got;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The PromQL series of the calls `call` matching the label matchers `sel`.
pub fn calls_series(sel: &str, call: &str) -> String {
    format!("memlock_trace_syscalls_total{{{sel},syscall=\"{call}\"}}")
}

/// The probe's series in PromQL, by its name after exec and its cgroup.
pub struct ProbeSeries {
    pub mlocks: f64,
    pub munlocks: f64,
    /// Everything the probe's cgroup made, whatever the name: only fleetprobe's.
    pub in_cgroup: Vec<Value>,
    pub locked: f64,
    pub unlocked: f64,
    pub errors: f64,
}

pub fn probe_series(prometheus: &Prometheus, cgroups: &Cgroups) -> ProbeSeries {
    let probe_sel = format!(
        "job=\"{JOB}\",comm=\"fleetprobe\",cgroup=\"{}\"",
        cgroups.path("probe")
    );
    ProbeSeries {
        mlocks: poll(prometheus, &calls_series(&probe_sel, "mlock"), N as f64),
        munlocks: poll(prometheus, &calls_series(&probe_sel, "munlock"), N as f64),
        in_cgroup: prometheus.query(&format!(
            "sum by (comm, syscall) (memlock_trace_syscalls_total{{job=\"{JOB}\",cgroup=\"{}\"}})",
            cgroups.path("probe")
        )),
        locked: prometheus.one(&format!(
            "memlock_trace_syscall_locked_bytes_total{{{probe_sel},syscall=\"mlock\"}}"
        )),
        unlocked: prometheus.one(&format!(
            "memlock_trace_syscall_unlocked_bytes_total{{{probe_sel},syscall=\"munlock\"}}"
        )),
        errors: prometheus.one(&format!(
            "sum(memlock_trace_syscall_errors_total{{{probe_sel}}})"
        )),
    }
}

/// The flood's calls by its own report, and its series in PromQL, by its cgroup (its name is
/// memlock-trace, as other tests' are).
pub struct FloodSeries {
    pub calls: u64,
    pub munlocks: u64,
    pub enomem: u64,
    pub mlocks_seen: f64,
    pub munlocks_seen: f64,
    pub errors: f64,
}

pub fn flood_series(prometheus: &Prometheus, cgroups: &Cgroups, report: &Value) -> FloodSeries {
    let calls = report["calls"].as_u64().unwrap();
    let munlocks = report["munlock_calls"].as_u64().unwrap();
    let enomem = report["enomem"].as_u64().unwrap();
    assert_eq!(calls, FLOOD_THREADS * FLOOD_CALLS);
    let flood_sel = format!("job=\"{JOB}\",cgroup=\"{}\"", cgroups.path("flood"));
    FloodSeries {
        calls,
        munlocks,
        enomem,
        mlocks_seen: poll(
            prometheus,
            &format!("sum({})", calls_series(&flood_sel, "mlock")),
            calls as f64,
        ),
        munlocks_seen: poll(
            prometheus,
            &format!("sum({})", calls_series(&flood_sel, "munlock")),
            munlocks as f64,
        ),
        errors: prometheus.one(&format!(
            "sum(memlock_trace_syscall_errors_total{{{flood_sel},syscall=\"mlock\",errno=\"ENOMEM\"}})"
        )),
    }
}

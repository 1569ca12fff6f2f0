//! Prometheus metrics (`--prometheus ADDR`): counters and latency histograms of the traced
//! calls labelled by comm (and pid only with `--prometheus-pid-label`, so cardinality stays
//! bounded by default), and the tracer's own health.
//!
//! Each hook family keeps its families in its own struct and file, registered in
//! [`Metrics::new`] and fed from the session: syscalls from the drain loop, page faults
//! (`faults.rs`) from the fault family's read-back on the session's health ticker.

mod auth;
mod faults;
mod health;
pub mod server;
mod syscalls;
pub mod web_config;

use std::fmt::Write as _;

use prometheus_client::{encoding::text::encode, registry::Registry};

pub use self::{faults::FaultMetrics, health::HealthMetrics, syscalls::SyscallMetrics};

/// Every metric memlock-trace exports, prefixed `memlock_trace_`.
pub struct Metrics {
    registry: Registry,
    pub syscalls: SyscallMetrics,
    pub faults: FaultMetrics,
    pub health: HealthMetrics,
}

/// Label sets are built at run time because the pid label is optional.
pub type Labels = Vec<(&'static str, String)>;

impl Metrics {
    pub fn new(pid_label: bool) -> Self {
        let mut registry = Registry::with_prefix("memlock_trace");
        let syscalls = SyscallMetrics::register(&mut registry, pid_label);
        let faults = FaultMetrics::register(&mut registry, pid_label);
        let health = HealthMetrics::register(&mut registry);
        Self {
            registry,
            syscalls,
            faults,
            health,
        }
    }

    /// The OpenMetrics text exposition of everything registered.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            // Only a failing `fmt::Write` makes encoding fail, and a String never does.
            out.clear();
            let _ = writeln!(out, "# EOF");
        }
        out
    }
}

/// The label set for one process: comm, its cgroup v2 path (when known), plus the pid when
/// asked.
pub fn process_labels(pid_label: bool, comm: String, cgroup: String, pid: u32) -> Labels {
    let mut labels = vec![("comm", comm)];
    if !cgroup.is_empty() {
        labels.push(("cgroup", cgroup));
    }
    if pid_label {
        labels.push(("pid", pid.to_string()));
    }
    labels
}

/// Content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use memlock_trace_common::{
        process::ProcessKey,
        syscalls::{LATENCY_SLOTS, SyscallKey, latency_slot},
    };

    use super::*;
    use crate::{
        event::Syscall,
        syscalls::read::{KeyCounts, SyscallReport},
        tracer::Health,
    };

    fn key(tgid: u32, syscall: Syscall, errno: u32) -> SyscallKey {
        SyscallKey {
            tgid,
            nr: syscall.nr(),
            start_ns: 1,
            errno,
            _pad: 0,
        }
    }

    fn counts(calls: u64, ns: u64) -> KeyCounts {
        let mut latency = [0; LATENCY_SLOTS];
        latency[latency_slot(ns)] = calls;
        KeyCounts {
            calls,
            pages_populated: 4 * calls,
            pages_locked: 4 * calls,
            pages_unlocked: 0,
            max_ns: ns,
            latency,
        }
    }

    fn db(_: &ProcessKey) -> (String, String) {
        ("db".into(), String::new())
    }

    #[test]
    fn syscalls_and_health_encode_as_openmetrics() {
        let m = Metrics::new(false);
        let mut report = SyscallReport::default();
        report
            .counts
            .insert(key(7, Syscall::Mlock, 0), counts(1, 3_000));
        report
            .counts
            .insert(key(8, Syscall::Mlock, 12), counts(1, 1_500));
        m.syscalls.update(&report, db);
        // The kernel's running totals: a second refresh adds only the growth.
        report
            .counts
            .insert(key(7, Syscall::Mlock, 0), counts(2, 3_000));
        m.syscalls.update(&report, db);
        m.health.update(&Health {
            dropped_events: 5,
            ..Default::default()
        });
        m.health.update(&Health {
            dropped_events: 7,
            ..Default::default()
        });
        let text = m.encode();
        let has = |line: &str| assert!(text.contains(line), "{line}\n{text}");
        // Two pids, one comm: one series without a pid label.
        has("memlock_trace_syscalls_total{comm=\"db\",syscall=\"mlock\"} 3\n");
        has(
            "memlock_trace_syscall_errors_total{comm=\"db\",syscall=\"mlock\",errno=\"ENOMEM\"} 1\n",
        );
        has("memlock_trace_syscall_latency_seconds_count{comm=\"db\",syscall=\"mlock\"} 3\n");
        // 1.5 us in [1.024, 2.048) us, 3 us in [2.048, 4.096) us.
        has(
            "memlock_trace_syscall_latency_seconds_bucket{le=\"0.000002048\",comm=\"db\",syscall=\"mlock\"} 1\n",
        );
        has(
            "memlock_trace_syscall_latency_seconds_bucket{le=\"0.000004096\",comm=\"db\",syscall=\"mlock\"} 3\n",
        );
        has("memlock_trace_syscall_pages_populated_total{comm=\"db\",syscall=\"mlock\"} 12\n");
        // The kernel's running total, not the sum of the updates.
        has("memlock_trace_dropped_events_total 7\n");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn pid_and_cgroup_labels() {
        let m = Metrics::new(true);
        let mut report = SyscallReport::default();
        report
            .counts
            .insert(key(42, Syscall::Munlock, 0), counts(1, 1_000));
        m.syscalls.update(&report, |_| {
            ("db".into(), "/system.slice/db.service".into())
        });
        let text = m.encode();
        assert!(
            text.contains(
                "memlock_trace_syscalls_total{comm=\"db\",cgroup=\"/system.slice/db.service\",pid=\"42\",syscall=\"munlock\"} 1\n"
            ),
            "{text}"
        );
    }
}

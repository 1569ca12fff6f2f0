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

/// The label set for one process: comm, plus the pid when asked.
pub fn process_labels(pid_label: bool, comm: String, pid: u32) -> Labels {
    let mut labels = vec![("comm", comm)];
    if pid_label {
        labels.push(("pid", pid.to_string()));
    }
    labels
}

/// Content type of [`Metrics::encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{Syscall, SyscallRecord},
        tracer::Health,
    };

    fn rec(syscall: Syscall, tgid: u32, ret: i64, duration_ns: u64) -> SyscallRecord {
        SyscallRecord::fixture(syscall, tgid, ret, duration_ns, 4, 4, "db")
    }

    #[test]
    fn syscalls_and_health_encode_as_openmetrics() {
        let m = Metrics::new(false);
        m.syscalls.record(&rec(Syscall::Mlock, 7, 0, 3_000));
        m.syscalls.record(&rec(Syscall::Mlock, 8, -12, 1_500));
        m.health.update(&Health {
            dropped_events: 5,
            ..Default::default()
        });
        m.health.update(&Health {
            dropped_events: 7,
            ..Default::default()
        });
        let text = m.encode();
        // Two pids, one comm: one series without a pid label.
        assert!(
            text.contains("memlock_trace_syscalls_total{comm=\"db\",syscall=\"mlock\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("memlock_trace_syscall_errors_total{comm=\"db\",syscall=\"mlock\",errno=\"ENOMEM\"} 1\n"), "{text}");
        assert!(
            text.contains(
                "memlock_trace_syscall_latency_seconds_count{comm=\"db\",syscall=\"mlock\"} 2\n"
            ),
            "{text}"
        );
        // 1.5 us and 3 us: one below the 2 us bound, both below 4 us.
        assert!(text.contains("memlock_trace_syscall_latency_seconds_bucket{le=\"2e-6\",comm=\"db\",syscall=\"mlock\"} 1\n")
            || text.contains("memlock_trace_syscall_latency_seconds_bucket{le=\"0.000002\",comm=\"db\",syscall=\"mlock\"} 1\n"), "{text}");
        assert!(
            text.contains(
                "memlock_trace_syscall_pages_populated_total{comm=\"db\",syscall=\"mlock\"} 8\n"
            ),
            "{text}"
        );
        // The kernel's running total, not the sum of the updates.
        assert!(
            text.contains("memlock_trace_dropped_events_total 7\n"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn pid_label_when_asked() {
        let m = Metrics::new(true);
        m.syscalls.record(&rec(Syscall::Munlock, 42, 0, 1_000));
        assert!(m.encode().contains(
            "memlock_trace_syscalls_total{comm=\"db\",pid=\"42\",syscall=\"munlock\"} 1\n"
        ));
    }
}

//! Prometheus metrics (`--prometheus ADDR`): counters and latency histograms of the traced
//! calls labelled by comm (and pid only with `--prometheus-pid-label`, so cardinality stays
//! bounded by default), and the tracer's own health.
//!
//! Each hook family keeps its families in its own struct and file, registered in
//! [`Metrics::new`] and fed from the session's drain loop. Page-fault metrics (issue 4)
//! belong in a `faults.rs` next to `syscalls.rs`, as a `faults` field of [`Metrics`].

mod health;
pub mod server;
mod syscalls;

use std::fmt::Write as _;

use prometheus_client::{encoding::text::encode, registry::Registry};

pub use self::{health::HealthMetrics, syscalls::SyscallMetrics};

/// Every metric memlock-trace exports, prefixed `memlock_trace_`.
pub struct Metrics {
    registry: Registry,
    pub syscalls: SyscallMetrics,
    pub health: HealthMetrics,
}

/// Label sets are built at run time because the pid label is optional.
pub type Labels = Vec<(&'static str, String)>;

impl Metrics {
    pub fn new(pid_label: bool) -> Self {
        let mut registry = Registry::with_prefix("memlock_trace");
        let syscalls = SyscallMetrics::register(&mut registry, pid_label);
        let health = HealthMetrics::register(&mut registry);
        Self {
            registry,
            syscalls,
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

//! mlock-family call metrics.

use prometheus_client::{
    metrics::{
        counter::Counter,
        family::Family,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

use super::{Labels, process_labels};
use crate::event::{SyscallRecord, errno_name};

pub struct SyscallMetrics {
    pid_label: bool,
    calls: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    latency: Family<Labels, Histogram>,
    pages_populated: Family<Labels, Counter>,
    pages_locked: Family<Labels, Counter>,
    pages_unlocked: Family<Labels, Counter>,
}

/// 1 us to 8.4 s in powers of two: mlock of one page takes microseconds, mlockall of a
/// large process seconds.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-6, 2.0, 24))
}

impl SyscallMetrics {
    pub fn register(registry: &mut Registry, pid_label: bool) -> Self {
        let metrics = Self {
            pid_label,
            calls: Family::default(),
            errors: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            pages_populated: Family::default(),
            pages_locked: Family::default(),
            pages_unlocked: Family::default(),
        };
        registry.register(
            "syscalls",
            "mlock-family calls completed",
            metrics.calls.clone(),
        );
        registry.register(
            "syscall_errors",
            "mlock-family calls that failed, by errno",
            metrics.errors.clone(),
        );
        registry.register_with_unit(
            "syscall_latency",
            "Time spent inside mlock-family calls",
            Unit::Seconds,
            metrics.latency.clone(),
        );
        registry.register(
            "syscall_pages_populated",
            "Pages the kernel faulted in on the caller's behalf during mlock-family calls",
            metrics.pages_populated.clone(),
        );
        registry.register(
            "syscall_pages_locked",
            "Growth of mm->locked_vm across mlock-family calls, in pages",
            metrics.pages_locked.clone(),
        );
        registry.register(
            "syscall_pages_unlocked",
            "Shrinkage of mm->locked_vm across mlock-family calls, in pages",
            metrics.pages_unlocked.clone(),
        );
        metrics
    }

    pub fn record(&self, rec: &SyscallRecord) {
        let mut labels = process_labels(self.pid_label, rec.comm(), rec.raw.tgid);
        labels.push(("syscall", rec.syscall.name().to_string()));
        self.calls.get_or_create(&labels).inc();
        self.latency
            .get_or_create(&labels)
            .observe(rec.raw.duration_ns as f64 / 1e9);
        let populated = rec.pages_populated();
        if populated > 0 {
            self.pages_populated
                .get_or_create(&labels)
                .inc_by(populated);
        }
        let locked = rec.pages_locked();
        if locked > 0 {
            self.pages_locked
                .get_or_create(&labels)
                .inc_by(locked.unsigned_abs());
        } else if locked < 0 {
            self.pages_unlocked
                .get_or_create(&labels)
                .inc_by(locked.unsigned_abs());
        }
        if let Some(errno) = errno_name(rec.raw.ret) {
            labels.push(("errno", errno));
            self.errors.get_or_create(&labels).inc();
        }
    }
}

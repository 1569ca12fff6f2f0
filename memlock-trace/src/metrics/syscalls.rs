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
    /// In bytes (pages times the page size), Prometheus' base unit.
    populated_bytes: Family<Labels, Counter>,
    locked_bytes: Family<Labels, Counter>,
    unlocked_bytes: Family<Labels, Counter>,
    page_size: u64,
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
            populated_bytes: Family::default(),
            locked_bytes: Family::default(),
            unlocked_bytes: Family::default(),
            page_size: super::page_size(),
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
        registry.register_with_unit(
            "syscall_populated",
            "Memory the kernel faulted in on the caller's behalf during mlock-family calls",
            Unit::Bytes,
            metrics.populated_bytes.clone(),
        );
        registry.register_with_unit(
            "syscall_locked",
            "Growth of mm->locked_vm across mlock-family calls",
            Unit::Bytes,
            metrics.locked_bytes.clone(),
        );
        registry.register_with_unit(
            "syscall_unlocked",
            "Shrinkage of mm->locked_vm across mlock-family calls",
            Unit::Bytes,
            metrics.unlocked_bytes.clone(),
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
            self.populated_bytes
                .get_or_create(&labels)
                .inc_by(populated * self.page_size);
        }
        let locked = rec.pages_locked();
        if locked > 0 {
            self.locked_bytes
                .get_or_create(&labels)
                .inc_by(locked.unsigned_abs() * self.page_size);
        } else if locked < 0 {
            self.unlocked_bytes
                .get_or_create(&labels)
                .inc_by(locked.unsigned_abs() * self.page_size);
        }
        if let Some(errno) = errno_name(rec.raw.ret) {
            labels.push(("errno", errno));
            self.errors.get_or_create(&labels).inc();
        }
    }
}

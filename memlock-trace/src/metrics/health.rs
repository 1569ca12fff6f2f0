//! The tracer's own health: what was lost and why. The kernel keeps running totals; each
//! refresh adds the growth since the last one, so these stay true counters.

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use crate::tracer::Health;

#[derive(Default)]
pub struct HealthMetrics {
    /// By record kind (`syscall`, `vma`).
    events: Family<Vec<(&'static str, &'static str)>, Counter>,
    undecodable: Counter,
    dropped: Counter,
    untracked: Counter,
    failed_reads: Counter,
    dropped_vma: Counter,
    children_not_followed: Counter,
    evicted: Counter,
}

impl HealthMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "events_received",
            "Records read from the ring buffer, by kind",
            m.events.clone(),
        );
        registry.register(
            "undecodable_records",
            "Ring buffer records that could not be decoded",
            m.undecodable.clone(),
        );
        registry.register(
            "dropped_events",
            "Events lost because the ring buffer was full (counted in the kernel)",
            m.dropped.clone(),
        );
        registry.register(
            "untracked_calls",
            "Calls not traced because the in-flight table was full",
            m.untracked.clone(),
        );
        registry.register(
            "failed_reads",
            "Kernel fields that could not be read (reported as 0)",
            m.failed_reads.clone(),
        );
        registry.register(
            "dropped_vma_records",
            "VMA records lost because the ring buffer was full (counted in the kernel)",
            m.dropped_vma.clone(),
        );
        registry.register(
            "children_not_followed",
            "Children of traced processes not traced because the target map was full",
            m.children_not_followed.clone(),
        );
        registry.register(
            "evicted_processes",
            "Processes evicted from the per-process summary table (--max-processes)",
            m.evicted.clone(),
        );
        m
    }

    /// `received`: (record kind, how many) read in one drain.
    pub fn record_events(&self, received: &[(&'static str, u64)], undecodable: u64) {
        for &(kind, n) in received {
            self.events.get_or_create(&vec![("kind", kind)]).inc_by(n);
        }
        self.undecodable.inc_by(undecodable);
    }

    /// Brings the counters up to the kernel's (and the aggregator's) totals.
    pub fn update(&self, health: &Health) {
        raise(&self.dropped, health.dropped_events);
        raise(&self.untracked, health.untracked_calls);
        raise(&self.failed_reads, health.failed_reads);
        raise(&self.dropped_vma, health.dropped_vma_records);
        raise(
            &self.children_not_followed,
            health.processes.children_not_followed,
        );
        raise(&self.evicted, health.processes.evicted_processes);
    }
}

/// Raises `counter` to the running total `total` (never lowers it).
pub(super) fn raise(counter: &Counter, total: u64) {
    let current = counter.get();
    if total > current {
        counter.inc_by(total - current);
    }
}

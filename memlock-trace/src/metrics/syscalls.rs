//! mlock-family call metrics, from the kernel's per-process counts (`SYSCALL_STATS`): exact
//! whatever the event ring buffer drops. Like the fault series, each refresh adds each
//! key's growth since the last one to its label set.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use memlock_trace_common::{
    process::ProcessKey,
    syscalls::{SyscallKey, latency_slot_range},
};
use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::{Registry, Unit},
};

use super::{Labels, faults::LatencyFamily, names::NameCap};
use crate::{
    buckets::Buckets,
    event::{Syscall, errno_name},
    process::counts::growth,
    syscalls::read::{KeyCounts, SyscallReport},
};

pub struct SyscallMetrics {
    names: Arc<NameCap>,
    calls: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    latency: LatencyFamily,
    /// In bytes (base pages times the page size, whatever the size of the pages holding
    /// them), Prometheus' base unit.
    populated_bytes: Family<Labels, Counter>,
    /// The faults that populated them: one per huge page where huge pages did.
    populated_faults: Family<Labels, Counter>,
    locked_bytes: Family<Labels, Counter>,
    unlocked_bytes: Family<Labels, Counter>,
    page_size: u64,
    /// Each key's running totals at the last refresh.
    last: Mutex<HashMap<SyscallKey, SeenCalls>>,
}

/// A key's running totals at the last refresh: the kernel's, the latency slots kept sparse
/// (328 bytes a key dense, for each of up to 8,192 (process, call, outcome) keys).
#[derive(Clone, Debug, Default)]
struct SeenCalls {
    calls: u64,
    pages_populated: u64,
    faults_populated: u64,
    pages_locked: u64,
    pages_unlocked: u64,
    latency: Buckets,
}

impl SeenCalls {
    fn of(counts: &KeyCounts) -> Self {
        Self {
            calls: counts.calls,
            pages_populated: counts.pages_populated,
            faults_populated: counts.faults_populated,
            pages_locked: counts.pages_locked,
            pages_unlocked: counts.pages_unlocked,
            latency: Buckets::from_dense(&counts.latency),
        }
    }
}

impl SyscallMetrics {
    pub fn register(registry: &mut Registry, names: Arc<NameCap>) -> Self {
        let metrics = Self {
            names,
            calls: Family::default(),
            errors: Family::default(),
            latency: LatencyFamily::default(),
            populated_bytes: Family::default(),
            populated_faults: Family::default(),
            locked_bytes: Family::default(),
            unlocked_bytes: Family::default(),
            page_size: super::page_size(),
            last: Mutex::default(),
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
            "Memory the kernel mapped on the caller's behalf during mlock-family calls (base \
             pages, whatever the size of the pages holding them)",
            Unit::Bytes,
            metrics.populated_bytes.clone(),
        );
        registry.register(
            "syscall_populated_faults",
            "Faults the kernel took on the caller's behalf during mlock-family calls (one per \
             huge page where huge pages were populated)",
            metrics.populated_faults.clone(),
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

    /// Adds each key's growth since the last refresh; `labels_of` gives a process's name
    /// and cgroup path.
    pub fn update(
        &self,
        report: &SyscallReport,
        mut labels_of: impl FnMut(&ProcessKey) -> (String, String),
    ) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        for (key, now) in &report.counts {
            let Some(syscall) = Syscall::from_nr(key.nr) else {
                continue;
            };
            let seen = last.entry(*key).or_default();
            // A key's figures change with its calls only: most keys, nothing new.
            if seen.calls == now.calls {
                continue;
            }
            let before = std::mem::replace(seen, SeenCalls::of(now));
            // An entry evicted and made anew: all of it is new.
            let before = if now.calls < before.calls {
                SeenCalls::default()
            } else {
                before
            };
            let calls = now.calls - before.calls;
            let process = ProcessKey {
                tgid: key.tgid,
                _pad: 0,
                start_ns: key.start_ns,
            };
            let (comm, cgroup) = labels_of(&process);
            let mut labels = self.names.labels(comm, cgroup, key.tgid);
            labels.push(("syscall", syscall.name().to_string()));
            self.calls.get_or_create(&labels).inc_by(calls);
            self.latency.add_ranges(
                labels.clone(),
                now.latency.iter().enumerate().map(|(slot, &n)| {
                    let b = before.latency.get(slot);
                    // The open-ended last slot: past every finite bound.
                    let (low, high) = latency_slot_range(slot);
                    ((low, high.min(low.saturating_mul(2))), growth(n, b))
                }),
            );
            for (family, n, b) in [
                (
                    &self.populated_bytes,
                    now.pages_populated,
                    before.pages_populated,
                ),
                (&self.locked_bytes, now.pages_locked, before.pages_locked),
                (
                    &self.unlocked_bytes,
                    now.pages_unlocked,
                    before.pages_unlocked,
                ),
            ] {
                let n = growth(n, b);
                if n > 0 {
                    family.get_or_create(&labels).inc_by(n * self.page_size);
                }
            }
            let faults = growth(now.faults_populated, before.faults_populated);
            if faults > 0 {
                self.populated_faults.get_or_create(&labels).inc_by(faults);
            }
            if let Some(errno) = errno_name(-i64::from(key.errno)) {
                labels.push(("errno", errno));
                self.errors.get_or_create(&labels).inc_by(calls);
            }
        }
        // Keys the kernel no longer holds: a later entry starts from zero.
        last.retain(|key, _| report.counts.contains_key(key));
    }
}

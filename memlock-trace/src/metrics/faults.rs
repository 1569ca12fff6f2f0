//! Page-fault metrics: counts by class, pages populated per system call, latency
//! histograms and the fault hooks' own health, labelled like the syscall series.
//!
//! The kernel keeps running totals per process (an LRU map); each refresh adds each
//! process's growth since the last one to its label set, so the series stay true counters
//! when a process exits, its entry is evicted, or two processes share a comm.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, atomic::AtomicU64},
};

use memlock_trace_common::{
    causes::cause,
    faults::{HIST_BUCKETS, bucket_range, class, major_kind, populate, stat},
    process::ProcessKey,
};
use prometheus_client::{
    encoding::{EncodeMetric, MetricEncoder, NoLabelSet},
    metrics::{MetricType, TypedMetric, counter::Counter, family::Family, gauge::Gauge},
    registry::{Registry, Unit},
};

use super::{Labels, names::NameCap};
use crate::{
    buckets::Buckets,
    faults::{FaultHealth, FaultHooks, Unobservable, summary::ProcessFaults},
    process::counts::{bucket_growth, growth},
};

/// Upper bounds of the latency buckets: powers of two nanoseconds, 256 ns to 134 ms. The
/// kernel's log-linear buckets never straddle a power of two, so each falls in exactly one.
const BOUND_SHIFTS: std::ops::RangeInclusive<u32> = 8..=27;

/// (kernel class, `class` label, `origin` label) of the completed-fault classes.
const CLASSES: [(u32, usize, &str, &str); 4] = [
    (class::USER_MINOR, stat::USER_MINOR, "minor", "user"),
    (class::USER_MAJOR, stat::USER_MAJOR, "major", "user"),
    (
        class::POPULATED_MINOR,
        stat::POPULATED_MINOR,
        "minor",
        "populated",
    ),
    (
        class::POPULATED_MAJOR,
        stat::POPULATED_MAJOR,
        "major",
        "populated",
    ),
];

pub struct FaultMetrics {
    names: Arc<NameCap>,
    faults: Family<Labels, Counter>,
    populated_by: Family<Labels, Counter>,
    retried: Family<Labels, Counter>,
    failed: Family<Labels, Counter>,
    latency: LatencyFamily,
    /// The timed major faults' latency again, by kind.
    major_kinds: LatencyFamily,
    /// Seconds of timed faults spent in each cause.
    causes: Family<Labels, Counter<f64, AtomicU64>>,
    /// One fault in this many is timed (`--latency-sample`; 1: every one).
    latency_sample_every: Gauge,
    health: Family<Vec<(&'static str, &'static str)>, Counter>,
    /// What each process's counters stood at when last seen.
    last: Mutex<HashMap<ProcessKey, Seen>>,
}

/// One process's running totals at the last refresh, and its name.
#[derive(Clone, Default)]
struct Seen {
    /// The last name read, for when the process is gone.
    comm: Option<String>,
    counts: [u64; stat::COUNT],
    /// Sparse: most processes have no page populated inside a call.
    populated_by: Buckets,
    /// (kernel class, buckets): a vector, not a map, for the one or two classes a process
    /// has (a B-tree's leaf has room for 11, ~300 bytes for each of 12,288 processes).
    hists: Vec<(u32, Buckets)>,
    cause_ns: [u64; cause::COUNT],
}

impl FaultMetrics {
    pub fn register(registry: &mut Registry, names: Arc<NameCap>) -> Self {
        let m = Self {
            names,
            faults: Family::default(),
            populated_by: Family::default(),
            retried: Family::default(),
            failed: Family::default(),
            latency: LatencyFamily::default(),
            major_kinds: LatencyFamily::default(),
            causes: Family::default(),
            latency_sample_every: Gauge::default(),
            health: Family::default(),
            last: Mutex::default(),
        };
        registry.register(
            "page_faults",
            "Completed page faults, as getrusage counts them: class minor or major; origin \
             user (through the fault exception) or populated (by the kernel inside a call)",
            m.faults.clone(),
        );
        registry.register(
            "page_faults_populated",
            "Faults the kernel took populating pages inside a system call, by that call (the \
             populated origin of page_faults; one per huge page where huge pages back them: \
             the pages are syscall_populated_bytes)",
            m.populated_by.clone(),
        );
        registry.register(
            "page_faults_retried",
            "Faults that returned VM_FAULT_RETRY before completing (fentry/kprobe hooks only)",
            m.retried.clone(),
        );
        registry.register(
            "page_faults_failed",
            "Faults that ended in SIGSEGV/SIGBUS or an error",
            m.failed.clone(),
        );
        registry.register_with_unit(
            "page_fault_latency",
            "Time to resolve a page fault (handle_mm_fault), by class and origin",
            Unit::Seconds,
            m.latency.clone(),
        );
        registry.register_with_unit(
            "page_fault_major_kind_latency",
            "Time to resolve a timed major page fault, by kind: anon_swap_in (anonymous memory, \
             a private file mapping's written pages included, read back from swap), \
             shmem_swap_in, file_read (a file's page read in)",
            Unit::Seconds,
            m.major_kinds.clone(),
        );
        registry.register_with_unit(
            "page_fault_cause",
            "Time timed page faults spent in a cause: direct_reclaim, memcg_reclaim, \
             compaction, throttled (reclaim throttling), off_cpu (switched out outside reclaim and \
             compaction: I/O, a page lock, a CPU); a cause the kernel's hooks cannot \
             time has no series (memlock-trace -v names it)",
            Unit::Seconds,
            m.causes.clone(),
        );
        registry.register(
            "page_fault_latency_sample_every",
            "Faults per one timed in page_fault_latency (--latency-sample N; 1: every fault \
             timed). The page_faults counts are exact",
            m.latency_sample_every.clone(),
        );
        registry.register(
            "fault_health",
            "What the fault hooks could not keep, by kind (the fault_health fields of the JSON \
             summary)",
            m.health.clone(),
        );
        m
    }

    /// Adds each process's growth since the last refresh. `comm_of` names a process as the
    /// syscall series do (its current comm); then its last name read; the comm the kernel
    /// stored with its first fault (before an exec, for a launched command) is the fallback.
    pub fn update(
        &self,
        processes: BTreeMap<ProcessKey, ProcessFaults>,
        hooks: &FaultHooks,
        health: &FaultHealth,
        mut labels_of: impl FnMut(&ProcessKey) -> (Option<String>, String),
    ) {
        self.latency_sample_every
            .set(i64::from(hooks.latency_sample));
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        learned_starts(&mut last, &processes);
        // Processes the kernel no longer holds: a later entry for the pid starts from zero.
        last.retain(|key, _| processes.contains_key(key));
        for (key, p) in processes {
            // Updated in place: a removal and insertion per process left the table's
            // tombstones to a rehash that doubled it (12 MiB at a refresh of 12,288).
            let before = last.entry(key).or_default();
            // Most processes the kernel holds have exited, their counts unchanged: nothing
            // to add, and nothing allocated (a refresh replacing every process's entry
            // scattered them over the heap, which grew 18 MiB in 10 minutes of churn).
            // Every fault, timed or not, shows in the counts.
            if before.counts == p.stats.counts {
                continue;
            }
            // Read each time: a process first seen before its exec must not keep the old name.
            let (comm, cgroup) = labels_of(&key);
            let comm = comm
                .or_else(|| before.comm.take())
                .unwrap_or_else(|| p.stats.name.to_str_lossy().into_owned());
            let c = &p.stats.counts;
            // Only a process with new faults to add takes one of the names that keep their
            // own series (every exported count grows with a completed, retried or failed one).
            let active = CLASSES
                .iter()
                .map(|&(_, index, ..)| index)
                .chain([stat::RETRIED, stat::FAILED])
                .any(|index| growth(c[index], before.counts[index]) > 0);
            if active {
                let base = self.names.labels(comm.clone(), cgroup, key.tgid);
                self.add_growth(&p, before, base, hooks.observes(Unobservable::Retried));
            }
            *before = Seen {
                comm: Some(comm),
                counts: p.stats.counts,
                populated_by: Buckets::from_dense(&p.stats.populated_by),
                hists: p.hists.into_iter().collect(),
                cause_ns: p.stats.cause_ns,
            };
        }
        for (name, total) in [
            ("stats_evicted", health.stats_evicted),
            ("histograms_evicted", health.histograms_evicted),
            ("regions_evicted", health.regions_evicted),
            ("update_failed", health.update_failed),
            ("events_dropped", health.events_dropped),
            ("stacks_dropped", health.stacks_dropped.unwrap_or(0)),
            ("stacks_evicted", health.stacks_evicted.unwrap_or(0)),
        ] {
            super::health::raise(&self.health.get_or_create(&vec![("kind", name)]), total);
        }
    }

    /// Adds what `p`'s counts and histograms grew by since `before` to the series labelled
    /// `base`.
    fn add_growth(&self, p: &ProcessFaults, before: &Seen, base: Labels, retried_observed: bool) {
        let c = &p.stats.counts;
        let with = |extra: &[(&'static str, &str)]| {
            let mut labels = base.clone();
            labels.extend(extra.iter().map(|&(k, v)| (k, v.to_string())));
            labels
        };
        // What the histogram of `kernel_class` grew by, if the process has one.
        let hist_growth = |kernel_class: u32| {
            let buckets = p.hists.get(&kernel_class)?;
            let old = before
                .hists
                .iter()
                .find_map(|(class, b)| (*class == kernel_class).then_some(b));
            Some(bucket_growth::<HIST_BUCKETS>(buckets, old))
        };
        for (kernel_class, index, class_label, origin) in CLASSES {
            let labels = with(&[("class", class_label), ("origin", origin)]);
            let n = growth(c[index], before.counts[index]);
            if n > 0 {
                self.faults.get_or_create(&labels).inc_by(n);
            }
            if let Some(added) = hist_growth(kernel_class) {
                self.latency.add(labels, &added);
            }
        }
        for (kernel_class, kind) in major_kind::CLASSES.into_iter().zip(major_kind::KEYS) {
            if let Some(added) = hist_growth(kernel_class) {
                self.major_kinds.add(with(&[("kind", kind)]), &added);
            }
        }
        for (slot, (name, now)) in populate::NAMES.iter().zip(p.stats.populated_by).enumerate() {
            let n = growth(now, before.populated_by.get(slot));
            if n > 0 {
                self.populated_by
                    .get_or_create(&with(&[("syscall", name)]))
                    .inc_by(n);
            }
        }
        for ((key, now), old) in cause::KEYS
            .iter()
            .zip(p.stats.cause_ns)
            .zip(before.cause_ns)
        {
            let ns = growth(now, old);
            if ns > 0 {
                self.causes
                    .get_or_create(&with(&[("cause", key)]))
                    .inc_by(ns as f64 / 1e9);
            }
        }
        for (observed, index, family) in [
            (retried_observed, stat::RETRIED, &self.retried),
            (true, stat::FAILED, &self.failed),
        ] {
            let n = growth(c[index], before.counts[index]);
            if observed && n > 0 {
                family.get_or_create(&base).inc_by(n);
            }
        }
    }
}

/// Latency histograms built from the kernel's buckets (a prometheus-client `Histogram` takes
/// one observation at a time; the kernel has already counted them).
#[derive(Clone, Debug, Default)]
pub(super) struct LatencyFamily {
    series: std::sync::Arc<Mutex<BTreeMap<Labels, LatencySeries>>>,
}

#[derive(Clone, Debug)]
struct LatencySeries {
    /// Per bound of [`BOUND_SHIFTS`], then +Inf; not cumulative.
    buckets: Vec<u64>,
    /// Seconds, from each kernel bucket's midpoint (good to 1/16 of each value).
    sum: f64,
}

impl LatencyFamily {
    fn add(&self, labels: Labels, kernel: &[u64; HIST_BUCKETS]) {
        self.add_ranges(
            labels,
            kernel
                .iter()
                .enumerate()
                .map(|(b, &n)| (bucket_range(b), n)),
        );
    }

    /// Adds counts of values in `[low, high)` ranges that never straddle a power of two.
    pub(super) fn add_ranges(
        &self,
        labels: Labels,
        ranges: impl Iterator<Item = ((u64, u64), u64)>,
    ) {
        let ranges: Vec<_> = ranges.filter(|(_, n)| *n > 0).collect();
        if ranges.is_empty() {
            return;
        }
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let s = series.entry(labels).or_insert_with(|| LatencySeries {
            buckets: vec![0; BOUND_SHIFTS.count() + 1],
            sum: 0.0,
        });
        for ((low, high), n) in ranges {
            // The first bound at or above every value of the bucket (high is exclusive).
            let slot = BOUND_SHIFTS
                .clone()
                .position(|shift| high <= 1u64 << shift)
                .unwrap_or(BOUND_SHIFTS.count());
            s.buckets[slot] += n;
            s.sum += n as f64 * (low + (high - low) / 2) as f64 / 1e9;
        }
    }
}

impl TypedMetric for LatencyFamily {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyFamily {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        for (labels, s) in series.iter() {
            // Per bucket, not cumulative: the encoder accumulates.
            let buckets: Vec<(f64, u64)> = s
                .buckets
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    let bound = BOUND_SHIFTS
                        .clone()
                        .nth(i)
                        .map_or(f64::INFINITY, |shift| (1u64 << shift) as f64 / 1e9);
                    (bound, n)
                })
                .collect();
            let count = s.buckets.iter().sum();
            let mut family = encoder.encode_family(labels)?;
            family.encode_histogram::<NoLabelSet>(s.sum, count, &buckets, None)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// A process counted by pid before its start was known (start 0: a `-p` target only perf
/// counted, [`crate::faults::read::FaultReport::learn_starts`]) keeps its running totals
/// under its start once a hook met it, so its faults so far are not added twice.
fn learned_starts(
    last: &mut HashMap<ProcessKey, Seen>,
    processes: &BTreeMap<ProcessKey, ProcessFaults>,
) {
    let unstarted: Vec<ProcessKey> = last
        .keys()
        .filter(|k| k.start_ns == 0 && !processes.contains_key(k))
        .copied()
        .collect();
    for old in unstarted {
        let started = ProcessKey { start_ns: 1, ..old }..=ProcessKey {
            start_ns: u64::MAX,
            ..old
        };
        if let Some((&key, _)) = processes.range(started).next()
            && !last.contains_key(&key)
            && let Some(seen) = last.remove(&old)
        {
            last.insert(key, seen);
        }
    }
}

#[cfg(test)]
mod tests;

//! The kernel's aggregation as per-process (and per-thread) figures: counts by class,
//! latency percentiles from the kernel's buckets, faults attributed to mappings
//! ([`super::mappings`]).

use std::collections::{BTreeMap, btree_map::Entry};

use memlock_trace_common::{
    faults::{
        FaultKey, HIST_BUCKETS, HistKey, RegionKey, bucket_range, class, major_kind, populate, stat,
    },
    process::ProcessKey,
};
use serde::Serialize;

use super::mappings::{LeftOut, MappingFaults, RegionSites, add_pages, by_mapping};
use super::{
    FaultHooks, Unobservable,
    read::{FaultReport, KeyStats},
};
use crate::{buckets::Buckets, output::Outside, procfs::MappingCache};

/// Latency of one reported class, from the kernel's log-linear buckets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ClassLatency {
    /// Faults timed.
    pub count: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p99_9: u64,
    /// Exact.
    pub max: u64,
    /// The timed faults' latencies added up, each at its bucket's midpoint (clamped to the
    /// max): within a bucket's width (1/8) of the exact sum. What `advise` weighs faults by.
    pub total: u64,
}

/// A class's faults as (ns, faults) per kernel bucket, each at the bucket's midpoint clamped
/// to the exact max: the values the percentiles are computed from, for `--hist`.
pub fn bucket_values(buckets: &[u64; HIST_BUCKETS], max: u64) -> Vec<(u64, u64)> {
    buckets
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(b, &n)| {
            let (low, high) = bucket_range(b);
            ((low + (high - low) / 2).min(max).max(1), n)
        })
        .collect()
}

impl ClassLatency {
    /// Percentiles interpolated inside the bucket they fall in, taking its faults as spread
    /// evenly across it; the max is the kernel's exact one. Why not each bucket at its
    /// midpoint (as before): a percentile then moves in whole buckets (1/8 of the value), so
    /// two nearly equal distributions, e.g. a sampled one and the exact one, could differ by
    /// 14% at p90 when the rank fell either side of a bucket edge (BENCHMARKS.md, issue 14).
    pub fn from_buckets(buckets: &[u64; HIST_BUCKETS], max: u64) -> Option<Self> {
        let count: u64 = buckets.iter().sum();
        if count == 0 {
            return None;
        }
        let at = |q: f64| quantile(buckets, count, q).min(max);
        Some(Self {
            count,
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            p99_9: at(0.999),
            max,
            total: bucket_values(buckets, max)
                .iter()
                .map(|(ns, n)| ns * n)
                .sum(),
        })
    }
}

/// The value at quantile `q` of `count` faults in kernel buckets, linear inside its bucket.
fn quantile(buckets: &[u64; HIST_BUCKETS], count: u64, q: f64) -> u64 {
    let rank = (q * count as f64).max(1.0);
    let mut before = 0u64;
    for (b, &n) in buckets.iter().enumerate() {
        if n == 0 {
            continue;
        }
        if (before + n) as f64 >= rank {
            let (low, high) = bucket_range(b);
            let within = ((rank - before as f64) / n as f64).clamp(0.0, 1.0);
            return low + ((high - low) as f64 * within) as u64;
        }
        before += n;
    }
    u64::MAX
}

/// One process's (or thread's) faults: the `"faults"` object of the JSON summary.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FaultSummary {
    /// Completed faults, as the kernel's `min_flt`/`maj_flt` count them.
    pub minor: u64,
    pub major: u64,
    /// Taken through the page-fault exception (user code, or the kernel touching user memory).
    pub user: u64,
    /// Populated by the kernel without an exception (mlock, MAP_POPULATE, ...).
    pub populated: u64,
    pub retried: Option<u64>,
    pub failed: Option<u64>,
    /// Populated pages per system call.
    pub populated_by: BTreeMap<&'static str, u64>,
    /// Completed faults in VM_LOCKED / VM_LOCKONFAULT VMAs (hooks that see the VMA).
    pub in_locked_vma: Option<u64>,
    pub in_lockonfault_vma: Option<u64>,
    pub latency_ns: BTreeMap<&'static str, ClassLatency>,
    /// Per class, the (ns, faults) values the percentiles come from (`--hist`).
    #[serde(skip)]
    pub latency_values: BTreeMap<&'static str, Vec<(u64, u64)>>,
    /// Faults counted without a latency (their start was not seen).
    pub latency_unmatched: u64,
    /// `--latency-sample N`: one fault in N was timed (absent: every one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_sample: Option<LatencySample>,
    /// The timed faults' time by cause (absent when faults are not timed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_by_cause: Option<super::causes::TimeByCause>,
    pub by_mapping: Vec<MappingFaults>,
    /// The mappings `--top-mappings` left out of `by_mapping`, and their faults.
    pub by_mapping_left_out: LeftOut,
    /// `--stacks`: the top user call stacks by faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stacks: Option<Vec<crate::faults::stacks::StackFaults>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<ThreadFaults>,
}

/// How latency was sampled: one fault in `every` timed, `timed` of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LatencySample {
    pub every: u32,
    pub timed: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ThreadFaults {
    pub tid: u32,
    pub comm: Outside,
    #[serde(flatten)]
    pub faults: FaultSummary,
}

/// Reported classes and the kernel classes they merge.
const LATENCY_CLASSES: [(&str, &[u32]); 9] = [
    ("minor", &[class::USER_MINOR, class::POPULATED_MINOR]),
    ("major", &[class::USER_MAJOR, class::POPULATED_MAJOR]),
    ("user", &[class::USER_MINOR, class::USER_MAJOR]),
    (
        "populated",
        &[class::POPULATED_MINOR, class::POPULATED_MAJOR],
    ),
    ("retried", &[class::RETRIED]),
    ("failed", &[class::FAILED]),
    (major_kind::ROWS[0], &[major_kind::CLASSES[0]]),
    (major_kind::ROWS[1], &[major_kind::CLASSES[1]]),
    (major_kind::ROWS[2], &[major_kind::CLASSES[2]]),
];

fn summarize_key(
    hists: &BTreeMap<HistKey, Buckets>,
    key: FaultKey,
    s: &KeyStats,
    hooks: &FaultHooks,
) -> FaultSummary {
    let c = &s.counts;
    let sees_vma = hooks.observes(Unobservable::InLockedVma);
    let mut latency_ns = BTreeMap::new();
    let mut latency_values = BTreeMap::new();
    let kinds = hooks.causes.as_ref().is_some_and(|c| c.major_kinds);
    for (name, classes) in LATENCY_CLASSES {
        if !kinds && major_kind::ROWS.contains(&name) {
            continue;
        }
        let mut merged = [0u64; HIST_BUCKETS];
        let mut max = 0;
        for &cls in classes {
            if let Some(h) = hists.get(&HistKey {
                key,
                class: cls,
                _pad: 0,
            }) {
                h.add_to(&mut merged);
            }
            max = max.max(s.max_ns[cls as usize]);
        }
        if let Some(l) = ClassLatency::from_buckets(&merged, max) {
            latency_ns.insert(name, l);
            latency_values.insert(name, bucket_values(&merged, max));
        }
    }
    // Minor and major cover every timed fault: user ones on any set, populated ones on
    // fentry/kprobe (the tracepoint set times none of those).
    let timed = |class: &str| latency_ns.get(class).map_or(0, |l: &ClassLatency| l.count);
    let latency_sample = (hooks.latency_sample > 1).then(|| LatencySample {
        every: hooks.latency_sample,
        timed: timed("minor") + timed("major"),
    });
    FaultSummary {
        minor: c[stat::USER_MINOR] + c[stat::POPULATED_MINOR],
        major: c[stat::USER_MAJOR] + c[stat::POPULATED_MAJOR],
        user: c[stat::USER_MINOR] + c[stat::USER_MAJOR],
        populated: c[stat::POPULATED_MINOR] + c[stat::POPULATED_MAJOR],
        retried: hooks
            .observes(Unobservable::Retried)
            .then_some(c[stat::RETRIED]),
        failed: Some(c[stat::FAILED]),
        populated_by: populate::NAMES
            .iter()
            .zip(s.populated_by)
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| (*name, n))
            .collect(),
        in_locked_vma: sees_vma.then_some(c[stat::IN_LOCKED]),
        in_lockonfault_vma: sees_vma.then_some(c[stat::IN_LOCKONFAULT]),
        latency_ns,
        latency_values,
        latency_unmatched: c[stat::LATENCY_UNMATCHED],
        latency_sample,
        time_by_cause: super::causes::time_by_cause(s, hooks),
        by_mapping: Vec::new(),
        by_mapping_left_out: LeftOut::default(),
        stacks: None,
        threads: Vec::new(),
    }
}

/// A process: its pid and start time, which a reused pid does not share.
fn process_of(key: &FaultKey) -> ProcessKey {
    ProcessKey {
        tgid: key.tgid,
        _pad: 0,
        start_ns: key.start_ns,
    }
}

/// Per-process summaries (with their threads when the kernel kept them per thread), by
/// (pid, start time).
pub fn summarize(
    report: &FaultReport,
    hooks: &FaultHooks,
    mappings: &mut MappingCache,
    top_mappings: usize,
) -> BTreeMap<ProcessKey, (Outside, FaultSummary)> {
    // Fold thread keys into their process; histograms too.
    let mut processes: BTreeMap<ProcessKey, KeyStats> = BTreeMap::new();
    // The histograms only: the whole report's clone held its mappings and regions twice.
    let mut merged = report.hists.clone();
    for (key, s) in &report.stats {
        let p = processes.entry(process_of(key)).or_default();
        p.merge(s);
        if key.tid == key.tgid {
            p.name.clone_from(&s.name);
        }
        if key.tid != 0 {
            for cls in 0..class::COUNT as u32 {
                if let Some(h) = report.hists.get(&HistKey {
                    key: *key,
                    class: cls,
                    _pad: 0,
                }) {
                    merged
                        .entry(HistKey {
                            key: FaultKey {
                                tgid: key.tgid,
                                tid: 0,
                                start_ns: key.start_ns,
                            },
                            class: cls,
                            _pad: 0,
                        })
                        .or_default()
                        .add(h);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    // One read of the sysfs file a summary, not one a process.
    let thp_mode = crate::procfs::thp_mode();
    for (&process, s) in &processes {
        let tgid = process.tgid;
        let key = FaultKey {
            tgid,
            tid: 0,
            start_ns: process.start_ns,
        };
        let mut summary = summarize_key(&merged, key, s, hooks);
        let comm = mappings.comm(tgid).unwrap_or_else(|| s.name.clone());
        let sites: Vec<RegionSites<'_>> = report.stacks.as_ref().map_or(Vec::new(), |stacks| {
            let first = RegionKey {
                tgid,
                ..RegionKey::default()
            };
            stacks
                .sites
                .range(first..)
                .take_while(|(key, _)| key.tgid == tgid)
                .collect()
        });
        (summary.by_mapping, summary.by_mapping_left_out) = by_mapping(
            report.regions.get(&tgid).map_or(&[][..], Vec::as_slice),
            &sites,
            report.mappings.get(&tgid).unwrap_or(&BTreeMap::new()),
            mappings.get(tgid).map(|maps| (maps, mappings.file())),
            // Gone (or never read: gone before the first read).
            (mappings.exited(tgid) || mappings.get(tgid).is_none()).then(|| mappings.noted(tgid)),
            top_mappings,
        );
        if hooks.plan.counted_by_perf() {
            // Counted at each fault's start: whether it was major is not known there.
            summary.by_mapping.iter_mut().for_each(|m| m.majors = None);
            summary.by_mapping_left_out.majors = None;
        }
        add_pages(
            &mut summary.by_mapping,
            mappings.get(tgid).unwrap_or_default(),
            mappings.unmapped(tgid),
            thp_mode,
        );
        summary.threads = report
            .stats
            .iter()
            .filter(|(k, _)| process_of(k) == process && k.tid != 0)
            .map(|(k, ts)| ThreadFaults {
                tid: k.tid,
                // The kernel keeps a thread's comm from its first fault; the main thread's
                // follows an exec through the process's latest name.
                comm: if k.tid == tgid {
                    comm.clone()
                } else {
                    ts.name.clone()
                },
                faults: summarize_key(&report.hists, *k, ts, hooks),
            })
            .collect();
        out.insert(process, (comm, summary));
    }
    out
}

/// One process's counters and latency buckets, its threads folded in: what the Prometheus
/// fault series are made of (the text and JSON summary come from [`summarize`]).
#[derive(Clone, Debug, Default)]
pub struct ProcessFaults {
    pub stats: KeyStats,
    /// Kernel latency class ([`class`]) -> its log-linear buckets (the metrics keep one of
    /// these for every process the kernel maps hold).
    pub hists: BTreeMap<u32, Buckets>,
}

/// Every process in `stats` and `hists` (a report's), threads folded into their process.
/// Taken by value: a process's only key (threads not kept apart) moves, not copied, so a
/// refresh holds one copy of every process the kernel maps hold, not two.
pub fn by_process(
    stats: BTreeMap<FaultKey, KeyStats>,
    hists: BTreeMap<HistKey, Buckets>,
) -> BTreeMap<ProcessKey, ProcessFaults> {
    let mut out: BTreeMap<ProcessKey, ProcessFaults> = BTreeMap::new();
    for (key, s) in stats {
        let p = match out.entry(process_of(&key)) {
            Entry::Vacant(slot) => {
                slot.insert(ProcessFaults {
                    stats: s,
                    hists: BTreeMap::new(),
                });
                continue;
            }
            Entry::Occupied(slot) => slot.into_mut(),
        };
        p.stats.merge(&s);
        if key.tid == key.tgid {
            p.stats.name = s.name;
        }
    }
    for (hk, buckets) in hists {
        let p = out.entry(process_of(&hk.key)).or_default();
        match p.hists.entry(hk.class) {
            Entry::Vacant(slot) => {
                slot.insert(buckets);
            }
            Entry::Occupied(mut slot) => slot.get_mut().add(&buckets),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use memlock_trace_common::faults::bucket_of;

    use super::*;

    #[test]
    fn latency_from_buckets_is_within_a_bucket() {
        let mut buckets = [0u64; HIST_BUCKETS];
        // 1000 faults at 1..=1000 us.
        for us in 1..=1000u64 {
            buckets[bucket_of(us * 1000)] += 1;
        }
        let l = ClassLatency::from_buckets(&buckets, 1_000_000).unwrap();
        assert_eq!(l.count, 1000);
        assert_eq!(l.max, 1_000_000);
        for (got, want) in [(l.p50, 500_000), (l.p90, 900_000), (l.p99, 990_000)] {
            assert!(got.abs_diff(want) * 8 <= want, "{got} vs {want}: {l:?}");
        }
        assert!(l.p99_9 <= l.max && l.p99_9 >= l.p99);
        // 1..=1000 us add up to 500.5 ms.
        assert!(l.total.abs_diff(500_500_000) * 16 <= 500_500_000, "{l:?}");
        assert_eq!(ClassLatency::from_buckets(&[0; HIST_BUCKETS], 0), None);
    }

    #[test]
    fn percentiles_move_smoothly_across_a_bucket_edge() {
        // Faults spread evenly over 1000..3000 ns, and the same shifted by 2%: p90 (2800 ns)
        // sits near the 2816 ns bucket edge, where midpoints jumped a whole bucket.
        let spread = |shift: f64| {
            let mut buckets = [0u64; HIST_BUCKETS];
            for i in 0..10_000u64 {
                let ns = ((1000 + i / 5) as f64 * shift) as u64;
                buckets[bucket_of(ns)] += 1;
            }
            ClassLatency::from_buckets(&buckets, 4000).unwrap()
        };
        let (a, b) = (spread(1.0), spread(1.02));
        for (x, y) in [(a.p50, b.p50), (a.p90, b.p90), (a.p99, b.p99)] {
            let ratio = y as f64 / x as f64;
            assert!((0.99..1.06).contains(&ratio), "{x} vs {y}: {a:?} {b:?}");
        }
        assert!(a.p90.abs_diff(2800) * 50 <= 2800, "{a:?}");
    }
}

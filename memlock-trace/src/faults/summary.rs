//! The kernel's aggregation as per-process (and per-thread) figures: counts by class,
//! latency percentiles from the kernel's buckets, faults attributed to mappings.

use std::collections::{BTreeMap, HashMap as StdHashMap};

use hdrhistogram::Histogram;
use memlock_trace_common::{
    faults::{
        FaultKey, HIST_BUCKETS, HistKey, RegionKey, RegionValue, bucket_range, class, populate,
        stat,
    },
    vma::{VM_LOCKED, VM_LOCKONFAULT},
};
use serde::Serialize;

use super::{
    FaultHooks,
    read::{FaultReport, KeyStats},
    sizing::REGION_SHIFT,
};
use crate::{
    latency::Latency,
    procfs::{Mapping, MappingCache},
};

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
    /// Each bucket's faults are recorded at the bucket's midpoint (so percentiles are good to
    /// half a bucket, 1/16 of the value); the max is the kernel's exact one.
    pub fn from_buckets(buckets: &[u64; HIST_BUCKETS], max: u64) -> Option<Self> {
        let mut h = Histogram::<u64>::new(3).expect("3 significant figures is valid");
        let mut count = 0;
        for (mid, n) in bucket_values(buckets, max) {
            // Auto-resizing: recording cannot fail.
            let _ = h.record_n(mid, n);
            count += n;
        }
        if count == 0 {
            return None;
        }
        let Latency { p50, p90, p99, .. } = Latency::of(&h);
        let clamp = |v: u64| v.min(max);
        Some(Self {
            count,
            p50: clamp(p50),
            p90: clamp(p90),
            p99: clamp(p99),
            p99_9: clamp(h.value_at_quantile(0.999)),
            max,
        })
    }
}

/// A mapping's share of a process's faults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MappingFaults {
    /// `[heap]`, `[stack]`, a file path, `anonymous`; `unmapped` when no current mapping holds
    /// the address any more, `unknown` when the process's mappings could not be read (it
    /// exited before a snapshot) or the address is outside the last ones read before it
    /// exited. Neighbouring runs outside every mapping are one row, `start` to `end`.
    pub mapping: String,
    pub start: String,
    pub end: String,
    pub faults: u64,
    /// `VM_LOCKED` / `VM_LOCKONFAULT` of the VMA: as the fault hook saw it (`"vma"`), or from
    /// `/proc/PID/smaps` when the summary was made (`"smaps"`), or, for an exited process's
    /// VMA known only from an mlock-family call, as that call left it (`"call"`), or unknown.
    pub locked: Option<bool>,
    pub lockonfault: Option<bool>,
    pub locked_source: &'static str,
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
    /// `--latency-sample N`: one exception fault in N was timed (absent: every one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_sample: Option<LatencySample>,
    pub by_mapping: Vec<MappingFaults>,
    /// `--stacks`: the top user call stacks by faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stacks: Option<Vec<crate::faults::stacks::StackFaults>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<ThreadFaults>,
}

/// How latency was sampled: one exception fault in `every` timed, `timed` of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LatencySample {
    pub every: u32,
    pub timed: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ThreadFaults {
    pub tid: u32,
    pub comm: String,
    #[serde(flatten)]
    pub faults: FaultSummary,
}

/// Reported classes and the kernel classes they merge.
const LATENCY_CLASSES: [(&str, &[u32]); 6] = [
    ("minor", &[class::USER_MINOR, class::POPULATED_MINOR]),
    ("major", &[class::USER_MAJOR, class::POPULATED_MAJOR]),
    ("user", &[class::USER_MINOR, class::USER_MAJOR]),
    (
        "populated",
        &[class::POPULATED_MINOR, class::POPULATED_MAJOR],
    ),
    ("retried", &[class::RETRIED]),
    ("failed", &[class::FAILED]),
];

fn summarize_key(
    report: &FaultReport,
    key: FaultKey,
    s: &KeyStats,
    hooks: &FaultHooks,
) -> FaultSummary {
    let c = &s.counts;
    let observed = |name: &str| !hooks.unobserved.contains(&name);
    let mut latency_ns = BTreeMap::new();
    let mut latency_values = BTreeMap::new();
    for (name, classes) in LATENCY_CLASSES {
        let mut merged = [0u64; HIST_BUCKETS];
        let mut max = 0;
        for &cls in classes {
            if let Some(h) = report.hists.get(&HistKey {
                key,
                class: cls,
                _pad: 0,
            }) {
                for (m, x) in merged.iter_mut().zip(h) {
                    *m += x;
                }
            }
            max = max.max(s.max_ns[cls as usize]);
        }
        if let Some(l) = ClassLatency::from_buckets(&merged, max) {
            latency_ns.insert(name, l);
            latency_values.insert(name, bucket_values(&merged, max));
        }
    }
    let latency_sample = (hooks.latency_sample > 1).then(|| LatencySample {
        every: hooks.latency_sample,
        timed: latency_ns.get("user").map_or(0, |l: &ClassLatency| l.count),
    });
    FaultSummary {
        minor: c[stat::USER_MINOR] + c[stat::POPULATED_MINOR],
        major: c[stat::USER_MAJOR] + c[stat::POPULATED_MAJOR],
        user: c[stat::USER_MINOR] + c[stat::USER_MAJOR],
        populated: c[stat::POPULATED_MINOR] + c[stat::POPULATED_MAJOR],
        retried: observed("retried").then_some(c[stat::RETRIED]),
        failed: observed("failed").then_some(c[stat::FAILED]),
        populated_by: populate::NAMES
            .iter()
            .zip(s.populated_by)
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| (*name, n))
            .collect(),
        in_locked_vma: observed("in_locked_vma").then_some(c[stat::IN_LOCKED]),
        in_lockonfault_vma: observed("in_locked_vma").then_some(c[stat::IN_LOCKONFAULT]),
        latency_ns,
        latency_values,
        latency_unmatched: c[stat::LATENCY_UNMATCHED],
        latency_sample,
        by_mapping: Vec::new(),
        stacks: None,
        threads: Vec::new(),
    }
}

fn add_counts(into: &mut KeyStats, from: &KeyStats) {
    for (a, b) in into.counts.iter_mut().zip(from.counts) {
        *a += b;
    }
    for (a, b) in into.populated_by.iter_mut().zip(from.populated_by) {
        *a += b;
    }
    for (a, b) in into.max_ns.iter_mut().zip(from.max_ns) {
        *a = (*a).max(b);
    }
}

/// Per-process summaries (with their threads when the kernel kept them per thread).
pub fn summarize(
    report: &FaultReport,
    hooks: &FaultHooks,
    mappings: &mut MappingCache,
    top_mappings: usize,
) -> BTreeMap<u32, (String, FaultSummary)> {
    // Fold thread keys into their process; histograms too.
    let mut processes: BTreeMap<u32, KeyStats> = BTreeMap::new();
    let mut merged = report.clone();
    for (key, s) in &report.stats {
        let p = processes.entry(key.tgid).or_default();
        add_counts(p, s);
        if p.comm.is_empty() || key.tid == key.tgid {
            p.comm.clone_from(&s.comm);
        }
        if key.tid != 0 {
            for cls in 0..class::COUNT as u32 {
                if let Some(h) = report.hists.get(&HistKey {
                    key: *key,
                    class: cls,
                    _pad: 0,
                }) {
                    let total = merged
                        .hists
                        .entry(HistKey {
                            key: FaultKey {
                                tgid: key.tgid,
                                tid: 0,
                            },
                            class: cls,
                            _pad: 0,
                        })
                        .or_insert([0; HIST_BUCKETS]);
                    for (t, x) in total.iter_mut().zip(h) {
                        *t += x;
                    }
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    for (&tgid, s) in &processes {
        let key = FaultKey { tgid, tid: 0 };
        let mut summary = summarize_key(&merged, key, s, hooks);
        let comm = mappings.comm(tgid).unwrap_or_else(|| s.comm.clone());
        summary.by_mapping = by_mapping(
            report.regions.get(&tgid).map_or(&[][..], Vec::as_slice),
            mappings.get(tgid),
            // Gone (or never read: gone before the first read).
            (mappings.exited(tgid) || mappings.get(tgid).is_none()).then(|| mappings.noted(tgid)),
            top_mappings,
        );
        summary.threads = report
            .stats
            .iter()
            .filter(|(k, _)| k.tgid == tgid && k.tid != 0)
            .map(|(k, ts)| ThreadFaults {
                tid: k.tid,
                // The kernel keeps a thread's comm from its first fault; the main thread's
                // follows an exec through the process's latest name.
                comm: if k.tid == tgid {
                    comm.clone()
                } else {
                    ts.comm.clone()
                },
                faults: summarize_key(report, *k, ts, hooks),
            })
            .collect();
        out.insert(tgid, (comm, summary));
    }
    out
}

/// One process's counters and latency buckets, its threads folded in: what the Prometheus
/// fault series are made of (the text and JSON summary come from [`summarize`]).
#[derive(Clone, Debug, Default)]
pub struct ProcessFaults {
    pub stats: KeyStats,
    /// Kernel latency class ([`class`]) -> its log-linear buckets.
    pub hists: BTreeMap<u32, [u64; HIST_BUCKETS]>,
}

/// Every process in `report`, threads folded into their process.
pub fn by_process(report: &FaultReport) -> BTreeMap<u32, ProcessFaults> {
    let mut out: BTreeMap<u32, ProcessFaults> = BTreeMap::new();
    for (key, s) in &report.stats {
        let p = out.entry(key.tgid).or_default();
        add_counts(&mut p.stats, s);
        if p.stats.comm.is_empty() || key.tid == key.tgid {
            p.stats.comm.clone_from(&s.comm);
        }
    }
    for (hk, buckets) in &report.hists {
        let p = out.entry(hk.key.tgid).or_default();
        let total = p.hists.entry(hk.class).or_insert([0; HIST_BUCKETS]);
        for (t, x) in total.iter_mut().zip(buckets) {
            *t += x;
        }
    }
    out
}

/// Attributes region counts to the process's mappings and returns the top `top` by faults.
/// `exited`: `maps` are the last seen before the process exited, so an address outside them
/// is unknown (mapped after they were read), not unmapped, unless a VMA an mlock-family call
/// saw since holds it (`noted`, newest last).
pub fn by_mapping(
    regions: &[(RegionKey, RegionValue)],
    maps: Option<&[Mapping]>,
    exited: Option<&[Mapping]>,
    top: usize,
) -> Vec<MappingFaults> {
    let mut per_mapping: StdHashMap<(u64, u64), MappingFaults> = StdHashMap::new();
    // Runs no mapping holds, merged below into spans of neighbouring runs.
    let mut outside: Vec<(u64, u64)> = Vec::new();
    let unattributed = if maps.is_none() || exited.is_some() {
        "unknown"
    } else {
        "unmapped"
    };
    for (key, value) in regions {
        // The key is a VMA start or the page of a run's first fault: the mapping that
        // contains it.
        let holds = |m: &&Mapping| m.start <= key.start && key.start < m.end;
        let found = maps
            .and_then(|maps| maps.iter().find(holds).map(|m| (m, "smaps")))
            .or_else(|| {
                let noted = exited?.iter().rev().find(holds)?;
                Some((noted, "call"))
            });
        let (range, mut entry) = match found {
            Some((m, source)) => (
                (m.start, m.end),
                MappingFaults {
                    mapping: m.name.clone(),
                    start: format!("{:#x}", m.start),
                    end: format!("{:#x}", m.end),
                    faults: 0,
                    locked: Some(m.locked),
                    lockonfault: m.lockonfault,
                    locked_source: source,
                },
            ),
            None if key.exact == 0 => {
                outside.push((key.start, value.faults));
                continue;
            }
            None => (
                (key.start, key.start),
                MappingFaults {
                    mapping: unattributed.into(),
                    start: format!("{:#x}", key.start),
                    end: String::new(),
                    faults: 0,
                    locked: None,
                    lockonfault: None,
                    locked_source: "unknown",
                },
            ),
        };
        if key.exact != 0 {
            // The hook read the VMA's own flags at fault time: better than a later snapshot.
            entry.locked = Some(value.vm_flags & VM_LOCKED != 0);
            entry.lockonfault = Some(value.vm_flags & VM_LOCKONFAULT != 0);
            entry.locked_source = "vma";
        }
        let slot = per_mapping.entry(range).or_insert(entry);
        slot.faults += value.faults;
        if key.exact != 0 {
            slot.locked = Some(slot.locked == Some(true) || value.vm_flags & VM_LOCKED != 0);
            slot.lockonfault =
                Some(slot.lockonfault == Some(true) || value.vm_flags & VM_LOCKONFAULT != 0);
        }
    }
    let mut list: Vec<MappingFaults> = per_mapping.into_values().collect();
    list.extend(
        spans(outside)
            .into_iter()
            .map(|(start, end, faults)| MappingFaults {
                mapping: unattributed.into(),
                start: format!("{start:#x}"),
                end: format!("{end:#x}"),
                faults,
                locked: None,
                lockonfault: None,
                locked_source: "unknown",
            }),
    );
    list.sort_by(|a, b| b.faults.cmp(&a.faults).then_with(|| a.start.cmp(&b.start)));
    list.truncate(top);
    list
}

/// Runs of faults (first page, faults) outside every known mapping, as (start, end, faults)
/// spans: a run in the same or the next `1 << REGION_SHIFT` window as the span before it
/// continues that span (an 8 MiB region touched in order is one span, not 128 rows). The end
/// is the end of the last run's window.
fn spans(mut runs: Vec<(u64, u64)>) -> Vec<(u64, u64, u64)> {
    let window = 1u64 << REGION_SHIFT;
    runs.sort_unstable();
    let mut spans: Vec<(u64, u64, u64)> = Vec::new();
    for (start, faults) in runs {
        let window_end = (start & !(window - 1)) + window;
        match spans.last_mut() {
            Some(span) if start < span.1 + window => {
                span.1 = span.1.max(window_end);
                span.2 += faults;
            }
            _ => spans.push((start, window_end, faults)),
        }
    }
    spans
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
        assert_eq!(ClassLatency::from_buckets(&[0; HIST_BUCKETS], 0), None);
    }

    fn mapping(start: u64, end: u64, name: &str, locked: bool) -> Mapping {
        Mapping {
            start,
            end,
            offset: 0,
            name: name.into(),
            locked,
            lockonfault: Some(false),
        }
    }

    #[test]
    fn regions_attribute_to_mappings() {
        let maps = [
            mapping(0x10000, 0x40000, "[heap]", false),
            mapping(0x48000, 0x58000, "/lib/x.so", true),
        ];
        let region = |start, faults| {
            let key = RegionKey {
                tgid: 1,
                exact: 0,
                start,
            };
            (
                key,
                RegionValue {
                    faults,
                    vm_flags: 0,
                },
            )
        };
        let regions = [
            region(0x10000, 16),
            region(0x20000, 4),
            // The page of a run's first fault, inside the library.
            region(0x49000, 3),
            region(0x90000, 1),
        ];
        let list = by_mapping(&regions, Some(&maps), None, 10);
        assert_eq!(list.len(), 3, "{list:?}");
        assert_eq!((list[0].mapping.as_str(), list[0].faults), ("[heap]", 20));
        assert_eq!(
            (list[1].mapping.as_str(), list[1].faults, list[1].locked),
            ("/lib/x.so", 3, Some(true))
        );
        assert_eq!((list[2].mapping.as_str(), list[2].faults), ("unmapped", 1));
        assert_eq!(by_mapping(&regions, Some(&maps), None, 1).len(), 1);
    }

    #[test]
    fn neighbouring_runs_outside_every_mapping_are_one_row_and_exited_is_not_unmapped() {
        let maps = [mapping(0x10000, 0x40000, "[heap]", false)];
        let run = |start, faults| {
            let key = RegionKey {
                tgid: 1,
                exact: 0,
                start,
            };
            let value = RegionValue {
                faults,
                vm_flags: 0,
            };
            (key, value)
        };
        // 8 MiB touched in order (runs of 16 pages, one per 64 KiB window, the first one
        // starting mid-window), then a lone run far away.
        let base = 0x7f00_0000_0000u64;
        let mut regions: Vec<_> = (0..128)
            .map(|i| run(base + 0x3000 + i * 0x10000, 16))
            .collect();
        regions.push(run(base + 0x1000_0000, 2));
        for (exited, label) in [(None, "unmapped"), (Some(&[][..]), "unknown")] {
            let list = by_mapping(&regions, Some(&maps), exited, 10);
            let rows: Vec<_> = list
                .iter()
                .map(|m| {
                    (
                        m.mapping.as_str(),
                        m.faults,
                        m.start.as_str(),
                        m.end.as_str(),
                    )
                })
                .collect();
            assert_eq!(
                rows,
                [
                    (label, 2048, "0x7f0000003000", "0x7f0000800000"),
                    (label, 2, "0x7f0010000000", "0x7f0010010000"),
                ]
            );
        }
    }

    #[test]
    fn an_exited_process_region_known_from_an_mlock_call_is_named_by_it() {
        let maps = [mapping(0x10000, 0x40000, "[heap]", false)];
        let run = |start| {
            let key = RegionKey {
                tgid: 1,
                exact: 0,
                start,
            };
            let value = RegionValue {
                faults: 16,
                vm_flags: 0,
            };
            (key, value)
        };
        let regions = [run(0x100000), run(0x110000), run(0x900000)];
        // Locked, then unlocked: the newest state counts.
        let noted = [
            mapping(0x100000, 0x200000, "VMA seen by mlock2", true),
            mapping(0x100000, 0x200000, "VMA seen by munlock", false),
        ];
        let list = by_mapping(&regions, Some(&maps), Some(&noted), 10);
        let rows: Vec<_> = list
            .iter()
            .map(|m| (m.mapping.as_str(), m.faults, m.locked, m.locked_source))
            .collect();
        assert_eq!(
            rows,
            [
                ("VMA seen by munlock", 32, Some(false), "call"),
                ("unknown", 16, None, "unknown"),
            ]
        );
    }

    #[test]
    fn exact_regions_use_the_vma_flags() {
        let maps = [mapping(0x10000, 0x40000, "anonymous", false)];
        let regions = [(
            RegionKey {
                tgid: 1,
                exact: 1,
                start: 0x10000,
            },
            RegionValue {
                faults: 5,
                vm_flags: VM_LOCKED | 0x3,
            },
        )];
        let list = by_mapping(&regions, Some(&maps), None, 10);
        assert_eq!(list[0].locked, Some(true));
        assert_eq!(list[0].locked_source, "vma");
    }
}

//! Reads the kernel's fault aggregation back: the maps the CPUs share, and the per-CPU
//! values (the sole target's, the region runs) summed over CPUs.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    maps::{HashMap, IterableMap as _, MapData, PerCpuArray},
};
use memlock_trace_common::causes::cause;
use memlock_trace_common::faults::{
    FaultEntry, FaultKey, FaultStats, HIST_BUCKETS, Hist, HistKey, RegionKey, RegionSlot,
    RegionValue, SLOTS, class, fault_counter, names, stat,
};
use memlock_trace_common::mapping::MappingInfo;
use serde::Serialize;

use super::stacks::StackReport;
use crate::buckets::Buckets;
use crate::{map_batch, object::map, output::Outside, per_cpu::CpuCounters};

/// Everything the kernel aggregated, summed over CPUs.
#[derive(Clone, Debug, Default)]
pub struct FaultReport {
    pub stats: BTreeMap<FaultKey, KeyStats>,
    pub hists: BTreeMap<HistKey, Buckets>,
    /// Faults per region, per process.
    pub regions: BTreeMap<u32, Vec<(RegionKey, RegionValue)>>,
    /// The VMAs the fault hooks identified, per process, by start.
    pub mappings: BTreeMap<u32, BTreeMap<u64, MappingInfo>>,
    /// Faults per user call stack (`--stacks`).
    pub stacks: Option<StackReport>,
    pub health: FaultHealth,
}

impl FaultReport {
    /// (map, entries read) of the maps that hold per-process state.
    pub fn map_entries(&self) -> [(&'static str, usize); 3] {
        [
            (names::FAULT_STATS, self.stats.len()),
            (names::FAULT_HIST, self.hists.len()),
            (
                names::FAULT_REGIONS,
                self.regions.values().map(Vec::len).sum(),
            ),
        ]
    }

    /// Adds the faults counting perf events counted per process (count-only mode), keyed
    /// by pid alone until [`Self::learn_starts`].
    pub fn add_counted(&mut self, counted: BTreeMap<u32, (u64, u64)>) {
        for (tgid, (minor, major)) in counted {
            let s = self.stats.entry(unstarted(tgid)).or_default();
            s.counts[stat::USER_MINOR] += minor;
            s.counts[stat::USER_MAJOR] += major;
        }
    }

    /// Gives the figures counted by pid alone (the fast path's, the perf counters') the
    /// start `start_of` knows for the pid. Called after every count is read: the programs
    /// record a process's start before they count its first fault, so a start read after
    /// the counts covers each of them; one still unknown (a `-p` target whose faults only
    /// perf counted, before any hook met it) stays at 0 until one does.
    pub fn learn_starts(&mut self, start_of: impl Fn(u32) -> u64) {
        let known = |key: &FaultKey| {
            (key.start_ns == 0)
                .then(|| start_of(key.tgid))
                .filter(|&start| start != 0)
                .map(|start_ns| FaultKey { start_ns, ..*key })
        };
        rekey(&mut self.stats, known, |into, s| into.merge(&s));
        rekey(
            &mut self.hists,
            |h| {
                Some(HistKey {
                    key: known(&h.key)?,
                    ..*h
                })
            },
            |into, h| into.add(&h),
        );
    }
}

/// Moves each entry `new_key` gives a new key to under it, `merge`d with one already there.
fn rekey<K: Ord + Copy, V: Default>(
    map: &mut BTreeMap<K, V>,
    new_key: impl Fn(&K) -> Option<K>,
    merge: impl Fn(&mut V, V),
) {
    let moved: Vec<(K, K)> = map.keys().filter_map(|k| Some((*k, new_key(k)?))).collect();
    for (from, to) in moved {
        if let Some(value) = map.remove(&from) {
            merge(map.entry(to).or_default(), value);
        }
    }
}

/// The key of figures counted by pid, before the process's start is known.
fn unstarted(tgid: u32) -> FaultKey {
    FaultKey {
        tgid,
        tid: 0,
        start_ns: 0,
    }
}

/// One key's counters, summed over CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyStats {
    pub counts: [u64; stat::COUNT],
    pub populated_by: [u64; SLOTS],
    pub max_ns: [u64; SLOTS],
    /// The timed faults' time in each cause, and the slowest one's parts (see
    /// `FaultStats`).
    pub cause_ns: [u64; cause::COUNT],
    pub slowest_ns: u64,
    pub slowest_cause_ns: [u64; cause::COUNT],
    /// The comm of the first fault, exact (Prometheus labels take it lossy, when needed).
    pub name: Outside,
}

/// The fault hooks' own health.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FaultHealth {
    /// Processes (threads) whose statistics the bounded LRU map evicted: their counts are
    /// lost. Non-zero means the map is too small for this machine's process count.
    pub stats_evicted: u64,
    pub histograms_evicted: u64,
    pub regions_evicted: u64,
    /// Faults not counted because a map update failed.
    pub update_failed: u64,
    /// Sampled fault events lost to a full ring buffer.
    pub events_dropped: u64,
    /// `--stacks` only: sampled faults whose stack was lost to a full ring buffer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stacks_dropped: Option<u64>,
    /// `--stacks` only: always 0 since stacks are summed in user space.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stacks_evicted: Option<u64>,
    /// `--stacks` only: one fault in this many keeps its stack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stacks_sample_every: Option<u32>,
    /// `--stacks` only: how the kept stacks were unwound, and what they lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack_unwinding: Option<crate::unwind::StackHealth>,
}

/// Points the fault hooks' single-process fast path at `tgid` (0 turns it off).
pub fn set_sole_target(ebpf: &mut Ebpf, tgid: u32) -> Result<()> {
    let map = ebpf
        .map_mut(names::FAULT_SOLE_TGID)
        .ok_or_else(|| anyhow!("map {} missing", names::FAULT_SOLE_TGID))?;
    let mut sole: aya::maps::Array<&mut MapData, u32> = aya::maps::Array::try_from(map)?;
    sole.set(0, tgid, 0)
        .with_context(|| format!("setting the fault fast path's target to {tgid}"))
}

/// The processes that have fault statistics.
pub fn pids(ebpf: &Ebpf) -> Result<BTreeSet<u32>> {
    let stats: HashMap<&MapData, FaultKey, FaultStats> =
        HashMap::try_from(map(ebpf, names::FAULT_STATS)?)?;
    Ok(stats
        .keys()
        .filter_map(Result::ok)
        .map(|k| k.tgid)
        .collect())
}

/// Reads every fault map. Pending region caches are folded into their regions, and faults
/// still pending in threads that no longer exist are counted as failed.
/// `sole`: the process the single-process fast path counted for, if it was used (its
/// figures keyed by pid alone until [`FaultReport::learn_starts`]).
pub fn read(ebpf: &Ebpf, per_thread: bool, sole: Option<u32>) -> Result<FaultReport> {
    let mut report = FaultReport::default();
    let counters = CpuCounters::open(ebpf, names::FAULT_COUNTERS)?;
    let sum = |index: u32| counters.sum(index).unwrap_or(0);
    // The insert counters before the maps: a live session reads the maps while faults go on,
    // and a key inserted meanwhile must not count as evicted (inserts minus keys seen).
    let inserts = [
        fault_counter::STATS_INSERTS,
        fault_counter::HIST_INSERTS,
        fault_counter::REGION_INSERTS,
    ]
    .map(sum);
    let stats_hashed = read_stats(ebpf, &mut report)?;
    let sole_minor = match sole {
        Some(sole) => read_sole(ebpf, sole, &mut report)?,
        None => None,
    };
    let hists_hashed = read_hists(ebpf, &mut report)?;
    if let Some((key, buckets)) = sole_minor {
        let slot = report
            .hists
            .entry(HistKey {
                key,
                class: class::USER_MINOR,
                _pad: 0,
            })
            .or_default();
        slot.add(&buckets);
    }
    let regions_hashed = read_regions(ebpf, &mut report)?;
    read_mappings(ebpf, &mut report)?;
    count_failed_pending(ebpf, &mut report, per_thread)?;
    report.health = FaultHealth {
        stats_evicted: inserts[0].saturating_sub(stats_hashed),
        histograms_evicted: inserts[1].saturating_sub(hists_hashed),
        regions_evicted: inserts[2].saturating_sub(regions_hashed),
        update_failed: sum(fault_counter::UPDATE_FAILED),
        events_dropped: sum(fault_counter::EVENTS_DROPPED),
        // Set by the tracer with --stacks.
        stacks_dropped: None,
        stacks_evicted: None,
        stacks_sample_every: None,
        stack_unwinding: None,
    };
    Ok(report)
}

impl KeyStats {
    /// Adds one CPU's (or the shared map's) counters of the key.
    fn add(&mut self, v: &FaultStats) {
        for (sum, x) in self.counts.iter_mut().zip(v.counts) {
            *sum += x;
        }
        for (sum, x) in self.populated_by.iter_mut().zip(v.populated_by) {
            *sum += x;
        }
        for (max, x) in self.max_ns.iter_mut().zip(v.max_ns) {
            *max = (*max).max(x);
        }
        let slowest = v.slowest_cause_ns.map(u64::from);
        self.add_causes(&v.cause_ns, u64::from(v.slowest_ns), &slowest);
        if self.name.is_empty() {
            self.name = crate::event::comm_of(&v.comm);
        }
    }

    /// Adds another key's counters (its name only where this has none).
    pub fn merge(&mut self, from: &KeyStats) {
        for (a, b) in self.counts.iter_mut().zip(from.counts) {
            *a += b;
        }
        for (a, b) in self.populated_by.iter_mut().zip(from.populated_by) {
            *a += b;
        }
        for (a, b) in self.max_ns.iter_mut().zip(from.max_ns) {
            *a = (*a).max(b);
        }
        self.add_causes(&from.cause_ns, from.slowest_ns, &from.slowest_cause_ns);
        if self.name.is_empty() {
            self.name = from.name.clone();
        }
    }

    fn add_causes(
        &mut self,
        cause_ns: &[u64; cause::COUNT],
        slowest: u64,
        parts: &[u64; cause::COUNT],
    ) {
        for (sum, x) in self.cause_ns.iter_mut().zip(cause_ns) {
            *sum += x;
        }
        if slowest > self.slowest_ns {
            self.slowest_ns = slowest;
            self.slowest_cause_ns = *parts;
        }
    }
}

/// The statistics map; returns the keys it held.
fn read_stats(ebpf: &Ebpf, report: &mut FaultReport) -> Result<u64> {
    let stats: HashMap<&MapData, FaultKey, FaultStats> =
        HashMap::try_from(map(ebpf, names::FAULT_STATS)?)?;
    let mut hashed = 0u64;
    for (key, value) in map_batch::entries::<FaultKey, FaultStats>(stats.map())? {
        report.stats.entry(key).or_default().add(&value);
        hashed += 1;
    }
    Ok(hashed)
}

/// The single-process fast path's statistics: the same process's, by another road. Returns
/// its minor-fault histogram, for the histograms read next.
fn read_sole(
    ebpf: &Ebpf,
    tgid: u32,
    report: &mut FaultReport,
) -> Result<Option<(FaultKey, Buckets)>> {
    let fast: PerCpuArray<&MapData, FaultStats> =
        PerCpuArray::try_from(map(ebpf, names::FAULT_SOLE_STATS)?)?;
    let values = fast.get(&0, 0)?;
    if !values.iter().any(|v| v.comm[0] != 0) {
        return Ok(None);
    }
    let key = unstarted(tgid);
    let entry = report.stats.entry(key).or_default();
    for v in values.iter() {
        entry.add(v);
    }
    let hist: PerCpuArray<&MapData, Hist> =
        PerCpuArray::try_from(map(ebpf, names::FAULT_SOLE_HIST)?)?;
    let mut buckets = [0; HIST_BUCKETS];
    for v in hist.get(&0, 0)?.iter() {
        for (s, &c) in buckets.iter_mut().zip(v.counts.iter()) {
            *s += u64::from(c);
        }
    }
    let buckets = Buckets::from_dense(&buckets);
    Ok((!buckets.is_empty()).then_some((key, buckets)))
}

/// The latency histograms; returns the keys the map held.
fn read_hists(ebpf: &Ebpf, report: &mut FaultReport) -> Result<u64> {
    let hists: HashMap<&MapData, HistKey, Hist> = HashMap::try_from(map(ebpf, names::FAULT_HIST)?)?;
    // One kernel histogram at a time: the whole map decoded at once was 8 MiB more.
    map_batch::for_each::<HistKey, Hist>(hists.map(), |key, value| {
        let buckets = Buckets::from_dense(&value.counts);
        report.hists.entry(key).or_default().add(&buckets);
    })?;
    Ok(report.hists.len() as u64)
}

/// The faults per region: the hash map's, and what the per-CPU runs and region tables hold
/// and have not moved to it yet. Returns the keys the hash map held.
fn read_regions(ebpf: &Ebpf, report: &mut FaultReport) -> Result<u64> {
    let regions: HashMap<&MapData, RegionKey, RegionValue> =
        HashMap::try_from(map(ebpf, names::FAULT_REGIONS)?)?;
    let mut region_sums: BTreeMap<RegionKey, RegionValue> = BTreeMap::new();
    for (key, value) in map_batch::entries::<RegionKey, RegionValue>(regions.map())? {
        add_region(&mut region_sums, key, &value);
    }
    let hashed = region_sums.len() as u64;
    for name in [names::FAULT_REGION_RUN, names::FAULT_REGION_SLOTS] {
        let slots: PerCpuArray<&MapData, RegionSlot> = PerCpuArray::try_from(map(ebpf, name)?)?;
        map_batch::for_each_per_cpu(slots.map(), |_: u32, values: &[RegionSlot]| {
            for slot in values.iter().filter(|s| s.value.faults > 0) {
                add_region(&mut region_sums, slot.key, &slot.value);
            }
        })?;
    }
    for (key, value) in region_sums {
        report
            .regions
            .entry(key.tgid)
            .or_default()
            .push((key, value));
    }
    Ok(hashed)
}

fn add_region(sums: &mut BTreeMap<RegionKey, RegionValue>, key: RegionKey, value: &RegionValue) {
    let sum = sums.entry(key).or_default();
    sum.faults += value.faults;
    sum.majors += value.majors;
    sum.vm_flags |= value.vm_flags;
}

/// The VMAs the fault hooks identified, per process.
fn read_mappings(ebpf: &Ebpf, report: &mut FaultReport) -> Result<()> {
    let identified: HashMap<&MapData, RegionKey, MappingInfo> =
        HashMap::try_from(map(ebpf, names::FAULT_MAPPINGS)?)?;
    for (key, info) in map_batch::entries::<RegionKey, MappingInfo>(identified.map())? {
        report
            .mappings
            .entry(key.tgid)
            .or_default()
            .insert(key.start, info);
    }
    Ok(())
}

/// A fault still pending in a thread that is gone never completed: it failed (the process
/// died of it, typically).
fn count_failed_pending(ebpf: &Ebpf, report: &mut FaultReport, per_thread: bool) -> Result<()> {
    let entries: HashMap<&MapData, u32, FaultEntry> =
        HashMap::try_from(map(ebpf, names::FAULT_ENTRY)?)?;
    for (tid, entry) in map_batch::entries::<u32, FaultEntry>(entries.map())? {
        if entry.pending != 0 && !Path::new(&format!("/proc/{}/task/{tid}", entry.tgid)).exists() {
            let tid = if per_thread { tid } else { 0 };
            // The entry has no start time: the latest process with the pid is the one.
            if let Some((_, s)) = report
                .stats
                .iter_mut()
                .filter(|(k, _)| k.tgid == entry.tgid && k.tid == tid)
                .max_by_key(|(k, _)| k.start_ns)
            {
                s.counts[stat::FAILED] += 1;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pid 7's fast-path figures, read under start 0, join the entry its threads' hooks keyed
    /// under its start 500; pid 8, whose start no hook recorded, keeps 0.
    #[test]
    fn figures_counted_by_pid_take_the_start_read_after_them() {
        let mut report = FaultReport::default();
        for (key, minor) in [
            (unstarted(7), 3),
            (
                FaultKey {
                    start_ns: 500,
                    ..unstarted(7)
                },
                4,
            ),
            (unstarted(8), 5),
        ] {
            report.stats.entry(key).or_default().counts[stat::USER_MINOR] = minor;
            let hist = HistKey {
                key,
                class: class::USER_MINOR,
                _pad: 0,
            };
            let mut dense = [0u64; HIST_BUCKETS];
            dense[1] = minor;
            report.hists.insert(hist, Buckets::from_dense(&dense));
        }
        report.learn_starts(|tgid| if tgid == 7 { 500 } else { 0 });
        let minors: Vec<(u32, u64, u64)> = report
            .stats
            .iter()
            .map(|(k, s)| (k.tgid, k.start_ns, s.counts[stat::USER_MINOR]))
            .collect();
        assert_eq!(minors, [(7, 500, 7), (8, 0, 5)]);
        let timed: Vec<(u32, u64, u64)> = report
            .hists
            .iter()
            .map(|(h, b)| {
                let mut dense = [0u64; HIST_BUCKETS];
                b.add_to(&mut dense);
                (h.key.tgid, h.key.start_ns, dense.iter().sum())
            })
            .collect();
        assert_eq!(timed, [(7, 500, 7), (8, 0, 5)]);
    }
}

//! Reads the kernel's counts of mlock-family calls (`SYSCALL_STATS`) back and puts them in the summary: the counts, errors, pages and latency buckets
//! there are the kernel's, exact whatever the ring buffer dropped; the events add only what
//! needs a record per call (the figures of the last failure, per-thread latencies).

use std::collections::BTreeMap;

use anyhow::Result;
use aya::{
    EbpfLoader,
    maps::{HashMap, IterableMap as _, MapData},
};
use memlock_trace_common::{
    process::ProcessKey,
    syscalls::{
        MAX_SYSCALL_KEYS, SyscallFigures, SyscallKey, SyscallStats, latency_slot_range, names,
        syscall_counter,
    },
};
use serde::Serialize;

use super::{ProcessSyscalls, SyscallSummary};
use crate::{
    event::{Syscall, errno_name},
    latency::Latency,
    output::Outside,
    per_cpu::CpuCounters,
    process::counts::growth,
};

/// One key's figures, summed over CPUs.
pub type KeyCounts = SyscallFigures<u64>;

/// Everything `SYSCALL_STATS` holds.
#[derive(Clone, Debug, Default)]
pub struct SyscallReport {
    pub counts: BTreeMap<SyscallKey, KeyCounts>,
    pub health: SyscallHealth,
}

/// What the kernel could not keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SyscallHealth {
    /// (process, call, outcome) entries the bounded LRU map evicted: their calls are missing
    /// from the summary (not from Prometheus, which had counted them).
    pub evicted: u64,
    /// Calls not counted because the map update failed.
    pub update_failed: u64,
}

/// Keys when a handful of processes is traced (a command or `-p`, without their children):
/// five calls and a few outcomes each.
const FEW_PROCESS_KEYS: u32 = 1024;

/// Sizes `SYSCALL_STATS`: shared by the CPUs, [`MAX_SYSCALL_KEYS`] on any machine. With
/// `few_processes`, [`FEW_PROCESS_KEYS`]: creating the map at 16384 keys took 13 ms of a
/// short command's session.
pub fn prepare_loader(loader: &mut EbpfLoader<'_>, few_processes: bool) -> Result<()> {
    let entries = if few_processes {
        FEW_PROCESS_KEYS
    } else {
        MAX_SYSCALL_KEYS
    };
    loader.map_max_entries(names::SYSCALL_STATS, entries);
    Ok(())
}

pub fn read(ebpf: &aya::Ebpf) -> Result<SyscallReport> {
    let map = |name: &str| crate::object::map(ebpf, name);
    let counters = CpuCounters::open(ebpf, names::SYSCALL_COUNTERS)?;
    let sum = |index: u32| counters.sum(index).unwrap_or(0);
    // Before the map: a key inserted while it is read must not count as evicted.
    let inserts = sum(syscall_counter::INSERTS);
    let stats: HashMap<&MapData, SyscallKey, SyscallStats> =
        HashMap::try_from(map(names::SYSCALL_STATS)?)?;
    let mut report = SyscallReport::default();
    for (key, v) in crate::map_batch::entries::<SyscallKey, SyscallStats>(stats.map())? {
        let c = report.counts.entry(key).or_default();
        {
            c.calls += v.calls;
            c.pages_populated += v.pages_populated;
            c.faults_populated += v.faults_populated;
            c.pages_locked += v.pages_locked;
            c.pages_unlocked += v.pages_unlocked;
            c.max_ns = c.max_ns.max(v.max_ns);
            for (s, &n) in c.latency.iter_mut().zip(v.latency.iter()) {
                *s += u64::from(n);
            }
        }
    }
    report.health = SyscallHealth {
        evicted: inserts.saturating_sub(report.counts.len() as u64),
        update_failed: sum(syscall_counter::UPDATE_FAILED),
    };
    Ok(report)
}

impl SyscallReport {
    /// What was counted since `before` (an interval's own calls).
    pub fn since(&self, before: &SyscallReport) -> SyscallReport {
        let mut counts = BTreeMap::new();
        for (key, now) in &self.counts {
            let then = before.counts.get(key).copied().unwrap_or_default();
            // Fewer calls than before: the entry was evicted and made anew, and all of it is
            // new ([`growth`]'s rule, judged on the calls for the whole entry).
            let then = if now.calls < then.calls {
                KeyCounts::default()
            } else {
                then
            };
            if now.calls == then.calls {
                continue;
            }
            let mut latency = now.latency;
            for (n, t) in latency.iter_mut().zip(then.latency) {
                *n = growth(*n, t);
            }
            counts.insert(
                *key,
                KeyCounts {
                    calls: now.calls - then.calls,
                    pages_populated: growth(now.pages_populated, then.pages_populated),
                    faults_populated: growth(now.faults_populated, then.faults_populated),
                    pages_locked: growth(now.pages_locked, then.pages_locked),
                    pages_unlocked: growth(now.pages_unlocked, then.pages_unlocked),
                    max_ns: now.max_ns,
                    latency,
                },
            );
        }
        SyscallReport {
            counts,
            health: self.health,
        }
    }

    /// Per process, per call: the counts over every outcome, and the errors by errno.
    fn by_process(&self) -> BTreeMap<ProcessKey, BTreeMap<Syscall, CallTotals>> {
        let mut out: BTreeMap<ProcessKey, BTreeMap<Syscall, CallTotals>> = BTreeMap::new();
        for (key, c) in &self.counts {
            let Some(syscall) = Syscall::from_nr(key.nr) else {
                continue;
            };
            let process = ProcessKey {
                tgid: key.tgid,
                _pad: 0,
                start_ns: key.start_ns,
            };
            let t = out.entry(process).or_default().entry(syscall).or_default();
            t.all.calls += c.calls;
            t.all.pages_populated += c.pages_populated;
            t.all.faults_populated += c.faults_populated;
            t.all.pages_locked += c.pages_locked;
            t.all.pages_unlocked += c.pages_unlocked;
            t.all.max_ns = t.all.max_ns.max(c.max_ns);
            for (s, n) in t.all.latency.iter_mut().zip(c.latency) {
                *s += n;
            }
            if let Some(errno) = errno_name(-i64::from(key.errno)) {
                *t.errors.entry(errno).or_default() += c.calls;
            }
        }
        out
    }
}

#[derive(Default)]
struct CallTotals {
    all: KeyCounts,
    errors: BTreeMap<String, u64>,
}

/// The summary's calls: the kernel's counts for every process it counted, with what only
/// the events know (the last failure's figures, per-thread latencies) added where they
/// arrived. A process's name is the one `name_of` gives (its identity), else its events'.
///
/// Latency percentiles: the events' HdrHistogram (3 significant digits) when it saw every
/// call the kernel counted, else the kernel's log2 slots (within a factor of two, the
/// maximum exact).
/// Every process either side has: the summary's `fold` caps the list it shows.
///
/// `counted` is everything the kernel holds now (for an interval `kernel` is only its
/// growth): an event whose call `counted` knows belongs to whichever interval the kernel
/// counted it in, which is not this one when the record arrived a moment after the count
/// was read. Only calls the kernel lost (an evicted entry) are taken from the events.
pub fn merge(
    events: Vec<ProcessSyscalls>,
    kernel: &SyscallReport,
    counted: &SyscallReport,
    name_of: impl Fn(&ProcessKey) -> Option<Outside>,
) -> Vec<ProcessSyscalls> {
    let mut from_events: BTreeMap<ProcessKey, ProcessSyscalls> = events
        .into_iter()
        .map(|p| {
            (
                ProcessKey {
                    tgid: p.pid,
                    _pad: 0,
                    start_ns: p.start_ns,
                },
                p,
            )
        })
        .collect();
    let mut out = Vec::new();
    let mut kernel_only = Vec::new();
    for (key, calls) in kernel.by_process() {
        let known = from_events.contains_key(&key);
        let mut p = from_events.remove(&key).unwrap_or_else(|| ProcessSyscalls {
            pid: key.tgid,
            start_ns: key.start_ns,
            comm: Outside::default(),
            syscalls: BTreeMap::new(),
            threads: BTreeMap::new(),
        });
        if let Some(name) = name_of(&key) {
            p.comm = name;
        }
        for (syscall, t) in calls {
            let seen = p.syscalls.remove(syscall.name());
            let exact = seen.as_ref().filter(|s| s.count == t.all.calls);
            let (latency_ns, latency_values) = match exact {
                Some(s) => (s.latency_ns, s.latency_values.clone()),
                None => slots_latency(&t.all),
            };
            p.syscalls.insert(
                syscall.name(),
                SyscallSummary {
                    count: t.all.calls,
                    errors: t.errors,
                    last_failure: seen.map(|s| s.last_failure).unwrap_or_default(),
                    latency_ns,
                    latency_values,
                    pages_populated: t.all.pages_populated,
                    faults_populated: t.all.faults_populated,
                    pages_locked: t.all.pages_locked as i64 - t.all.pages_unlocked as i64,
                },
            );
        }
        if known {
            out.push(p);
        } else {
            kernel_only.push(p);
        }
    }
    // Processes whose kernel entries were evicted keep what their events said.
    let counted = counted.by_process();
    for (key, mut p) in from_events {
        if let Some(calls) = counted.get(&key) {
            p.syscalls
                .retain(|name, _| !calls.keys().any(|s| s.name() == *name));
        }
        if !p.syscalls.is_empty() {
            out.push(p);
        }
    }
    out.extend(kernel_only);
    out.sort_by_key(|p| (p.pid, p.start_ns));
    out
}

/// Percentiles from log2 slots, each value taken as the middle of its slot (the maximum is
/// exact), and the (ns, calls) pairs for `--hist`.
fn slots_latency(c: &KeyCounts) -> (Latency, Vec<(u64, u64)>) {
    let mid = |slot: usize| {
        let (low, high) = latency_slot_range(slot);
        if high == u64::MAX {
            low
        } else {
            low + (high - low) / 2
        }
    };
    let values: Vec<(u64, u64)> = c
        .latency
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(slot, &n)| (mid(slot).min(c.max_ns), n))
        .collect();
    let total: u64 = values.iter().map(|(_, n)| n).sum();
    let at = |q: f64| {
        let rank = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for &(v, n) in &values {
            seen += n;
            if seen >= rank {
                return v;
            }
        }
        c.max_ns
    };
    let latency = if total == 0 {
        Latency::default()
    } else {
        Latency {
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: c.max_ns,
        }
    };
    (latency, values)
}

/// Kernel counts for the tests of what is built on them (here and the metrics).
#[cfg(test)]
pub(crate) mod fixtures {
    use memlock_trace_common::syscalls::{LATENCY_SLOTS, SyscallKey, latency_slot};

    use super::{KeyCounts, SyscallReport};
    use crate::event::Syscall;

    pub(crate) fn key(tgid: u32, start_ns: u64, syscall: Syscall, errno: u32) -> SyscallKey {
        SyscallKey {
            tgid,
            nr: syscall.nr(),
            start_ns,
            errno,
            _pad: 0,
        }
    }

    /// `calls` calls of 4 pages each, in `faults_per_call` faults, each taking `ns`.
    pub(crate) fn counts(calls: u64, ns: u64, faults_per_call: u64) -> KeyCounts {
        let mut latency = [0; LATENCY_SLOTS];
        latency[latency_slot(ns)] = calls;
        KeyCounts {
            calls,
            pages_populated: 4 * calls,
            faults_populated: faults_per_call * calls,
            pages_locked: 4 * calls,
            pages_unlocked: 0,
            max_ns: ns,
            latency,
        }
    }

    /// A report of these kernel counts, as one refresh reads them.
    pub(crate) fn report<const N: usize>(counts: [(SyscallKey, KeyCounts); N]) -> SyscallReport {
        SyscallReport {
            counts: counts.into(),
            ..SyscallReport::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        fixtures::{key, report},
        *,
    };

    fn counts(calls: u64, ns: u64) -> KeyCounts {
        super::fixtures::counts(calls, ns, 4)
    }

    #[test]
    fn kernel_counts_win_and_events_fill_in_names_and_failures() {
        let kernel = report([
            (key(7, 100, Syscall::Mlock, 0), counts(98, 3_000)),
            (key(7, 100, Syscall::Mlock, 12), counts(2, 500)),
            // Same pid, a later process: apart.
            (key(7, 900, Syscall::Munlock, 0), counts(1, 1_000)),
        ]);
        let merged = merge(Vec::new(), &kernel, &kernel, |k| {
            Some(if k.start_ns == 100 { "first" } else { "second" }.into())
        });
        assert_eq!(merged.len(), 2);
        let mlock = &merged[0].syscalls["mlock"];
        assert_eq!((merged[0].comm.to_str(), mlock.count), (Some("first"), 100));
        assert_eq!(mlock.errors["ENOMEM"], 2);
        assert_eq!(mlock.pages_populated, 400);
        // 98 of 100 in the 2048..4096 ns slot, the maximum exact.
        assert!(
            (2048..4096).contains(&mlock.latency_ns.p50),
            "{:?}",
            mlock.latency_ns
        );
        assert_eq!(mlock.latency_ns.max, 3_000);
        assert_eq!(merged[1].syscalls["munlock"].count, 1);
        assert_eq!(merged[1].comm, "second");
    }

    #[test]
    fn a_call_counted_in_an_earlier_interval_is_not_counted_again_from_its_late_record() {
        let late_record = || ProcessSyscalls {
            pid: 7,
            start_ns: 1,
            comm: "w".into(),
            syscalls: BTreeMap::from([(
                "mlock",
                SyscallSummary {
                    count: 1,
                    errors: BTreeMap::new(),
                    last_failure: BTreeMap::new(),
                    latency_ns: Latency::default(),
                    latency_values: Vec::new(),
                    pages_populated: 4,
                    faults_populated: 4,
                    pages_locked: 4,
                },
            )]),
            threads: Default::default(),
        };
        let counted = report([(key(7, 1, Syscall::Mlock, 0), counts(1, 3_000))]);
        let this_interval = counted.since(&counted);
        let merged = merge(vec![late_record()], &this_interval, &counted, |_| None);
        assert!(merged.is_empty(), "{merged:?}");
        // Evicted from the kernel's map: the record is all there is.
        let merged = merge(
            vec![late_record()],
            &SyscallReport::default(),
            &SyscallReport::default(),
            |_| None,
        );
        assert_eq!(merged[0].syscalls["mlock"].count, 1);
    }

    #[test]
    fn an_interval_is_the_growth() {
        let before = report([(key(7, 1, Syscall::Mlock, 0), counts(10, 3_000))]);
        let now = report([
            (key(7, 1, Syscall::Mlock, 0), counts(25, 3_000)),
            (key(8, 1, Syscall::Mlock, 0), counts(1, 3_000)),
        ]);
        let d = now.since(&before);
        assert_eq!(d.counts[&key(7, 1, Syscall::Mlock, 0)].calls, 15);
        assert_eq!(
            d.counts[&key(7, 1, Syscall::Mlock, 0)]
                .latency
                .iter()
                .sum::<u64>(),
            15
        );
        assert_eq!(d.counts[&key(8, 1, Syscall::Mlock, 0)].calls, 1);
    }
}

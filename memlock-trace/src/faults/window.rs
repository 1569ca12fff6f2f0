//! One interval's faults: the difference of two readings of the kernel's cumulative maps,
//! so `--interval` blocks show what happened in their window (as libbpf-tools clearing its
//! maps would) while the maps keep counting for the whole session's summary.

use memlock_trace_common::faults::{FaultKey, HIST_BUCKETS, HistKey, SLOTS, bucket_range};

use super::read::FaultReport;
use crate::{
    buckets::Buckets,
    process::counts::{bucket_growth, growth},
};

impl FaultReport {
    /// What was counted after `earlier` (a previous reading of the same maps). A key the LRU
    /// evicted and re-created in between can read lower than before: all it counts is new
    /// ([`growth`], the rule the Prometheus series follow too).
    /// The largest latency of a window is exact when it raised the session's maximum,
    /// otherwise it is the top of the window's highest latency bucket (within 1/8).
    pub fn since(&self, earlier: &FaultReport) -> FaultReport {
        let mut window = self.clone();
        for (key, hist) in &mut window.hists {
            let unstarted = HistKey {
                key: not_yet_started(key.key),
                ..*key
            };
            if let Some(old) = earlier.hists.get(key).or(earlier.hists.get(&unstarted)) {
                *hist = Buckets::from_dense(&bucket_growth::<HIST_BUCKETS>(hist, Some(old)));
            }
        }
        window.hists.retain(|_, h| !h.is_empty());
        for (key, stats) in &mut window.stats {
            let old = earlier.stats.get(key);
            let Some(old) = old.or(earlier.stats.get(&not_yet_started(*key))) else {
                continue;
            };
            for (n, o) in stats.counts.iter_mut().zip(old.counts) {
                *n = growth(*n, o);
            }
            for (n, o) in stats.populated_by.iter_mut().zip(old.populated_by) {
                *n = growth(*n, o);
            }
            for (n, o) in stats.cause_ns.iter_mut().zip(old.cause_ns) {
                *n = growth(*n, o);
            }
            if stats.slowest_ns == old.slowest_ns {
                // Not this window's: its slowest fault with a cause is not known.
                stats.slowest_ns = 0;
            }
            for class in 0..SLOTS {
                if stats.max_ns[class] != old.max_ns[class] {
                    continue; // raised in this window: exact
                }
                let top = window
                    .hists
                    .get(&HistKey {
                        key: *key,
                        class: class as u32,
                        _pad: 0,
                    })
                    .and_then(|h| h.last())
                    .map_or(0, |b| bucket_range(b).1 - 1);
                stats.max_ns[class] = stats.max_ns[class].min(top);
            }
        }
        window.stats.retain(|_, s| s.counts.iter().any(|&n| n > 0));
        for (tgid, regions) in &mut window.regions {
            if let Some(old) = earlier.regions.get(tgid) {
                for (key, value) in regions.iter_mut() {
                    if let Some((_, o)) = old.iter().find(|(k, _)| k == key) {
                        // Not [`growth`]: a region's total is read from the hash map, then
                        // the per-CPU runs, then the slots, while the programs move counts
                        // from runs to slots to the map; a count that moved between two of
                        // the reads is missed or read twice, once. Taking the lower reading
                        // after it as all new counted the whole total again (an interval row
                        // of 31,147 faults in a 16,384-page table); the difference leaves
                        // the next window to make it up.
                        value.faults = value.faults.saturating_sub(o.faults);
                    }
                }
            }
            regions.retain(|(_, v)| v.faults > 0);
        }
        if let (Some(now), Some(old)) = (&mut window.stacks, &earlier.stacks) {
            for (key, n) in &mut now.counts {
                *n = growth(*n, old.counts.get(key).copied().unwrap_or(0));
            }
            now.counts.retain(|_, n| *n > 0);
            for (region, sites) in &mut now.sites {
                let old = old.sites.get(region);
                for (stack, n) in sites.iter_mut() {
                    *n = growth(*n, old.and_then(|o| o.get(stack)).copied().unwrap_or(0));
                }
                sites.retain(|_, n| *n > 0);
            }
            now.sites.retain(|_, sites| !sites.is_empty());
        }
        window
    }
}

/// `key` as a reading made before the process's start was known has it: figures counted
/// by pid alone keep start 0 until a hook meets the process ([`FaultReport::learn_starts`]:
/// a `-p` target whose faults only perf counted). Without it, the window after the start
/// was learned took the process's whole count as new (988 + 2,048 for 2,048 faults).
fn not_yet_started(key: FaultKey) -> FaultKey {
    FaultKey { start_ns: 0, ..key }
}

#[cfg(test)]
mod tests {
    use memlock_trace_common::faults::{FaultKey, HIST_BUCKETS, bucket_of, class, stat};

    use super::*;
    use crate::{buckets::Buckets, faults::read::KeyStats};

    /// The one process of every reading.
    const KEY: FaultKey = FaultKey {
        tgid: 7,
        tid: 0,
        start_ns: 1,
    };

    fn reading(faults: u64, latencies: &[u64]) -> FaultReport {
        let mut r = FaultReport::default();
        let mut s = KeyStats::default();
        s.counts[stat::USER_MINOR] = faults;
        s.max_ns[class::USER_MINOR as usize] = latencies.iter().copied().max().unwrap_or(0);
        r.stats.insert(KEY, s);
        let mut h = [0u64; HIST_BUCKETS];
        for &ns in latencies {
            h[bucket_of(ns)] += 1;
        }
        let hk = HistKey {
            key: KEY,
            class: class::USER_MINOR,
            _pad: 0,
        };
        r.hists.insert(hk, Buckets::from_dense(&h));
        r
    }

    /// A window's user minor faults, and how many latencies its histogram holds.
    fn counted(window: &FaultReport) -> (u64, u64) {
        let faults = window.stats[&KEY].counts[stat::USER_MINOR];
        let hist = window.hists.values().next().unwrap();
        (faults, hist.iter().map(|(_, n)| n).sum())
    }

    #[test]
    fn a_window_holds_only_its_own_faults() {
        let first = reading(3, &[1_000, 2_000, 50_000]);
        let second = reading(5, &[1_000, 2_000, 50_000, 3_000, 4_000]);
        let w = second.since(&first);
        assert_eq!(counted(&w), (2, 2));
        let s = &w.stats[&KEY];
        // The session max (50 us) was not this window's: the window's top bucket bounds it.
        let max = s.max_ns[class::USER_MINOR as usize];
        assert!((4_000..4_608).contains(&max), "{max}");
        // Nothing new: the process has no window entry.
        assert!(second.since(&second).stats.is_empty());
    }

    /// Issue 46 point 8: a key the LRU evicted and re-created reads lower than before; what
    /// it counts is all new, as in the Prometheus series (it read 0 here before).
    #[test]
    fn an_evicted_and_recreated_key_is_all_new() {
        let first = reading(9, &[1_000, 1_000, 1_000]);
        let second = reading(2, &[1_000, 50_000]);
        assert_eq!(counted(&second.since(&first)), (2, 2));
    }

    /// The first reading of a `-p` target came before its start was known (start 0): the
    /// next window holds only the faults made since, not the whole count again.
    #[test]
    fn a_start_learned_between_readings_is_the_same_process() {
        let mut first = reading(988, &[1_000]);
        let unstarted = FaultKey { start_ns: 0, ..KEY };
        let stats = first.stats.remove(&KEY).unwrap();
        first.stats.insert(unstarted, stats);
        first.hists = std::mem::take(&mut first.hists)
            .into_iter()
            .map(|(k, h)| {
                (
                    HistKey {
                        key: unstarted,
                        ..k
                    },
                    h,
                )
            })
            .collect();
        let second = reading(2_048, &[1_000, 2_000]);
        assert_eq!(counted(&second.since(&first)), (1_060, 1));
    }

    /// A region read low once (its slot moved to the hash map between the reads) adds
    /// nothing to that window, and the next window makes it up: the windows sum to the
    /// session's total, never past it.
    #[test]
    fn a_region_read_low_once_counts_no_fault_twice() {
        use memlock_trace_common::faults::{RegionKey, RegionValue};
        let key = RegionKey {
            tgid: 7,
            exact: 0,
            start: 0x1000,
        };
        let with_region = |faults| {
            let mut r = reading(1, &[]);
            let value = RegionValue {
                faults,
                majors: 0,
                vm_flags: 0,
            };
            r.regions.insert(7, vec![(key, value)]);
            r
        };
        let readings = [
            with_region(0),
            with_region(5_000),
            with_region(4_000),
            with_region(9_000),
        ];
        let windows: Vec<u64> = readings
            .windows(2)
            .map(|w| {
                let window = w[1].since(&w[0]);
                window
                    .regions
                    .get(&7)
                    .and_then(|r| r.first())
                    .map_or(0, |(_, v)| v.faults)
            })
            .collect();
        assert_eq!(windows, [5_000, 0, 5_000]);
    }

    /// `--stacks`: a window's mapping stacks are the samples kept in it.
    #[test]
    fn a_window_holds_only_its_own_sampled_stacks() {
        use memlock_trace_common::faults::RegionKey;

        use crate::{faults::stacks::StackReport, unwind::Stack};
        let region = |start| RegionKey {
            tgid: 7,
            exact: 1,
            start,
        };
        let (a, b): (Stack, Stack) = ([0x10u64][..].into(), [0x20u64][..].into());
        let with_sites = |sites: &[(u64, &Stack, u64)]| {
            let mut r = reading(1, &[]);
            let mut report = StackReport::default();
            for &(start, stack, n) in sites {
                report
                    .sites
                    .entry(region(start))
                    .or_default()
                    .insert(Stack::clone(stack), n);
            }
            r.stacks = Some(report);
            r
        };
        let first = with_sites(&[(0x1000, &a, 4), (0x2000, &b, 1)]);
        let second = with_sites(&[(0x1000, &a, 6), (0x1000, &b, 2), (0x2000, &b, 1)]);
        let w = second.since(&first);
        let sites = &w.stacks.unwrap().sites;
        assert_eq!(sites.len(), 1, "{sites:?}");
        let in_first = &sites[&region(0x1000)];
        assert_eq!((in_first[&a], in_first[&b]), (2, 2), "{sites:?}");
    }
}

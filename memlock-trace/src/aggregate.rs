//! Per-process, per-syscall statistics, and the summary built from them.
//!
//! Syscall events are rare (one per call), so every latency is recorded exactly in an
//! HdrHistogram here in user space.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::{
    decode::SyscallRecord,
    faults::{FaultHealth, FaultHooks, FaultSummary},
    processes::ProcessTable,
    syscall::Syscall,
    tracer::Health,
};

/// Per process, keyed by (pid, start time) so a reused pid never mixes two processes.
#[derive(Default)]
pub struct Aggregator {
    processes: ProcessTable<ProcessStats>,
}

struct ProcessStats {
    comm: String,
    syscalls: BTreeMap<Syscall, SyscallStats>,
}

struct SyscallStats {
    count: u64,
    errors: BTreeMap<String, u64>,
    latency: Histogram<u64>,
    pages_populated: u64,
    pages_locked: i64,
}

impl SyscallStats {
    fn new() -> Self {
        Self {
            count: 0,
            errors: BTreeMap::new(),
            // 3 significant digits, auto-resizing: exact enough for ns latencies of any size.
            latency: Histogram::new(3).expect("3 significant figures is a valid precision"),
            pages_populated: 0,
            pages_locked: 0,
        }
    }
}

impl Aggregator {
    /// Keeps at most `max` processes (`--max-processes`).
    pub fn with_max_processes(max: usize) -> Self {
        Self {
            processes: ProcessTable::with_capacity(max),
        }
    }

    pub fn record_syscall(&mut self, rec: &SyscallRecord) {
        let process = self
            .processes
            .get_or_insert_with(rec.process(), || ProcessStats {
                comm: String::new(),
                syscalls: BTreeMap::new(),
            });
        // The comm of the last event wins: it follows an exec.
        process.comm = rec.comm();
        let stats = process
            .syscalls
            .entry(rec.syscall)
            .or_insert_with(SyscallStats::new);
        stats.count += 1;
        if let Some(errno) = crate::syscall::errno_name(rec.raw.ret) {
            *stats.errors.entry(errno).or_default() += 1;
        }
        record_latency(&mut stats.latency, rec.raw.duration_ns);
        stats.pages_populated += rec.pages_populated();
        stats.pages_locked += rec.pages_locked();
    }

    /// Processes evicted from the table so far (`--max-processes`).
    pub fn evicted_processes(&self) -> u64 {
        self.processes.evicted()
    }

    pub fn summary(&self, mut health: Health) -> Summary {
        health.processes.evicted_processes = self.processes.evicted();
        Summary {
            kind: "summary",
            schema: crate::render::JSON_SCHEMA,
            processes: self
                .processes
                .iter()
                .map(|(key, p)| ProcessSummary {
                    pid: key.tgid,
                    start_ns: key.start_ns,
                    comm: p.comm.clone(),
                    syscalls: p
                        .syscalls
                        .iter()
                        .map(|(s, st)| (s.name(), st.summary()))
                        .collect(),
                    faults: None,
                })
                .collect(),
            dropped_events: health.dropped_events,
            health,
            fault_hooks: None,
            fault_health: None,
        }
    }
}

/// Records into an auto-resizing histogram (`saturating_record` would clamp to the current,
/// tiny, range instead of growing it).
pub fn record_latency(histogram: &mut Histogram<u64>, ns: u64) {
    if histogram.record(ns.max(1)).is_err() {
        histogram.saturating_record(ns.max(1));
    }
}

impl SyscallStats {
    fn summary(&self) -> SyscallSummary {
        SyscallSummary {
            count: self.count,
            errors: self.errors.clone(),
            latency_ns: Latency::of(&self.latency),
            pages_populated: self.pages_populated,
            pages_locked: self.pages_locked,
        }
    }
}

/// The final (or periodic) report; serialises to the documented JSON summary line.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub schema: u32,
    pub processes: Vec<ProcessSummary>,
    pub dropped_events: u64,
    pub health: Health,
    /// The page-fault hook set used, and why better ones were refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault_hooks: Option<FaultHooks>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault_health: Option<FaultHealth>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProcessSummary {
    pub pid: u32,
    /// Process start, ns since boot (`/proc/PID/stat` field 22 is this in clock ticks).
    pub start_ns: u64,
    pub comm: String,
    pub syscalls: BTreeMap<&'static str, SyscallSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults: Option<FaultSummary>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SyscallSummary {
    pub count: u64,
    pub errors: BTreeMap<String, u64>,
    pub latency_ns: Latency,
    pub pages_populated: u64,
    pub pages_locked: i64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Latency {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        }
    }
}

impl Summary {
    pub fn process(&self, pid: u32) -> Option<&ProcessSummary> {
        self.processes.iter().find(|p| p.pid == pid)
    }

    /// Adds each process's faults, creating the processes that faulted without making a
    /// traced syscall. The fault comm (from /proc or the kernel) fills in missing ones.
    pub fn add_faults(
        &mut self,
        hooks: FaultHooks,
        health: FaultHealth,
        faults: BTreeMap<u32, (String, FaultSummary)>,
    ) {
        for (pid, (comm, summary)) in faults {
            match self.processes.iter_mut().find(|p| p.pid == pid) {
                Some(p) => p.faults = Some(summary),
                None => self.processes.push(ProcessSummary {
                    pid,
                    // Fault counts are kept per tgid in the kernel: no start time to show.
                    start_ns: 0,
                    comm,
                    syscalls: BTreeMap::new(),
                    faults: Some(summary),
                }),
            }
        }
        self.processes.sort_by_key(|p| p.pid);
        self.fault_hooks = Some(hooks);
        self.fault_health = Some(health);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(syscall: Syscall, tgid: u32, ret: i64, duration_ns: u64, pages: u64) -> SyscallRecord {
        SyscallRecord::fixture(
            syscall,
            tgid,
            ret,
            duration_ns,
            pages,
            if ret == 0 { pages } else { 0 },
            "work",
        )
    }

    #[test]
    fn counts_errors_pages_and_latency_per_process_and_call() {
        let mut agg = Aggregator::default();
        for i in 1..=100 {
            agg.record_syscall(&rec(Syscall::Mlock, 7, 0, i * 1000, 4));
        }
        agg.record_syscall(&rec(Syscall::Mlock, 7, -12, 500, 0));
        agg.record_syscall(&rec(Syscall::Mlock, 7, -1, 500, 0));
        agg.record_syscall(&rec(Syscall::Munlockall, 8, 0, 10, 0));
        let s = agg.summary(Health {
            dropped_events: 3,
            ..Default::default()
        });
        assert_eq!(s.dropped_events, 3);
        assert_eq!(s.processes.len(), 2);
        let mlock = &s.process(7).unwrap().syscalls["mlock"];
        assert_eq!(mlock.count, 102);
        assert_eq!(mlock.errors["ENOMEM"], 1);
        assert_eq!(mlock.errors["EPERM"], 1);
        assert_eq!(mlock.pages_populated, 400);
        assert_eq!(mlock.pages_locked, 400);
        // 102 samples (two of 500 ns, then 1..=100 us): the median is the 51st, 49 us.
        // 3 significant digits: within 0.1 %.
        assert!(
            mlock.latency_ns.p50.abs_diff(49_000) <= 49,
            "{:?}",
            mlock.latency_ns
        );
        assert!(
            mlock.latency_ns.max.abs_diff(100_000) <= 100,
            "{:?}",
            mlock.latency_ns
        );
        assert_eq!(s.process(8).unwrap().syscalls["munlockall"].count, 1);
        assert_eq!(s.process(7).unwrap().comm, "work");
    }

    #[test]
    fn summary_json_has_the_documented_shape() {
        let mut agg = Aggregator::default();
        agg.record_syscall(&rec(Syscall::Mlock, 7, -12, 500, 0));
        let v = serde_json::to_value(agg.summary(Health::default())).unwrap();
        assert_eq!(v["type"], "summary");
        assert_eq!(v["dropped_events"], 0);
        let m = &v["processes"][0]["syscalls"]["mlock"];
        assert_eq!(v["processes"][0]["pid"], 7);
        assert_eq!(m["count"], 1);
        assert_eq!(m["errors"]["ENOMEM"], 1);
        for k in ["p50", "p90", "p99", "max"] {
            assert!(m["latency_ns"][k].is_u64(), "{k}");
        }
        assert_eq!(m["pages_populated"], 0);
        assert_eq!(m["pages_locked"], 0);
    }
}

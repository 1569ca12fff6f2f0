//! Per-process, per-syscall statistics.
//!
//! Syscall events are rare (one per call), so every latency is recorded here in user space:
//! as it is while a process has made few calls, in an HdrHistogram past that
//! ([`Latencies`]).

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::why::LockFigures;
use crate::{
    event::{Syscall, SyscallRecord, errno_name},
    latency::{Latencies, Latency},
    output::Outside,
    process::ProcessTable,
};

/// Per process, keyed by (pid, start time) so a reused pid never mixes two processes.
#[derive(Default)]
pub struct Aggregator {
    processes: ProcessTable<ProcessStats>,
    /// Also keep each thread's latencies (`--per-thread`, for `--hist`).
    per_thread: bool,
}

struct ProcessStats {
    comm: Outside,
    syscalls: BTreeMap<Syscall, SyscallStats>,
    /// Per thread and call, the latencies (with `per_thread`).
    threads: BTreeMap<u32, BTreeMap<Syscall, Latencies>>,
}

struct SyscallStats {
    count: u64,
    errors: BTreeMap<String, u64>,
    /// Per errno, the figures of the last failure (why it failed).
    last_failure: BTreeMap<String, LockFigures>,
    latency: Latencies,
    pages_populated: u64,
    faults_populated: u64,
    pages_locked: i64,
}

impl SyscallStats {
    fn new() -> Self {
        Self {
            count: 0,
            errors: BTreeMap::new(),
            last_failure: BTreeMap::new(),
            latency: Latencies::default(),
            pages_populated: 0,
            faults_populated: 0,
            pages_locked: 0,
        }
    }
}

impl Aggregator {
    /// Keeps at most `max` processes (`--max-processes`).
    pub fn with_max_processes(max: usize) -> Self {
        Self {
            processes: ProcessTable::with_capacity(max),
            per_thread: false,
        }
    }

    /// Also keeps each thread's latency histograms.
    pub fn per_thread(mut self, on: bool) -> Self {
        self.per_thread = on;
        self
    }

    pub fn record_syscall(&mut self, rec: &SyscallRecord) {
        let process = self
            .processes
            .get_or_insert_with(rec.process(), || ProcessStats {
                comm: Outside::default(),
                syscalls: BTreeMap::new(),
                threads: BTreeMap::new(),
            });
        // The comm of the last event wins: it follows an exec.
        process.comm = rec.name();
        let stats = process
            .syscalls
            .entry(rec.syscall)
            .or_insert_with(SyscallStats::new);
        stats.count += 1;
        if let Some(errno) = errno_name(rec.raw.ret) {
            stats
                .last_failure
                .insert(errno.clone(), LockFigures::of(rec));
            *stats.errors.entry(errno).or_default() += 1;
        }
        stats.latency.record(rec.raw.duration_ns);
        stats.pages_populated += rec.pages_populated();
        stats.faults_populated += rec.faults_populated();
        stats.pages_locked += rec.pages_locked();
        if self.per_thread {
            let thread = process.threads.entry(rec.raw.tid).or_default();
            thread
                .entry(rec.syscall)
                .or_default()
                .record(rec.raw.duration_ns);
        }
    }

    /// Processes evicted from the table so far (`--max-processes`).
    pub fn evicted_processes(&self) -> u64 {
        self.processes.evicted()
    }

    /// Every process's calls so far.
    pub fn summaries(&self) -> Vec<ProcessSyscalls> {
        self.processes
            .iter()
            .map(|(key, p)| ProcessSyscalls {
                pid: key.tgid,
                start_ns: key.start_ns,
                comm: p.comm.clone(),
                syscalls: p
                    .syscalls
                    .iter()
                    .map(|(s, st)| (s.name(), st.summary()))
                    .collect(),
                threads: p
                    .threads
                    .iter()
                    .map(|(tid, calls)| {
                        let calls = calls
                            .iter()
                            .map(|(s, l)| (s.name(), values(&l.histogram())))
                            .collect();
                        (*tid, calls)
                    })
                    .collect(),
            })
            .collect()
    }
}

impl SyscallStats {
    fn summary(&self) -> SyscallSummary {
        let latency = self.latency.histogram();
        SyscallSummary {
            count: self.count,
            errors: self.errors.clone(),
            last_failure: self.last_failure.clone(),
            latency_ns: Latency::of(&latency),
            latency_values: values(&latency),
            pages_populated: self.pages_populated,
            faults_populated: self.faults_populated,
            pages_locked: self.pages_locked,
        }
    }
}

/// Every recorded latency as (ns, calls): the lowest value of each HdrHistogram bucket
/// (3 significant digits), what log2 histograms are made from.
fn values(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|v| {
            (
                h.lowest_equivalent(v.value_iterated_to()),
                v.count_at_value(),
            )
        })
        .collect()
}

/// Latencies per thread and call name: (ns, calls) pairs.
pub type ThreadLatencies = BTreeMap<u32, BTreeMap<&'static str, Vec<(u64, u64)>>>;

/// One process's calls, by syscall name.
#[derive(Clone, Debug)]
pub struct ProcessSyscalls {
    pub pid: u32,
    /// Process start, ns since boot (`/proc/PID/stat` field 22 is this in clock ticks).
    pub start_ns: u64,
    pub comm: Outside,
    pub syscalls: BTreeMap<&'static str, SyscallSummary>,
    /// With `--per-thread`: each thread's latencies per call.
    pub threads: ThreadLatencies,
}

#[derive(Clone, Debug, Serialize)]
pub struct SyscallSummary {
    pub count: u64,
    pub errors: BTreeMap<String, u64>,
    /// Per errno, what the last failed call was checked against.
    pub last_failure: BTreeMap<String, LockFigures>,
    pub latency_ns: Latency,
    /// The latencies the percentiles come from, as (ns, calls), for `--hist`.
    #[serde(skip)]
    pub latency_values: Vec<(u64, u64)>,
    /// Base pages populated (4 KiB each, however large the pages that hold them).
    pub pages_populated: u64,
    /// The faults that populated them: fewer where huge pages did.
    pub faults_populated: u64,
    pub pages_locked: i64,
}

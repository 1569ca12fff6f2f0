//! What the event loop does with what arrives: decodes each record, feeds the families'
//! aggregation and the metrics, prints event lines, and puts the summary together.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

mod config;
mod drain;
mod metrics;
mod naming;
mod profiles;
mod summarize;

pub(super) use config::{OutputConfig, OutputStart};
use naming::{name_exited, only_thread};

use super::order::Reorder;
use crate::{
    faults::{FaultReport, stacks::StackSymbolizer},
    metrics::Metrics,
    output::{Sink, WallClock},
    process::{cgroup::CgroupPaths, table::ProcessTable},
    procfs::MappingCache,
    syscalls::{Aggregator, read::SyscallReport},
    tracer::Tracer,
    unwind::StackCollector,
    vma::{self, VmaHooks},
};

pub(super) struct Output {
    /// What the arguments ask of the output.
    pub(super) config: OutputConfig,
    /// Stdout, or `-o FILE`.
    pub(super) out: Sink,
    pub(super) clock: WallClock,
    /// `--interval`: what the current interval has seen.
    pub(super) window: Option<IntervalState>,
    /// When the session started, CLOCK_REALTIME ns.
    pub(super) started_ns: u64,
    pub(super) aggregator: Aggregator,
    pub(super) undecodable: u64,
    pub(super) metrics: Option<Arc<Metrics>>,
    pub(super) vma: VmaOutput,
    pub(super) mappings: MappingCache,
    /// `--events`: each process's mappings as `/proc/PID/maps` lists them (no page-table
    /// walk, so read again as soon as an event falls outside them), to place fault events.
    pub(super) event_maps: MappingCache,
    /// Keeps the files it parsed from one summary to the next.
    pub(super) symbolizer: StackSymbolizer,
    /// `--stacks`: the kept stacks, unwound, and the modules of every process.
    pub(super) stacks: Option<StackCollector>,
    /// Event lines waiting for their turn in time order.
    pub(super) order: Reorder,
    /// Cgroup ids to paths, kept from one summary to the next.
    pub(super) cgroups: CgroupPaths,
    /// When each exited process's fault count can be checked against the kernel's.
    pub(super) exit_check: Option<ExitCheck>,
    /// `--folded`, `--flamegraph`, `--pprof`: written at the end of the session.
    pub(super) profiles: crate::profile::ProfileFiles,
}

/// Which processes the fault family counted from their very start, so that the kernel's
/// count at their exit is what the summary should say.
pub(super) struct ExitCheck {
    /// CLOCK_BOOTTIME when the hooks were attached: processes started later.
    pub(super) attached_ns: u64,
    /// The launched command: its faults before exec are not counted, by design.
    pub(super) launched: Option<u32>,
}

/// One interval's own figures: reset when its block is printed.
pub(super) struct IntervalState {
    pub(super) aggregator: Aggregator,
    pub(super) vma_counts: BTreeMap<u32, vma::ChangeCounts>,
    /// The fault maps as read at the interval's start.
    pub(super) faults_before: Option<FaultReport>,
    /// The kernel's call counts as read at the interval's start.
    pub(super) syscalls_before: Option<SyscallReport>,
    pub(super) start_ns: u64,
}

/// What a summary covers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
    Interval,
    Session,
}

/// VMA events: paired with their calls by the tracker, counted per process.
#[derive(Default)]
pub(super) struct VmaOutput {
    pub(super) tracker: vma::Tracker,
    pub(super) hooks: Option<VmaHooks>,
    /// Per process, bounded as the call statistics are (`--max-processes`, the least
    /// recently changed evicted): keyed by pid, it grew with every process that ever locked
    /// memory, for as long as a system-wide session ran.
    pub(super) counts: ProcessTable<vma::ChangeCounts>,
}

impl Output {
    /// Snapshots the mappings of every process that has faulted: a process not read yet at
    /// once, the others when their snapshot is older than `max_age` times the number of
    /// processes, so that following many children (a forking server) does not multiply
    /// the re-reads.
    pub(super) fn refresh_mappings(&mut self, tracer: &Tracer, max_age: Duration) {
        if let Ok(pids) = tracer.fault_pids() {
            let max_age = max_age * u32::try_from(pids.len()).unwrap_or(u32::MAX).max(1);
            for pid in pids {
                self.mappings.refresh(pid, max_age);
            }
        }
    }
}

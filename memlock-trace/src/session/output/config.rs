//! What the arguments ask of the output, read once: the loop, the event lines and the
//! summaries read [`OutputConfig`], never the arguments again; and the output's state, made
//! empty at the session's start.

use std::sync::Arc;

use super::{ExitCheck, IntervalState, Output, VmaOutput};
use crate::{
    cli::TraceArgs,
    faults::stacks::StackSymbolizer,
    metrics::Metrics,
    output::{Sink, TextStyle, WallClock},
    process::ProcessTable,
    procfs::{MappingCache, MapsFile},
    syscalls::Aggregator,
    unwind::StackCollector,
    vma::VmaHooks,
};

pub(in crate::session) struct OutputConfig {
    pub(in crate::session) json: bool,
    pub(in crate::session) style: TextStyle,
    /// `-T`: the wall-clock time on every event line.
    pub(in crate::session) timestamps: bool,
    /// `-t TID`: only this thread's calls and faults.
    pub(in crate::session) tid: Option<u32>,
    /// `--per-thread` (or `-t`): figures per thread.
    pub(in crate::session) per_thread: bool,
    /// `--max-processes`: the summary lists this many, and folds the rest by name.
    pub(in crate::session) max_processes: usize,
    /// `--events`' kinds: each call, each call's VMA line and VMA stores, each fault.
    pub(in crate::session) syscall_events: bool,
    pub(in crate::session) vma_events: bool,
    pub(in crate::session) fault_events: bool,
    pub(in crate::session) top_mappings: usize,
    pub(in crate::session) top_stacks: usize,
    /// `--stack-sample`: one fault in N keeps its stack.
    pub(in crate::session) stack_sample: u32,
    /// `--by cgroup`.
    pub(in crate::session) by_cgroup: bool,
}

impl OutputConfig {
    pub(in crate::session) fn of(args: &TraceArgs, max_processes: usize) -> Self {
        Self {
            json: args.json,
            style: TextStyle {
                unit: args.unit(),
                hist: args.hist,
            },
            timestamps: args.timestamp,
            tid: args.tid,
            per_thread: args.per_thread || args.tid.is_some(),
            max_processes,
            syscall_events: args.syscall_events(),
            vma_events: args.vma_events(),
            fault_events: args.fault_events(),
            top_mappings: args.top_mappings,
            top_stacks: args.stacks_top,
            stack_sample: args.stack_sample,
            by_cgroup: args.production.by == Some(crate::cli::GroupBy::Cgroup),
        }
    }

    /// An empty aggregation of calls, sized and keyed as the options ask.
    pub(in crate::session) fn aggregator(&self) -> Aggregator {
        Aggregator::with_max_processes(self.max_processes).per_thread(self.per_thread)
    }
}

/// What the output starts with besides its configuration.
pub(in crate::session) struct OutputStart {
    pub(in crate::session) sink: Sink,
    pub(in crate::session) profiles: crate::profile::ProfileFiles,
    /// When the session started, CLOCK_REALTIME ns.
    pub(in crate::session) started_ns: u64,
    /// `--interval`: the summaries come by interval as well.
    pub(in crate::session) intervals: bool,
    pub(in crate::session) metrics: Option<Arc<Metrics>>,
    pub(in crate::session) vma_hooks: Option<VmaHooks>,
    /// Where mapping names come from (see [`MapsFile`]).
    pub(in crate::session) maps: MapsFile,
    pub(in crate::session) stacks: Option<StackCollector>,
    pub(in crate::session) exit_check: Option<ExitCheck>,
}

impl Output {
    pub(in crate::session) fn new(config: OutputConfig, start: OutputStart) -> Self {
        let max_processes = config.max_processes;
        Self {
            out: start.sink,
            clock: WallClock::measure(),
            window: start.intervals.then(|| IntervalState {
                aggregator: config.aggregator(),
                vma_counts: Default::default(),
                faults_before: None,
                syscalls_before: None,
                start_ns: start.started_ns,
            }),
            started_ns: start.started_ns,
            aggregator: config.aggregator(),
            undecodable: 0,
            metrics: start.metrics,
            vma: VmaOutput {
                hooks: start.vma_hooks,
                counts: ProcessTable::with_capacity(max_processes),
                ..VmaOutput::default()
            },
            mappings: MappingCache::reading(start.maps),
            event_maps: MappingCache::reading(MapsFile::Maps),
            symbolizer: StackSymbolizer::default(),
            stacks: start.stacks,
            order: Default::default(),
            cgroups: Default::default(),
            exit_check: start.exit_check,
            profiles: start.profiles,
            config,
        }
    }
}

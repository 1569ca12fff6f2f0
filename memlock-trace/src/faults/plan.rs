//! How a session's page faults are hooked, decided once from the options, the targets and
//! the kernel: where a fault's start is stamped, where it completes, and who counts it.
//! attach, the hook lines, the per-thread perf events and the read-back all read the plan;
//! none of them decides again.

use serde::Serialize;

use super::{BenchFloor, FaultOptions, HookSet};

/// The kernel function the fentry/kprobe sets hook: every fault passes through it.
pub const FAULT_FUNCTION: &str = "handle_mm_fault";

/// What older kernels lack that the tracepoint set would use, from the kernel's BTF.
pub struct KernelSupport {
    /// `perf_event_attr.inherit_thread` (5.13): counting events that follow new threads
    /// but not forked children. Without it count-only mode uses the BPF programs.
    pub inherit_thread: bool,
    /// `bpf_map_lookup_percpu_elem` (5.19): a fault's start searched on other CPUs. Without
    /// it the `_local` perf programs look on this CPU only.
    pub percpu_lookup: bool,
    /// `bpf_find_vma` (5.17): the VMA a populating call filled looked up with it; else by
    /// the rbtree walk.
    pub find_vma: bool,
    /// VMAs in a maple tree (6.1), which the fault completions walk themselves.
    pub maple_tree: bool,
}

impl KernelSupport {
    pub fn of(btf: &crate::probe::KernelBtf) -> Self {
        Self {
            inherit_thread: btf
                .field_offset("perf_event_attr", "inherit_thread")
                .is_ok(),
            percpu_lookup: btf.has_enum_member("bpf_func_id", "BPF_FUNC_map_lookup_percpu_elem"),
            find_vma: btf.has_find_vma(),
            maple_tree: btf.mapping_config().is_ok_and(|c| c.maple_valid == 1),
        }
    }
}

/// Where the perf events that run a program (or count) are opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventScope {
    /// On every CPU, for every process (system-wide, `--follow-children`).
    EveryCpu,
    /// On each target thread, inherited by its new threads (5.13's `inherit_thread`): a
    /// process that is not traced never runs them.
    TargetThreads,
}

/// Where the tracepoint set stamps a fault's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultStart {
    /// Not stamped: the faults are counted, not timed.
    Untimed,
    /// The `exceptions:page_fault_user/kernel` tracepoints (tp_btf, else classic): they run
    /// for every fault on the machine and reject other processes' inside.
    Tracepoints,
    /// `PAGE_FAULTS` perf events on the targets' threads: other processes' faults find no
    /// event and run nothing.
    TargetThreads,
}

/// The session's fault hooks, decided once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultPlan {
    /// fentry/fexit or kprobe/kretprobe on `handle_mm_fault`: a program at each fault's
    /// start and end, counting every fault.
    Function,
    /// The tracepoint set, count-only on specific targets: counting perf events on their
    /// threads, no BPF program per fault.
    CountingEvents,
    /// The tracepoint set: a program at each fault's completion (`PAGE_FAULTS_MIN/MAJ`,
    /// every `period` faults), its start stamped at `start`.
    Completions {
        start: FaultStart,
        on: EventScope,
        /// One fault in this many runs the completion programs (`--latency-sample`); their
        /// events' own counts are then the process's fault counts.
        period: u32,
    },
}

impl FaultPlan {
    /// The plan for hook set `set`, or why the tracepoint set cannot serve these options.
    pub fn decide(
        set: HookSet,
        options: &FaultOptions,
        specific_targets: bool,
        kernel: &KernelSupport,
    ) -> Result<Self, &'static str> {
        if set != HookSet::Tracepoint {
            return Ok(Self::Function);
        }
        if let Some(reason) = sampling_refused(options, specific_targets, kernel) {
            return Err(reason);
        }
        if kernel.inherit_thread && wants_counting_events(options, specific_targets) {
            return Ok(Self::CountingEvents);
        }
        // The system-wide floors keep the per-CPU events they measure.
        let on = match specific_targets
            && kernel.inherit_thread
            && matches!(options.bench.floor, None | Some(BenchFloor::PerThread))
        {
            true => EventScope::TargetThreads,
            false => EventScope::EveryCpu,
        };
        // `--classic-tracepoints` and `--tracepoint-start` keep the tracepoints, for the bench.
        let start = if !options.latency {
            FaultStart::Untimed
        } else if on == EventScope::TargetThreads
            && !options.bench.classic_tracepoints
            && !options.bench.tracepoint_start
        {
            FaultStart::TargetThreads
        } else {
            FaultStart::Tracepoints
        };
        Ok(Self::Completions {
            start,
            on,
            period: options.latency_period(),
        })
    }

    /// The faults are counted by perf events on the targets' threads (read back by the
    /// loader), not by the programs: counting events, or sampled completions whose
    /// programs run for one fault in N.
    pub fn counted_by_perf(self) -> bool {
        match self {
            Self::CountingEvents => true,
            Self::Completions { period, .. } => period > 1,
            Self::Function => false,
        }
    }

    /// Perf events are opened on each target thread as targets are added (`FaultCounters`).
    pub fn per_target_events(self) -> bool {
        matches!(
            self,
            Self::CountingEvents
                | Self::Completions {
                    on: EventScope::TargetThreads,
                    ..
                }
        )
    }

    /// The completion programs run on the targets' threads, not on every CPU.
    pub fn per_target_completion(self) -> bool {
        matches!(
            self,
            Self::Completions {
                on: EventScope::TargetThreads,
                ..
            }
        )
    }

    /// The fault starts come from `PAGE_FAULTS` events on the targets' threads.
    pub fn start_on_target_threads(self) -> bool {
        matches!(
            self,
            Self::Completions {
                start: FaultStart::TargetThreads,
                ..
            }
        )
    }

    /// How each fault's VMA is found, for the hook lines.
    pub fn vma_lookup(self, kernel: &KernelSupport) -> String {
        // The perf events' programs run with interrupts off, where bpf_find_vma would defer
        // its unlock to an irq_work each time: they walk the tree themselves.
        let how = if kernel.maple_tree {
            "a lockless walk of mm->mm_mt"
        } else {
            "a walk of mm->mm_rb"
        };
        match self {
            Self::Function => format!("each fault's VMA from {}'s argument", FAULT_FUNCTION),
            Self::CountingEvents => "no program per fault: mappings from /proc/PID/smaps".into(),
            Self::Completions { period: 1, .. } => {
                format!("each fault's VMA looked up with {how} at its completion")
            }
            Self::Completions {
                start: FaultStart::TargetThreads,
                ..
            } => format!("each fault's VMA looked up with {how} at its start"),
            Self::Completions { .. } => {
                "faults counted by page at their start: mappings from /proc/PID/smaps".into()
            }
        }
    }
}

/// In the summary's `fault_hooks`: `counting` and `per_target_completion` as before the plan
/// was a type (the JSON schema keeps its fields), and where a fault's start is stamped.
impl Serialize for FaultPlan {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let start = match self {
            Self::Function => None,
            Self::CountingEvents => Some(FaultStart::Untimed),
            Self::Completions { start, .. } => Some(*start),
        };
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("counting", &(*self == Self::CountingEvents))?;
        map.serialize_entry("per_target_completion", &self.per_target_completion())?;
        if let Some(start) = start {
            map.serialize_entry("fault_start", &start)?;
        }
        map.end()
    }
}

/// Whether counting perf events would do, were the kernel recent enough: specific processes,
/// and nothing per fault (no latency, events, per-thread keys or stacks).
pub fn wants_counting_events(options: &FaultOptions, specific_targets: bool) -> bool {
    specific_targets
        && !options.latency
        && !options.events
        && !options.per_thread
        && !options.stacks
}

/// Why the tracepoint set cannot sample latency here, if it cannot: the sampled events'
/// own counts replace the per-fault program's, which needs per-process events (specific
/// targets, `inherit_thread`) and nothing else per fault.
fn sampling_refused(
    options: &FaultOptions,
    specific_targets: bool,
    kernel: &KernelSupport,
) -> Option<&'static str> {
    if !options.samples_latency() {
        None
    } else if !specific_targets {
        Some(
            "--latency-sample needs -p PID or a command, without --follow-children: system-wide, per-process counts need a program on every fault",
        )
    } else if !kernel.inherit_thread {
        Some(SAMPLING_NEEDS_INHERIT_THREAD)
    } else if options.events || options.per_thread || options.stacks {
        Some(
            "--latency-sample counts per process only: not with --events, --per-thread or --stacks",
        )
    } else {
        None
    }
}

/// Why the tracepoint set refuses `--latency-sample` before 5.13: the sampled events' own
/// counts are the process's fault counts, so they must follow its new threads and not its
/// forked children, which only `inherit_thread` does (plain `inherit` adds the children's
/// faults to the count read back).
pub const SAMPLING_NEEDS_INHERIT_THREAD: &str =
    "--latency-sample needs perf_event_attr.inherit_thread (Linux 5.13)";

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(inherit_thread: bool) -> KernelSupport {
        KernelSupport {
            inherit_thread,
            percpu_lookup: true,
            find_vma: true,
            maple_tree: true,
        }
    }

    #[test]
    fn one_plan_per_session_from_options_targets_and_kernel() {
        let timed = FaultOptions::default();
        let count_only = FaultOptions {
            latency: false,
            ..FaultOptions::default()
        };
        let sampled = FaultOptions {
            latency_sample: 8,
            ..FaultOptions::default()
        };
        let tp = HookSet::Tracepoint;
        let plan =
            |o: &FaultOptions, specific, k: bool| FaultPlan::decide(tp, o, specific, &kernel(k));
        assert_eq!(
            plan(&timed, true, true),
            Ok(FaultPlan::Completions {
                start: FaultStart::TargetThreads,
                on: EventScope::TargetThreads,
                period: 1
            })
        );
        assert_eq!(
            plan(&timed, false, true),
            Ok(FaultPlan::Completions {
                start: FaultStart::Tracepoints,
                on: EventScope::EveryCpu,
                period: 1
            })
        );
        assert_eq!(plan(&count_only, true, true), Ok(FaultPlan::CountingEvents));
        // Before 5.13 count-only needs the programs.
        assert_eq!(
            plan(&count_only, true, false),
            Ok(FaultPlan::Completions {
                start: FaultStart::Untimed,
                on: EventScope::EveryCpu,
                period: 1
            })
        );
        let sampled_plan = plan(&sampled, true, true).unwrap();
        assert!(sampled_plan.counted_by_perf() && sampled_plan.start_on_target_threads());
        assert_eq!(
            plan(&sampled, false, true).unwrap_err().split(' ').next(),
            Some("--latency-sample")
        );
        assert_eq!(
            plan(&sampled, true, false),
            Err(SAMPLING_NEEDS_INHERIT_THREAD)
        );
        assert_eq!(
            FaultPlan::decide(HookSet::Fentry, &sampled, false, &kernel(false)),
            Ok(FaultPlan::Function)
        );
    }
}

//! The page-fault hook family: every fault through `handle_mm_fault`, per process (and
//! thread), minor or major, taken by the task itself or populated by the kernel on its
//! behalf inside a call, with latency, mapping and user call stack.
//!
//! Loader side, one file per concern: [`sizing`] sets the globals and map sizes before load,
//! [`attach`] picks the best hook set the kernel allows, [`counting`] is the count-only
//! mode's perf counters, [`read`] reads the kernel's per-CPU aggregation back, [`summary`]
//! turns it into per-process figures attributed to mappings, [`stacks`] symbolizes call
//! stacks, and [`render`] prints them.

pub mod attach;
mod bench_variant;
pub mod causes;
pub mod counting;
pub mod mappings;
pub mod plan;
pub mod read;
pub mod render;
pub mod sizing;
pub mod stacks;
pub mod summary;
mod window;

use anyhow::Result;
use serde::Serialize;

pub use bench_variant::{BenchFloor, BenchVariant};
pub use read::{FaultHealth, FaultReport};
pub use summary::{FaultSummary, summarize};

use crate::object::{AttachContext, HookFamily, HookLine, Refused};
use plan::FaultPlan;

/// `--fault-hooks`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum HookChoice {
    /// The best set the kernel allows: fentry, then kprobe, then tracepoint.
    #[default]
    Auto,
    Fentry,
    Kprobe,
    Tracepoint,
    /// Do not trace page faults.
    Off,
}

/// A hook set for page faults, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HookSet {
    Fentry,
    Kprobe,
    Tracepoint,
}

impl HookSet {
    pub const ALL: [HookSet; 3] = [HookSet::Fentry, HookSet::Kprobe, HookSet::Tracepoint];

    pub fn name(self) -> &'static str {
        match self {
            HookSet::Fentry => "fentry",
            HookSet::Kprobe => "kprobe",
            HookSet::Tracepoint => "tracepoint",
        }
    }
}

/// What the user asked of fault tracing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultOptions {
    pub hooks: HookChoice,
    /// Time each fault (otherwise counts only, the cheapest mode).
    pub latency: bool,
    pub per_thread: bool,
    /// Stream sampled fault events.
    pub events: bool,
    /// Keep one streamed fault in this many.
    pub sample_every: u32,
    /// `--latency-sample N`: time one fault in N, the counts staying exact; 1 times every
    /// fault.
    pub latency_sample: u32,
    /// Mappings listed per process.
    pub top_mappings: usize,
    /// Count faults per user call stack (`--stacks`).
    pub stacks: bool,
    /// `--stack-sample N`: one fault in N keeps its stack (copied and unwound).
    pub stack_sample: u32,
    /// Stacks listed per process.
    pub top_stacks: usize,
    /// `cargo xtask bench`'s variants (the `bench` feature's hidden flags).
    pub bench: BenchVariant,
}

/// One fault in this many keeps its stack by default (`--stack-sample`). A kept stack costs
/// the faulting thread about 2.1 us in the kernel (bpf_stats of the completion program:
/// 2251 ns a run with every fault keeping its stack, 130 without stacks; the copy of up to
/// 8 KiB of user stack dominates) and the tracer about 80 ns to unwind: one in 32 adds
/// about 66 ns per fault, under 5% of an untraced fault (1.5 us here), the bound the
/// count-only mode is held to.
pub const DEFAULT_STACK_SAMPLE: u32 = 32;

impl Default for FaultOptions {
    fn default() -> Self {
        Self {
            hooks: HookChoice::Auto,
            latency: true,
            per_thread: false,
            events: false,
            sample_every: 1,
            latency_sample: 1,
            top_mappings: 10,
            stacks: false,
            stack_sample: DEFAULT_STACK_SAMPLE,
            top_stacks: 10,
            bench: BenchVariant::default(),
        }
    }
}

impl FaultOptions {
    /// One fault in this many is timed (1: every one).
    pub fn latency_period(&self) -> u32 {
        if self.latency {
            self.latency_sample.max(1)
        } else {
            1
        }
    }

    /// `--latency-sample N` with N > 1: on the tracepoint set the completion events sample
    /// one fault in N (and their counts replace the programs'); on fentry/kprobe the
    /// programs count every fault and read the clock for one in N.
    pub fn samples_latency(&self) -> bool {
        self.latency_period() > 1
    }
}

/// A better hook set the kernel refused, and its reason.
#[derive(Clone, Debug, Serialize)]
pub struct Refusal {
    pub hook_set: HookSet,
    #[serde(rename = "reason")]
    pub refused: Refused,
}

/// The fault hooks in use: named in the text output and the JSON summary.
#[derive(Clone, Debug, Serialize)]
pub struct FaultHooks {
    pub hook_set: HookSet,
    /// The kernel hooks attached.
    pub hooks: Vec<String>,
    /// Better sets tried first and refused.
    pub refused: Vec<Refusal>,
    pub latency: bool,
    /// Where each fault's start and completion are hooked, and who counts it.
    #[serde(flatten)]
    pub plan: FaultPlan,
    /// What this hook set cannot observe (reported as null).
    pub unobserved: Vec<Unobservable>,
    /// One fault in this many is timed (1: every one); the counts stay exact.
    pub latency_sample: u32,
    /// The completion programs to bind to target threads (opened by
    /// [`counting::FaultCounters`]), where the plan puts them there.
    #[serde(skip)]
    pub completion_programs: Option<[&'static str; 2]>,
    /// A fault's start is taken from `PAGE_FAULTS` perf events on the targets' threads (the
    /// program named here), not from the system-wide start tracepoints, so other processes'
    /// faults run no program at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_program: Option<&'static str>,
    /// The causes of fault time measured (None: faults are not timed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub causes: Option<attach::CauseHooks>,
}

/// What a fault hook set may not see, named as the summary's fields: `page_fault_user` and
/// perf events see neither the VM_FAULT_RETRY results nor the VMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unobservable {
    Retried,
    InLockedVma,
}

impl Unobservable {
    pub fn name(self) -> &'static str {
        match self {
            Self::Retried => "retried",
            Self::InLockedVma => "in_locked_vma",
        }
    }
}

impl FaultHooks {
    /// Whether this hook set sees `what`.
    pub fn observes(&self, what: Unobservable) -> bool {
        !self.unobserved.contains(&what)
    }
}

impl HookFamily for FaultHooks {
    const NAME: &'static str = "faults";
    type Options = FaultOptions;

    fn attach(cx: &mut AttachContext<'_>, options: &FaultOptions) -> Result<Self> {
        attach::attach(cx, options)
    }

    fn hook_line(&self) -> HookLine {
        let set = self.hook_set.name();
        let mut full = format!("{set} ({})", self.hooks.join(", "));
        for refusal in &self.refused {
            let reason = refusal.refused.reason.lines().next().unwrap_or_default();
            full.push_str(&format!("; {} refused: {reason}", refusal.hook_set.name()));
        }
        HookLine::Traced {
            set,
            brief: set.to_string(),
            full,
            refused: self.refused.iter().map(|r| r.refused.clone()).collect(),
        }
    }
}

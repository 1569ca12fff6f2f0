//! `--folded`, `--flamegraph`, `--pprof`: the stacks both families kept with `--stacks`
//! (sampled page faults, mlock-family call sites) as the files profilers read: folded
//! lines as `stackcollapse-perf.pl` writes them (flamegraph.pl, inferno, speedscope), a
//! flame graph SVG in flamegraph.pl's `mem` palette, and a pprof profile (`go tool pprof`,
//! Grafana Pyroscope, Parca). Built above the families from their results; neither they
//! nor the tracer import it.

pub mod files;
pub mod flamegraph;
pub mod folded;
pub mod pprof;

use std::collections::BTreeMap;

use clap::ValueEnum;
use memlock_trace_common::{
    faults::StackKey,
    stacks::{SyscallStackKey, SyscallStackValue},
};

pub use self::files::ProfileFiles;
use crate::{
    procfs::PAGE_SIZE,
    symbolize::{Frame, StackSymbolizer},
    unwind::ModuleRegistry,
};

/// What a profile's stacks are weighed by (`--profile-weight`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Weight {
    /// Page faults, i.e. pages faulted in (each sampled fault counted as --stack-sample).
    #[default]
    Faults,
    /// Bytes faulted in: faults times the 4 KiB page.
    FaultBytes,
    /// Mlock-family calls per call site.
    Calls,
    /// Bytes the calls added to `locked_vm`.
    LockedBytes,
}

impl Weight {
    /// Whether the stacks are the faults' (else the mlock-family calls').
    pub fn of_faults(self) -> bool {
        matches!(self, Self::Faults | Self::FaultBytes)
    }

    /// Whether the weight is in bytes (the second value of each pprof sample).
    pub fn in_bytes(self) -> bool {
        matches!(self, Self::FaultBytes | Self::LockedBytes)
    }

    /// flamegraph.pl's `--countname`.
    pub fn count_name(self) -> &'static str {
        match self {
            Self::Faults => "pages",
            Self::Calls => "calls",
            Self::FaultBytes | Self::LockedBytes => "bytes",
        }
    }
}

/// One distinct stack of one process, with its two figures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileStack {
    pub pid: u32,
    /// The process's name (after its last exec), the root frame as perf gives it.
    pub comm: String,
    /// Innermost first, inlined functions included, as [`StackSymbolizer::stack`] gives them.
    pub frames: Vec<Frame>,
    /// Faults (calls).
    pub count: u64,
    /// Bytes faulted in (bytes locked).
    pub bytes: u64,
}

/// The stacks of one kind, for one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub weight: Weight,
    /// Faults: one in this many kept its stack (counts are scaled by it). 1 for calls.
    pub sample_every: u32,
    pub stacks: Vec<ProfileStack>,
}

impl ProfileStack {
    /// The figure `weight` asks for.
    pub fn weight(&self, weight: Weight) -> u64 {
        if weight.in_bytes() {
            self.bytes
        } else {
            self.count
        }
    }
}

/// The instruction pointers of a kept stack, zero-terminated.
fn depth(ips: &[u64]) -> &[u64] {
    &ips[..ips.iter().position(|&ip| ip == 0).unwrap_or(ips.len())]
}

/// What a profile's stacks are named with: each process's kept modules, the symbolizer,
/// and each process's name by pid.
pub struct Symbols<'a> {
    pub modules: &'a ModuleRegistry,
    pub symbolizer: &'a StackSymbolizer,
    pub comm: &'a dyn Fn(u32) -> String,
}

impl Symbols<'_> {
    /// Each (process, stack) of `per_stack` as a profile stack: its frames symbolized with
    /// the process's modules, its count and bytes as `figures` gives them.
    fn symbolized<V>(
        &self,
        per_stack: BTreeMap<(u32, &[u64]), V>,
        figures: impl Fn(V) -> (u64, u64),
    ) -> Vec<ProfileStack> {
        per_stack
            .into_iter()
            .map(|((pid, ips), v)| {
                let (count, bytes) = figures(v);
                ProfileStack {
                    pid,
                    comm: (self.comm)(pid),
                    frames: self.symbolizer.stack(ips, self.modules.get(pid)),
                    count,
                    bytes,
                }
            })
            .collect()
    }

    /// The faults per (process, stack), threads folded into their process, as the collector
    /// counted them (each sample as the faults it stands for, already scaled by
    /// `sample_every`: [`crate::unwind::StackCollector`]).
    pub fn fault_profile(
        &self,
        faults: &BTreeMap<StackKey, u64>,
        sample_every: u32,
        weight: Weight,
    ) -> Profile {
        let mut per_stack: BTreeMap<(u32, &[u64]), u64> = BTreeMap::new();
        for (key, n) in faults {
            *per_stack.entry((key.tgid, depth(&key.ips))).or_default() += n;
        }
        Profile {
            weight,
            sample_every: sample_every.max(1),
            stacks: self.symbolized(per_stack, |n| (n, n * PAGE_SIZE)),
        }
    }

    /// The mlock-family calls per (process, call site), every call of a site together.
    pub fn call_profile(
        &self,
        calls: &BTreeMap<SyscallStackKey, SyscallStackValue>,
        weight: Weight,
    ) -> Profile {
        let mut per_stack: BTreeMap<(u32, &[u64]), SyscallStackValue> = BTreeMap::new();
        for (key, v) in calls {
            per_stack
                .entry((key.tgid, depth(&key.ips)))
                .or_default()
                .add(v);
        }
        Profile {
            weight,
            sample_every: 1,
            stacks: self.symbolized(per_stack, |v| (v.calls, v.locked * PAGE_SIZE)),
        }
    }
}

//! The command line: every clap type of the tool, in this folder: the tracing options here,
//! the subcommands in [`commands`], production options in [`production`]. The lab's
//! subcommands exist only with the `lab` feature.

mod commands;
pub mod man;
mod production;
mod profile;
#[cfg(test)]
mod tests;

use clap::{ArgGroup, Args, Parser, ValueEnum};
use std::{ffi::OsString, path::PathBuf};

pub use commands::Command;
#[cfg(feature = "lab")]
pub use commands::{WorkloadName, WorkloadParams};
pub use production::{GroupBy, ProductionArgs};
pub use profile::ProfileArgs;

use crate::{
    faults::{FaultOptions, HookChoice},
    values::{self, int},
};

/// Most rows a `--top-*` list prints: more than anyone reads.
const MAX_TOP: usize = 1_000_000;

#[derive(Debug, Parser)]
#[command(
    name = "memlock-trace",
    version,
    about = "Trace mlock-family calls and page faults from the kernel: who, what range, how long, \
             what it returned, how many pages it populated and locked, which faults each process \
             took, where and how long they took.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub trace: TraceArgs,
}

/// `memlock-trace [OPTIONS] [-- COMMAND ARGS...]`: system-wide unless `-p` or a command.
/// `stack_sources`: what keeps stacks (`--stacks`, or a profile file, which implies it).
#[derive(Debug, Args, Default, Clone)]
#[command(group(
    ArgGroup::new("stack_sources")
        .args(["stacks", "folded", "flamegraph", "pprof"])
        .multiple(true)
))]
pub struct TraceArgs {
    /// Trace this running process and all its threads (repeatable).
    #[arg(short = 'p', long = "pid", value_name = "PID", value_parser = int(1, values::MAX_PIDS),
          allow_negative_numbers = true)]
    pub pids: Vec<u32>,
    /// Trace only this thread (its process is traced, its other threads are left out).
    #[arg(short = 't', long = "tid", value_name = "TID", conflicts_with_all = ["pids", "command"],
          value_parser = int(1, values::MAX_PIDS), allow_negative_numbers = true)]
    pub tid: Option<u32>,
    /// Print what happened in each SECS-second interval (counts reset per interval), then
    /// the whole session's summary at the end.
    #[arg(short = 'i', long, value_name = "SECS", value_parser = values::secs, allow_negative_numbers = true)]
    pub interval: Option<f64>,
    /// Stop after SECS seconds. A launched command still running then is sent SIGTERM and
    /// waited for, as `timeout(1)` does, and the exit status is 124.
    #[arg(short = 'd', long, value_name = "SECS", value_parser = values::secs, allow_negative_numbers = true)]
    pub duration: Option<f64>,
    /// INTERVAL as in libbpf-tools: `memlock-trace 1 5` prints five one-second intervals,
    /// then exits.
    #[arg(value_name = "INTERVAL", value_parser = positional_secs, conflicts_with = "interval",
          allow_negative_numbers = true)]
    pub interval_positional: Option<f64>,
    /// Number of intervals to print before exiting.
    #[arg(value_name = "COUNT", requires = "interval_positional", value_parser = positive_count,
          allow_negative_numbers = true)]
    pub count: Option<u64>,
    /// Log2 histograms of each call's latency and of fault latency per class, per process
    /// (and per thread with --per-thread).
    #[arg(long)]
    pub hist: bool,
    /// Latencies in milliseconds.
    #[arg(short = 'm', long = "milliseconds", conflicts_with = "microseconds")]
    pub milliseconds: bool,
    /// Latencies in microseconds (by default each column picks the unit that fits it).
    #[arg(short = 'u', long = "microseconds")]
    pub microseconds: bool,
    /// Put the wall-clock time (HH:MM:SS.mmm) on every event line.
    #[arg(short = 'T', long = "timestamp")]
    pub timestamp: bool,
    /// Write the tracer's own output (text or JSON) to FILE; a launched command keeps the
    /// terminal.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// More detail on stderr: `-v` prints the hook sets and why better ones were refused, in
    /// full, and the eBPF programs' own diagnostics (failed kernel reads, full maps, dropped
    /// records, targets leaving), named by program.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,
    /// Nothing on stderr but errors and warnings.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    /// Print each call, the VMAs it changed and each page fault as they happen; or only the
    /// kinds named, comma-separated: `--events=calls` (one line per call), `--events=syscalls`
    /// (each call with its VMA line: `calls,vma`), `--events=faults`.
    #[arg(
        long,
        value_enum,
        value_name = "KINDS",
        num_args = 0..=1,
        require_equals = true,
        value_delimiter = ',',
        default_missing_value = "all"
    )]
    pub events: Option<Vec<EventKinds>>,
    /// Write JSON lines (events with --events, then the summary) instead of text.
    #[arg(long)]
    pub json: bool,
    /// With --events, also show VMA stores by mmap, mprotect, munmap, madvise, brk, ... (by
    /// default only those of mlock-family calls and of VMAs with VM_LOCKED/VM_LOCKONFAULT).
    #[arg(long)]
    pub all_vma_changes: bool,
    #[command(flatten)]
    pub production: ProductionArgs,
    /// Page-fault hooks: the best the kernel allows (fentry, then kprobe, then tracepoint),
    /// one of them forced, or off.
    #[arg(long, value_enum, value_name = "HOOKS", default_value_t = HookChoice::Auto)]
    pub fault_hooks: HookChoice,
    /// Count page faults only: no start times or latency histograms (the cheapest mode).
    #[arg(long)]
    pub count_only: bool,
    /// Report page faults per thread too.
    #[arg(long)]
    pub per_thread: bool,
    /// With --events, print one page fault in N.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = int(1, u32::MAX),
          allow_negative_numbers = true)]
    pub sample: u32,
    /// Time one page fault in N, counts staying exact. Tracepoint hooks: with -p or a command
    /// only, per process (the completion event runs its program once per N faults);
    /// fentry/kprobe: any targets (the programs count every fault and read the clock for one
    /// in N of each thread's).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = int(1, u32::MAX),
          conflicts_with = "count_only", allow_negative_numbers = true)]
    pub latency_sample: u32,
    /// Mappings listed per process, by page faults.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = int(0, MAX_TOP),
          allow_negative_numbers = true)]
    pub top_mappings: usize,
    /// Keep user call stacks, unwound with each module's unwind tables (as perf's
    /// --call-graph dwarf) and symbolized: every mlock-family call's call site, and the
    /// stack of one page fault in --stack-sample (pages populated inside mlock,
    /// MAP_POPULATE, ... count at the call site). Implied by --folded, --flamegraph and
    /// --pprof, as `perf script report flamegraph` works from the call graphs it needs.
    #[arg(long)]
    pub stacks: bool,
    /// With --stacks: one page fault in N keeps its stack (1: every fault).
    #[arg(long, value_name = "N", default_value_t = crate::faults::DEFAULT_STACK_SAMPLE,
          requires = "stack_sources", value_parser = int(1, u32::MAX), allow_negative_numbers = true)]
    pub stack_sample: u32,
    /// Stacks listed per process with --stacks, by page faults.
    #[arg(long, value_name = "N", default_value_t = 10, requires = "stack_sources",
          value_parser = int(0, MAX_TOP), allow_negative_numbers = true)]
    pub stacks_top: usize,
    #[command(flatten)]
    pub profile: ProfileArgs,
    /// The benchmark's hidden flags, only in a build with the `bench` feature; the product's
    /// defaults otherwise.
    #[cfg_attr(feature = "bench", command(flatten))]
    #[cfg_attr(not(feature = "bench"), arg(skip))]
    pub bench: crate::faults::BenchVariant,
    /// Tests only: the syscall programs read `task_struct.mm` at the offset of
    /// `task_struct.min_flt`, so every `mm_struct` read of theirs fails (-v's failed-read
    /// records, end to end); their locked_vm and map_count figures are then wrong.
    #[arg(long, hide = true)]
    pub test_unreadable_mm: bool,
    /// Run COMMAND as USER (a name, or a uid `getent passwd` lists) with USER's groups and no
    /// capabilities, as `strace -u` does; the tracer keeps its own. (`-u` is --microseconds.)
    #[arg(long, value_name = "USER", requires = "command", value_parser = clap::value_parser!(OsString))]
    pub user: Option<OsString>,
    /// `advise --apply` only: set NAME=VALUE in the launched command's environment, not the
    /// tracer's (the preload library must not load into the tracer), instead of launching
    /// it through env(1), whose own faults and mappings would count as the command's.
    #[arg(long, hide = true, value_name = "NAME=VALUE", requires = "command", value_parser = clap::value_parser!(OsString))]
    pub command_env: Vec<OsString>,
    /// Tests only: the event ring buffer's size in bytes (a power of two multiple of the
    /// page size), small enough to drop records on purpose.
    #[arg(long, hide = true, value_name = "BYTES")]
    pub test_ring_bytes: Option<u32>,
    /// Launch COMMAND and trace it and its threads until it exits. Its name and arguments
    /// are bytes, as the kernel takes them: they need not be UTF-8.
    #[arg(last = true, value_name = "COMMAND", value_parser = clap::value_parser!(OsString))]
    pub command: Vec<OsString>,
}

/// What `--events` prints: a list of kinds, as perf trace's `-e` and bpftrace take several.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EventKinds {
    /// Every kind below (`--events` alone).
    All,
    /// One line per mlock-family call, and nothing else of it.
    Calls,
    /// Each mlock-family call with the VMAs it changed: `calls,vma` (what it always meant,
    /// which scripts and the suite's JSON reading rely on).
    Syscalls,
    /// The VMAs each call split, merged, locked or unlocked, and VMA stores
    /// (`--all-vma-changes` for those of other calls).
    Vma,
    /// Page faults (one in `--sample`).
    Faults,
}

impl TraceArgs {
    /// `--interval` or the INTERVAL positional.
    pub fn interval_secs(&self) -> Option<f64> {
        self.interval.or(self.interval_positional)
    }

    /// The latency unit: fixed by `-m`/`-u`, or chosen per column.
    pub fn unit(&self) -> crate::output::Unit {
        if self.milliseconds {
            crate::output::Unit::Ms
        } else if self.microseconds {
            crate::output::Unit::Us
        } else {
            crate::output::Unit::Auto
        }
    }

    /// `--stacks`, or a profile file (`--folded`, `--flamegraph`, `--pprof`), which implies
    /// it.
    pub fn keeps_stacks(&self) -> bool {
        self.stacks || self.profile.any_file()
    }

    /// Whether `--events` names any of `kinds` (or `all`).
    fn shows(&self, kinds: &[EventKinds]) -> bool {
        self.events.as_ref().is_some_and(|named| {
            named
                .iter()
                .any(|k| *k == EventKinds::All || kinds.contains(k))
        })
    }

    pub fn syscall_events(&self) -> bool {
        self.shows(&[EventKinds::Calls, EventKinds::Syscalls])
    }

    /// The VMA line of each call, and VMA stores: `--events`, `--events=syscalls` or
    /// `--events=...,vma`.
    pub fn vma_events(&self) -> bool {
        self.shows(&[EventKinds::Vma, EventKinds::Syscalls])
    }

    pub fn fault_events(&self) -> bool {
        self.shows(&[EventKinds::Faults])
    }

    pub fn fault_options(&self) -> FaultOptions {
        FaultOptions {
            hooks: self.fault_hooks,
            latency: !self.count_only,
            // `-t TID` needs the thread's own figures, which the kernel keeps per thread.
            per_thread: self.per_thread || self.tid.is_some(),
            events: self.fault_events(),
            sample_every: self.sample.max(1),
            latency_sample: self.latency_sample.max(1),
            top_mappings: self.top_mappings,
            stacks: self.keeps_stacks(),
            stack_sample: self.stack_sample,
            top_stacks: self.stacks_top,
            bench: self.bench,
        }
    }
}

fn positive_count(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("`{s}` is not a number of intervals (1 or more)")),
    }
}

/// The first positional: an interval, or a mistyped subcommand.
fn positional_secs(s: &str) -> Result<f64, String> {
    values::secs(s).map_err(|_| {
        format!(
            "`{s}` is neither a subcommand nor an interval in seconds: see `memlock-trace --help`"
        )
    })
}

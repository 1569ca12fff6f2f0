//! Command-line interface.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::faults::{FaultOptions, HookChoice};

#[derive(Debug, Parser)]
#[command(
    name = "memlock-trace",
    version,
    about = "Trace mlock-family calls from the kernel: who, what range, how long, what it returned, \
             how many pages it populated and locked.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub trace: TraceArgs,
}

/// `memlock-trace [OPTIONS] [-- COMMAND ARGS...]`: system-wide unless `-p` or a command.
#[derive(Debug, Args, Default, Clone)]
pub struct TraceArgs {
    /// Trace this running process and all its threads (repeatable).
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Print a summary every SECS seconds while tracing.
    #[arg(long, value_name = "SECS", value_parser = positive_secs)]
    pub interval: Option<f64>,
    /// Stop after SECS seconds.
    #[arg(long, value_name = "SECS", value_parser = positive_secs)]
    pub duration: Option<f64>,
    /// Print each call (and page fault) as it happens; `--events=syscalls` or
    /// `--events=faults` for one kind only.
    #[arg(
        long,
        value_enum,
        value_name = "KINDS",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "all"
    )]
    pub events: Option<EventKinds>,
    /// Write JSON lines (events with --events, then the summary) instead of text.
    #[arg(long)]
    pub json: bool,
    /// With --events, also show VMA stores by mmap, mprotect, munmap, madvise, brk, ... (by
    /// default only those of mlock-family calls and of VMAs with VM_LOCKED/VM_LOCKONFAULT).
    #[arg(long)]
    pub all_vma_changes: bool,
    #[command(flatten)]
    pub production: crate::cli_production::ProductionArgs,
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
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub sample: u32,
    /// Mappings listed per process, by page faults.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub top_mappings: usize,
    /// Count page faults per user call stack and list each process's top stacks,
    /// symbolized (pages populated inside mlock, MAP_POPULATE, ... count at the call site).
    #[arg(long)]
    pub stacks: bool,
    /// Stacks listed per process with --stacks, by page faults.
    #[arg(long, value_name = "N", default_value_t = 10, requires = "stacks")]
    pub stacks_top: usize,
    /// Launch COMMAND and trace it and its threads until it exits.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// What `--events` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EventKinds {
    All,
    Syscalls,
    Faults,
}

impl TraceArgs {
    pub fn syscall_events(&self) -> bool {
        matches!(self.events, Some(EventKinds::All | EventKinds::Syscalls))
    }

    pub fn fault_events(&self) -> bool {
        matches!(self.events, Some(EventKinds::All | EventKinds::Faults))
    }

    pub fn fault_options(&self) -> FaultOptions {
        FaultOptions {
            hooks: self.fault_hooks,
            latency: !self.count_only,
            per_thread: self.per_thread,
            events: self.fault_events(),
            sample_every: self.sample.max(1),
            top_mappings: self.top_mappings,
            stacks: self.stacks,
            top_stacks: self.stacks_top,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Report what the running kernel allows (fentry, kprobe, tp_btf, tracepoint, perf
    /// events, ring buffer, BTF) and which hook set each hook family would use.
    Probe {
        /// Write the report as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Run every reference experiment with the tracer attached and write a report with charts.
    Suite(crate::suite::SuiteArgs),
    /// Run one reference experiment (see SCENARIOS.md) and print its own measurements as JSON.
    Scenario {
        name: crate::workload::scenario::Scenario,
        #[command(flatten)]
        args: crate::workload::scenario::ScenarioArgs,
        /// Write the result here instead of stdout.
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
    },
    /// Run a bundled workload (used by `cargo xtask run` and the tests).
    Workload {
        name: WorkloadName,
        #[command(flatten)]
        params: crate::cli_production::WorkloadParams,
        /// Write the workload's own measurements here as JSON.
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
    },
    /// Run mlock scenarios under the tracer and check each step against /proc/PID/maps and
    /// smaps; exits 1 on any mismatch.
    Verify {
        /// Also write the report as JSON to FILE.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum WorkloadName {
    /// One of each mlock-family call, one of them failing.
    Syscalls,
    /// Fork --count children that all exist at once; each makes --calls mlock calls.
    Children,
    /// --threads threads each making --calls failing mlock calls as fast as they can.
    Flood,
    /// Takes page faults on command (stdin), answering its own fault counters (stdout).
    Faults,
}

fn positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("`{s}` is not a positive number of seconds")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("memlock-trace").chain(args.iter().copied()))
    }

    #[test]
    fn system_wide_by_default() {
        let cli = parse(&[]).unwrap();
        assert!(cli.command.is_none());
        assert!(cli.trace.pids.is_empty() && cli.trace.command.is_empty());
    }

    #[test]
    fn pids_repeat_and_options_parse() {
        let cli = parse(&[
            "-p",
            "1",
            "--pid",
            "2",
            "--interval",
            "0.5",
            "--duration",
            "3",
            "--events",
            "--json",
            "--all-vma-changes",
        ])
        .unwrap();
        assert!(cli.trace.all_vma_changes);
        assert_eq!(cli.trace.pids, [1, 2]);
        assert_eq!(cli.trace.interval, Some(0.5));
        assert_eq!(cli.trace.duration, Some(3.0));
        assert!(cli.trace.syscall_events() && cli.trace.fault_events() && cli.trace.json);
    }

    #[test]
    fn command_after_double_dash_keeps_its_own_flags() {
        let cli = parse(&["--events", "--", "ls", "-l", "--json"]).unwrap();
        assert_eq!(cli.trace.command, ["ls", "-l", "--json"]);
        assert!(!cli.trace.json);
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(parse(&["--pid", "abc"]).is_err());
        assert!(parse(&["--duration", "-1"]).is_err());
        assert!(parse(&["--interval", "0"]).is_err());
    }

    #[test]
    fn verify_subcommand() {
        let cli = parse(&["verify", "--json", "/tmp/v.json"]).unwrap();
        let Some(Command::Verify { json }) = cli.command else {
            panic!("not verify: {:?}", cli.command);
        };
        assert_eq!(json.as_deref(), Some(std::path::Path::new("/tmp/v.json")));
        assert!(parse(&["verify", "--json"]).is_err());
    }

    #[test]
    fn fault_options_parse() {
        let cli = parse(&[
            "--fault-hooks",
            "tracepoint",
            "--count-only",
            "--per-thread",
            "--events",
            "--sample",
            "100",
            "--top-mappings",
            "3",
            "--stacks",
            "--stacks-top",
            "4",
        ])
        .unwrap();
        let o = cli.trace.fault_options();
        assert_eq!(o.hooks, HookChoice::Tracepoint);
        assert!(!o.latency && o.per_thread && o.events);
        assert!(o.stacks && o.top_stacks == 4);
        assert!(
            parse(&["--stacks-top", "4"]).is_err(),
            "--stacks-top needs --stacks"
        );
        assert_eq!((o.sample_every, o.top_mappings), (100, 3));
        let d = parse(&[]).unwrap().trace.fault_options();
        assert_eq!(
            d,
            FaultOptions {
                events: false,
                ..FaultOptions::default()
            }
        );
        let syscalls_only = parse(&["--events=syscalls", "--json"]).unwrap().trace;
        assert!(syscalls_only.syscall_events() && !syscalls_only.fault_events());
        assert!(!syscalls_only.fault_options().events);
        assert!(
            parse(&["--events=faults"])
                .unwrap()
                .trace
                .fault_options()
                .events
        );
        assert!(parse(&["--events=bogus"]).is_err());
        assert!(parse(&["--fault-hooks", "uprobe"]).is_err());
        assert!(parse(&["--sample", "0"]).is_err());
        assert_eq!(
            parse(&["--fault-hooks", "off"])
                .unwrap()
                .trace
                .fault_options()
                .hooks,
            HookChoice::Off
        );
    }

    #[test]
    fn workload_subcommand() {
        let cli = parse(&["workload", "syscalls", "--report", "/tmp/r.json"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Workload {
                name: WorkloadName::Syscalls,
                ..
            })
        ));
    }
}

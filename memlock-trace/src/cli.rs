//! The command line: every clap type of the tool, in one place. The lab's subcommands
//! exist only with the `lab` feature.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

use std::net::SocketAddr;

use crate::{
    faults::{BenchFloor, FaultOptions, HookChoice},
    process::DEFAULT_MAX_PROCESSES,
};

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
    /// Benchmark only: attach the fault-start tracepoints the classic way even where tp_btf
    /// works (as bpftrace does).
    #[arg(long, hide = true)]
    pub classic_tracepoints: bool,
    /// Benchmark only: the tracepoint set's per-fault hooks with programs that do nothing
    /// (`empty`) or only read the clock (`clock`); nothing is counted.
    #[arg(long, hide = true, value_enum, value_name = "FLOOR")]
    pub bench_floor: Option<BenchFloor>,
    /// More detail on stderr; -v also prints the eBPF programs' own diagnostics (failed
    /// kernel reads, full maps, dropped records, targets leaving), named by program.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
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
            classic_tracepoints: self.classic_tracepoints,
            bench_floor: self.bench_floor,
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
    #[cfg(feature = "lab")]
    /// Run every reference experiment with the tracer attached and write a report with charts.
    Suite(crate::lab::suite::SuiteArgs),
    #[cfg(feature = "lab")]
    /// Run one reference experiment (see SCENARIOS.md) and print its own measurements as JSON.
    Scenario {
        name: crate::lab::workload::scenario::Scenario,
        #[command(flatten)]
        args: crate::lab::workload::scenario::ScenarioArgs,
        /// Write the result here instead of stdout.
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
    },
    #[cfg(feature = "lab")]
    /// Run a bundled workload (used by `cargo xtask run` and the tests).
    Workload {
        name: WorkloadName,
        #[command(flatten)]
        params: WorkloadParams,
        /// Write the workload's own measurements here as JSON.
        #[arg(long, value_name = "FILE")]
        report: Option<PathBuf>,
    },
    #[cfg(feature = "lab")]
    /// Run mlock scenarios under the tracer and check each step against /proc/PID/maps and
    /// smaps; exits 1 on any mismatch.
    Verify {
        /// Also write the report as JSON to FILE.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
    },
}

#[cfg(feature = "lab")]
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

/// Options for production use: the process filters, Prometheus export and the bounds on
/// per-process state.
#[derive(Debug, Args, Default, Clone)]
pub struct ProductionArgs {
    /// Only processes whose name (the comm of the main thread, at most 15 bytes) is NAME.
    #[arg(long, value_name = "NAME")]
    pub comm: Option<String>,
    /// Only processes in this cgroup v2 or below it (a path under the cgroup2 mount, or
    /// relative to it, e.g. `system.slice/nginx.service`).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<PathBuf>,
    /// Also trace the processes that traced processes fork, from their first instruction.
    #[arg(long)]
    pub follow_children: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (`IP:PORT`, or `:PORT` for all
    /// interfaces; port 0 picks a free one, printed on stderr).
    #[arg(long, value_name = "ADDR", value_parser = listen_addr)]
    pub prometheus: Option<SocketAddr>,
    /// Add a `pid` label to per-process metrics (one series per process: use with care).
    #[arg(long, requires = "prometheus")]
    pub prometheus_pid_label: bool,
    /// Most processes the summary keeps; past that the least recently seen is evicted and
    /// counted (`evicted_processes`).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_PROCESSES, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_processes: u32,
    /// Most processes traced at once by pid (`-p`, a command, its children); children past
    /// that are counted as not followed.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_targets: Option<u32>,
}

/// Parameters of the `children` and `flood` workloads.
#[cfg(feature = "lab")]
#[derive(Debug, Args, Clone)]
pub struct WorkloadParams {
    /// `children`: how many children.
    #[arg(long, default_value_t = 4)]
    pub count: u32,
    /// mlock calls per child (`children`) or per thread (`flood`).
    #[arg(long, default_value_t = 1)]
    pub calls: u32,
    /// `flood`: how many threads.
    #[arg(long, default_value_t = 2)]
    pub threads: u32,
    /// `flood`: wait for one byte on stdin before starting.
    #[arg(long)]
    pub wait_stdin: bool,
}

fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    let full = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_string(),
    };
    full.parse().map_err(|_| {
        format!("`{s}` is not a listen address: use IP:PORT (127.0.0.1:9464, [::1]:9464) or :PORT")
    })
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

    #[cfg(feature = "lab")]
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

    #[cfg(feature = "lab")]
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

    #[test]
    fn production_options_parse() {
        let cli = parse(&[
            "--comm",
            "postgres",
            "--cgroup",
            "system.slice",
            "--follow-children",
            "--prometheus",
            ":9464",
            "--prometheus-pid-label",
            "--max-processes",
            "10",
            "--max-targets",
            "5",
        ])
        .unwrap();
        let p = &cli.trace.production;
        assert_eq!(p.comm.as_deref(), Some("postgres"));
        assert_eq!(
            p.cgroup.as_deref(),
            Some(std::path::Path::new("system.slice"))
        );
        assert!(p.follow_children && p.prometheus_pid_label);
        assert_eq!(p.prometheus, Some("0.0.0.0:9464".parse().unwrap()));
        assert_eq!((p.max_processes, p.max_targets), (10, Some(5)));
        let p = parse(&["--prometheus", "[::1]:0"])
            .unwrap()
            .trace
            .production;
        assert_eq!(p.prometheus, Some("[::1]:0".parse().unwrap()));
        assert_eq!(
            p.max_processes,
            crate::process::table::DEFAULT_MAX_PROCESSES
        );
    }

    #[test]
    fn bad_production_options_are_rejected() {
        let e = parse(&["--prometheus", "localhost"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a listen address"), "{e}");
        assert!(parse(&["--prometheus", "1.2.3.4:99999"]).is_err());
        assert!(
            parse(&["--prometheus-pid-label"]).is_err(),
            "needs --prometheus"
        );
        assert!(parse(&["--max-processes", "0"]).is_err());
        assert!(parse(&["--max-targets", "-1"]).is_err());
    }
}

//! The command line: every clap type of the tool, in one place. The lab's subcommands
//! exist only with the `lab` feature.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

use std::net::SocketAddr;

use crate::{
    faults::{BenchFloor, FaultOptions, HookChoice},
    process::DEFAULT_MAX_PROCESSES,
};

use crate::values::{self, MAX_PIDS, int};

/// Most rows a `--top-*` list prints: more than anyone reads.
const MAX_TOP: usize = 1_000_000;
/// Most children or threads a bundled workload starts at once.
#[cfg(feature = "lab")]
const MAX_WORKERS: u32 = 1024;

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
    /// Trace only this thread (its process is traced, its other threads are left out).
    #[arg(short = 't', long = "tid", value_name = "TID", conflicts_with_all = ["pids", "command"])]
    pub tid: Option<u32>,
    /// Print what happened in each SECS-second interval (counts reset per interval), then
    /// the whole session's summary at the end.
    #[arg(short = 'i', long, value_name = "SECS", value_parser = values::secs)]
    pub interval: Option<f64>,
    /// Stop after SECS seconds.
    #[arg(short = 'd', long, value_name = "SECS", value_parser = values::secs)]
    pub duration: Option<f64>,
    /// INTERVAL as in libbpf-tools: `memlock-trace 1 5` prints five one-second intervals,
    /// then exits.
    #[arg(value_name = "INTERVAL", value_parser = positional_secs, conflicts_with = "interval")]
    pub interval_positional: Option<f64>,
    /// Number of intervals to print before exiting.
    #[arg(value_name = "COUNT", requires = "interval_positional", value_parser = positive_count)]
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
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = int(1, u32::MAX))]
    pub sample: u32,
    /// Time one page fault in N, counts staying exact. Tracepoint hooks: with -p or a command
    /// only, per process (the completion event runs its program once per N faults);
    /// fentry/kprobe: any targets (the programs count every fault and read the clock for one
    /// in N of each thread's).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = int(1, u32::MAX),
          conflicts_with = "count_only")]
    pub latency_sample: u32,
    /// Mappings listed per process, by page faults.
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = int(0, MAX_TOP))]
    pub top_mappings: usize,
    /// Count page faults per user call stack and list each process's top stacks,
    /// symbolized (pages populated inside mlock, MAP_POPULATE, ... count at the call site).
    #[arg(long)]
    pub stacks: bool,
    /// Stacks listed per process with --stacks, by page faults.
    #[arg(long, value_name = "N", default_value_t = 10, requires = "stacks", value_parser = int(0, MAX_TOP))]
    pub stacks_top: usize,
    /// Benchmark only: attach the fault-start tracepoints the classic way even where tp_btf
    /// works (as bpftrace does).
    #[arg(long, hide = true)]
    pub classic_tracepoints: bool,
    /// Benchmark only: time faults from the system-wide start tracepoints even with -p or a
    /// command, where the start is otherwise taken on the targets' threads only.
    #[arg(long, hide = true)]
    pub tracepoint_start: bool,
    /// Benchmark only: the tracepoint set's per-fault hooks with programs that do nothing
    /// (`empty`) or only read the clock (`clock`), or the per-thread events of `-p` with
    /// programs that do nothing (`per-thread`); nothing is counted.
    #[arg(long, hide = true, value_enum, value_name = "FLOOR")]
    pub bench_floor: Option<BenchFloor>,
    /// Tests only: the syscall programs read `task_struct.mm` at the offset of
    /// `task_struct.min_flt`, so every `mm_struct` read of theirs fails (-v's failed-read
    /// records, end to end); their locked_vm and map_count figures are then wrong.
    #[arg(long, hide = true)]
    pub test_unreadable_mm: bool,
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
            // `-t TID` needs the thread's own figures, which the kernel keeps per thread.
            per_thread: self.per_thread || self.tid.is_some(),
            events: self.fault_events(),
            sample_every: self.sample.max(1),
            latency_sample: self.latency_sample.max(1),
            top_mappings: self.top_mappings,
            stacks: self.stacks,
            top_stacks: self.stacks_top,
            classic_tracepoints: self.classic_tracepoints,
            tracepoint_start: self.tracepoint_start,
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
        /// Write the result here instead of stdout (`-o`, as everywhere).
        #[arg(short = 'o', long, visible_alias = "output", value_name = "FILE")]
        report: Option<PathBuf>,
    },
    #[cfg(feature = "lab")]
    /// Run a bundled workload (used by `cargo xtask run` and the tests).
    Workload {
        name: WorkloadName,
        #[command(flatten)]
        params: WorkloadParams,
        /// Write the workload's own measurements here as JSON (`-o`, as everywhere).
        #[arg(short = 'o', long, visible_alias = "output", value_name = "FILE")]
        report: Option<PathBuf>,
    },
    #[cfg(feature = "lab")]
    /// Run mlock scenarios under the tracer and check each step against /proc/PID/maps and
    /// smaps; exits 1 on any mismatch.
    Verify {
        /// Write the report as JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Write the report to FILE instead of stdout.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Print shell completions for SHELL (bash, zsh, fish, elvish, powershell) on stdout.
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
    /// Print the man page (roff) on stdout, or write it and one page per subcommand to DIR.
    #[command(hide = true)]
    Man { dir: Option<PathBuf> },
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
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_PROCESSES, value_parser = int(1, MAX_PIDS))]
    pub max_processes: u32,
    /// Most processes traced at once by pid (`-p`, a command, its children); children past
    /// that are counted as not followed.
    #[arg(long, value_name = "N", value_parser = int(1, MAX_PIDS))]
    pub max_targets: Option<u32>,
}

/// Parameters of the `children` and `flood` workloads.
#[cfg(feature = "lab")]
#[derive(Debug, Args, Clone)]
pub struct WorkloadParams {
    /// `children`: how many children.
    #[arg(long, default_value_t = 4, value_parser = int(1, MAX_WORKERS))]
    pub count: u32,
    /// mlock calls per child (`children`) or per thread (`flood`).
    #[arg(long, default_value_t = 1)]
    pub calls: u32,
    /// `flood`: how many threads.
    #[arg(long, default_value_t = 2, value_parser = int(1, MAX_WORKERS))]
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
        let cli = parse(&["verify", "--json", "-o", "/tmp/v.json"]).unwrap();
        let Some(Command::Verify { json, output }) = cli.command else {
            panic!("not verify: {:?}", cli.command);
        };
        assert!(json, "--json is a flag, as in every subcommand");
        assert_eq!(output.as_deref(), Some(std::path::Path::new("/tmp/v.json")));
        assert!(parse(&["verify", "--json", "/tmp/v.json"]).is_err());
    }

    #[test]
    fn libbpf_tools_habits_parse() {
        let cli = parse(&["1", "5"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(
            (cli.trace.interval_secs(), cli.trace.count),
            (Some(1.0), Some(5))
        );
        let t = parse(&[
            "-i", "0.5", "-d", "3", "-t", "42", "-T", "-m", "--hist", "-vv",
        ])
        .unwrap()
        .trace;
        assert_eq!(
            (t.interval_secs(), t.duration, t.tid),
            (Some(0.5), Some(3.0), Some(42))
        );
        assert!(t.timestamp && t.hist && t.fault_options().per_thread);
        assert_eq!((t.unit(), t.verbose), (crate::output::Unit::Ms, 2));
        assert_eq!(
            parse(&["-u"]).unwrap().trace.unit(),
            crate::output::Unit::Us
        );
        assert_eq!(parse(&[]).unwrap().trace.unit(), crate::output::Unit::Auto);
        // Positionals before `--` are the interval; after it, the command's own.
        let t = parse(&["2", "--", "sleep", "1"]).unwrap().trace;
        assert_eq!(
            (t.interval_secs(), t.command.as_slice()),
            (Some(2.0), &["sleep".to_string(), "1".to_string()][..])
        );
        let t = parse(&["-o", "/tmp/x", "-q", "--", "ls"]).unwrap().trace;
        assert!(t.quiet && t.output.is_some());
        // Subcommands still win over the interval positional.
        assert!(matches!(
            parse(&["probe"]).unwrap().command,
            Some(Command::Probe { .. })
        ));
        for bad in [
            &["-m", "-u"][..],
            &["-v", "-q"],
            &["1", "--interval", "2"],
            &["0"],
            &["1", "0"],
            &["-t", "5", "-p", "6"],
            &["-t", "5", "--", "ls"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        let e = parse(&["prboe"]).unwrap_err().to_string();
        assert!(e.contains("neither a subcommand nor an interval"), "{e}");
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
        for out in ["--report", "--output", "-o"] {
            let cli = parse(&["workload", "syscalls", out, "/tmp/r.json"]).unwrap();
            let Some(Command::Workload { report, .. }) = cli.command else {
                panic!("not workload: {:?}", cli.command);
            };
            assert_eq!(report.as_deref(), Some(std::path::Path::new("/tmp/r.json")));
        }
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

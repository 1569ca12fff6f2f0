//! The subcommands, and the lab's workload parameters.

use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;

#[cfg(feature = "lab")]
use crate::values::int;

/// Most children or threads a bundled workload starts at once.
#[cfg(feature = "lab")]
const MAX_WORKERS: u32 = 1024;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Report what the running kernel allows (fentry, kprobe, tp_btf, tracepoint, perf
    /// events, ring buffer, BTF) and which hook set each hook family would use.
    Probe {
        /// Write the report as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Trace a command (or a running process) and advise what memory to lock or populate,
    /// what locking cannot help and what not to do; --apply runs it again with the advice
    /// applied and compares the two runs.
    Advise(crate::advise::AdviseArgs),
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
    /// Touches 64 MiB under MADV_HUGEPAGE, then mlocks another 64 MiB MADV_HUGEPAGE region;
    /// reports getrusage across the mlock and the VMA's smaps. Holds the region 1.5 s,
    /// unmaps it and waits 1.5 s more, so a tracer reads its smaps with and without it.
    Thp,
    /// mlocks 8 MiB of MAP_HUGETLB memory (reserve vm.nr_hugepages first); reports as `thp`.
    Hugetlb,
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
    /// `flood`: follow each mlock with a munlock of the same page (failing the same way).
    #[arg(long)]
    pub munlock: bool,
}

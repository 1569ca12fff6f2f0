//! `cargo xtask bench`: what tracing page faults costs a faulting process.
//!
//! One workload (`memlock-trace workload faults`, first touch of `--mib` MiB with transparent
//! huge pages off) is measured untraced, under memlock-trace in count-only, default (counts +
//! latency histograms) and streaming (`--events`, every fault through the ring buffer)
//! modes, and under a bpftrace script doing the default mode's job on the same hooks. Modes
//! are interleaved round by round, so drift on a shared machine hits them alike; medians are
//! compared. Every traced run also checks the tracer's count against the kernel's own
//! (`/proc/PID/stat`): a cheap tracer that loses faults would not be a result. A last run
//! faults from every CPU at once and must lose nothing either. Results go to BENCHMARKS.md.
//!
//! [`workload`] drives the workload process, [`tracer`] starts a tracer, waits until it is
//! attached and stops it, [`measure`] runs one measured run with a tracer attached (and reads
//! back what the tracer and the kernel counted), [`report`] writes the markdown section; this
//! file holds the options, the modes and the schedule of runs. The other benches (`--soak`,
//! `--node-cost`, `--stack-cost`, `--pressure`) have a module each.

mod measure;
mod node_cost;
mod pressure;
mod report;
mod soak;
mod stack_cost;
mod tracer;
mod workload;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, anyhow, bail};

use self::{
    measure::{ProgramCost, Sample, measure, with_bpf_stats},
    report::{Environment, FAULTS_SECTION, Machine, replace_section, report},
    workload::Placement,
};
use crate::{run::workspace_root, util::run as run_cmd};

#[derive(clap::Args)]
pub struct Args {
    /// MiB first-touched per measured run.
    #[arg(long, default_value_t = 256)]
    mib: usize,
    /// Measured runs per mode (at least 5).
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Times the command runs in each measured run; the fastest counts.
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Where to write the report.
    #[arg(long, default_value = "BENCHMARKS.md")]
    out: PathBuf,
    /// Instead: run the tracer system-wide with --prometheus for MINUTES under process
    /// churn, and plot its memory, CPU and series over time into BENCHMARKS.md.
    #[arg(long, value_name = "MINUTES")]
    soak: Option<f64>,
    /// Instead: what a session costs the rest of the node (fork+exec, stress-ng --fork,
    /// getppid, first touch, map memory) untraced, beside memlock-trace system-wide,
    /// --count-only and -p, and beside bpftrace scripts, alternating; --runs rounds.
    #[arg(long, conflicts_with = "soak")]
    node_cost: bool,
    /// With --node-cost: measure memlock-trace's setups (untraced, system-wide,
    /// --count-only, -p) inside a qemu guest booting this stock kernel instead (5.10, 6.1,
    /// 6.12; repeatable): where the syscall hooks are fentry trampolines. Ratios only, the
    /// guest is emulated.
    #[arg(long, value_name = "KERNEL", requires = "node_cost")]
    guest: Vec<String>,
    /// Inside the guest (what --guest runs there): the tracer to measure.
    #[arg(long, hide = true, requires = "node_cost")]
    in_guest: Option<PathBuf>,
    /// Instead: what a page-fault flame graph costs, memlock-trace's `--stacks --folded`
    /// beside `perf record --call-graph dwarf` + `perf script` collapsed; --runs rounds.
    #[arg(long, conflicts_with_all = ["soak", "node_cost"])]
    stack_cost: bool,
    /// Instead: what tracing costs a process under memory pressure (the memory-pressure
    /// scenario: swap on zram, a memory cgroup below its working set), untraced, default
    /// mode and --count-only alternating; --runs rounds.
    #[arg(long, conflicts_with_all = ["soak", "node_cost", "stack_cost"])]
    pressure: bool,
}

const PAGE: usize = 4096;
/// memlock-trace's `faults::DEFAULT_STACK_SAMPLE` (`--stack-sample`'s default).
const DEFAULT_STACK_SAMPLE: u32 = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Untraced,
    CountOnly,
    Default,
    /// The default mode with the start tracepoints attached as bpftrace 0.17 attaches them.
    DefaultClassic,
    Streaming,
    Bpftrace,
    /// The default mode's hooks with programs that do nothing: the floor under any tool
    /// that uses them.
    EmptyPrograms,
    /// The same hooks with programs that only read the clock at each end: the floor under
    /// any tool that times faults on them.
    ClockPrograms,
    /// The per-thread events `-p` uses (`PAGE_FAULTS` start, `PAGE_FAULTS_MIN/MAJ`
    /// completion) with programs that do nothing: the floor under the default mode with
    /// `-p`, and with the completion at period 32 under `--latency-sample 32`.
    PerThreadFloor,
    PerThreadFloor32,
    /// `--latency-sample N`: counts exact, one fault in N timed.
    Sampled8,
    Sampled32,
    Sampled128,
    /// The default mode and `--latency-sample 32` with the start taken from the system-wide
    /// tp_btf hook rather than from per-thread `PAGE_FAULTS` events (hidden
    /// `--tracepoint-start`): the other design, side by side.
    DefaultTpStart,
    Sampled32TpStart,
    /// `--stacks --stack-sample 1`: every fault keeps its stack (registers and 8 KiB of
    /// user stack copied, unwound by the tracer): the cost of one kept stack.
    StacksEvery,
    /// `--stacks` at its default rate.
    StacksDefault,
}

impl Mode {
    const ALL: [Mode; 17] = [
        Mode::Untraced,
        Mode::CountOnly,
        Mode::Default,
        Mode::Sampled8,
        Mode::Sampled32,
        Mode::Sampled128,
        Mode::DefaultTpStart,
        Mode::Sampled32TpStart,
        Mode::DefaultClassic,
        Mode::Streaming,
        Mode::Bpftrace,
        Mode::EmptyPrograms,
        Mode::ClockPrograms,
        Mode::PerThreadFloor,
        Mode::PerThreadFloor32,
        Mode::StacksEvery,
        Mode::StacksDefault,
    ];

    fn label(self) -> &'static str {
        match self {
            Mode::Untraced => "untraced",
            Mode::CountOnly => "memlock-trace --count-only",
            Mode::Default => "memlock-trace (counts + latency histograms)",
            Mode::DefaultClassic => "the same, classic tracepoints like bpftrace",
            Mode::Streaming => "memlock-trace --events (every fault streamed)",
            Mode::Bpftrace => "bpftrace, same hooks and job",
            Mode::EmptyPrograms => "the same hooks, programs that do nothing (floor)",
            Mode::ClockPrograms => "the same hooks, programs that only read the clock (floor)",
            Mode::Sampled8 => "memlock-trace --latency-sample 8",
            Mode::Sampled32 => "memlock-trace --latency-sample 32",
            Mode::Sampled128 => "memlock-trace --latency-sample 128",
            Mode::DefaultTpStart => "memlock-trace, start from system-wide tp_btf",
            Mode::Sampled32TpStart => "--latency-sample 32, start from system-wide tp_btf",
            Mode::PerThreadFloor => "the per-thread events of -p, programs that do nothing (floor)",
            Mode::PerThreadFloor32 => {
                "the same, completion at period 32 (floor of --latency-sample 32)"
            }
            Mode::StacksEvery => "memlock-trace --stacks --stack-sample 1",
            Mode::StacksDefault => "memlock-trace --stacks (one fault in 32 keeps its stack)",
        }
    }

    /// The modes whose latency the report sets against the default (exact) mode's, in
    /// [`Mode::ALL`]'s order: the default mode, the sampled ones and the tp_btf-start
    /// variants.
    fn latency_compared() -> impl Iterator<Item = Mode> {
        Mode::ALL.into_iter().filter(|mode| {
            matches!(
                mode,
                Mode::Default
                    | Mode::Sampled8
                    | Mode::Sampled32
                    | Mode::Sampled128
                    | Mode::DefaultTpStart
                    | Mode::Sampled32TpStart
            )
        })
    }

    /// The floor modes: hooks with programs that count nothing.
    fn is_floor(self) -> bool {
        matches!(
            self,
            Mode::EmptyPrograms
                | Mode::ClockPrograms
                | Mode::PerThreadFloor
                | Mode::PerThreadFloor32
        )
    }
}

impl Args {
    /// Whether this is the measuring half of `--node-cost --guest`, run inside the guest.
    pub fn in_guest(&self) -> bool {
        self.in_guest.is_some()
    }
}

pub fn run(args: &Args) -> Result<()> {
    if let Some(minutes) = args.soak {
        return soak::run(&build_tracer(TracerBuild::Product)?, minutes, &args.out);
    }
    if args.node_cost {
        if let Some(tracer) = &args.in_guest {
            return node_cost::guest::measure_here(tracer, args.runs);
        }
        if !args.guest.is_empty() {
            return node_cost::guest::run(&args.guest, args.runs, &args.out);
        }
        return node_cost::run(args.runs, &args.out);
    }
    if args.stack_cost {
        return stack_cost::run(args.runs, &args.out);
    }
    if args.pressure {
        return pressure::run(args.runs, &args.out);
    }
    page_faults(args)
}

/// The page-fault benchmark: every mode round after round, the max-rate run and the profiled
/// runs, then the section of BENCHMARKS.md; an error if a tracer lost or invented a fault.
fn page_faults(args: &Args) -> Result<()> {
    if args.runs < 5 {
        bail!("--runs must be at least 5");
    }
    // The peer tool and the program-statistics reader, before minutes of measuring: the
    // last step needs bpftool.
    crate::util::install_missing_packages(&["bpftrace", "bpftool"])
        .context("the benchmark compares with bpftrace and reads program costs with bpftool")?;
    let tracer = build_tracer(TracerBuild::WithBenchFlags)?;
    let bpftrace = which("bpftrace").ok_or_else(|| {
        anyhow!("bpftrace is installed but not on PATH (the comparison needs it)")
    })?;
    let machine = Machine::before_the_runs(&bpftrace);
    let cpus = machine.cpus;
    let bench = Schedule {
        tracer: &tracer,
        bpftrace: &bpftrace,
        pages: args.mib * 1024 * 1024 / PAGE,
        cpus,
        pinned: Placement::workload_alone(cpus),
    };
    let mut env = Environment {
        machine,
        thp: std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_else(|_| "unknown".into())
            .trim()
            .into(),
    };
    let (samples, neighbours) = bench.rounds(args.runs, args.repeats)?;
    let max_rate = bench.max_rate()?;
    let costs = bench.program_costs()?;
    env.machine.load_after = load_average();
    let report = report(
        args,
        bench.pages,
        &env,
        &samples,
        &neighbours,
        &max_rate,
        &costs,
    );
    let out = workspace_root().join(&args.out);
    let existing = std::fs::read_to_string(&out).unwrap_or_default();
    std::fs::write(&out, replace_section(&existing, FAULTS_SECTION, &report))
        .with_context(|| format!("writing {}", out.display()))?;
    println!("{report}");
    println!("xtask bench: wrote {}", out.display());
    nothing_lost(samples.iter().chain(&max_rate))
}

/// The page-fault benchmark's runs: the tracers, the workload's size and where it runs.
struct Schedule<'a> {
    tracer: &'a Path,
    bpftrace: &'a Path,
    pages: usize,
    cpus: usize,
    /// Where the rounds run the workload (the max-rate run uses every CPU).
    pinned: Placement,
}

/// One sample per mode per round, and per mode but untraced per round while the tracer
/// follows another process: (round, mode, sample).
type Rounds = (Vec<(Mode, Sample)>, Vec<(usize, Mode, Sample)>);

impl Schedule<'_> {
    /// `runs` rounds, each every mode in turn, then every traced mode while the tracer follows
    /// a `sleep` (what a process that is not traced pays): drift hits them all alike.
    fn rounds(&self, runs: usize, repeats: usize) -> Result<Rounds> {
        let mut samples = Vec::new();
        let mut neighbours = Vec::new();
        for round in 1..=runs {
            for mode in Mode::ALL {
                let sample = self
                    .touch(mode, repeats, None, None)
                    .with_context(|| format!("round {round}, {}", mode.label()))?;
                eprintln!(
                    "xtask bench: round {round}/{runs} {:<48} {:>7.0} ns/fault{}",
                    mode.label(),
                    sample.ns_per_fault,
                    sample
                        .traced_faults
                        .map(|t| format!(", traced {t} of {} faults", sample.kernel_faults))
                        .unwrap_or_default()
                );
                samples.push((mode, sample));
            }
            for mode in Mode::ALL[1..].iter().copied() {
                let sample = self
                    .beside_a_target(mode, repeats)
                    .with_context(|| format!("round {round}, {}, non-target", mode.label()))?;
                eprintln!(
                    "xtask bench: round {round}/{runs} non-target, {:<36} {:>7.0} ns/fault",
                    mode.label(),
                    sample.ns_per_fault,
                );
                neighbours.push((round, mode, sample));
            }
        }
        Ok((samples, neighbours))
    }

    /// One run of the rounds' command, pinned, the tracer following `follow` instead of the
    /// workload if given; each BPF program's cost appended to `costs` if given.
    fn touch(
        &self,
        mode: Mode,
        repeats: usize,
        costs: Option<&mut Vec<ProgramCost>>,
        follow: Option<u32>,
    ) -> Result<Sample> {
        let command = format!("touch {}", self.pages);
        let placement = self.pinned;
        measure(
            self.tracer,
            self.bpftrace,
            mode,
            &command,
            placement,
            repeats,
            costs,
            follow,
        )
    }

    /// One run of the workload, untraced itself, while the tracer follows a `sleep`.
    fn beside_a_target(&self, mode: Mode, repeats: usize) -> Result<Sample> {
        let mut bystander = self
            .pinned
            .command(Path::new("sleep"), true)
            .arg("3600")
            .spawn()
            .context("starting the traced bystander (sleep)")?;
        let sample = self.touch(mode, repeats, None, Some(bystander.id()));
        let _ = bystander.kill();
        let _ = bystander.wait();
        sample
    }

    /// Every CPU faulting at once, as fast as it can: the tracer must still count each fault.
    fn max_rate(&self) -> Result<Vec<(Mode, Sample)>> {
        let (cpus, command) = (self.cpus, format!("mtouch {} {}", self.pages, self.cpus));
        let mut max_rate = Vec::new();
        for mode in [Mode::Untraced, Mode::Default, Mode::CountOnly] {
            let anywhere = Placement::Anywhere;
            let sample = measure(
                self.tracer,
                self.bpftrace,
                mode,
                &command,
                anywhere,
                1,
                None,
                None,
            )
            .with_context(|| format!("max-rate run, {}", mode.label()))?;
            eprintln!(
                "xtask bench: max rate, {cpus} threads, {:<36} {:>7.0} wall ns/fault",
                mode.label(),
                sample.wall_ns_per_fault
            );
            max_rate.push((mode, sample));
        }
        Ok(max_rate)
    }

    /// Where the cost goes: one more run of each BPF mode with the kernel timing every
    /// program.
    fn program_costs(&self) -> Result<Vec<ProgramCost>> {
        let mut costs = Vec::new();
        with_bpf_stats(|| {
            for mode in [Mode::Default, Mode::Bpftrace] {
                self.touch(mode, 1, Some(&mut costs), None)
                    .with_context(|| format!("profiled run, {}", mode.label()))?;
            }
            Ok(())
        })?;
        Ok(costs)
    }
}

/// An error naming every run whose tracer counted other than the kernel.
fn nothing_lost<'a>(runs: impl Iterator<Item = &'a (Mode, Sample)>) -> Result<()> {
    let lost: Vec<String> = runs
        .filter(|(_, s)| s.traced_faults.is_some_and(|t| t != s.kernel_faults))
        .map(|(m, s)| {
            format!(
                "{}: {:?} of {}",
                m.label(),
                s.traced_faults,
                s.kernel_faults
            )
        })
        .collect();
    if !lost.is_empty() {
        bail!("tracers lost or invented faults:\n{}", lost.join("\n"));
    }
    Ok(())
}

/// Which tracer a benchmark measures.
#[derive(Clone, Copy)]
enum TracerBuild {
    /// The product as users build it.
    Product,
    /// With the `bench` feature: the hidden `--bench-floor`, `--classic-tracepoints` and
    /// `--tracepoint-start` flags and the floor programs, which the product leaves out.
    WithBenchFlags,
}

/// Builds the release tracer as `build` says and returns its path.
fn build_tracer(build: TracerBuild) -> Result<PathBuf> {
    let mut cargo = Command::new("cargo");
    cargo.args(["build", "--release", "-p", "memlock-trace"]);
    if let TracerBuild::WithBenchFlags = build {
        cargo.args(["--features", "bench"]);
    }
    run_cmd(&mut cargo)?;
    Ok(workspace_root().join("target/release/memlock-trace"))
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
}

/// /proc/loadavg's 1, 5 and 15 minute figures.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

//! `cargo xtask bench --node-cost`: what a session costs the rest of the node, as an operator
//! running the tracer on every machine sees it. The same four figures (fork+exec rate,
//! `stress-ng --fork`, a cheap system call, first touch of a process nobody singled out) and
//! the session's BPF map memory are measured untraced, beside memlock-trace system-wide
//! (default and `--count-only`), beside `-p` of an idle `sleep`, and beside bpftrace scripts
//! doing the same jobs, setup after setup within each round, so load from other work on a
//! shared machine hits them alike. Each round's figures are divided by that round's untraced
//! ones; the report gives the medians of those ratios.
//!
//! [`figures`] measures one setup, [`report`] writes the section and the plot.

mod figures;
pub(super) mod guest;
mod report;

use std::{
    path::Path,
    process::{Child, Command},
};

use anyhow::{Context as _, Result, anyhow, bail};

use self::figures::Figures;
use super::{
    measure::{BPFTRACE_SCRIPT, attach_bpftrace},
    tracer::{Attached, attach},
};
use crate::{bench::report::Machine, run::workspace_root};

/// What runs beside the measured work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Setup {
    Untraced,
    /// `memlock-trace --json`: every process, default mode (counts + latency histograms).
    SystemWide,
    SystemWideCountOnly,
    /// The floors under the two system-wide modes: the same hooks with fault programs that
    /// return at once (`--bench-floor empty`; the other families' programs still run), what
    /// any program on those hooks pays before it counts a fault.
    SystemWideFloor,
    SystemWideCountOnlyFloor,
    /// `memlock-trace -p PID` of an idle `sleep`: the measured work is no target.
    OtherProcess,
    /// bpftrace counting faults with a latency histogram per pid, system-wide.
    BpftraceFaults,
    /// bpftrace counting faults per pid on the same events, nothing timed: `--count-only`'s
    /// peer.
    BpftraceFaultCount,
    /// bpftrace timing the mlock family on its `syscalls:*` events.
    BpftraceSyscalls,
}

impl Setup {
    pub(super) const ALL: [Setup; 9] = [
        Setup::Untraced,
        Setup::SystemWide,
        Setup::SystemWideCountOnly,
        Setup::SystemWideFloor,
        Setup::SystemWideCountOnlyFloor,
        Setup::OtherProcess,
        Setup::BpftraceFaults,
        Setup::BpftraceFaultCount,
        Setup::BpftraceSyscalls,
    ];

    pub(super) fn label(self) -> &'static str {
        match self {
            Setup::Untraced => "untraced",
            Setup::SystemWide => "memlock-trace system-wide",
            Setup::SystemWideCountOnly => "memlock-trace system-wide --count-only",
            Setup::SystemWideFloor => "floor: system-wide hooks, programs empty",
            Setup::SystemWideCountOnlyFloor => "floor: --count-only hooks, programs empty",
            Setup::OtherProcess => "memlock-trace -p (an idle sleep)",
            Setup::BpftraceFaults => "bpftrace: faults + latency per pid",
            Setup::BpftraceFaultCount => "bpftrace: faults counted per pid",
            Setup::BpftraceSyscalls => "bpftrace: mlock family timed",
        }
    }

    fn is_bpftrace(self) -> bool {
        matches!(
            self,
            Setup::BpftraceFaults | Setup::BpftraceFaultCount | Setup::BpftraceSyscalls
        )
    }
}

/// The mlock family timed per process and call, as memlock-trace's syscall family does, on
/// the per-call `syscalls:*` events.
const BPFTRACE_SYSCALLS: &str = r#"
tracepoint:syscalls:sys_enter_mlock,
tracepoint:syscalls:sys_enter_mlock2,
tracepoint:syscalls:sys_enter_munlock,
tracepoint:syscalls:sys_enter_mlockall,
tracepoint:syscalls:sys_enter_munlockall
{
    @start[tid] = nsecs;
}
tracepoint:syscalls:sys_exit_mlock,
tracepoint:syscalls:sys_exit_mlock2,
tracepoint:syscalls:sys_exit_munlock,
tracepoint:syscalls:sys_exit_mlockall,
tracepoint:syscalls:sys_exit_munlockall
/@start[tid]/
{
    @ns[pid, probe] = hist(nsecs - @start[tid]);
    delete(@start[tid]);
}
"#;

/// Faults counted per process on the events the faults script counts them on, as
/// `--count-only` counts them.
const BPFTRACE_FAULT_COUNT: &str = r#"
software:minor-faults:1
{
    @minor[pid] = count();
}
software:major-faults:1
{
    @major[pid] = count();
}
"#;

/// One round's figures of one setup.
pub(super) struct Run {
    pub(super) round: usize,
    pub(super) setup: Setup,
    pub(super) figures: Figures,
}

/// The host run: builds the tracer, installs the peers, measures `rounds` rounds and writes
/// the section of BENCHMARKS.md at `out` (and the plot beside it, in docs/).
pub(super) fn run(rounds: usize, out: &Path) -> Result<()> {
    if rounds < 3 {
        bail!("--runs must be at least 3 for --node-cost");
    }
    crate::util::install_missing_packages(&["bpftrace", "stress-ng"])
        .context("the node-cost benchmark compares with bpftrace and runs stress-ng --fork")?;
    let tracer = super::build_tracer(super::TracerBuild::WithBenchFlags)?;
    let bpftrace = super::which("bpftrace").ok_or_else(|| {
        anyhow!("bpftrace is installed but not on PATH (the comparison needs it)")
    })?;
    let mut machine = Machine::before_the_runs(&bpftrace);
    let runs = measure_rounds(&tracer, Some(&bpftrace), rounds, &Setup::ALL, |_| {})?;
    machine.load_after = super::load_average();
    let environment = report::Environment {
        machine,
        rounds,
        hooks: syscall_hooks_line(&tracer),
    };
    let plot = workspace_root().join(report::PLOT);
    report::plot(&plot, &runs)?;
    let section = report::section(&environment, &runs);
    let out = workspace_root().join(out);
    let existing = std::fs::read_to_string(&out).unwrap_or_default();
    std::fs::write(
        &out,
        super::report::replace_section(&existing, report::SECTION, &section),
    )
    .with_context(|| format!("writing {}", out.display()))?;
    println!("{section}");
    println!(
        "xtask bench --node-cost: wrote {} and {}",
        out.display(),
        plot.display()
    );
    Ok(())
}

/// `rounds` rounds of every setup in `setups`, in turn; `each` sees every run as it ends.
fn measure_rounds(
    tracer: &Path,
    bpftrace: Option<&Path>,
    rounds: usize,
    setups: &[Setup],
    mut each: impl FnMut(&Run),
) -> Result<Vec<Run>> {
    let mut runs = Vec::new();
    for round in 1..=rounds {
        for &setup in setups {
            let figures = measure_setup(tracer, bpftrace, setup)
                .with_context(|| format!("round {round}, {}", setup.label()))?;
            eprintln!(
                "xtask bench --node-cost: round {round}/{rounds} {:<40} {figures}",
                setup.label()
            );
            let run = Run {
                round,
                setup,
                figures,
            };
            each(&run);
            runs.push(run);
        }
    }
    Ok(runs)
}

/// One setup: started, measured, stopped.
fn measure_setup(tracer: &Path, bpftrace: Option<&Path>, setup: Setup) -> Result<Figures> {
    let mut bystander: Option<Child> = None;
    let attached: Option<Attached> = match setup {
        Setup::Untraced => None,
        Setup::BpftraceFaults | Setup::BpftraceFaultCount | Setup::BpftraceSyscalls => {
            // The fault script is the page-fault bench's, for every process: its pid
            // filters dropped.
            let script = match setup {
                Setup::BpftraceFaults => BPFTRACE_SCRIPT.replace("/pid == $1/\n", ""),
                Setup::BpftraceFaultCount => BPFTRACE_FAULT_COUNT.to_string(),
                _ => BPFTRACE_SYSCALLS.to_string(),
            };
            let bpftrace = bpftrace.context("a bpftrace setup without bpftrace")?;
            Some(attach_bpftrace(Command::new(bpftrace), &script, &[])?)
        }
        Setup::SystemWide
        | Setup::SystemWideCountOnly
        | Setup::SystemWideFloor
        | Setup::SystemWideCountOnlyFloor
        | Setup::OtherProcess => {
            let mut cmd = Command::new(tracer);
            cmd.arg("--json");
            if matches!(
                setup,
                Setup::SystemWideCountOnly | Setup::SystemWideCountOnlyFloor
            ) {
                cmd.arg("--count-only");
            }
            if matches!(
                setup,
                Setup::SystemWideFloor | Setup::SystemWideCountOnlyFloor
            ) {
                cmd.args(["--bench-floor", "empty"]);
            }
            if setup == Setup::OtherProcess {
                let sleep = Command::new("sleep")
                    .arg("3600")
                    .spawn()
                    .context("starting the idle process `-p` follows (sleep)")?;
                cmd.args(["-p", &sleep.id().to_string()]);
                bystander = Some(sleep);
            }
            Some(attach(cmd, "memlock-trace: tracing", true)?)
        }
    };
    let measured = figures::measure(tracer, attached.as_ref().map(|a| a.child.id()));
    if let Some(attached) = attached {
        let out = attached.stop();
        // bpftrace prints its maps at exit: nothing to check there but that it stopped.
        if !setup.is_bpftrace() {
            out?;
        }
    }
    if let Some(mut sleep) = bystander {
        let _ = sleep.kill();
        let _ = sleep.wait();
    }
    measured
}

/// What the tracer's `probe` says of its syscall hooks, for the report.
fn syscall_hooks_line(tracer: &Path) -> String {
    crate::util::output_of(Command::new(tracer).arg("probe"))
        .map(|out| {
            let joined = out.lines().map(str::trim).collect::<Vec<_>>().join(" ");
            joined
                .split("hooks ")
                .find(|part| part.starts_with("syscalls:"))
                .map(|part| part.trim().to_string())
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

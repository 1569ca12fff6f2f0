//! `cargo xtask bench --stack-cost`: what a page-fault flame graph costs, made by
//! memlock-trace (`--stacks --folded`) or by perf (`perf record -e page-faults -c 1
//! --call-graph dwarf`, then `perf script` collapsed by inferno, stackcollapse-perf.pl's port),
//! on the same workload, round by round.
//!
//! Both copy 8 KiB of user stack per kept fault and unwind it with DWARF in user space:
//! memlock-trace while the session runs, perf after it, from perf.data. Per mode, medians
//! over the rounds: the workload's CPU time per fault (what the traced process pays), the
//! tool's own CPU (its whole life, and perf script's and the collapse's after it), the time
//! from the stop to the folded file, the faults the folded lines hold against the kernel's
//! count, and the bytes written. perf's frame-pointer walk (`-g`) is beside them as the
//! cheapest kind of stack a profiler keeps: the workload, a Rust release build, has no frame
//! pointers, so its stacks stop after a frame or two.

use std::{
    fs,
    io::{Read as _, Write as _},
    path::Path,
    process::Command,
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use inferno::collapse::{
    Collapse as _,
    perf::{Folder, Options},
};

use super::{
    report::{Markers, median, replace_section},
    tracer::{Attached, attach, cpu_ns},
    workload::{Placement, Workload},
};
use crate::{run::workspace_root, util::run as run_cmd};

const SECTION: Markers = (
    "<!-- cargo xtask bench --stack-cost (generated, do not edit) -->",
    "<!-- end of cargo xtask bench --stack-cost -->",
);
/// MiB first-touched per run: 16,384 faults, whose dwarf samples make perf.data ~140 MB.
const MIB: usize = 64;
const PAGE: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Untraced,
    OursEvery,
    OursDefault,
    PerfDwarf,
    PerfFramePointers,
}

impl Mode {
    const ALL: [Mode; 5] = [
        Mode::Untraced,
        Mode::OursEvery,
        Mode::OursDefault,
        Mode::PerfDwarf,
        Mode::PerfFramePointers,
    ];

    fn is_perf(self) -> bool {
        matches!(self, Mode::PerfDwarf | Mode::PerfFramePointers)
    }

    fn label(self) -> &'static str {
        match self {
            Mode::Untraced => "untraced",
            Mode::OursEvery => "memlock-trace --stacks --stack-sample 1 --folded",
            Mode::OursDefault => "memlock-trace --stacks --folded (1 fault in 32)",
            Mode::PerfDwarf => {
                "perf record -c 1 --call-graph dwarf,8192 -m 1024, perf script collapsed"
            }
            Mode::PerfFramePointers => "perf record -c 1 -g -m 1024, perf script collapsed",
        }
    }
}

/// One round of one mode.
struct Run {
    mode: Mode,
    /// The workload's CPU time per fault.
    ns_per_fault: f64,
    /// The tool's CPU: its whole life, plus perf script and the collapse for perf.
    tool_cpu_ns: u64,
    /// From the stop to the folded file written.
    to_folded: Duration,
    /// Faults the folded lines hold, and the kernel's count of the window.
    folded_faults: u64,
    kernel_faults: u64,
    /// perf.data, or memlock-trace's folded file (its only output here).
    bytes: u64,
}

pub fn run(runs: usize, out: &Path) -> Result<()> {
    if runs < 3 {
        bail!("--runs must be at least 3");
    }
    crate::util::install_missing_packages(&["linux-perf"])
        .context("the comparison runs perf record")?;
    let tracer = super::build_tracer(super::TracerBuild::Product)?;
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let placement = Placement::workload_alone(cpus);
    let scratch = std::env::temp_dir().join(format!("xtask-stack-cost-{}", std::process::id()));
    fs::create_dir_all(&scratch)?;
    let mut all = Vec::new();
    for round in 1..=runs {
        for mode in Mode::ALL {
            let run = measure(&tracer, mode, placement, &scratch)
                .with_context(|| format!("round {round}, {}", mode.label()))?;
            eprintln!(
                "xtask bench: round {round}/{runs} {:<66} {:>6.0} ns/fault, tool {:.2} s CPU, \
                 folded {:.2} s after the stop, {} of {} faults",
                mode.label(),
                run.ns_per_fault,
                run.tool_cpu_ns as f64 / 1e9,
                run.to_folded.as_secs_f64(),
                run.folded_faults,
                run.kernel_faults
            );
            all.push(run);
        }
    }
    fs::remove_dir_all(&scratch).ok();
    let report = report(&all, runs);
    let path = workspace_root().join(out);
    let existing = fs::read_to_string(&path).unwrap_or_default();
    fs::write(&path, replace_section(&existing, SECTION, &report))
        .with_context(|| format!("writing {}", path.display()))?;
    println!("{report}");
    println!("xtask bench: wrote {}", path.display());
    Ok(())
}

fn measure(tracer: &Path, mode: Mode, placement: Placement, scratch: &Path) -> Result<Run> {
    let mut workload = Workload::spawn(tracer, placement)?;
    workload.run("touch 256")?;
    let pid = workload.pid().to_string();
    let folded = scratch.join("stacks.folded");
    let data = scratch.join("perf.data");
    let attached = match mode {
        Mode::Untraced => None,
        Mode::OursEvery | Mode::OursDefault => {
            let mut cmd = placement.command(tracer, true);
            cmd.args(["-p", &pid, "--json", "--stacks", "--folded"])
                .arg(&folded);
            if mode == Mode::OursEvery {
                cmd.args(["--stack-sample", "1"]);
            }
            Some(attach(cmd, "memlock-trace: tracing", true)?)
        }
        Mode::PerfDwarf | Mode::PerfFramePointers => {
            let graph: &[&str] = match mode {
                Mode::PerfDwarf => &["--call-graph", "dwarf,8192"],
                _ => &["-g"],
            };
            Some(attach_perf(placement, graph, &pid, &data, scratch)?)
        }
    };
    let before = workload.kernel_faults()?;
    let pages = MIB * 1024 * 1024 / PAGE;
    let (_, cpu_ns) = workload.run(&format!("touch {pages}"))?;
    let kernel_faults = workload.kernel_faults()? - before;
    let ns_per_fault = cpu_ns as f64 / kernel_faults.max(1) as f64;
    let Some(attached) = attached else {
        return Ok(Run {
            mode,
            ns_per_fault,
            tool_cpu_ns: 0,
            to_folded: Duration::ZERO,
            folded_faults: 0,
            kernel_faults,
            bytes: 0,
        });
    };
    let stopped = attached.stop_measured(mode.is_perf())?;
    let (mut tool_cpu_ns, mut to_folded) = (stopped.cpu_ns, stopped.after_stop);
    let (text, bytes) = if mode.is_perf() {
        let began = Instant::now();
        let (text, script_cpu_ns) = perf_folded(&data)?;
        tool_cpu_ns += script_cpu_ns;
        to_folded += began.elapsed();
        (text, fs::metadata(&data)?.len())
    } else {
        (fs::read_to_string(&folded)?, fs::metadata(&folded)?.len())
    };
    fs::remove_file(&data).ok();
    fs::remove_file(&folded).ok();
    drop(workload);
    Ok(Run {
        mode,
        ns_per_fault,
        tool_cpu_ns,
        to_folded,
        folded_faults: text
            .lines()
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum(),
        kernel_faults,
        bytes,
    })
}

/// `perf record` on `pid`, started with its events disabled and enabled through its control
/// FIFO: its acknowledgement says the events are on, as memlock-trace's "tracing" line does.
fn attach_perf(
    placement: Placement,
    graph: &[&str],
    pid: &str,
    data: &Path,
    scratch: &Path,
) -> Result<Attached> {
    let (ctl, ack) = (scratch.join("perf.ctl"), scratch.join("perf.ack"));
    for fifo in [&ctl, &ack] {
        fs::remove_file(fifo).ok();
        run_cmd(Command::new("mkfifo").arg(fifo))?;
    }
    let mut cmd = placement.command(Path::new("perf"), true);
    // A 4 MiB buffer per CPU, as memlock-trace's stack ring (perf's default, 516 KiB, lost
    // a quarter of the dwarf samples here).
    cmd.args([
        "record",
        "-e",
        "page-faults",
        "-c",
        "1",
        "--mmap-pages",
        "1024",
    ])
    .args(graph)
    .args(["-D", "-1", "--control"])
    .arg(format!("fifo:{},{}", ctl.display(), ack.display()))
    .args(["-p", pid, "-o"])
    .arg(data);
    let attached = attach(cmd, "Events disabled", true)?;
    // perf opens the FIFOs after its "disabled" line; opening them blocks until it has.
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let handshake = || -> std::io::Result<String> {
            fs::OpenOptions::new()
                .write(true)
                .open(&ctl)?
                .write_all(b"enable\n")?;
            let mut reply = [0u8; 16];
            let n = fs::File::open(&ack)?.read(&mut reply)?;
            Ok(String::from_utf8_lossy(&reply[..n]).into_owned())
        };
        let _ = done_tx.send(handshake());
    });
    match done_rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(reply)) if reply.starts_with("ack") => Ok(attached),
        other => bail!("perf record did not enable its events: {other:?}"),
    }
}

/// `perf script` of `data`, collapsed by inferno; and the CPU that took (perf script's,
/// from its rusage, and this thread's collapse).
fn perf_folded(data: &Path) -> Result<(String, u64)> {
    let children_before = cpu_ns(libc::RUSAGE_CHILDREN);
    let thread_before = cpu_ns(libc::RUSAGE_THREAD);
    let script = Command::new("perf")
        .args(["script", "-i"])
        .arg(data)
        .output()
        .context("perf script")?;
    if !script.status.success() {
        bail!(
            "perf script: {}",
            String::from_utf8_lossy(&script.stderr).trim()
        );
    }
    let mut folded = Vec::new();
    Folder::from(Options::default())
        .collapse(&script.stdout[..], &mut folded)
        .context("collapsing perf script's output")?;
    let cpu = cpu_ns(libc::RUSAGE_CHILDREN) - children_before + cpu_ns(libc::RUSAGE_THREAD)
        - thread_before;
    Ok((String::from_utf8(folded)?, cpu))
}

fn report(all: &[Run], runs: usize) -> String {
    let of = |mode: Mode, f: &dyn Fn(&Run) -> f64| {
        median(all.iter().filter(|r| r.mode == mode).map(f).collect())
    };
    let untraced = of(Mode::Untraced, &|r| r.ns_per_fault);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut text = format!(
        "## Flame-graph cost: memlock-trace's folded stacks beside perf's (`cargo xtask bench \
         --stack-cost`)\n\n\
         Kernel {}, {} CPUs; {runs} rounds, the modes interleaved in each; {MIB} MiB \
         first-touched per run (`memlock-trace workload faults`, one fault per 4 KiB page), \
         the workload pinned to the last CPU and the tool to CPU 0. Medians over the rounds. \
         \"Tool CPU\" is the tool's whole life (wait4's rusage) and, for perf, `perf script` \
         and the collapse after it; \"to folded\" is from the stop (SIGINT) to the folded \
         lines written.\n\n\
         | tool | workload CPU per fault | vs untraced | tool CPU | to folded | faults in the folded lines / kernel's | bytes written |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        kernel.trim(),
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    for mode in Mode::ALL {
        let ns = of(mode, &|r| r.ns_per_fault);
        let (folded, kernel) = (
            of(mode, &|r| r.folded_faults as f64),
            of(mode, &|r| r.kernel_faults as f64),
        );
        let cells = if mode == Mode::Untraced {
            "| | | |".to_string()
        } else {
            format!(
                "{:.2} s | {:.2} s | {folded:.0} / {kernel:.0} | {:.0} kB |",
                of(mode, &|r| r.tool_cpu_ns as f64) / 1e9,
                of(mode, &|r| r.to_folded.as_secs_f64()),
                of(mode, &|r| r.bytes as f64) / 1e3,
            )
        };
        text.push_str(&format!(
            "| {} | {ns:.0} ns | {:.2}x | {cells}\n",
            mode.label(),
            ns / untraced
        ));
    }
    text
}

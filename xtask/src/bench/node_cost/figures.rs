//! The figures of one setup: fork+exec rate, `stress-ng --fork`, `getppid` per call, first
//! touch per page of a fresh process, and the session's BPF map memory.

use std::{fmt, path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

use super::super::{
    tracer::cpu_ns,
    workload::{Placement, Workload},
};

/// `/bin/true` runs per fork+exec sample: ~1 s untraced here.
const FORK_EXECS: u32 = 400;
/// `getppid` calls per timed loop; the fastest of 2 x [`REPEATS`] loops counts.
const GETPPID_CALLS: u32 = 300_000;
/// Pages first-touched per sample (64 MiB).
const TOUCH_PAGES: usize = 16_384;
/// Repeats of the short figures; interference only adds time, so the fastest counts.
const REPEATS: usize = 3;
const STRESS_SECS: u32 = 3;

#[derive(Clone, Copy, Debug, Default)]
pub(in crate::bench) struct Figures {
    pub(in crate::bench) fork_exec_per_sec: f64,
    /// None without stress-ng.
    pub(in crate::bench) stress_fork_per_sec: Option<f64>,
    pub(in crate::bench) getppid_ns: f64,
    /// CPU time of the touching process per page.
    pub(in crate::bench) first_touch_ns: f64,
    /// Map memory (`memlock:` in fdinfo) of the session's maps, and how many (None untraced).
    pub(in crate::bench) map_bytes: Option<u64>,
    pub(in crate::bench) maps: usize,
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fork+exec {:.0}/s, stress-ng {}, getppid {:.1} ns, first touch {:.0} ns/page",
            self.fork_exec_per_sec,
            self.stress_fork_per_sec
                .map_or("-".into(), |v| format!("{v:.0}/s")),
            self.getppid_ns,
            self.first_touch_ns
        )?;
        if let Some(bytes) = self.map_bytes {
            write!(f, ", {} maps {:.1} MiB", self.maps, bytes as f64 / MIB)?;
        }
        Ok(())
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// Measures every figure with the session of `session_pid` (None: untraced) running.
/// `tracer` is memlock-trace's binary, whose `workload faults` does the first touch.
pub(in crate::bench) fn measure(tracer: &Path, session_pid: Option<u32>) -> Result<Figures> {
    let (map_bytes, maps) = match session_pid {
        Some(pid) => {
            let (bytes, maps) = map_memory(pid)?;
            (Some(bytes), maps)
        }
        None => (None, 0),
    };
    Ok(Figures {
        fork_exec_per_sec: fork_exec_rate()?,
        stress_fork_per_sec: stress_fork()?,
        getppid_ns: getppid_ns(),
        first_touch_ns: first_touch_ns(tracer)?,
        map_bytes,
        maps,
    })
}

/// A shell loop of fork+exec `/bin/true` (POSIX sh, so busybox runs it too): runs per
/// CPU-second of the shell and its children (`getrusage(RUSAGE_CHILDREN)`), so time other
/// processes held the CPU does not count; what a tracer adds to a fork, an exec, their
/// faults and system calls runs in those processes and does.
fn fork_exec_rate() -> Result<f64> {
    let script = format!("i=0; while [ $i -lt {FORK_EXECS} ]; do /bin/true; i=$((i + 1)); done");
    let before = cpu_ns(libc::RUSAGE_CHILDREN);
    crate::util::run(Command::new("sh").args(["-c", &script]))?;
    let spent_ns = cpu_ns(libc::RUSAGE_CHILDREN) - before;
    Ok(f64::from(FORK_EXECS) / (spent_ns.max(1) as f64 / 1e9))
}

/// `stress-ng --fork 1`: bogo-ops per second of its CPU time (usr+sys, which leaves out the
/// time other processes held the CPU), from its YAML report; None where stress-ng is not
/// installed (a guest).
fn stress_fork() -> Result<Option<f64>> {
    if super::super::which("stress-ng").is_none() {
        return Ok(None);
    }
    let yaml = std::env::temp_dir().join(format!("node-cost-{}.yaml", std::process::id()));
    crate::util::output_of(Command::new("stress-ng").args([
        "--fork",
        "1",
        "-t",
        &STRESS_SECS.to_string(),
        "--metrics-brief",
        "--yaml",
        &yaml.to_string_lossy(),
    ]))?;
    let text = std::fs::read_to_string(&yaml).context("stress-ng's YAML report")?;
    let _ = std::fs::remove_file(&yaml);
    let rate = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("bogo-ops-per-second-usr-sys-time:"))
        .and_then(|v| v.trim().parse().ok());
    match rate {
        Some(rate) => Ok(Some(rate)),
        None => bail!("no bogo-ops-per-second-usr-sys-time in stress-ng's report:\n{text}"),
    }
}

/// ns of this thread's CPU time per `getppid` through `syscall()`, the fastest of a few
/// loops: a call that no hook wants, so what it pays is what every system call of the node
/// pays. CPU time, not wall time: a loop preempted by other work is not slower.
fn getppid_ns() -> f64 {
    let mut best = u64::MAX;
    for _ in 0..REPEATS * 2 {
        let started = thread_cpu_ns();
        for _ in 0..GETPPID_CALLS {
            // SAFETY: getppid takes no argument and touches no memory.
            unsafe { libc::syscall(libc::SYS_getppid) };
        }
        best = best.min(thread_cpu_ns() - started);
    }
    best as f64 / f64::from(GETPPID_CALLS)
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer to a local; this clock always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU ns per page of first touch in a process started after the session (system-wide, a
/// target; beside `-p`, none).
fn first_touch_ns(tracer: &Path) -> Result<f64> {
    let mut workload = Workload::spawn(tracer, Placement::Anywhere)?;
    workload.run("touch 256")?;
    let mut best = f64::MAX;
    for _ in 0..REPEATS {
        let before = workload.kernel_faults()?;
        let (_, cpu_ns) = workload.run(&format!("touch {TOUCH_PAGES}"))?;
        let faults = workload.kernel_faults()? - before;
        best = best.min(cpu_ns as f64 / faults.max(1) as f64);
    }
    Ok(best)
}

/// The BPF maps process `pid` holds, from its fds' fdinfo: their `memlock:` sum (what the
/// kernel charges for them) and how many, each map once however many fds refer to it.
fn map_memory(pid: u32) -> Result<(u64, usize)> {
    let dir = format!("/proc/{pid}/fdinfo");
    let mut seen = std::collections::BTreeSet::new();
    let mut bytes = 0;
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let Ok(text) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let (Some(id), Some(memlock)) = (field("map_id:"), field("memlock:"))
            && seen.insert(id)
        {
            bytes += memlock;
        }
    }
    Ok((bytes, seen.len()))
}

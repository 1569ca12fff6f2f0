//! One measured run: a fresh workload, a tracer attached to it in the mode measured, the
//! command run in the traced window, then what the kernel and the tracer counted, and
//! optionally what each BPF program cost (`kernel.bpf_stats_enabled`).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
};

use anyhow::{Context as _, Result, anyhow, bail};

use super::{
    Mode,
    tracer::{Attached, attach},
    workload::{Placement, Workload},
};
use crate::util::output_of;

/// The bpftrace equivalent of memlock-trace's default mode on the tracepoint hook set:
/// per-process minor/major counts and latency histograms from fault entry to accounting.
pub(super) const BPFTRACE_SCRIPT: &str = r#"
tracepoint:exceptions:page_fault_user,
tracepoint:exceptions:page_fault_kernel
/pid == $1/
{
    @start[tid] = nsecs;
}
software:minor-faults:1
/pid == $1/
{
    @minor[pid] = count();
    if (@start[tid]) {
        @minor_ns[pid] = hist(nsecs - @start[tid]);
        delete(@start[tid]);
    }
}
software:major-faults:1
/pid == $1/
{
    @major[pid] = count();
    if (@start[tid]) {
        @major_ns[pid] = hist(nsecs - @start[tid]);
        delete(@start[tid]);
    }
}
"#;

/// The probe bpftrace attaches last: it prints once every other probe is in place (bpftrace
/// prints "Attaching N probes" before it attaches them).
const BPFTRACE_READY: &str = r#"
interval:ms:50
/@ready == 0/
{
    printf("attached\n");
    @ready = 1;
}
"#;

/// Starts `cmd` (a bpftrace) on `script` and `args`, and waits until its probes are attached.
pub(super) fn attach_bpftrace(mut cmd: Command, script: &str, args: &[&str]) -> Result<Attached> {
    cmd.arg("-e")
        .arg(format!("{script}{BPFTRACE_READY}"))
        .args(args);
    attach(cmd, "attached", false)
}

/// One measured run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sample {
    /// The workload's CPU time (all its threads) per fault: the figure compared, as it
    /// leaves out time other processes held the CPU.
    pub(super) ns_per_fault: f64,
    /// Wall-clock time per fault (includes what the tracer's user space costs the machine).
    pub(super) wall_ns_per_fault: f64,
    /// Faults the kernel counted in the traced window.
    pub(super) kernel_faults: u64,
    /// Faults the tracer counted in that window (None untraced).
    pub(super) traced_faults: Option<u64>,
    /// memlock-trace's user-fault latency over the window (None without latency).
    pub(super) latency: Option<Latency>,
    /// `--stacks`: what the kept stacks cost the tracer's user space (None without).
    pub(super) stacks: Option<StackFigures>,
}

/// `--stacks`: the kept stacks of a run, from the summary's `fault_health`.
#[derive(Clone, Copy, Debug)]
pub(super) struct StackFigures {
    /// Stacks unwound from registers and stack bytes, and the time that took.
    pub(super) unwound: u64,
    pub(super) unwind_ns: u64,
    /// Sampled faults whose stack was lost to a full ring buffer.
    pub(super) lost: u64,
}

/// Percentiles of the user faults timed, and how many were timed.
#[derive(Clone, Copy, Debug)]
pub(super) struct Latency {
    pub(super) p50: u64,
    pub(super) p90: u64,
    pub(super) p99: u64,
    pub(super) timed: u64,
}

/// One run of `command` in a fresh workload, traced as `mode` from after a warm-up to after
/// the run, so the traced window holds exactly that run; with `costs`, also the run time of
/// every BPF program the tracer loaded (kernel.bpf_stats_enabled), appended there. With
/// `follow`, the tracer follows that process instead and the workload is a non-target.
#[expect(clippy::too_many_arguments, reason = "one measured run's settings")]
pub(super) fn measure(
    tracer: &Path,
    bpftrace: &Path,
    mode: Mode,
    command: &str,
    placement: Placement,
    repeats: usize,
    costs: Option<&mut Vec<ProgramCost>>,
    follow: Option<u32>,
) -> Result<Sample> {
    let mut workload = Workload::spawn(tracer, placement)?;
    // Warm the code paths and the workload's own buffers before anything is measured.
    workload.run("touch 256")?;
    let pid = follow.unwrap_or(workload.pid()).to_string();
    let programs_before = match costs {
        Some(_) => program_stats()?.into_keys().collect(),
        None => BTreeSet::new(),
    };
    let attached = match mode {
        Mode::Untraced => None,
        Mode::Bpftrace => {
            let cmd = placement.command(bpftrace, true);
            Some(attach_bpftrace(cmd, BPFTRACE_SCRIPT, &[&pid])?)
        }
        _ => {
            let mut cmd = placement.command(tracer, true);
            cmd.args(memlock_trace_args(mode, &pid));
            Some(attach(cmd, "memlock-trace: tracing", true)?)
        }
    };
    let before = workload.kernel_faults()?;
    // The command runs `repeats` times in the traced window; the fastest run is the sample.
    // Interference on a shared machine only ever adds time, so the minimum of a few runs is
    // the cost with the least of it (the median of single runs swung by +-15% here).
    let (mut wall_ns, mut cpu_ns) = (u64::MAX, u64::MAX);
    for _ in 0..repeats {
        let (wall, cpu) = workload.run(command)?;
        wall_ns = wall_ns.min(wall);
        cpu_ns = cpu_ns.min(cpu);
    }
    let kernel_faults = workload.kernel_faults()? - before;
    if let Some(costs) = costs {
        for (id, cost) in program_stats()? {
            if !programs_before.contains(&id) && cost.runs > 0 {
                costs.push(ProgramCost { mode, ..cost });
            }
        }
    }
    let (traced_faults, latency, stacks) = match attached {
        None => (None, None, None),
        Some(attached) => {
            let out = attached.stop()?;
            match mode {
                // Following another process: nothing of the workload's to count.
                _ if follow.is_some() => (None, None, None),
                Mode::Bpftrace => (Some(bpftrace_faults(&out, &pid)?), None, None),
                // Floor programs count nothing.
                _ if mode.is_floor() => (None, None, None),
                _ => {
                    let (faults, latency, stacks) = memlock_trace_faults(&out, &pid)?;
                    (Some(faults), latency, stacks)
                }
            }
        }
    };
    drop(workload);
    // Every run of the command takes the same faults.
    let faults = (kernel_faults as f64 / repeats as f64).max(1.0);
    Ok(Sample {
        ns_per_fault: cpu_ns as f64 / faults,
        wall_ns_per_fault: wall_ns as f64 / faults,
        kernel_faults,
        traced_faults,
        latency,
        stacks,
    })
}

/// memlock-trace's command line for `mode`, tracing `pid` on the tracepoint hook set. The
/// benchmark-only variants are hidden flags of memlock-trace: `--classic-tracepoints` attaches
/// the start tracepoints the classic way, as bpftrace does; `--bench-floor empty|clock`
/// replaces the per-fault programs by the floor programs.
fn memlock_trace_args(mode: Mode, pid: &str) -> Vec<&str> {
    let extra: &[&str] = match mode {
        Mode::CountOnly => &["--count-only"],
        Mode::Sampled8 => &["--latency-sample", "8"],
        Mode::Sampled32 => &["--latency-sample", "32"],
        Mode::Sampled128 => &["--latency-sample", "128"],
        Mode::Streaming => &["--events"],
        Mode::DefaultClassic => &["--classic-tracepoints"],
        Mode::DefaultTpStart => &["--tracepoint-start"],
        Mode::Sampled32TpStart => &["--latency-sample", "32", "--tracepoint-start"],
        Mode::EmptyPrograms => &["--bench-floor", "empty"],
        Mode::ClockPrograms => &["--bench-floor", "clock"],
        Mode::PerThreadFloor => &["--bench-floor", "per-thread"],
        Mode::PerThreadFloor32 => &["--bench-floor", "per-thread", "--latency-sample", "32"],
        Mode::StacksEvery => &["--stacks", "--stack-sample", "1"],
        Mode::StacksDefault => &["--stacks"],
        Mode::Untraced | Mode::Default | Mode::Bpftrace => &[],
    };
    let mut args = vec!["-p", pid, "--json", "--fault-hooks", "tracepoint"];
    args.extend_from_slice(extra);
    args
}

/// One BPF program's share: runs and average run time (bpf_stats).
#[derive(Clone, Debug)]
pub(super) struct ProgramCost {
    pub(super) mode: Mode,
    pub(super) name: String,
    pub(super) runs: u64,
    pub(super) avg_ns: f64,
}

/// Every loaded BPF program's run statistics, by id (`bpftool prog show -j`).
fn program_stats() -> Result<BTreeMap<u64, ProgramCost>> {
    let out = output_of(Command::new("bpftool").args(["prog", "show", "-j"]))
        .context("bpftool (apt-get install bpftool) lists the programs' run times")?;
    let programs: serde_json::Value = serde_json::from_str(&out)?;
    let mut stats = BTreeMap::new();
    for p in programs.as_array().into_iter().flatten() {
        let (Some(id), Some(runs), Some(ns)) = (
            p["id"].as_u64(),
            p["run_cnt"].as_u64(),
            p["run_time_ns"].as_u64(),
        ) else {
            continue;
        };
        stats.insert(
            id,
            ProgramCost {
                mode: Mode::Untraced,
                name: p["name"].as_str().unwrap_or("?").to_string(),
                runs,
                avg_ns: ns as f64 / runs.max(1) as f64,
            },
        );
    }
    Ok(stats)
}

/// Runs `f` with kernel.bpf_stats_enabled on, restoring the setting after.
pub(super) fn with_bpf_stats<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    const KNOB: &str = "/proc/sys/kernel/bpf_stats_enabled";
    let old = std::fs::read_to_string(KNOB).with_context(|| format!("reading {KNOB}"))?;
    std::fs::write(KNOB, "1").with_context(|| format!("enabling {KNOB}"))?;
    let result = f();
    let _ = std::fs::write(KNOB, old.trim());
    result
}

/// minor + major of `pid` in memlock-trace's JSON summary line, its user faults' latency,
/// and with `--stacks` what the kept stacks cost.
fn memlock_trace_faults(
    out: &str,
    pid: &str,
) -> Result<(u64, Option<Latency>, Option<StackFigures>)> {
    let summary = out
        .lines()
        .rev()
        .find_map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .filter(|v| v["type"] == "summary")
        })
        .ok_or_else(|| anyhow!("no JSON summary in memlock-trace's output"))?;
    let process = summary["processes"]
        .as_array()
        .and_then(|ps| {
            ps.iter()
                .find(|p| p["pid"].as_u64().is_some_and(|p| p.to_string() == pid))
        })
        .ok_or_else(|| anyhow!("pid {pid} missing from the summary"))?;
    let faults = &process["faults"];
    let user = &faults["latency_ns"]["user"];
    let latency = user["count"].as_u64().map(|timed| Latency {
        p50: user["p50"].as_u64().unwrap_or(0),
        p90: user["p90"].as_u64().unwrap_or(0),
        p99: user["p99"].as_u64().unwrap_or(0),
        timed,
    });
    let health = &summary["fault_health"];
    let unwinding = &health["stack_unwinding"];
    let stacks = unwinding["unwound"].as_u64().map(|unwound| StackFigures {
        unwound,
        unwind_ns: unwinding["unwind_ns"].as_u64().unwrap_or(0),
        lost: health["stacks_dropped"].as_u64().unwrap_or(0),
    });
    Ok((
        faults["minor"].as_u64().unwrap_or(0) + faults["major"].as_u64().unwrap_or(0),
        latency,
        stacks,
    ))
}

/// `@minor[PID]: N` + `@major[PID]: N` in bpftrace's exit output.
fn bpftrace_faults(out: &str, pid: &str) -> Result<u64> {
    let count = |name: &str| -> u64 {
        let prefix = format!("@{name}[{pid}]: ");
        out.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let total = count("minor") + count("major");
    if total == 0 {
        bail!("no counts in bpftrace's output:\n{out}");
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn benchmark_only_programs_are_chosen_by_flags() {
        let common = ["-p", "42", "--json", "--fault-hooks", "tracepoint"];
        let extra = |mode| {
            let args = memlock_trace_args(mode, "42");
            assert_eq!(args[..common.len()], common, "{mode:?}");
            args[common.len()..].to_vec()
        };
        assert!(extra(Mode::Default).is_empty());
        assert_eq!(extra(Mode::CountOnly), ["--count-only"]);
        assert_eq!(extra(Mode::Sampled32), ["--latency-sample", "32"]);
        assert_eq!(extra(Mode::Streaming), ["--events"]);
        assert_eq!(extra(Mode::DefaultClassic), ["--classic-tracepoints"]);
        assert_eq!(extra(Mode::EmptyPrograms), ["--bench-floor", "empty"]);
        assert_eq!(extra(Mode::ClockPrograms), ["--bench-floor", "clock"]);
    }
}

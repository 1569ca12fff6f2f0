//! `cargo xtask bench --pressure`: what tracing page faults costs a process under memory
//! pressure, where each fault meets the cause programs (reclaim, compaction, throttling) as
//! well as the fault hooks.
//!
//! The workload is the `memory-pressure` scenario (`memlock-trace scenario memory-pressure`):
//! inside a memory cgroup limited below its working set, with swap on zram, it writes an
//! allocation twice the limit's size page by page twice (the first pass takes minor faults
//! that each charge the cgroup past its limit and reclaim; the second takes major faults,
//! swap-ins, that reclaim as well), then reads back two of its regions that went to swap
//! (swap-ins alone). It measures each phase itself: its thread's CPU time (a fault's
//! reclaim, its zram compression and a tracer's programs all run in that thread; waits for a
//! CPU on a shared machine do not count) and faults (`getrusage`), so a traced run and an
//! untraced one are measured alike. Untraced, under memlock-trace (default mode,
//! `--follow-children`) and under `--count-only` alternate round by round; each phase's CPU
//! time per fault is divided by the same round's untraced one, and the report gives the
//! median ratio and the range. Every traced run also checks the tracer's counts of
//! the experiment's process against the kernel's at its exit.

use std::{fmt::Write as _, path::Path, process::Command};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::{
    load_average,
    report::{Markers, kernel_release, median, replace_section},
};
use crate::run::workspace_root;

const SECTION: Markers = (
    "<!-- cargo xtask bench --pressure (generated, do not edit) -->",
    "<!-- end of cargo xtask bench --pressure -->",
);
/// The scenario's sizes: three 32 MiB regions, 256 MiB pushed through a 128 MiB cgroup.
const SIZES: [&str; 6] = [
    "--pressure-region-mib",
    "32",
    "--pressure-limit-mib",
    "128",
    "--pressure-mib",
    "256",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Untraced,
    Default,
    CountOnly,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Untraced, Mode::Default, Mode::CountOnly];

    fn label(self) -> &'static str {
        match self {
            Mode::Untraced => "untraced",
            Mode::Default => "memlock-trace (counts + latency + causes)",
            Mode::CountOnly => "memlock-trace --count-only",
        }
    }

    fn tracer_args(self) -> &'static [&'static str] {
        match self {
            Mode::Untraced => &[],
            Mode::Default => &["--follow-children"],
            Mode::CountOnly => &["--follow-children", "--count-only"],
        }
    }
}

/// The phases the scenario times, and how each is found in its JSON result.
const PHASES: [(&str, &str); 3] = [
    (
        "first pass over the allocation: minor faults, each reclaiming in the cgroup",
        "pressure/0",
    ),
    (
        "second pass: major faults (swap-ins), each reclaiming in the cgroup",
        "pressure/1",
    ),
    (
        "reading back two swapped-out regions: major faults (swap-ins)",
        "touched_again",
    ),
];

/// One run of one mode: each phase's CPU time per fault, and its faults.
struct Run {
    mode: Mode,
    ns_per_fault: [f64; PHASES.len()],
    faults: [u64; PHASES.len()],
    /// The default mode's share of the timed faults' time it put down to memcg reclaim.
    memcg_reclaim_share: Option<f64>,
}

pub fn run(runs: usize, out: &Path) -> Result<()> {
    if runs < 3 {
        bail!("--runs must be at least 3");
    }
    let tracer = super::build_tracer(super::TracerBuild::Product)?;
    let load_before = load_average();
    let scratch = std::env::temp_dir().join(format!("xtask-pressure-{}.json", std::process::id()));
    let mut all = Vec::new();
    for round in 1..=runs {
        for mode in Mode::ALL {
            let run = measure(&tracer, mode, &scratch)
                .with_context(|| format!("round {round}, {}", mode.label()))?;
            eprintln!(
                "xtask bench: round {round}/{runs} {:<44} {} CPU ns/fault",
                mode.label(),
                run.ns_per_fault.map(|ns| format!("{ns:>6.0}")).join(" ")
            );
            all.push(run);
        }
    }
    std::fs::remove_file(&scratch).ok();
    let report = report(&all, runs, &load_before);
    let path = workspace_root().join(out);
    let existing = std::fs::read_to_string(&path).unwrap_or_default();
    std::fs::write(&path, replace_section(&existing, SECTION, &report))
        .with_context(|| format!("writing {}", path.display()))?;
    println!("{report}");
    println!("xtask bench: wrote {}", path.display());
    Ok(())
}

/// One run of the scenario in `mode`; for a traced mode, the tracer's JSON summary goes to
/// `summary` and its counts must be the kernel's.
fn measure(tracer: &Path, mode: Mode, summary: &Path) -> Result<Run> {
    let mut command = Command::new(tracer);
    if mode != Mode::Untraced {
        command
            .args(mode.tracer_args())
            .args(["--quiet", "--json", "-o"])
            .arg(summary)
            .arg("--")
            .arg(tracer);
    }
    command.args(["scenario", "memory-pressure"]).args(SIZES);
    let out = command.output().context("running the scenario")?;
    if !out.status.success() {
        bail!(
            "the scenario failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let result: Value =
        serde_json::from_slice(&out.stdout).context("the scenario printed no JSON result")?;
    let mut ns_per_fault = [0.0; PHASES.len()];
    let mut faults = [0; PHASES.len()];
    for (i, (_, at)) in PHASES.iter().enumerate() {
        let (ns, n) = phase(&result, at)?;
        ns_per_fault[i] = ns as f64 / n.max(1) as f64;
        faults[i] = n;
    }
    let memcg_reclaim_share = if mode == Mode::Untraced {
        None
    } else {
        check_counts(&result, summary, mode == Mode::Default)?
    };
    Ok(Run {
        mode,
        ns_per_fault,
        faults,
        memcg_reclaim_share,
    })
}

/// A phase's time and faults: `pressure/N` is the Nth pass, `touched_again` the lazy and
/// populated regions' read-backs together.
fn phase(result: &Value, at: &str) -> Result<(u64, u64)> {
    let passes: Vec<&Value> = match at.split_once('/') {
        Some((list, index)) => vec![&result[list][index.parse::<usize>()?]],
        None => ["lazy", "populate"].map(|r| &result[at][r]).to_vec(),
    };
    let figure = |pass: &Value, key: &str| {
        pass.pointer(key)
            .and_then(Value::as_u64)
            .with_context(|| format!("no {key} in the scenario's {at}: {pass}"))
    };
    let (mut ns, mut faults) = (0, 0);
    for pass in passes {
        ns += figure(pass, "/cpu_ns")?;
        faults += figure(pass, "/faults/majflt")? + figure(pass, "/faults/minflt")?;
    }
    Ok((ns, faults))
}

/// The tracer's counts of the experiment's process against the kernel's at its exit; with
/// `causes`, the share of its timed faults' time put down to memcg reclaim.
fn check_counts(result: &Value, summary: &Path, causes: bool) -> Result<Option<f64>> {
    let pid = result["pids"][0].clone();
    let text = std::fs::read_to_string(summary)?;
    let process = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["type"] == "summary")
        .flat_map(|v| v["processes"].as_array().cloned().unwrap_or_default())
        .rfind(|p| p["pid"] == pid)
        .with_context(|| format!("the tracer's summary has no pid {pid}"))?;
    let (faults, kernel) = (&process["faults"], &result["faults_at_exit"]);
    if faults["major"] != kernel["majflt"] || faults["minor"] != kernel["minflt"] {
        bail!(
            "the tracer counted {} major and {} minor faults, the kernel {} and {}",
            faults["major"],
            faults["minor"],
            kernel["majflt"],
            kernel["minflt"]
        );
    }
    if !causes {
        return Ok(None);
    }
    let memcg = faults["time_by_cause"]["causes_ns"]["memcg_reclaim"].as_f64();
    let timed: f64 = ["minor", "major"]
        .iter()
        .filter_map(|class| faults["latency_ns"][class]["total"].as_f64())
        .sum();
    Ok(memcg.map(|m| m / timed.max(1.0)))
}

fn report(all: &[Run], runs: usize, load_before: &str) -> String {
    let mut out = String::from(
        "## Page faults under memory pressure: traced against untraced (`cargo xtask bench --pressure`)\n\n",
    );
    let kernel = kernel_release();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let _ = writeln!(
        out,
        "Method: {runs} rounds; in each, `memlock-trace scenario memory-pressure {}` untraced, \
         launched under memlock-trace with `--follow-children` (its default mode: counts, latency histograms, each timed fault's time split by cause), and under \
         `--count-only`. The scenario makes swap on zram and a memory cgroup (v1 or v2) below \
         its working set and measures each phase itself: the CPU time of its one thread (a \
         fault's reclaim, zram compression and the tracer's programs all run in it; waits for \
         a CPU on this shared machine do not count) and its faults (`getrusage`). Each phase's time per fault is divided by the same round's untraced \
         one; the table gives the median of those ratios, their range in brackets (reclaim's \
         own cost varies from run to run of any mode, untraced included), and the median figure. Every traced run's counts of the experiment's process equal the \
         kernel's at its exit (checked, or the bench fails). Kernel {}, {cpus} CPUs, shared \
         with other builds: load average {load_before} before, {} after.\n",
        SIZES.join(" "),
        kernel,
        load_average()
    );
    out.push_str("| phase (faults per run) |");
    for mode in Mode::ALL {
        let _ = write!(out, " {} |", mode.label());
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(Mode::ALL.len()));
    out.push('\n');
    let untraced: Vec<&Run> = all.iter().filter(|r| r.mode == Mode::Untraced).collect();
    for (i, (name, _)) in PHASES.iter().enumerate() {
        let faults = median(untraced.iter().map(|r| r.faults[i] as f64).collect());
        let _ = write!(out, "| {name} ({faults:.0}) |");
        for mode in Mode::ALL {
            let mine: Vec<&Run> = all.iter().filter(|r| r.mode == mode).collect();
            let ns = median(mine.iter().map(|r| r.ns_per_fault[i]).collect());
            if mode == Mode::Untraced {
                let _ = write!(out, " 1 ({ns:.0} CPU ns/fault) |");
                continue;
            }
            let ratios: Vec<f64> = mine
                .iter()
                .zip(&untraced)
                .map(|(m, u)| m.ns_per_fault[i] / u.ns_per_fault[i])
                .collect();
            let (low, high) = ratios
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), r| (l.min(*r), h.max(*r)));
            let _ = write!(
                out,
                " {:.2} [{low:.2}-{high:.2}] ({ns:.0} CPU ns/fault) |",
                median(ratios.clone())
            );
        }
        out.push('\n');
    }
    let shares: Vec<f64> = all.iter().filter_map(|r| r.memcg_reclaim_share).collect();
    if !shares.is_empty() {
        let _ = writeln!(
            out,
            "\nThe default mode put {:.0}% of its timed faults' time down to memcg reclaim \
             (median over the rounds).",
            median(shares) * 100.0
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::phase;

    #[test]
    fn a_phase_is_its_pass_or_both_read_backs_in_cpu_time() {
        let pass = |cpu_ns: u64, majflt: u64, minflt: u64| json!({"ns": cpu_ns * 3, "cpu_ns": cpu_ns, "faults": {"majflt": majflt, "minflt": minflt}});
        let result = json!({
            "pressure": [pass(100, 1, 9), pass(200, 20, 0)],
            "touched_again": {"lazy": pass(30, 3, 0), "populate": pass(40, 4, 0), "mlock": pass(1, 0, 0)},
        });
        assert_eq!(phase(&result, "pressure/0").unwrap(), (100, 10));
        assert_eq!(phase(&result, "pressure/1").unwrap(), (200, 20));
        assert_eq!(phase(&result, "touched_again").unwrap(), (70, 7));
        assert!(phase(&json!({}), "pressure/0").is_err());
    }
}

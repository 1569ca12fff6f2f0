//! `memlock-trace suite`: every reference experiment run with the tracer attached, then a
//! report (markdown, JSON, charts) putting side by side what the workload measured, what
//! the tracer saw in the kernel, and what the references published.
//!
//! The tracer runs as a separate `memlock-trace --json --events` process, system-wide, so it
//! sees every process a scenario starts (workers, forks, qemu); each scenario's result names
//! its pids, and the report picks those processes out of the tracer's output: the ones
//! started while the scenario ran, since pids are reused.

use std::{
    io::{BufRead as _, BufReader, Read as _},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use serde_json::{Value, json};

use super::{
    report::{self, ScenarioRun},
    seeds,
    workload::scenario::{Scenario, ScenarioArgs},
};

#[derive(Debug, Args)]
pub struct SuiteArgs {
    /// Run only these scenarios (repeatable; default: all).
    #[arg(long = "scenario", value_name = "NAME")]
    pub scenarios: Vec<Scenario>,
    /// Where to write report.md, report.json and the charts.
    #[arg(long, default_value = "memlock-trace-report")]
    pub out: PathBuf,
    /// Tiny sizes: a quick check that every scenario runs and the figures are consistent.
    #[arg(long)]
    pub tiny: bool,
    /// Leave out the advice section (`advise --apply` on first-touch, malloc-vs-mmap,
    /// thread-stack and dynamic-alloc, run after the scenarios).
    #[arg(long)]
    pub no_advice: bool,
    #[command(flatten)]
    pub sizes: ScenarioArgs,
}

/// Runs the suite and writes its report; returns the exit code (0, or 1 when a consistency
/// check failed).
pub fn run(args: SuiteArgs) -> Result<i32> {
    let sizes = if args.tiny {
        ScenarioArgs::tiny()
    } else {
        args.sizes.clone()
    };
    let scenarios = if args.scenarios.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        args.scenarios.clone()
    };
    // Refuse impossible sizes before anything starts.
    for &s in &scenarios {
        sizes
            .check_limits(s)
            .map_err(|e| crate::UsageError(format!("{e:#}")))?;
    }
    // The report's directory must take files before the scenarios run, not after.
    std::fs::create_dir_all(&args.out).map_err(|e| {
        crate::UsageError(format!(
            "cannot write the report in {}: {e}",
            args.out.display()
        ))
    })?;
    crate::output::create_private(&args.out.join("report.md"), "suite -o")?;

    let tracer = TracerProcess::start()?;
    let bar = ProgressBar::new(scenarios.len() as u64).with_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .expect("valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut runs = Vec::new();
    for &scenario in &scenarios {
        bar.set_message(scenario.name());
        let window = Window::open()?;
        let own = run_scenario(scenario, &sizes)
            .with_context(|| format!("scenario {}", scenario.name()))?;
        runs.push((scenario, own, window.close()?));
        bar.inc(1);
    }
    let (events, vma_calls, summary) = tracer.stop()?;
    // After the system-wide tracer stopped: advise runs tracers of its own.
    let mut advised = Vec::new();
    if !args.no_advice {
        for case in seeds::cases(&scenarios) {
            bar.set_message(format!("{} advice", case.scenario.name()));
            let run = seeds::run(case, &sizes, &args.out);
            if let Some(e) = &run.error {
                eprintln!("memlock-trace: advice on {}: {e}", case.scenario.name());
            }
            advised.push(run);
        }
    }
    bar.finish_with_message("done");

    let runs: Vec<ScenarioRun> = runs
        .into_iter()
        .map(|(scenario, own, window)| {
            let pids: Vec<u32> = collect_pids(&own);
            let processes = summary["processes"]
                .as_array()
                .map_or(&[][..], Vec::as_slice);
            let traced = pick(processes, &pids, "start_ns", window.boot_ns);
            let events = pick(&events, &pids, "time_ns", window.wall_ns);
            let vma_calls = pick(&vma_calls, &pids, "time_ns", window.wall_ns);
            ScenarioRun {
                scenario,
                secs: window.secs(),
                own,
                traced,
                events,
                vma_calls,
            }
        })
        .collect();
    let health = summary["health"].clone();
    let written = report::write(&args.out, &runs, &advised, &health, args.tiny)?;
    let mut verdicts = format!("report: {}\n", written.markdown.display());
    // Columns as wide as their widest entry ("partly agrees", "INCONSISTENT").
    let rows = || {
        written
            .verdicts
            .iter()
            .flat_map(|(scenario, v)| v.iter().map(move |v| (scenario.as_str(), v)))
    };
    let scenario_width = rows().map(|(s, _)| s.len()).max().unwrap_or(0);
    let verdict_width = rows().map(|(_, v)| v.verdict.len()).max().unwrap_or(0);
    for (scenario, v) in rows() {
        verdicts.push_str(&format!(
            "  {scenario:<scenario_width$}  {:<verdict_width$}  {}\n",
            v.verdict, v.claim
        ));
    }
    crate::output::Sink::open(None)?.write_result(verdicts.as_bytes())?;
    // A finding, as verify's mismatches (exit 1), not a failure of the tool (125).
    if written.inconsistent > 0 {
        eprintln!(
            "memlock-trace: {} tracer/workload consistency checks failed (see the report)",
            written.inconsistent
        );
        return Ok(1);
    }
    Ok(0)
}

fn run_scenario(scenario: Scenario, sizes: &ScenarioArgs) -> Result<Value> {
    let out = Command::new(std::env::current_exe()?)
        .args(["scenario", scenario.name()])
        .args(sizes.to_args())
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("failed ({})", out.status);
    }
    serde_json::from_slice(&out.stdout).context("the scenario printed no JSON result")
}

/// When a scenario ran, on the clock of process start times (CLOCK_BOOTTIME, the summary's
/// `start_ns`) and on the events' (`time_ns`, wall clock).
struct Window {
    boot_ns: (u64, u64),
    wall_ns: (u64, u64),
}

impl Window {
    fn open() -> Result<Self> {
        let boot = crate::procfs::boot_time_ns()?;
        let wall = crate::output::WallClock::now_ns();
        Ok(Self {
            boot_ns: (boot, boot),
            wall_ns: (wall, wall),
        })
    }

    fn close(mut self) -> Result<Self> {
        self.boot_ns.1 = crate::procfs::boot_time_ns()?;
        self.wall_ns.1 = crate::output::WallClock::now_ns();
        Ok(self)
    }

    /// How long it lasted (on the boot clock, which does not jump).
    fn secs(&self) -> f64 {
        (self.boot_ns.1 - self.boot_ns.0) as f64 / 1e9
    }
}

/// The items (summary processes, events) of a scenario: one of its `pids` whose `time`
/// field lies in `(from, to)`. A pid alone is not enough: the suite goes through tens of
/// thousands of pids, so the kernel reuses them, across scenarios and within one (a
/// worker's pid taken by a later worker).
fn pick(items: &[Value], pids: &[u32], time: &str, (from, to): (u64, u64)) -> Vec<Value> {
    items
        .iter()
        .filter(|v| {
            v["pid"]
                .as_u64()
                .is_some_and(|pid| pids.contains(&(pid as u32)))
                && v[time].as_u64().is_some_and(|t| (from..=to).contains(&t))
        })
        .cloned()
        .collect()
}

/// Every `"pids"` array anywhere in a scenario's result.
fn collect_pids(v: &Value) -> Vec<u32> {
    let mut pids = Vec::new();
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                if k == "pids" {
                    pids.extend(
                        child
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|p| p.as_u64())
                            .map(|p| p as u32),
                    );
                } else {
                    pids.extend(collect_pids(child));
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| pids.extend(collect_pids(i))),
        _ => {}
    }
    pids
}

/// `memlock-trace --json --events`, system-wide, in the background.
struct TracerProcess {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl TracerProcess {
    fn start() -> Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            // Syscall events only: streaming every fault of the machine would load it.
            .args(["--json", "--events=syscalls"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting the tracer")?;
        // Ready once it says what it traces (programs attached).
        let mut stderr = BufReader::new(child.stderr.take().expect("piped"));
        let mut said = String::new();
        loop {
            let mut line = String::new();
            if stderr.read_line(&mut line)? == 0 {
                let _ = child.wait();
                bail!("the tracer did not start: {}", said.trim());
            }
            said.push_str(&line);
            if line.starts_with("memlock-trace: tracing") {
                break;
            }
        }
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stderr.read_to_string(&mut rest);
        });
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self { child, lines })
    }

    /// SIGINT, then the syscall events, the VMA changes of each call and the final summary.
    fn stop(mut self) -> Result<(Vec<Value>, Vec<Value>, Value)> {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT);
        let status = self.child.wait()?;
        if !status.success() {
            bail!("the tracer exited with {status}");
        }
        let (mut events, mut vma_calls) = (Vec::new(), Vec::new());
        let mut summary = Value::Null;
        // The reader thread ends at EOF, after the tracer's last line.
        for line in self.lines.iter() {
            let v: Value =
                serde_json::from_str(&line).with_context(|| format!("tracer output: {line}"))?;
            match v["type"].as_str() {
                Some("summary") => summary = v,
                Some("syscall") => events.push(v),
                Some("vma_call") => vma_calls.push(v),
                _ => {}
            }
        }
        if summary.is_null() {
            bail!("the tracer printed no summary");
        }
        Ok((events, vma_calls, json!(summary)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_pid_is_two_processes_of_its_scenario_and_none_of_another() {
        let process = |pid: u32, start_ns: u64| json!({"pid": pid, "start_ns": start_ns});
        let summary = [
            process(7, 50),  // a pid of this scenario, from before it
            process(7, 110), // a worker
            process(8, 120), // not one of its pids
            process(7, 130), // the worker's pid, reused by a later worker
            process(7, 250), // after the scenario
        ];
        let picked = pick(&summary, &[7, 7], "start_ns", (100, 200));
        assert_eq!(picked, [process(7, 110), process(7, 130)]);
    }
}

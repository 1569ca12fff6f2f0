//! The seeds, answered: `memlock-trace advise --apply --json` run on one variant of each
//! scenario whose reference draws a conclusion about locking (first-touch, malloc-vs-mmap,
//! thread-stack, dynamic-alloc), for the report to check against that conclusion.
//!
//! Each case runs this binary as `advise --apply --json -o FILE -- memlock-trace scenario NAME
//! --variant V ...`: one process per run, so advise's per-process figures are the variant's.
//! The workload prints its own measurements on stdout (advise's report goes to FILE), one
//! JSON object per run: before, then after the advice was applied.

use std::{
    ffi::{OsStr, OsString},
    os::unix::ffi::OsStrExt as _,
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use super::workload::scenario::{Scenario, ScenarioArgs};

/// How long the workload sleeps before its experiment, so that advise's start-up window
/// (detected at 0.1 s resolution) closes before the measured part begins.
const SETTLE_MS: u64 = 300;

/// One scenario variant advised on.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub scenario: Scenario,
    /// The variant the reference's conclusion is about: the one without locking.
    pub variant: &'static str,
}

/// The cases among `scenarios`, in the suite's order.
pub fn cases(scenarios: &[Scenario]) -> Vec<Case> {
    scenarios
        .iter()
        .filter_map(|&scenario| {
            let variant = match scenario {
                Scenario::FirstTouch => "lazy",
                Scenario::MallocVsMmap => "malloc",
                Scenario::ThreadStack => "off",
                Scenario::DynamicAlloc => "churn",
                _ => return None,
            };
            Some(Case { scenario, variant })
        })
        .collect()
}

/// What one case produced.
pub struct AdviceRun {
    pub case: Case,
    pub secs: f64,
    /// The command advise ran, as shown in the report.
    pub command: String,
    /// `advise --apply --json`'s object; Null when advise failed (see `error`).
    pub advise: Value,
    /// The workload's own measurements: the first run's, then the second's (when the
    /// advice could be applied).
    pub workload: Vec<Value>,
    pub error: Option<String>,
}

/// Runs advise on `case`, its report written to `dir`.
pub fn run(case: Case, sizes: &ScenarioArgs, dir: &Path) -> AdviceRun {
    let start = Instant::now();
    let mut sizes = sizes.clone();
    sizes.settle_ms = SETTLE_MS;
    // One repetition: a region mapped again at the same place would read as allocator
    // churn, which is dynamic-alloc's case, not these.
    sizes.runs = 1;
    let name = case.scenario.name();
    let file = dir.join(format!("advice-{name}.json"));
    let mut workload_argv: Vec<OsString> = vec![
        "memlock-trace".into(),
        "scenario".into(),
        name.into(),
        "--variant".into(),
        case.variant.into(),
    ];
    workload_argv.extend(sizes.to_args());
    // Shown in the report: escaped, as every argument (a `--kernel` path is anyone's).
    let command = crate::output::escape(workload_argv.join(OsStr::new(" ")).as_bytes());
    let outcome = advise(&workload_argv[1..], &file);
    let (advise, workload, error) = match outcome {
        Ok((a, w)) => (a, w, None),
        Err(e) => (Value::Null, Vec::new(), Some(format!("{e:#}"))),
    };
    AdviceRun {
        case,
        secs: start.elapsed().as_secs_f64(),
        command,
        advise,
        workload,
        error,
    }
}

fn advise(workload_args: &[OsString], file: &Path) -> Result<(Value, Vec<Value>)> {
    let exe = std::env::current_exe().context("finding our own executable")?;
    let out = Command::new(&exe)
        .args(["advise", "--apply", "--json", "-o"])
        .arg(file)
        .arg("--")
        .arg(&exe)
        .args(workload_args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("running memlock-trace advise")?;
    if !out.status.success() {
        bail!("advise --apply exited with {}", out.status);
    }
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading advise's report {}", file.display()))?;
    let advise: Value = serde_json::from_str(&text).context("advise's report is not JSON")?;
    let workload = serde_json::Deserializer::from_slice(&out.stdout)
        .into_iter::<Value>()
        .collect::<Result<Vec<_>, _>>()
        .context("the workload's measurements are not JSON")?;
    if workload.is_empty() {
        bail!("the workload printed no measurements");
    }
    Ok((advise, workload))
}

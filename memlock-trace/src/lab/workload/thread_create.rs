//! thread-create (reference 000, table 5 / figure 3): P processes each creating threads as
//! fast as they can, with no mlock, under `mlockall(MCL_CURRENT)` and under
//! `mlockall(MCL_CURRENT | MCL_FUTURE)`. Under MCL_FUTURE every new thread stack is
//! populated and locked when it is mapped.

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use nix::sys::mman::{MlockAllFlags, mlockall};
use serde_json::{Value, json};

use super::{args::ScenarioArgs, nix_ok};

pub const MODES: [&str; 3] = ["off", "current", "future"];

pub fn run(args: &ScenarioArgs) -> Result<Value> {
    if args.worker {
        return worker(args.variant.as_deref().unwrap_or("off"), args);
    }
    let mut results = Vec::new();
    let mut pids = Vec::new();
    // Modes interleave within each repetition, and each figure is the median of the
    // repetitions, so a burst of noise on this shared machine hits one sample, not one mode.
    let repetitions = args.runs.min(3);
    let cpus = super::args::online_cpus();
    for processes in args.process_counts() {
        for mode in MODES {
            let mut rates = Vec::new();
            let mut threads_total = 0;
            for _ in 0..repetitions {
                let (threads, secs) = measure(mode, processes, args, &mut pids)?;
                threads_total += threads;
                rates.push(threads as f64 / secs.max(1e-9));
            }
            results.push(json!({
                "mode": mode,
                "processes": processes,
                // More workers than CPUs: they take turns, which is not what is measured.
                "oversubscribed": processes > cpus,
                "workers": processes * repetitions,
                "threads": threads_total,
                "threads_per_sec": super::median(rates.iter().copied()),
                "samples": rates,
            }));
        }
    }
    Ok(json!({
        "cpus": cpus,
        "stack_kib": args.create_stack_kib,
        "stack_cache": !args.no_stack_cache,
        "results": results,
        "pids": pids,
    }))
}

/// P workers of one mode at once; returns threads created and the longest worker's time.
fn measure(
    mode: &str,
    processes: usize,
    args: &ScenarioArgs,
    pids: &mut Vec<u32>,
) -> Result<(u64, f64)> {
    let workers: Vec<Child> = (0..processes)
        .map(|_| spawn_worker(mode, args))
        .collect::<Result<_>>()?;
    let mut threads = 0u64;
    let mut secs = 0f64;
    for w in workers {
        pids.push(w.id());
        let out = w.wait_with_output()?;
        if !out.status.success() {
            bail!("thread-create worker ({mode}) failed: {}", out.status);
        }
        let v: Value = serde_json::from_slice(&out.stdout).context("worker result")?;
        threads += v["threads"].as_u64().unwrap_or(0);
        secs = secs.max(v["secs"].as_f64().unwrap_or(0.0));
    }
    Ok((threads, secs))
}

fn spawn_worker(mode: &str, args: &ScenarioArgs) -> Result<Child> {
    Command::new(std::env::current_exe()?)
        .args(["scenario", "thread-create", "--worker", "--variant", mode])
        .args(["--seconds", &args.seconds.to_string()])
        .args(["--create-stack-kib", &args.create_stack_kib.to_string()])
        .args(args.no_stack_cache.then_some("--no-stack-cache"))
        // glibc caches the stacks of joined threads (40 MiB by default, set explicitly here so
        // the run does not depend on the environment): a new thread then reuses an already
        // populated stack. --no-stack-cache shows the cost of a fresh stack per thread.
        .env(
            "GLIBC_TUNABLES",
            format!(
                "glibc.pthread.stack_cache_size={}",
                if args.no_stack_cache { 0 } else { 40 << 20 }
            ),
        )
        .stdout(Stdio::piped())
        .spawn()
        .context("spawning a thread-create worker")
}

fn worker(mode: &str, args: &ScenarioArgs) -> Result<Value> {
    let flags = match mode {
        "off" => MlockAllFlags::empty(),
        "current" => MlockAllFlags::MCL_CURRENT,
        "future" => MlockAllFlags::MCL_CURRENT | MlockAllFlags::MCL_FUTURE,
        other => bail!("unknown thread-create mode {other}"),
    };
    if !flags.is_empty() {
        nix_ok("mlockall", mlockall(flags))?;
    }
    let deadline = Duration::from_secs_f64(args.seconds);
    let start = Instant::now();
    let mut threads = 0u64;
    while start.elapsed() < deadline {
        std::thread::Builder::new()
            .stack_size(args.create_stack_kib * 1024)
            .spawn(|| {})
            .context("creating a thread")?
            .join()
            .map_err(|_| anyhow::anyhow!("a thread panicked"))?;
        threads += 1;
    }
    Ok(json!({ "threads": threads, "secs": start.elapsed().as_secs_f64() }))
}

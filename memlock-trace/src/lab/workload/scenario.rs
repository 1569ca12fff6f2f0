//! The reference experiments as bundled scenarios (`../shared/SCENARIOS.md`).
//!
//! A scenario with variants (lazy/mlock/populate, off/MCL_CURRENT/MCL_FUTURE, ...) runs each
//! variant in a child process of its own, so the tracer's per-process counts belong to
//! exactly one variant. Every result names the pids it ran in.

use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::{
    dynamic_alloc, first_touch, fork_inherit, malloc_vs_mmap, memlock_limit, memory_pressure,
    thp_split, thread_create, thread_stack, vm_memory, vma_split,
};

pub use super::args::{Scenario, ScenarioArgs};

/// Runs `scenario` (all its variants, each in its own process) and returns its own
/// measurements as JSON.
pub fn run(scenario: Scenario, args: &ScenarioArgs) -> Result<Value> {
    // Sizes the machine cannot hold are the user's to fix (2); failures later are ours (125).
    args.check_limits(scenario)
        .map_err(|e| crate::UsageError(format!("{e:#}")))?;
    if let Some(variant) = &args.variant {
        return run_variant(scenario, variant, args);
    }
    let variants = scenario.variants();
    if variants.is_empty() {
        let mut result = run_variant(scenario, "", args)?;
        if result.get("pids").is_none() {
            result["pids"] = json!([std::process::id()]);
        }
        return Ok(result);
    }
    let mut out = serde_json::Map::new();
    for variant in variants {
        out.insert(variant.clone(), run_in_child(scenario, &variant, args)?);
    }
    Ok(json!({ "variants": out }))
}

fn run_variant(scenario: Scenario, variant: &str, args: &ScenarioArgs) -> Result<Value> {
    // THP would turn 512 first touches into one: the experiments are about 4 KiB pages,
    // but for the one about huge pages.
    if scenario != Scenario::ThpSplit {
        let _ = nix::sys::prctl::set_thp_disable(true);
    }
    if args.settle_ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(args.settle_ms));
    }
    let mut result = match scenario {
        Scenario::FirstTouch => first_touch::run(variant, args)?,
        Scenario::ThreadCreate => thread_create::run(args)?,
        Scenario::ThreadStack => thread_stack::run(variant, args)?,
        Scenario::DynamicAlloc => dynamic_alloc::run(variant, args)?,
        Scenario::VmaSplit => vma_split::run()?,
        Scenario::ThpSplit => thp_split::run()?,
        Scenario::ForkInherit => fork_inherit::run()?,
        Scenario::MallocVsMmap => malloc_vs_mmap::run(variant, args)?,
        Scenario::MemlockLimit => memlock_limit::run(args)?,
        Scenario::VmMemory => vm_memory::run(variant, args)?,
        Scenario::MemoryPressure => memory_pressure::run(variant, args)?,
    };
    if result.get("pids").is_none() {
        result["pids"] = json!([std::process::id()]);
    }
    Ok(result)
}

/// Re-runs this binary as `scenario NAME --variant V` with the same sizes, and reads its
/// JSON result from stdout.
fn run_in_child(scenario: Scenario, variant: &str, args: &ScenarioArgs) -> Result<Value> {
    let exe = std::env::current_exe().context("finding our own executable")?;
    let out = Command::new(exe)
        .args(["scenario", scenario.name()])
        .args(args.to_args())
        .args(["--variant", variant])
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {} variant {variant}", scenario.name()))?;
    if !out.status.success() {
        bail!(
            "{} variant {variant} failed ({})",
            scenario.name(),
            out.status
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "{} variant {variant} printed no JSON result",
            scenario.name()
        )
    })
}

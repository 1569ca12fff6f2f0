//! The aarch64 guests' part of `cargo xtask test`: building for them the test binaries they
//! run, the lib's tests and the test files whose `Runs on:` names `arm64`. A guest is
//! emulated instruction by instruction beside three x86_64 guests on a 2-core machine, so
//! it runs every family's exact figures and no more: the lib's tests (the programs
//! verified, CO-RE offsets against arm64's BTF), `probe`, the calls against what the
//! workload made, the faults against `/proc/PID/stat`, the VMA changes against
//! `/proc/PID/maps` and `locked_vm`, unwinding without frame pointers, and two bundled
//! scenarios with their consistency checks. What user space builds on top of the hooks is
//! the same code on both architectures, and the x86_64 stages run it.

use anyhow::{Context as _, Result};

use super::{Build, binaries::guest_lock_chain, build_test_binaries, placement};
use crate::{run::workspace_root, vm::GuestArch};

/// test:suite's scenarios there (`MEMLOCK_TRACE_SCENARIOS`): faults by first touch,
/// populated by mlock and by MAP_POPULATE, and VM_LOCKED cutting a VMA.
const SCENARIOS: &str = "first-touch,vma-split";

/// Why the other binaries do not run on an arm64 guest.
pub(super) const NOT_ON_ARM64: &str = "x86_64 guests and the host only: user space on top \
    of the hooks, the same code on both architectures; this guest checks the hooks' own \
    figures (test:syscalls, test:faults, test:vma_whole, test:verify)";

/// Cross-builds for `arch` the lib's tests, the test files whose `Runs on:` names `arm64`
/// (`placement`), and the tracer, installing the target's standard library and cross gcc
/// when missing, and compiles test:stacks' C program for it with that gcc (the guest has no
/// compiler).
pub(super) fn build(arch: GuestArch) -> Result<Build> {
    let target = arch
        .rust_target()
        .context("only a foreign guest is cross-built")?;
    crate::setup::ensure_cross(target)?;
    let tests: Vec<String> = placement::test_files()?
        .into_iter()
        .filter(|(_, placement)| placement.arm64)
        .map(|(name, _)| name)
        .collect();
    // The lib's tests run on every guest (`placement::LIB`).
    let mut args = vec!["--target", target, "-p", "memlock-trace", "--lib"];
    for test in &tests {
        args.extend(["--test", test]);
    }
    let binaries = build_test_binaries(&args)?;
    let debug = workspace_root().join("target").join(target).join("debug");
    let (lock_chain, lock_chain_env) = guest_lock_chain(arch, &debug)?;
    let tracer = debug.join("memlock-trace");
    Ok(Build {
        binaries,
        extra_files: vec![
            // Integration tests run the CLI by its absolute host path.
            (tracer.clone(), tracer.display().to_string()),
            lock_chain,
        ],
        tracer,
        env: vec![
            lock_chain_env,
            ("MEMLOCK_TRACE_SCENARIOS".into(), SCENARIOS.into()),
        ],
    })
}

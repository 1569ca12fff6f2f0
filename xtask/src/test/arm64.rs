//! The aarch64 guests' part of `cargo xtask test`: which test binaries they run, and building
//! them for them. A guest is emulated instruction by instruction beside three x86_64 guests
//! on a 2-core machine, so it runs every family's exact figures and no more: the lib's
//! tests (the programs verified, CO-RE offsets against arm64's BTF), `probe`, the calls
//! against what the workload made, the faults against `/proc/PID/stat`, the VMA changes
//! against `/proc/PID/maps` and `locked_vm`, unwinding without frame pointers, and two
//! bundled scenarios with their consistency checks. What user space builds on top of the
//! hooks is the same code on both architectures, and the x86_64 stages run it.

use anyhow::{Context as _, Result};

use super::{Build, binaries::guest_lock_chain, build_test_binaries};
use crate::{run::workspace_root, vm::GuestArch};

/// The test binaries the aarch64 guests run.
pub(super) const ARM64_TESTS: &[&str] = &[
    "memlock-trace/lib:memlock_trace",
    "memlock-trace/test:probe",
    "memlock-trace/test:syscalls",
    "memlock-trace/test:faults",
    "memlock-trace/test:vma_whole",
    "memlock-trace/test:verify",
    "memlock-trace/test:unwind_tables",
    "memlock-trace/test:suite",
];

/// test:suite's scenarios there (`MEMLOCK_TRACE_SCENARIOS`): faults by first touch,
/// populated by mlock and by MAP_POPULATE, and VM_LOCKED cutting a VMA.
const SCENARIOS: &str = "first-touch,vma-split";

/// Why the other binaries do not run on an arm64 guest.
pub(super) const NOT_ON_ARM64: &str = "x86_64 guests and the host only: user space on top \
    of the hooks, the same code on both architectures; this guest checks the hooks' own \
    figures (test:syscalls, test:faults, test:vma_whole, test:verify)";

/// Cross-builds [`ARM64_TESTS`] and the tracer for `arch`, installing the
/// target's standard library and cross gcc when missing, and compiles test:stacks' C
/// program for it with that gcc (the guest has no compiler).
pub(super) fn build(arch: GuestArch) -> Result<Build> {
    let target = arch
        .rust_target()
        .context("only a foreign guest is cross-built")?;
    crate::setup::ensure_cross(target)?;
    let mut args = vec!["--target", target, "-p", "memlock-trace"];
    for name in ARM64_TESTS {
        match name.rsplit_once(':') {
            Some((kind, _)) if kind.ends_with("/lib") => args.push("--lib"),
            Some((_, test)) => args.extend(["--test", test]),
            None => {}
        }
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

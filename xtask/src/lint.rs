//! `cargo xtask lint`: rustfmt and clippy over the whole workspace. `cargo xtask test` runs
//! the same checks before any test, so CI (which runs `cargo xtask test`) always lints.
//!
//! Each check is one cargo command run from the workspace root, with cargo's own output on
//! the terminal. Every check runs even when an earlier one fails, so one run names all the
//! failing checks, each with the command that reproduces it. When nothing changed, cargo's
//! caches make the whole step take a few seconds.

use std::{process::Command, time::Instant};

use anyhow::{Context as _, Result, bail};

use crate::run::workspace_root;

/// One check: a name for the messages and the arguments of the cargo command that runs it.
struct Check {
    name: &'static str,
    cargo_args: &'static [&'static str],
}

impl Check {
    /// The command line as a user would type it, to reproduce a failure.
    fn command_line(&self) -> String {
        format!("cargo {}", self.cargo_args.join(" "))
    }
}

/// The eBPF crate's clippy, apart from the workspace's: the crate builds only for
/// bpfel-unknown-none, with the nightly toolchain and `-Z build-std=core`, and has no test
/// harness (so no `--all-targets`). It is not a default member, so the user-space clippy
/// skips it. Its own target directory keeps the nightly artifacts (core built from source,
/// host build scripts and proc macros) apart from the stable ones in `target/`. Kept in one
/// place so the invocation is easy to change; the README quotes it.
const CLIPPY_EBPF: &[&str] = &[
    "+nightly",
    "clippy",
    "-p",
    "memlock-trace-ebpf",
    "--target",
    "bpfel-unknown-none",
    "-Z",
    "build-std=core",
    "--target-dir",
    "target/ebpf-clippy",
    "--",
    "-D",
    "warnings",
];

/// In the order they run: the quickest first.
const CHECKS: [Check; 4] = [
    Check {
        // Every member, the eBPF crate included: formatting needs no target.
        name: "rustfmt",
        cargo_args: &["fmt", "--all", "--", "--check"],
    },
    Check {
        // The fuzz targets are a crate of their own, outside the workspace (cargo-fuzz's
        // layout); building them is `scripts/fuzz.sh`'s, formatting is checked here.
        name: "rustfmt, fuzz targets",
        cargo_args: &["fmt", "--manifest-path", "fuzz/Cargo.toml", "--", "--check"],
    },
    Check {
        // The default members (memlock-trace, memlock-trace-common, xtask), tests included.
        name: "clippy, user space",
        cargo_args: &["clippy", "--all-targets", "--", "-D", "warnings"],
    },
    Check {
        name: "clippy, eBPF crate",
        cargo_args: CLIPPY_EBPF,
    },
];

/// Runs every check; fails naming each check that failed and the command to reproduce it.
pub fn run() -> Result<()> {
    let mut failed = Vec::new();
    for check in &CHECKS {
        let command_line = check.command_line();
        println!("xtask: lint: {}: {command_line}", check.name);
        let start = Instant::now();
        let status = Command::new("cargo")
            .args(check.cargo_args)
            .current_dir(workspace_root())
            .status()
            .with_context(|| format!("cannot run `{command_line}`"))?;
        let secs = start.elapsed().as_secs_f64();
        if status.success() {
            println!("xtask: lint: {}: ok ({secs:.1}s)", check.name);
        } else {
            println!("xtask: lint: {}: FAILED ({status}, {secs:.1}s)", check.name);
            failed.push(format!("  {}: reproduce with `{command_line}`", check.name));
        }
    }
    if !failed.is_empty() {
        bail!(
            "lint failed ({} of {} checks; cargo's output above says why):\n{}",
            failed.len(),
            CHECKS.len(),
            failed.join("\n")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checks_are_the_documented_commands() {
        let lines: Vec<String> = CHECKS.iter().map(Check::command_line).collect();
        assert_eq!(
            lines,
            [
                "cargo fmt --all -- --check",
                "cargo fmt --manifest-path fuzz/Cargo.toml -- --check",
                "cargo clippy --all-targets -- -D warnings",
                "cargo +nightly clippy -p memlock-trace-ebpf --target bpfel-unknown-none \
                 -Z build-std=core --target-dir target/ebpf-clippy -- -D warnings",
            ]
        );
    }
}

//! What the test binaries need besides themselves: the Debian packages their files declare,
//! and test:stacks' C program compiled for a guest.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use super::TestBinary;
use crate::{run::workspace_root, util::output_of, vm::GuestArch};

/// The Debian packages the test binaries among `binaries` declare (`Packages:`), each once:
/// installed when missing (like qemu) before any stage runs them, since a guest's initramfs
/// carries the programs the host has (python3 with its standard library, memcached: see
/// `vm::programs`).
pub(super) fn packages_for<'a>(binaries: impl IntoIterator<Item = &'a TestBinary>) -> Vec<&'a str> {
    let mut packages = Vec::new();
    for binary in binaries {
        for package in &binary.placement.packages {
            if !packages.contains(&package.as_str()) {
                packages.push(package.as_str());
            }
        }
    }
    packages
}

/// test:stacks' C program, compiled for `arch` into `dir` (no guest has a compiler), as the
/// guest file test:unwind_tables runs and the variable that names it there.
pub(super) fn guest_lock_chain(
    arch: GuestArch,
    dir: &Path,
) -> Result<((PathBuf, String), (String, String))> {
    const GUEST_PATH: &str = "/tests/lock_chain";
    let lock_chain = dir.join("lock_chain");
    output_of(
        Command::new(arch.gcc())
            .args(["-O2", "-fomit-frame-pointer", "-g", "-o"])
            .arg(&lock_chain)
            .arg(workspace_root().join("memlock-trace/tests/stacks/lock_chain.c")),
    )
    .with_context(|| format!("compiling test:stacks' C program with {}", arch.gcc()))?;
    Ok((
        (lock_chain, GUEST_PATH.into()),
        ("MEMLOCK_TRACE_LOCK_CHAIN".into(), GUEST_PATH.into()),
    ))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::test::placement::Placement;

    #[test]
    fn packages_are_named_once() {
        let binary = |packages: &[&str]| TestBinary {
            name: "memlock-trace/test:x".into(),
            package: "memlock-trace".into(),
            path: PathBuf::new(),
            placement: Placement {
                packages: packages.iter().map(|p| p.to_string()).collect(),
                ..Placement::default()
            },
        };
        let binaries = [
            binary(&["python3"]),
            binary(&[]),
            binary(&["gcc", "python3"]),
        ];
        assert_eq!(packages_for(&binaries), ["python3", "gcc"]);
        assert!(packages_for(&binaries[1..2]).is_empty());
    }
}

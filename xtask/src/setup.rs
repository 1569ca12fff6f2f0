//! Installs what building and running memlock-trace needs on a fresh machine, idempotently:
//! the nightly toolchain's rust-src (for `-Z build-std=core`), bpf-linker linked against
//! the nightly rustc's own LLVM, rustfmt and clippy for the lint checks, and tracefs
//! mounted. When everything is present this only runs a few quick checks.

use std::{
    env, fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::util::{output_of, run};

/// The bpf-linker release known to work with aya 0.14 and LLVM 22.
const BPF_LINKER_VERSION: &str = "0.13.0";

pub fn ensure() -> Result<()> {
    ensure_nightly()?;
    ensure_rust_src()?;
    ensure_bpf_linker()?;
    ensure_lint_tools()?;
    ensure_tracefs()?;
    Ok(())
}

/// What cross-building for `target` needs besides [`ensure`]: the standard library for the
/// target (rustup) and, for aarch64, Debian's cross linker (`.cargo/config.toml` names it).
pub fn ensure_cross(target: &str) -> Result<()> {
    let installed = output_of(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if !installed.lines().any(|t| t.trim() == target) {
        eprintln!("xtask: installing the Rust standard library for {target}");
        run(Command::new("rustup").args(["target", "add", target])).with_context(|| {
            format!("installing {target} failed: run `rustup target add {target}`")
        })?;
    }
    match target.split('-').next() {
        Some("aarch64") => crate::util::install_missing_packages(&[
            "gcc-aarch64-linux-gnu",
            "libc6-dev-arm64-cross",
        ])
        .context("the aarch64 build links with Debian's cross gcc"),
        Some("x86_64") => Ok(()),
        _ => bail!("cargo xtask dist builds for x86_64 and aarch64 Linux, not {target}"),
    }
}

fn ensure_nightly() -> Result<()> {
    if output_of(Command::new("rustc").args(["+nightly", "--version"])).is_ok() {
        return Ok(());
    }
    bail!(
        "the nightly Rust toolchain is missing (the eBPF crate needs -Z build-std): \
         run `rustup toolchain install nightly --component rust-src`"
    )
}

fn ensure_rust_src() -> Result<()> {
    let sysroot = nightly_sysroot()?;
    if sysroot.join("lib/rustlib/src/rust/library/core").exists() {
        return Ok(());
    }
    eprintln!("xtask: installing rust-src for the nightly toolchain");
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
        .context(
            "installing rust-src failed: run `rustup component add rust-src --toolchain nightly`",
        )
}

fn nightly_sysroot() -> Result<PathBuf> {
    let out = output_of(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?;
    Ok(PathBuf::from(out.trim()))
}

/// The LLVM major version the nightly rustc was built with, e.g. 22.
fn nightly_llvm_major() -> Result<u32> {
    let out = output_of(Command::new("rustc").args(["+nightly", "-vV"]))?;
    out.lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next()?.parse().ok())
        .ok_or_else(|| anyhow!("`rustc +nightly -vV` names no LLVM version"))
}

fn cache_dir() -> PathBuf {
    env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join("memlock-trace")
}

/// bpf-linker must link the same LLVM major as the nightly rustc. No matching llvm-dev is
/// packaged, but rustc ships its LLVM as a shared library: point bpf-linker's build at a
/// stable prefix holding links to it (the binary keeps an rpath to that prefix).
fn ensure_bpf_linker() -> Result<()> {
    let sysroot = nightly_sysroot()?;
    let major = nightly_llvm_major()?;
    let prefix = cache_dir().join(format!("llvm-{major}-prefix"));
    link_rustc_llvm(&sysroot.join("lib"), &prefix.join("lib"))?;
    if let Ok(version) = output_of(Command::new("bpf-linker").arg("--version"))
        && version.contains(BPF_LINKER_VERSION)
    {
        return Ok(());
    }
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against the nightly rustc's LLVM {major} \
         (about a minute, once)"
    );
    run(Command::new("cargo")
        .args(["+stable", "install", "bpf-linker", "--version", BPF_LINKER_VERSION, "--force"])
        .args(["--no-default-features", "--features", &format!("llvm-{major}")])
        .env("LLVM_PREFIX", &prefix))
    .with_context(|| {
        format!(
            "building bpf-linker failed; the manual fix is \
             `LLVM_PREFIX={} cargo install bpf-linker --no-default-features --features llvm-{major}`",
            prefix.display()
        )
    })?;
    output_of(Command::new("bpf-linker").arg("--version"))
        .context("bpf-linker was installed but does not run (is ~/.cargo/bin on PATH?)")?;
    Ok(())
}

/// Makes `prefix_lib` hold `libLLVM.so` (for the build) and the library's own soname (for
/// the rpath at run time), both pointing into the nightly sysroot.
fn link_rustc_llvm(sysroot_lib: &Path, prefix_lib: &Path) -> Result<()> {
    let libllvm = fs::read_dir(sysroot_lib)
        .with_context(|| format!("reading {}", sysroot_lib.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so."))
        })
        .ok_or_else(|| {
            anyhow!(
                "no libLLVM.so.* in {}: is this a rustup nightly toolchain?",
                sysroot_lib.display()
            )
        })?;
    fs::create_dir_all(prefix_lib)?;
    let soname = libllvm.file_name().expect("a file");
    for name in [Path::new("libLLVM.so"), Path::new(soname)] {
        let link = prefix_lib.join(name);
        if fs::read_link(&link).ok().as_deref() == Some(libllvm.as_path()) {
            continue;
        }
        let _ = fs::remove_file(&link);
        symlink(&libllvm, &link).with_context(|| format!("linking {}", link.display()))?;
    }
    Ok(())
}

/// `cargo xtask lint` runs rustfmt and clippy on the toolchain xtask runs on, and clippy on
/// nightly for the eBPF crate; rustup's minimal profile has none of them.
fn ensure_lint_tools() -> Result<()> {
    ensure_cargo_component(None, "rustfmt", "fmt")?;
    ensure_cargo_component(None, "clippy", "clippy")?;
    ensure_cargo_component(Some("nightly"), "clippy", "clippy")
}

/// Adds `component` to `toolchain` (None: the current one) unless `cargo SUBCOMMAND` runs.
fn ensure_cargo_component(
    toolchain: Option<&str>,
    component: &str,
    subcommand: &str,
) -> Result<()> {
    let mut probe = Command::new("cargo");
    let mut add = Command::new("rustup");
    add.args(["component", "add", component]);
    if let Some(toolchain) = toolchain {
        probe.arg(format!("+{toolchain}"));
        add.args(["--toolchain", toolchain]);
    }
    if output_of(probe.args([subcommand, "--version"])).is_ok() {
        return Ok(());
    }
    let for_toolchain = toolchain.map_or(String::new(), |t| format!(" --toolchain {t}"));
    eprintln!("xtask: installing {component}{for_toolchain}");
    run(&mut add).with_context(|| {
        format!(
            "installing {component} failed: run `rustup component add {component}{for_toolchain}`"
        )
    })
}

/// aya reads tracepoint ids from tracefs, which a fresh machine has not mounted.
fn ensure_tracefs() -> Result<()> {
    const TRACEFS: &str = "/sys/kernel/tracing";
    if Path::new(TRACEFS).join("events").exists() {
        return Ok(());
    }
    run(Command::new("mount").args(["-t", "tracefs", "tracefs", TRACEFS])).with_context(|| {
        format!("tracefs is not mounted and mounting it failed: run `mount -t tracefs tracefs {TRACEFS}` as root")
    })
}

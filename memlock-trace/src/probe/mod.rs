//! What the running kernel offers: privileges, tracefs, and which hook kinds it allows
//! ([`capabilities`]); its BTF is read by [`crate::btf`].
//!
//! Everything here runs before any program is loaded, so that a missing piece is reported
//! as one clear sentence naming the fix instead of a verifier dump.

pub mod capabilities;

use std::{fs, path::Path};

use anyhow::{Context as _, Result, anyhow, bail};

pub use crate::btf::{KernelBtf, VMLINUX_BTF, kernel_release, kernel_version};
pub use capabilities::{Capability, capabilities, unprivileged};

pub const TRACEFS: &str = "/sys/kernel/tracing";

const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Fails unless this process may load tracing programs: root, or CAP_BPF + CAP_PERFMON
/// (CAP_SYS_ADMIN implies both on older kernels), and CAP_DAC_READ_SEARCH where tracefs is
/// closed to other users (mode 0700, current kernels). The message names every capability
/// missing at once, and a `setcap` line granting all that are needed, so that one fix is
/// enough.
pub fn check_privileges() -> Result<()> {
    let (needed, missing) = privileges()?;
    if missing.is_empty() {
        return Ok(());
    }
    // setcap replaces the file's set: name all that are needed, not only the missing ones.
    let grant: Vec<String> = needed.iter().map(|n| n.to_lowercase()).collect();
    let tracefs = if missing.contains(&"CAP_DAC_READ_SEARCH") {
        format!(
            " (CAP_DAC_READ_SEARCH: tracepoint ids are read from tracefs at {TRACEFS}, mode 0700)"
        )
    } else {
        String::new()
    };
    bail!(
        "missing capabilities {}{tracefs}: run memlock-trace as root, or grant them with \
         `sudo setcap {}+ep $(which memlock-trace)` once `chgrp GROUP` and `chmod 750` have \
         made it a binary only GROUP may run{}",
        in_words(&missing),
        grant.join(","),
        paranoid_note(),
    )
}

/// The capabilities a session needs that this process lacks (empty when it has them all).
pub fn missing_capabilities() -> Result<Vec<&'static str>> {
    Ok(privileges()?.1)
}

/// The capabilities needed, and those of them this process lacks.
fn privileges() -> Result<(Vec<&'static str>, Vec<&'static str>)> {
    let status = fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .ok_or_else(|| anyhow!("no CapEff line in /proc/self/status"))?;
    let has = |cap: u32| cap_eff & (1 << cap) != 0;
    let mut needed = vec![(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")];
    if has(CAP_SYS_ADMIN) {
        needed.clear();
    }
    // Tracepoint ids are read from tracefs; where it is closed to us, the capability is what
    // opens it (root passes anyway).
    let tracefs_closed = fs::metadata(Path::new(TRACEFS).join("events"))
        .is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied);
    if tracefs_closed {
        needed.push((CAP_DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH"));
    }
    let missing = needed
        .iter()
        .filter(|(cap, _)| !has(*cap))
        .map(|(_, name)| *name)
        .collect();
    Ok((needed.into_iter().map(|(_, name)| name).collect(), missing))
}

/// `A`, `A and B`, `A, B and C`.
pub fn in_words(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// Debian's `kernel.perf_event_paranoid` 3 refuses perf events even with CAP_PERFMON: said
/// with the capabilities, so that granting them is not followed by another refusal.
fn paranoid_note() -> String {
    match fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok())
    {
        Some(level) if level > 2 => format!(
            "; and since kernel.perf_event_paranoid is {level}, also \
             `sudo sysctl kernel.perf_event_paranoid=2` (at {level} only CAP_SYS_ADMIN may \
             open perf events)"
        ),
        _ => String::new(),
    }
}

/// Mounts tracefs if it is not mounted yet (a fresh machine has it unmounted, and aya reads
/// tracepoint ids from it).
pub fn ensure_tracefs() -> Result<()> {
    match fs::metadata(Path::new(TRACEFS).join("events")) {
        Ok(_) => return Ok(()),
        // Mounted, but mode 0700: without root, reading tracepoint ids needs the capability.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => bail!(
            "cannot read tracefs at {TRACEFS} (mode 0700): run memlock-trace as root or grant \
             CAP_DAC_READ_SEARCH too (`setcap cap_bpf,cap_perfmon,cap_dac_read_search+ep`), \
             which it needs to read tracepoint ids"
        ),
        Err(_) => {}
    }
    nix::mount::mount(
        Some("tracefs"),
        TRACEFS,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .with_context(|| {
        format!("tracefs is not mounted and mounting it failed: run `mount -t tracefs tracefs {TRACEFS}`")
    })
}

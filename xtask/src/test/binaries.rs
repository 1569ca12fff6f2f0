//! Which test binaries run where and need what: the host-only ones with their reasons, and
//! the Debian packages of the ones that run third-party programs.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use super::TestBinary;
use crate::{run::workspace_root, util::output_of, vm::GuestArch};

/// Test binaries run on the host stage only, with the reason the guests' tables show. Only
/// kernel-independent behaviour belongs here (CLI parsing, output shape, JSON schema,
/// errors decided in user space); the figures behind such output are checked in the guests
/// too, by the binaries named in each reason. Every other binary runs on every kernel, or
/// on the guests [`GUEST_SUBSETS`] names.
pub(super) const HOST_ONLY: &[(&str, &str)] = &[
    (
        "memlock-trace/test:promptness",
        "host only: asserts wall-clock bounds (SIGTERM, --duration), which mean nothing in a \
         software-emulated guest; the summary and unloading at SIGTERM: test:robustness, in \
         a guest too",
    ),
    (
        "memlock-trace/test:seed_advice",
        "host only: advise --apply runs each seed again with the preload library, which the \
         guest's initramfs does not carry (the seeds themselves: test:suite, in a guest too)",
    ),
    (
        "memlock-trace/test:prometheus_fleet",
        "host only: runs Debian's prometheus against a system-wide tracer, which the guest's \
         initramfs does not carry (the counts it scrapes: test:exact_calls and test:prometheus, \
         in the guests too)",
    ),
    (
        "memlock-trace/test:systemd_unit",
        "host only: systemd-analyze checks the unit file, whatever the kernel (the capabilities \
         it grants are exercised by test:least_privilege, in the guests too)",
    ),
    (
        "memlock-trace/test:advise",
        "host only: runs the command a second time with the preload library and setpriv, \
         which the guest's initramfs does not carry (the per-interval fault figures advise \
         reads: test:intervals and test:faults, in the guests too)",
    ),
    (
        "memlock-trace/test:advise_cgroup",
        "host only: the memory cgroup's limits and usage are files advise reads in user \
         space, the same on every kernel (the per-interval fault figures advise weighs: \
         test:intervals and test:faults, in the guests too)",
    ),
    (
        "memlock-trace/test:advise_pressure",
        "host only: advise --apply runs python3 again with the preload library, which the \
         guest's initramfs does not carry, in the pressured cgroup (the swap and cgroup \
         figures behind it: test:memory_pressure and test:verify, in the guests too)",
    ),
    (
        "memlock-trace/test:advise_memcached",
        "host only: runs memcached a second time with the preload library and perf stat, \
         which the guest's initramfs does not carry (the fault figures advise reads: \
         test:intervals and test:faults, in the guests too)",
    ),
    (
        "memlock-trace/test:stacks",
        "host only: compiles a C program with gcc and compares with perf and gdb, which the \
         guests do not carry (the kernel side of --stacks: test:fault_cli, in the guests too)",
    ),
    (
        "memlock-trace/test:profiles",
        "host only: compiles a C program with gcc and compares with perf, go tool pprof and \
         node's perf map, which the guests do not carry (the kernel side of --stacks: \
         test:fault_cli, in the guests too)",
    ),
    (
        "memlock-trace/test:byte_names",
        "host only: a command named and given arguments in bytes is launched in user space, \
         the same on every kernel; the guests' programs are busybox applets, chosen by their \
         name (launched commands traced: test:targets, in a guest too)",
    ),
    (
        "memlock-trace/test:metrics_server",
        "host only: the /metrics server's limits (connections, header size, timeouts, accept \
         errors) and formats are user space, the same on every kernel",
    ),
    (
        "memlock-trace/test:prometheus_https",
        "host only: runs Debian's prometheus and promtool against --web-config (TLS, basic \
         auth), user space on every kernel",
    ),
    (
        "memlock-trace/test:prometheus_server",
        "host only: runs Debian's prometheus server, which the guest's initramfs does not carry \
         (the metrics it scrapes: test:prometheus, in a guest too)",
    ),
    (
        "memlock-trace/test:json_schema",
        "host only: JSON shape (schema, time_ns, stack frame keys) is user space; the stacks \
         and verify behind it: test:fault_cli and test:verify, in the guests too",
    ),
    (
        "memlock-trace/test:errors",
        "host only: usage errors, output-path and I/O errors, exit codes are decided in user \
         space, the same on every kernel",
    ),
    (
        "memlock-trace/test:hostile_names",
        "host only: compiles a C program with gcc and renames a symbol with objcopy, which \
         the guest's initramfs does not carry; the escaping is user space (the figures \
         behind the rows: test:fault_cli and test:syscalls, in the guests too)",
    ),
    (
        "memlock-trace/test:run_as_user",
        "host only: --user switches groups, gid, uid and capabilities in user space before \
         exec, and the install recipe needs setcap, which the guest's initramfs does not \
         carry (least privilege itself: test:least_privilege, in the guests too)",
    ),
    (
        "memlock-trace/test:habits",
        "host only: output formats (--hist rows, units, -T, -o, -q/-v, man page, \
         completions); the counts behind them: test:syscalls, test:intervals, \
         test:fault_cli, in the guests too",
    ),
];
/// Binaries that run on some guests only (and always on the host), with the guests they run
/// on and why the others can do without them. Three guests each running every binary do not
/// fit CI's time on two cores: emulated beside the host stage, each guest took 55 to over 60
/// minutes. What differs between the kernels is the hooks, so every guest checks each
/// family's figures against the kernel's own (syscalls: test:syscalls or test:exact_calls;
/// faults: test:faults, test:fault_cli or test:mappings; VMAs: test:vma_whole and
/// test:verify, on all three with the lib's BTF tests and test:probe), and what user space
/// builds on top of the hooks runs on one guest, chosen to balance the guests' times. 6.1
/// and 6.12 offer the same hooks (fentry, kprobes, `bpf_find_vma`, the maple tree; only the
/// VMA family's functions differ); 5.10 has the rbtree, the raw syscall dispatchers and no
/// `bpf_find_vma`.
const GUEST_SUBSETS: &[(&str, &[&str], &str)] = &[
    (
        "memlock-trace/test:syscalls",
        &["5.10", "6.12"],
        "the syscall family's hooks are 6.12's on 6.1, where test:exact_calls counts them",
    ),
    (
        "memlock-trace/test:exact_calls",
        &["5.10", "6.1"],
        "the syscall family's hooks are 6.1's on 6.12, where test:syscalls counts them",
    ),
    (
        "memlock-trace/test:faults",
        &["5.10", "6.12"],
        "the fault family's hooks are 6.12's on 6.1 (fentry/fexit handle_mm_fault), where \
         test:fault_cli and test:mappings count them; 6.12 also has per-VMA locks, whose \
         retried faults the accuracy tests count against getrusage",
    ),
    (
        "memlock-trace/test:fault_cli",
        &["5.10", "6.1"],
        "the fault family's output on top of its hooks (their counts against getrusage on \
         5.10 and 6.12: test:faults), with --stacks on 5.10's raw syscall dispatchers and \
         6.1's trampolines, which 6.12 shares",
    ),
    (
        "memlock-trace/test:mappings",
        &["5.10", "6.1"],
        "the mapping a fault hit: 5.10 walks the rbtree, 6.1 calls bpf_find_vma as 6.12 does",
    ),
    (
        "memlock-trace/test:why_failed",
        &["5.10", "6.12"],
        "the limit, locked_vm and capabilities are kernel fields read through CO-RE, checked \
         on the oldest and the newest kernel (every guest resolves the programs' offsets in \
         the lib's BTF tests)",
    ),
    (
        "memlock-trace/test:least_privilege",
        &["5.10", "6.1"],
        "the capabilities each hook needs: 5.10's hooks, and 6.1's, which 6.12 shares",
    ),
    (
        "memlock-trace/test:fork_storm",
        &["5.10"],
        "user space on top of the hooks; on the guest that boots with 96 possible CPUs \
         (LARGE_MACHINE), where per-CPU sizing would show",
    ),
    (
        "memlock-trace/test:memory_limit",
        &["5.10"],
        "the unit's memory limit, on the guest that boots with 96 possible CPUs \
         (LARGE_MACHINE), where per-CPU maps would need more",
    ),
    ("memlock-trace/test:filters", &["5.10"], ON_ONE_GUEST),
    ("memlock-trace/test:names", &["5.10"], ON_ONE_GUEST),
    ("memlock-trace/test:cli", &["5.10"], ON_ONE_GUEST),
    ("memlock-trace/test:memcached", &["5.10"], ON_ONE_GUEST),
    ("memlock-trace/test:order", &["5.10"], ON_ONE_GUEST),
    ("memlock-trace/test:kernel_log", &["6.1"], ON_ONE_GUEST),
    ("memlock-trace/test:cgroups", &["6.1"], ON_ONE_GUEST),
    ("memlock-trace/test:targets", &["6.1"], ON_ONE_GUEST),
    ("memlock-trace/test:third_party", &["6.1"], ON_ONE_GUEST),
    ("memlock-trace/test:suite", &["6.1"], ON_ONE_GUEST),
    ("memlock-trace/test:prometheus", &["6.12"], ON_ONE_GUEST),
    (
        "memlock-trace/test:tracer_under_pressure",
        &["6.12"],
        "the tracer inside the pressured cgroup it traces: on the kernel whose LRU is the \
         multi-generational one, beside the host's classic LRU (the pressure itself, and the \
         counts under it, on every guest: test:memory_pressure and test:verify)",
    ),
    ("memlock-trace/test:intervals", &["6.12"], ON_ONE_GUEST),
    ("memlock-trace/test:robustness", &["6.12"], ON_ONE_GUEST),
    ("memlock-trace/test:pid_reuse", &["6.12"], ON_ONE_GUEST),
];
const ON_ONE_GUEST: &str = "user space on top of the hooks, whose own figures every guest \
                            checks (test:syscalls or test:exact_calls, test:faults or \
                            test:fault_cli, test:vma_whole, test:verify)";

/// Why `binary` does not run in the guest booting `kernel`, if it does not.
pub(super) fn not_in_guest(binary: &str, kernel: crate::vm::Kernel) -> Option<String> {
    if let Some((_, reason)) = HOST_ONLY.iter().find(|(name, _)| *name == binary) {
        return Some((*reason).to_string());
    }
    if kernel.arch.rust_target().is_some() {
        return (!super::arm64::ARM64_TESTS.contains(&binary))
            .then(|| super::arm64::NOT_ON_ARM64.to_string());
    }
    let kernel = kernel.version;
    let (_, on, why) = GUEST_SUBSETS.iter().find(|(name, _, _)| *name == binary)?;
    (!on.contains(&kernel)).then(|| {
        format!(
            "not on {kernel}, run on {} and the host: {why}",
            on.join(", ")
        )
    })
}

/// Test binaries that run Debian's programs, and the package of each: installed when missing
/// (like qemu) before any stage runs them, since a guest's initramfs carries the programs
/// the host has (python3 with its standard library, memcached: see `vm::programs`).
pub(super) const PROGRAM_TESTS: &[(&str, &str)] = &[
    ("memlock-trace/test:advise", "python3"),
    ("memlock-trace/test:advise_cgroup", "python3"),
    ("memlock-trace/test:advise_pressure", "python3"),
    ("memlock-trace/test:advise_memcached", "memcached"),
    ("memlock-trace/test:advise_memcached", "linux-perf"),
    ("memlock-trace/test:prometheus_server", "prometheus"),
    ("memlock-trace/test:prometheus_https", "prometheus"),
    // promtool lints the text format; the Python client's parser checks OpenMetrics.
    ("memlock-trace/test:metrics_server", "prometheus"),
    (
        "memlock-trace/test:metrics_server",
        "python3-prometheus-client",
    ),
    ("memlock-trace/test:hostile_names", "gcc"),
    ("memlock-trace/test:hostile_names", "binutils"),
    ("memlock-trace/test:run_as_user", "libcap2-bin"),
    ("memlock-trace/test:memcached", "memcached"),
    ("memlock-trace/test:third_party", "python3"),
    ("memlock-trace/test:mappings", "python3"),
    ("memlock-trace/test:tracer_under_pressure", "python3"),
    ("memlock-trace/test:profiles", "gcc"),
    ("memlock-trace/test:profiles", "linux-perf"),
    ("memlock-trace/test:profiles", "golang-go"),
    ("memlock-trace/test:profiles", "nodejs"),
    ("memlock-trace/test:stacks", "gcc"),
    ("memlock-trace/test:stacks", "linux-perf"),
    ("memlock-trace/test:stacks", "gdb"),
    ("memlock-trace/test:stacks", "memcached"),
    ("memlock-trace/test:stacks", "memtester"),
    ("memlock-trace/test:stacks", "python3"),
    ("memlock-trace/test:systemd_unit", "systemd"),
    ("memlock-trace/test:prometheus_fleet", "prometheus"),
    ("memlock-trace/test:prometheus_fleet", "python3"),
];

/// The package of each test binary in [`PROGRAM_TESTS`] among `binaries`.
pub(super) fn packages_for<'a>(
    binaries: impl IntoIterator<Item = &'a TestBinary>,
) -> Vec<&'static str> {
    let mut packages = Vec::new();
    for binary in binaries {
        for &(name, package) in PROGRAM_TESTS {
            if binary.name == name && !packages.contains(&package) {
                packages.push(package);
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
    use crate::run::workspace_root;

    /// A name in HOST_ONLY that matched no binary would run it in the guest after all; one
    /// in PROGRAM_TESTS would leave its package uninstalled and its program out of the guest.
    #[test]
    fn host_only_and_program_test_names_are_test_binaries() {
        let names = HOST_ONLY
            .iter()
            .chain(PROGRAM_TESTS)
            .map(|(name, _)| *name)
            .chain(GUEST_SUBSETS.iter().map(|(name, _, _)| *name))
            .chain(
                super::super::arm64::ARM64_TESTS
                    .iter()
                    .copied()
                    .filter(|name| !name.contains("/lib:")),
            );
        for name in names {
            let target = name
                .strip_prefix("memlock-trace/test:")
                .unwrap_or_else(|| panic!("{name}: not `memlock-trace/test:TARGET`"));
            let file = workspace_root().join(format!("memlock-trace/tests/{target}.rs"));
            assert!(file.is_file(), "{name}: no {}", file.display());
        }
        for (name, reason) in HOST_ONLY {
            assert!(reason.starts_with("host only: "), "{reason}");
            assert!(!super::super::arm64::ARM64_TESTS.contains(name), "{name}");
        }
    }

    /// A kernel misspelt in GUEST_SUBSETS would take its binary off every guest silently.
    #[test]
    fn guest_subsets_name_guest_kernels_and_leave_each_binary_somewhere() {
        let x86_64: Vec<crate::vm::Kernel> = crate::vm::KERNELS
            .into_iter()
            .filter(|k| k.arch.rust_target().is_none())
            .collect();
        let guests: Vec<&str> = x86_64.iter().map(|k| k.version).collect();
        for (name, on, _) in GUEST_SUBSETS {
            assert!(!on.is_empty(), "{name}");
            for kernel in *on {
                assert!(guests.contains(kernel), "{name}: no guest kernel {kernel}");
            }
            assert!(
                x86_64.iter().any(|&k| not_in_guest(name, k).is_none()),
                "{name}"
            );
            assert_eq!(
                x86_64
                    .iter()
                    .filter(|&&k| not_in_guest(name, k).is_some())
                    .count(),
                guests.len() - on.len(),
                "{name}"
            );
        }
    }

    #[test]
    fn program_tests_name_their_packages_once() {
        let binary = |name: &str| TestBinary {
            name: name.into(),
            package: "memlock-trace".into(),
            path: PathBuf::new(),
        };
        let binaries = [
            binary("memlock-trace/test:third_party"),
            binary("memlock-trace/test:faults"),
            binary("memlock-trace/test:third_party"),
        ];
        assert_eq!(packages_for(&binaries), ["python3"]);
        assert!(packages_for(&binaries[1..2]).is_empty());
    }
}

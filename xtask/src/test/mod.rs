//! `cargo xtask test`: the lint checks first (`cargo xtask lint`; a failure stops the run
//! before any test), then the same test binaries on this machine's kernel and inside qemu
//! guests booting stock Debian kernels (where fentry/kprobes load; `--kernel` picks 5.10,
//! 6.1, 6.12, and 6.1-arm64 and, only when named, 6.12-arm64, whose guests run the binaries
//! cross-built: [`arm64`]), with a table per kernel.

mod arm64;
mod binaries;
mod disk;
mod placement;
mod report;

use std::{
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use self::{
    binaries::packages_for,
    placement::Placement,
    report::{Outcome, Probe, outcome, print_table},
};
use crate::{
    lint,
    run::workspace_root,
    util::{install_missing_packages, output_of},
    vm,
};

#[derive(clap::Args)]
pub struct Args {
    /// Only run the tests on this machine's kernel.
    #[arg(long, conflicts_with_all = ["vm_only", "kernel"])]
    host_only: bool,
    /// Only run the tests inside the qemu guest.
    #[arg(long, conflicts_with = "kernel")]
    vm_only: bool,
    /// Run on these kernels only: `host`, a guest kernel (5.10, 6.1, 6.12, 6.1-arm64, 6.12-arm64), or `all` (the
    /// host and every guest, side by side); repeatable. Without it: all of them.
    #[arg(long, value_name = "VERSION")]
    kernel: Vec<String>,
    /// Only the test binaries whose name contains this (e.g. `faults`, `lib`); repeatable.
    /// The guest's `memlock-trace probe` always runs.
    #[arg(long, value_name = "NAME")]
    test: Vec<String>,
    /// Boot every guest with N possible CPUs, one of them online (`-smp N`, the kernel's
    /// `maxcpus=1`): the kernel sizes per-CPU maps for N, as on a large machine. Without
    /// it, [`LARGE_MACHINE`]'s guest boots so and the others with one CPU.
    #[arg(long, value_name = "N")]
    max_cpus: Option<u32>,
}

impl Args {
    /// Keeps the binaries `--test` names (all without it).
    fn keep_chosen(&self, binaries: &mut Vec<TestBinary>) {
        if !self.test.is_empty() {
            binaries.retain(|b| self.test.iter().any(|t| b.name.contains(t.as_str())));
        }
    }

    /// Whether to run on the host, and which guest kernels.
    fn kernels(&self) -> Result<(bool, Vec<vm::Kernel>)> {
        if self.kernel.is_empty() {
            let guests = if self.host_only {
                Vec::new()
            } else {
                vm::KERNELS.to_vec()
            };
            return Ok((!self.vm_only, guests));
        }
        if self.kernel.iter().any(|k| k == "all") {
            return Ok((true, vm::KERNELS.to_vec()));
        }
        let mut guests = Vec::new();
        for version in self.kernel.iter().filter(|k| *k != "host") {
            let kernel = vm::kernel(version)?;
            if !guests.contains(&kernel) {
                guests.push(kernel);
            }
        }
        Ok((self.kernel.iter().any(|k| k == "host"), guests))
    }
}

/// A test executable built by `cargo test --no-run`.
struct TestBinary {
    /// `package/target`, e.g. `memlock-trace/syscalls`.
    name: String,
    package: String,
    path: PathBuf,
    /// Where it runs and what it needs, as its source file declares.
    placement: Placement,
}

/// What a stage runs: test binaries, the tracer they run, and what a guest is given besides.
struct Build {
    binaries: Vec<TestBinary>,
    tracer: PathBuf,
    extra_files: Vec<(PathBuf, String)>,
    env: Vec<(String, String)>,
}

struct Stage {
    /// `host`, or the guest kernel's version.
    title: &'static str,
    kernel: String,
    probe: Probe,
    outcomes: Vec<Outcome>,
    /// Test binaries not run on this kernel, and why.
    not_run: Vec<(String, String)>,
    secs: f64,
}

impl Stage {
    fn ok(&self) -> bool {
        !self.outcomes.is_empty()
            && self
                .outcomes
                .iter()
                .all(|o| o.exit_code == 0 && o.failed == 0)
    }
}

/// The guest that boots as a large machine by default, and its possible CPUs: per-CPU maps
/// are sized by possible CPUs, so a 2-CPU host hides what a 96-CPU node pays and loses
/// (issue 29: the fork storm's exact counts and the 32 MiB of map memory, test:fork_storm,
/// which runs on this guest). One CPU is brought up; the others cost the guest only their
/// per-CPU areas.
const LARGE_MACHINE: (&str, u32) = ("5.10", 96);

/// Integration tests load programs into the kernel and filter on their own pid, so tests in
/// one binary must not run concurrently.
const LIBTEST_ARGS: [&str; 1] = ["--test-threads=1"];

pub fn run(args: &Args) -> Result<()> {
    disk::ensure_room(&workspace_root().join("target"))?;
    // Every run lints, whatever the stages: there is no flag to skip it, so CI always does.
    lint::run().context("no test ran")?;
    let (host, guests) = args.kernels()?;
    // The host stage needs the default kernel too: the suite test's vm-memory scenario
    // boots it under qemu. Fetched up front, so a failed fetch stops the run at once.
    if host {
        vm::ensure_assets(&vm::cache_dir(), vm::DEFAULT_KERNEL)?;
    }
    for &kernel in &guests {
        vm::ensure_assets(&vm::cache_dir(), kernel)?;
    }
    build_preload_library()?;
    let mut binaries = build_test_binaries(&[])?;
    args.keep_chosen(&mut binaries);
    if binaries.is_empty() {
        bail!("no test binary matches --test {}", args.test.join(", "));
    }
    // Before any stage: the guests' initramfs is built from what the host has installed.
    install_missing_packages(&packages_for(&binaries))?;
    let tracer = workspace_root().join("target/debug/memlock-trace");
    let (lock_chain, lock_chain_env) = binaries::guest_lock_chain(
        vm::GuestArch::X86_64,
        &workspace_root().join("target/debug"),
    )?;
    let native = Build {
        binaries,
        // Integration tests run the CLI by its absolute host path.
        extra_files: vec![(tracer.clone(), tracer.display().to_string()), lock_chain],
        tracer,
        env: vec![lock_chain_env],
    };
    // Foreign guests run the same binaries cross-built, once per architecture, before any
    // stage starts.
    let mut cross: Vec<(vm::GuestArch, Build)> = Vec::new();
    for &kernel in guests.iter().filter(|k| k.arch.rust_target().is_some()) {
        if cross.iter().all(|(arch, _)| *arch != kernel.arch) {
            let mut build = arm64::build(kernel.arch)?;
            args.keep_chosen(&mut build.binaries);
            cross.push((kernel.arch, build));
        }
    }
    // The host stage and the guests side by side: a guest is one qemu process emulating the
    // kernel, the host stage mostly waits on its tests' processes, and the machine has few
    // cores; one after the other the run took the host's time plus the slowest guest's.
    let (native, cross, max_cpus) = (&native, &cross, args.max_cpus);
    let (host_stage, guest_stages) = std::thread::scope(|scope| {
        let handles: Vec<_> = guests
            .iter()
            .map(|&kernel| {
                let max_cpus = max_cpus
                    .or_else(|| (kernel.version == LARGE_MACHINE.0).then_some(LARGE_MACHINE.1));
                let build = cross
                    .iter()
                    .find(|(arch, _)| *arch == kernel.arch)
                    .map_or(native, |(_, build)| build);
                scope.spawn(move || vm_stage(build, kernel, max_cpus))
            })
            .collect();
        let host_stage = host.then(|| host_stage(&native.binaries, &native.tracer));
        let guest_stages: Vec<Result<Stage>> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("guest thread panicked")))
            })
            .collect();
        (host_stage, guest_stages)
    });
    let mut stages = Vec::new();
    let mut errors = Vec::new();
    match host_stage {
        Some(Ok(stage)) => stages.push(stage),
        Some(Err(error)) => errors.push(format!("host: {error:#}")),
        None => {}
    }
    for stage in guest_stages {
        match stage {
            Ok(stage) => stages.push(stage),
            Err(error) => errors.push(format!("{error:#}")),
        }
    }
    println!();
    for stage in &stages {
        print_table(stage);
    }
    let passed: u64 = stages
        .iter()
        .flat_map(|s| &s.outcomes)
        .map(|o| o.passed)
        .sum();
    let failed: u64 = stages
        .iter()
        .flat_map(|s| &s.outcomes)
        .map(|o| o.failed)
        .sum();
    // The plain closing line CI reads, over both kernels.
    println!("{passed} passed, {failed} failed");
    if !errors.is_empty() {
        bail!("{}", errors.join("\n"));
    }
    if let Some(bad) = stages.iter().find(|s| !s.ok()) {
        bail!("tests failed on {} ({})", bad.title, bad.kernel);
    }
    Ok(())
}

/// `advise --apply` finds the preload library next to the tracer; `cargo test` builds only
/// the crate's test harness, not the library itself.
fn build_preload_library() -> Result<()> {
    let status = Command::new("cargo")
        .current_dir(workspace_root())
        .args(["build", "-p", "memlock-preload"])
        .status()
        .context("running cargo build -p memlock-preload")?;
    if !status.success() {
        bail!("building the preload library failed ({status})");
    }
    Ok(())
}

/// `cargo test --no-run [cargo_args]`'s test executables.
fn build_test_binaries(cargo_args: &[&str]) -> Result<Vec<TestBinary>> {
    // Compiler progress goes to the terminal; the JSON artifact list comes back on stdout.
    let out = Command::new("cargo")
        .current_dir(workspace_root())
        .args(["test", "--no-run", "--message-format=json"])
        .args(cargo_args)
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the tests failed ({})", out.status);
    }
    let out = String::from_utf8_lossy(&out.stdout);
    // `cargo test` builds the binary the integration tests run as CARGO_BIN_EXE_memlock-trace.
    let mut binaries = Vec::new();
    for line in out.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let package = msg["target"]["src_path"]
            .as_str()
            .and_then(|p| p.strip_prefix(&format!("{}/", workspace_root().display())))
            .and_then(|p| p.split('/').next())
            .unwrap_or("?")
            .to_string();
        let target = msg["target"]["name"].as_str().unwrap_or("?");
        let kind = msg["target"]["kind"][0].as_str().unwrap_or("?");
        let src_path = PathBuf::from(msg["target"]["src_path"].as_str().unwrap_or_default());
        binaries.push(TestBinary {
            name: format!("{package}/{kind}:{target}"),
            placement: placement::of_binary(&package, kind, &src_path)?,
            package,
            path: PathBuf::from(exe),
        });
    }
    if binaries.is_empty() {
        bail!("`cargo test --no-run` produced no test binaries");
    }
    Ok(binaries)
}

fn host_stage(binaries: &[TestBinary], tracer: &std::path::Path) -> Result<Stage> {
    let start = Instant::now();
    let kernel = output_of(Command::new("uname").arg("-r"))?
        .trim()
        .to_string();
    println!("xtask: host stage on kernel {kernel}");
    let probe = Probe::parse(
        &output_of(Command::new(tracer).args(["probe", "--json"]))
            .context("memlock-trace probe --json")?,
    )?;
    let mut outcomes = Vec::new();
    for binary in binaries {
        println!("xtask: running {}", binary.name);
        let mut child = Command::new(&binary.path)
            .args(LIBTEST_ARGS)
            .current_dir(workspace_root().join(&binary.package))
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("running {}", binary.path.display()))?;
        let mut output = String::new();
        for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
            let line = line?;
            println!("{line}");
            output.push_str(&line);
            output.push('\n');
        }
        let status = child.wait()?;
        outcomes.push(outcome(&binary.name, &output, status.code().unwrap_or(-1)));
    }
    Ok(Stage {
        title: "host",
        kernel,
        probe,
        outcomes,
        not_run: Vec::new(),
        secs: start.elapsed().as_secs_f64(),
    })
}

fn vm_stage(build: &Build, kernel: vm::Kernel, max_cpus: Option<u32>) -> Result<Stage> {
    let start = Instant::now();
    println!(
        "xtask: VM stage: booting Debian's {} kernel in qemu (software emulation{})",
        kernel.version,
        max_cpus.map_or(String::new(), |n| format!(", {n} possible CPUs"))
    );
    // Only memlock-trace's tests touch the kernel; xtask's own do not belong in the guest.
    let (guest_binaries, not_here): (Vec<&TestBinary>, Vec<&TestBinary>) = build
        .binaries
        .iter()
        .filter(|b| b.package == "memlock-trace")
        .partition(|b| b.placement.why_not_on(kernel).is_none());
    let mut not_run: Vec<(String, String)> = not_here
        .iter()
        .map(|b| {
            (
                b.name.clone(),
                b.placement.why_not_on(kernel).unwrap_or_default(),
            )
        })
        .collect();
    if kernel.arch.rust_target().is_some() {
        not_run.push(("(every other binary)".into(), arm64::NOT_ON_ARM64.into()));
    }
    let mut tests = vec![vm::VmTest {
        name: "probe".into(),
        binary: build.tracer.clone(),
        args: vec!["probe".into(), "--json".into()],
    }];
    tests.extend(guest_binaries.iter().map(|b| vm::VmTest {
        name: b.name.replace([':', '/'], "-"),
        binary: b.path.clone(),
        args: LIBTEST_ARGS.iter().map(|s| s.to_string()).collect(),
    }));
    let report = vm::run(&vm::VmOptions {
        kernel,
        tests,
        cache_dir: vm::cache_dir(),
        // A hang guard, not a target: software emulation on a loaded machine is slow, and
        // guests side by side share its cores (all test binaries took ~15-20 min per guest
        // with two guests and other work on 2 cores; 6.12 took ~2,600 s with every binary
        // once the syscall hooks were per-call fentry programs, before the 6.1/6.12 split;
        // a fresh-clone run of c188847, alone on the machine: 2,713, 2,857 and 2,793 s for
        // 5.10, 6.1 and 6.12; with the guests' split by hooks and optimised dependencies,
        // 1,511-1,527 s, which CI's slower machine stretches by up to 1.5x). 3,600 s keeps
        // the whole run inside CI's 90 minutes.
        timeout: Duration::from_secs(3600),
        memory_mib: 2048,
        max_cpus,
        extra_files: build.extra_files.clone(),
        env: build.env.clone(),
        // Debian's programs are this machine's, x86_64 binaries.
        programs: kernel.arch.rust_target().is_none()
            && !packages_for(guest_binaries.iter().copied()).is_empty(),
    })?;
    println!(
        "xtask: guest {} ({:.1} MiB initramfs, packed in {:.1}s) booted in {:.1}s, \
         tests done in {:.1}s; console log: {}",
        report.kernel_release,
        report.initramfs_bytes as f64 / (1024.0 * 1024.0),
        report.initramfs_secs,
        report.boot_secs,
        report.total_secs,
        report.console_log.display()
    );
    let mut probe = Probe::default();
    let mut outcomes = Vec::new();
    for result in &report.results {
        println!(
            "--- guest: {} (exit {}) ---\n{}",
            result.name,
            result.exit_code,
            result.output.trim_end()
        );
        if result.name == "probe" {
            probe = Probe::parse(&result.output)?;
            // The guest exists to exercise the hooks the host refuses.
            for &needed in kernel.arch.hooks_needed() {
                if !probe.usable(needed) {
                    bail!(
                        "the guest kernel {} does not offer {needed}; the VM stage cannot test that path:\n{}",
                        report.kernel_release,
                        result.output
                    );
                }
            }
            if result.exit_code != 0 {
                outcomes.push(Outcome {
                    name: "memlock-trace probe".into(),
                    passed: 0,
                    failed: 1,
                    exit_code: result.exit_code,
                });
            }
            continue;
        }
        let name = guest_binaries
            .iter()
            .find(|b| b.name.replace([':', '/'], "-") == result.name)
            .map_or(result.name.clone(), |b| b.name.clone());
        outcomes.push(outcome(&name, &result.output, result.exit_code));
    }
    Ok(Stage {
        title: kernel.version,
        kernel: report.kernel_release,
        probe,
        outcomes,
        not_run,
        secs: start.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_names_the_host_and_every_guest() {
        let args = |kernels: &[&str]| Args {
            host_only: false,
            vm_only: false,
            kernel: kernels.iter().map(|k| k.to_string()).collect(),
            test: Vec::new(),
            max_cpus: None,
        };
        let (host, guests) = args(&["all"]).kernels().unwrap();
        assert!(host);
        assert_eq!(guests, vm::KERNELS);
        let (host, guests) = args(&["6.12", "host"]).kernels().unwrap();
        assert!(host);
        assert_eq!(guests, [vm::kernel("6.12").unwrap()]);
        assert_eq!(args(&[]).kernels().unwrap(), (true, vm::KERNELS.to_vec()));
    }
}

//! Run test binaries inside qemu on a stock Debian kernel.
//!
//! The development kernel refuses fentry/fexit and has no kprobes, so those
//! code paths are tested in a guest booting Debian's cloud kernel, which
//! allows both. The guest is software-emulated (nested KVM fails here) and
//! has no disk or network: an initramfs holds busybox, the test binaries,
//! their shared libraries and an `/init` script that runs the tests and
//! reports each one's exit code on the serial console between marker lines.
//!
//! Everything the cloud kernel needs for this (initramfs, 8250 serial
//! console, BPF with BTF, kprobes, tracefs, debugfs, bpffs, tmpfs, devtmpfs,
//! the cgroup v2 memory controller) is built in. zram is a module: `/init`
//! loads it and what it needs (the kernel table's `modules`, taken from the
//! image's own package) so the memory-pressure scenario can swap to it. It
//! only loads them: the scenario sets up swap and its cgroup itself.
//!
//! One file per stage of a run: [`assets`] installs the host tools and caches the kernel
//! image with its [`modules`], [`initramfs`] lays out the guest and writes its `/init`
//! (with [`programs`], the cached archive of third-party programs some tests run), [`qemu`]
//! boots it under a hang guard and reads the results off the console. The marker lines below are the
//! protocol between the last two.

mod arch;
mod assets;
mod files;
mod initramfs;
mod modules;
mod programs;
mod qemu;

use std::{
    fs, io,
    path::PathBuf,
    process,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

pub use self::{
    arch::GuestArch,
    assets::{DEFAULT_KERNEL, KERNELS, Kernel, ensure_assets, kernel},
};

/// `/init` prints this and `uname -r` once booted.
const KERNEL_MARK: &str = "MEMLOCK-TRACE-KERNEL";
/// `/init` prints this and the test's name before running it.
const BEGIN_MARK: &str = "MEMLOCK-TRACE-BEGIN";
/// `/init` prints this, the test's name and its exit code after it.
const RESULT_MARK: &str = "MEMLOCK-TRACE-RESULT";
/// `/init` prints this after the last test, then powers off.
const DONE_MARK: &str = "MEMLOCK-TRACE-DONE";

/// One test to run in the guest.
pub struct VmTest {
    /// Names the test in the markers and the report; must not contain whitespace.
    pub name: String,
    /// Host path of the executable; it and the shared libraries `ldd` lists are copied in.
    pub binary: PathBuf,
    pub args: Vec<String>,
}

/// What to run and how.
pub struct VmOptions {
    /// The stock kernel to boot.
    pub kernel: Kernel,
    /// Run in order, each as root with `/tmp` as working directory.
    pub tests: Vec<VmTest>,
    /// Holds the cached kernels, the scratch initramfs and `console-PID-VERSION.log`.
    pub cache_dir: PathBuf,
    /// Limit for the guest, from qemu start to the guest powering off.
    pub timeout: Duration,
    pub memory_mib: u32,
    /// Possible CPUs, one of them online (`-smp N` and the kernel's `maxcpus=1`): the kernel
    /// sizes its per-CPU allocations for them, as on a machine with that many CPUs.
    /// `None`: one.
    pub max_cpus: Option<u32>,
    /// Extra files to copy in: (host path, absolute guest path).
    pub extra_files: Vec<(PathBuf, String)>,
    /// Exported to every test: (name, value).
    pub env: Vec<(String, String)>,
    /// Carry the third-party programs tests run (python3 and its standard library,
    /// memcached; see [`programs`]) where the host has them.
    pub programs: bool,
}

/// The outcome of one test.
pub struct VmTestResult {
    pub name: String,
    pub exit_code: i32,
    /// Everything the console showed while the test ran (stdout and stderr, plus
    /// any kernel messages printed meanwhile).
    pub output: String,
}

/// The outcome of a guest run in which every test ran to completion
/// (whatever its exit code).
pub struct VmReport {
    /// `uname -r` in the guest.
    pub kernel_release: String,
    /// In the order of [`VmOptions::tests`].
    pub results: Vec<VmTestResult>,
    /// The whole serial console (and qemu's stderr).
    pub console_log: PathBuf,
    /// The size of the initramfs the guest booted.
    pub initramfs_bytes: u64,
    /// Laying out and packing it (the programs' archive included, when built anew).
    pub initramfs_secs: f64,
    /// From starting qemu to the guest's init printing the kernel release.
    pub boot_secs: f64,
    /// The whole of [`run`], including [`ensure_assets`] and building the initramfs.
    pub total_secs: f64,
}

/// Where the kernel image and scratch files live, shared by the test stage and the
/// vm-memory scenario.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache"))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join("memlock-trace/vm")
}

/// Boots the stock kernel with the tests in an initramfs and runs them.
///
/// Returns `Ok` once every test has run, whatever the exit codes; errors if
/// assets can't be prepared, or the guest times out, panics or stops early
/// (the error then quotes the last console lines).
pub fn run(opts: &VmOptions) -> Result<VmReport> {
    let start = Instant::now();
    let version = opts.kernel.version;
    let assets = ensure_assets(&opts.cache_dir, opts.kernel)?;
    let scratch = ScratchDir::new(
        opts.cache_dir
            .join(format!("vm-run-{}-{version}", process::id())),
    )?;
    let packing = Instant::now();
    let initrd = initramfs::build(opts, &assets, &scratch.0)?;
    let initramfs_secs = packing.elapsed().as_secs_f64();
    let initramfs_bytes = fs::metadata(&initrd)
        .with_context(|| format!("reading {}", initrd.display()))?
        .len();
    // One log per run: concurrent runs (several worktrees) must not share it.
    let console_log = opts
        .cache_dir
        .join(format!("console-{}-{version}.log", process::id()));
    let console = qemu::boot(&assets.vmlinuz, &initrd, opts, &console_log)
        .with_context(|| format!("kernel {version}: booting {}", assets.vmlinuz.display()))?;

    let kernel_release = console.kernel_release.with_context(|| {
        format!(
            "kernel {version}: the guest never printed {KERNEL_MARK} (it did not boot); see {}",
            console_log.display()
        )
    })?;
    if kernel_release != assets.kernel_release {
        bail!(
            "kernel {version}: guest runs kernel {kernel_release}, expected {}",
            assets.kernel_release
        );
    }
    if console.results.len() != opts.tests.len() {
        bail!(
            "kernel {version}: guest reported {} of {} test results; see {}",
            console.results.len(),
            opts.tests.len(),
            console_log.display()
        );
    }
    Ok(VmReport {
        kernel_release,
        results: console.results,
        console_log,
        initramfs_bytes,
        initramfs_secs,
        boot_secs: console.boot.unwrap_or_default().as_secs_f64(),
        total_secs: start.elapsed().as_secs_f64(),
    })
}

/// A scratch directory, emptied on creation and removed on drop so failed runs leave no debris.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new(path: PathBuf) -> Result<Self> {
        match fs::remove_dir_all(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing stale {}", path.display()));
            }
            _ => {}
        }
        fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self(path))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

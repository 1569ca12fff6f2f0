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
//! console, BPF with BTF, kprobes, tracefs, debugfs, bpffs, tmpfs, devtmpfs)
//! is built in, so no kernel modules are loaded.

use std::{
    collections::BTreeMap,
    fs::{self, File},
    io::{self, BufRead, BufReader, Write},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{self, Command, Stdio},
    sync::mpsc::{self, RecvTimeoutError},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};

/// Debian packages providing the host tools.
const HOST_PACKAGES: [&str; 3] = ["qemu-system-x86", "busybox-static", "cpio"];
/// Installed by busybox-static; statically linked, so it runs in the guest as is.
const BUSYBOX: &str = "/bin/busybox";
/// Metapackage whose single dependency is the current cloud kernel image.
const KERNEL_METAPACKAGE: &str = "linux-image-cloud-amd64";

const KERNEL_MARK: &str = "MEMLOCK-TRACE-KERNEL";
const BEGIN_MARK: &str = "MEMLOCK-TRACE-BEGIN";
const RESULT_MARK: &str = "MEMLOCK-TRACE-RESULT";
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
    /// Run in order, each as root with `/tmp` as working directory.
    pub tests: Vec<VmTest>,
    /// Holds the cached kernel, the scratch initramfs and `console-PID.log`.
    pub cache_dir: PathBuf,
    /// Limit for the guest, from qemu start to the guest powering off.
    pub timeout: Duration,
    pub memory_mib: u32,
    /// Extra files to copy in: (host path, absolute guest path).
    pub extra_files: Vec<(PathBuf, String)>,
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
    /// From starting qemu to the guest's init printing the kernel release.
    pub boot_secs: f64,
    /// The whole of [`run`], including [`ensure_assets`] and building the initramfs.
    pub total_secs: f64,
}

/// The host-side ingredients of a guest.
pub struct VmAssets {
    pub vmlinuz: PathBuf,
    pub kernel_release: String,
}

/// Where the kernel image and scratch files live, shared by the test stage and the
/// vm-memory scenario.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache"))
        .unwrap_or_else(|| PathBuf::from("/tmp"))
        .join("memlock-trace/vm")
}

/// Installs the host tools (qemu-system-x86, busybox-static, cpio) with
/// apt-get if any is missing, running `apt-get update` only then, and
/// fetches the stock cloud kernel into `cache_dir/kernel` unless it is there
/// already. Fast and offline when everything is present.
pub fn ensure_assets(cache_dir: &Path) -> Result<VmAssets> {
    install_missing_packages()?;
    let kernel_dir = cache_dir.join("kernel");
    if let Some(assets) = cached_kernel(&kernel_dir)? {
        return Ok(assets);
    }
    fetch_kernel(cache_dir, &kernel_dir)?;
    cached_kernel(&kernel_dir)?.with_context(|| {
        format!(
            "no vmlinuz-* in {} after fetching the kernel",
            kernel_dir.display()
        )
    })
}

/// Boots the stock kernel with the tests in an initramfs and runs them.
///
/// Returns `Ok` once every test has run, whatever the exit codes; errors if
/// assets can't be prepared, or the guest times out, panics or stops early
/// (the error then quotes the last console lines).
pub fn run(opts: &VmOptions) -> Result<VmReport> {
    let start = Instant::now();
    let assets = ensure_assets(&opts.cache_dir)?;
    let scratch = ScratchDir::new(opts.cache_dir.join(format!("vm-run-{}", process::id())))?;
    let initrd = build_initramfs(opts, &scratch.0)?;
    // One log per run: concurrent runs (several worktrees) must not share it.
    let console_log = opts
        .cache_dir
        .join(format!("console-{}.log", process::id()));
    let console = boot(&assets.vmlinuz, &initrd, opts, &console_log)?;

    let kernel_release = console.kernel_release.with_context(|| {
        format!(
            "guest never printed {KERNEL_MARK}; see {}",
            console_log.display()
        )
    })?;
    if kernel_release != assets.kernel_release {
        bail!(
            "guest runs kernel {kernel_release}, expected {}",
            assets.kernel_release
        );
    }
    if console.results.len() != opts.tests.len() {
        bail!(
            "guest reported {} of {} test results; see {}",
            console.results.len(),
            opts.tests.len(),
            console_log.display()
        );
    }
    Ok(VmReport {
        kernel_release,
        results: console.results,
        console_log,
        boot_secs: console.boot.unwrap_or_default().as_secs_f64(),
        total_secs: start.elapsed().as_secs_f64(),
    })
}

fn install_missing_packages() -> Result<()> {
    // dpkg-query exits non-zero when a package is unknown, so only its output counts.
    let query = Command::new("dpkg-query")
        .args(["-W", "-f=${Package} ${db:Status-Abbrev}\n"])
        .args(HOST_PACKAGES)
        .output()
        .context("cannot run `dpkg-query`")?;
    let listing = String::from_utf8_lossy(&query.stdout);
    let installed: Vec<&str> = listing
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(_, status)| status.starts_with("ii"))
        .map(|(package, _)| package)
        .collect();
    let missing: Vec<&str> = HOST_PACKAGES
        .into_iter()
        .filter(|p| !installed.contains(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    crate::util::output_of(Command::new("apt-get").arg("update"))?;
    crate::util::output_of(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| format!("installing {}", missing.join(" ")))?;
    Ok(())
}

fn cached_kernel(kernel_dir: &Path) -> Result<Option<VmAssets>> {
    let entries = match fs::read_dir(kernel_dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        entries => entries.with_context(|| format!("reading {}", kernel_dir.display()))?,
    };
    for entry in entries {
        let name = entry?.file_name();
        if let Some(release) = name.to_str().and_then(|n| n.strip_prefix("vmlinuz-")) {
            return Ok(Some(VmAssets {
                vmlinuz: kernel_dir.join(&name),
                kernel_release: release.to_owned(),
            }));
        }
    }
    Ok(None)
}

fn fetch_kernel(cache_dir: &Path, kernel_dir: &Path) -> Result<()> {
    let scratch = ScratchDir::new(cache_dir.join(format!("kernel-fetch-{}", process::id())))?;
    // Package lists may be missing or name a version the mirror has since
    // dropped: refresh them once and retry.
    let deb = download_kernel_package(&scratch.0).or_else(|first_error| {
        crate::util::output_of(Command::new("apt-get").arg("update"))
            .with_context(|| format!("refreshing package lists after: {first_error:#}"))?;
        download_kernel_package(&scratch.0)
    })?;

    let extracted = scratch.0.join("extracted");
    crate::util::output_of(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&extracted))?;
    // Only the kernel image is kept: everything needed is built in (see module docs).
    let boot = extracted.join("boot");
    let vmlinuz = fs::read_dir(&boot)
        .with_context(|| format!("reading {}", boot.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.file_name()))
        .find(|name| name.to_string_lossy().starts_with("vmlinuz-"))
        .with_context(|| format!("{} contains no boot/vmlinuz-*", deb.display()))?;
    fs::create_dir_all(kernel_dir).with_context(|| format!("creating {}", kernel_dir.display()))?;
    // A rename, so an interrupted fetch never leaves a partial vmlinuz in the cache.
    fs::rename(boot.join(&vmlinuz), kernel_dir.join(&vmlinuz)).with_context(|| {
        format!(
            "moving {} into {}",
            vmlinuz.to_string_lossy(),
            kernel_dir.display()
        )
    })
}

/// Resolves the cloud metapackage's image package and downloads its .deb into `dir`.
fn download_kernel_package(dir: &Path) -> Result<PathBuf> {
    let depends =
        crate::util::output_of(Command::new("apt-cache").args(["depends", KERNEL_METAPACKAGE]))?;
    let package = depends
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .with_context(|| {
            format!("`apt-cache depends {KERNEL_METAPACKAGE}` names no linux-image-* package")
        })?;
    crate::util::output_of(
        Command::new("apt-get")
            .args(["download", package])
            .current_dir(dir),
    )
    .with_context(|| format!("fetching kernel package {package}"))?;
    fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| {
            path.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{package}_")))
        })
        .with_context(|| {
            format!(
                "`apt-get download {package}` left no .deb in {}",
                dir.display()
            )
        })
}

/// Lays out the guest's root file system under `dir/root` and packs it into `dir/initramfs.cpio`.
fn build_initramfs(opts: &VmOptions, dir: &Path) -> Result<PathBuf> {
    let root = dir.join("root");
    for sub in [
        "bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "tmp", "tests",
    ] {
        fs::create_dir_all(root.join(sub))?;
    }
    install_file(Path::new(BUSYBOX), &root, BUSYBOX)?;

    // Tests may share a binary (e.g. with different filters): copy each once.
    let mut binaries: BTreeMap<String, &Path> = BTreeMap::new();
    let mut script = init_script_prologue();
    for test in &opts.tests {
        if test.name.is_empty() || test.name.contains(char::is_whitespace) {
            bail!(
                "test name {:?} must be non-empty and free of whitespace",
                test.name
            );
        }
        let file_name = test
            .binary
            .file_name()
            .with_context(|| format!("test binary {} has no file name", test.binary.display()))?
            .to_string_lossy();
        let guest = format!("/tests/{file_name}");
        match binaries.get(&guest) {
            Some(&other) if other != test.binary => {
                bail!(
                    "test binaries {} and {} share a file name",
                    other.display(),
                    test.binary.display()
                )
            }
            Some(_) => {}
            None => {
                install_file(&test.binary, &root, &guest)?;
                strip_debug(&root.join(&guest[1..]));
                for lib in shared_libraries(&test.binary)? {
                    install_file(&lib, &root, &lib.to_string_lossy())?;
                }
                binaries.insert(guest.clone(), &test.binary);
            }
        }
        let command: Vec<String> = std::iter::once(&guest)
            .chain(&test.args)
            .map(|s| sh_quote(s))
            .collect();
        let name = sh_quote(&test.name);
        script += &format!(
            "echo {BEGIN_MARK} {name}\n{} </dev/null 2>&1\necho {RESULT_MARK} {name} $?\n",
            command.join(" ")
        );
    }
    script += &format!("echo {DONE_MARK}\npoweroff -f\n");

    for (host, guest) in &opts.extra_files {
        install_file(host, &root, guest)?;
        strip_debug(&root.join(guest.trim_start_matches('/')));
    }
    let init = root.join("init");
    fs::write(&init, script)?;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;

    let initrd = dir.join("initramfs.cpio");
    let mut find = Command::new("find")
        .arg(".")
        .current_dir(&root)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot run `find`")?;
    let names = find.stdout.take().context("no stdout from `find`")?;
    let packed = crate::util::output_of(
        Command::new("cpio")
            .args(["-o", "-H", "newc", "--quiet"])
            .current_dir(&root)
            .stdin(names)
            .stdout(File::create(&initrd)?),
    );
    // Reap `find` before reporting either failure.
    let found = find.wait()?;
    packed?;
    if !found.success() {
        bail!("`find .` failed in {}", root.display());
    }
    Ok(initrd)
}

/// `/tmp` stays on the initramfs root (RAM, writable already): a tmpfs there would hide
/// files installed under it, such as a workspace cloned into /tmp.
fn init_script_prologue() -> String {
    format!(
        "#!{BUSYBOX} sh
{BUSYBOX} --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
ip link set lo up
ulimit -l unlimited
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/tmp RUST_BACKTRACE=1 MEMLOCK_TRACE_IN_VM=1
cd /tmp
echo {KERNEL_MARK} $(uname -r)
"
    )
}

/// Drops the DWARF of a copied binary (symbols stay, so backtraces still name functions):
/// a debug test binary is ~60 MB, mostly debug info, and the initramfs is unpacked into
/// guest RAM, where a dozen of them no longer fit. Best effort: a failure keeps the copy whole.
fn strip_debug(path: &Path) {
    let stripped = Command::new("strip")
        .arg("--strip-debug")
        .arg(path)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        eprintln!(
            "xtask: warning: could not strip {}; the guest may run out of memory",
            path.display()
        );
    }
}

/// Copies `host` to the absolute `guest` path under `root`, keeping its permissions.
fn install_file(host: &Path, root: &Path, guest: &str) -> Result<()> {
    let relative = guest
        .strip_prefix('/')
        .with_context(|| format!("guest path {guest:?} is not absolute"))?;
    let dest = root.join(relative);
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::copy(host, &dest)
        .with_context(|| format!("copying {} to guest {guest}", host.display()))?;
    Ok(())
}

/// The libraries `ldd` resolves for `binary`, the dynamic loader included.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .context("cannot run `ldd`")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // Static executables need nothing.
        if String::from_utf8_lossy(&out.stderr).contains("not a dynamic executable") {
            return Ok(Vec::new());
        }
        bail!(
            "`ldd {}` failed: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut libs = Vec::new();
    for line in stdout.lines() {
        if line.contains("not found") {
            bail!(
                "{}: shared library missing on the host: {}",
                binary.display(),
                line.trim()
            );
        }
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x…)"; the vDSO line has no path.
        let target = line.split_once("=>").map_or(line, |(_, target)| target);
        if let Some(path) = target
            .split_whitespace()
            .next()
            .filter(|p| p.starts_with('/'))
        {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// What the guest reported on its console.
#[derive(Default)]
struct Console {
    kernel_release: Option<String>,
    boot: Option<Duration>,
    /// Output of the test that has begun but not yet reported.
    running: Option<String>,
    results: Vec<VmTestResult>,
    done: bool,
}

impl Console {
    fn feed(&mut self, line: &str, elapsed: Duration) {
        // A test's last line may lack a newline, so markers can follow other text.
        if let Some(at) = line.find(RESULT_MARK) {
            let mut fields = line[at + RESULT_MARK.len()..].split_whitespace();
            let (Some(name), Some(code)) = (fields.next(), fields.next()) else {
                return;
            };
            let mut output = self.running.take().unwrap_or_default();
            output += &line[..at];
            self.results.push(VmTestResult {
                name: name.to_owned(),
                exit_code: code.parse().unwrap_or(-1),
                output,
            });
        } else if line.contains(BEGIN_MARK) {
            self.running = Some(String::new());
        } else if let Some(at) = line.find(KERNEL_MARK) {
            self.kernel_release = Some(line[at + KERNEL_MARK.len()..].trim().to_owned());
            self.boot = Some(elapsed);
        } else if line.contains(DONE_MARK) {
            self.done = true;
        } else if let Some(output) = &mut self.running {
            *output += line;
            output.push('\n');
        }
    }
}

/// Runs qemu to completion, logging the console to `console_log` while parsing it.
fn boot(vmlinuz: &Path, initrd: &Path, opts: &VmOptions, console_log: &Path) -> Result<Console> {
    // Appending, so qemu's own stderr can share the file without clobbering console lines.
    let mut log = File::options()
        .create(true)
        .append(true)
        .open(console_log)
        .with_context(|| format!("opening {}", console_log.display()))?;
    log.set_len(0)?;
    let start = Instant::now();
    let mut qemu = Command::new("qemu-system-x86_64")
        // No -enable-kvm: nested KVM dies with an internal error on this machine kind.
        .args(["-cpu", "max", "-smp", "2", "-nographic", "-no-reboot"])
        // The guest needs no network; this also skips loading the NIC's option ROM.
        .args(["-nic", "none"])
        .args(["-m", &opts.memory_mib.to_string()])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        // panic=-1 reboots at once on a panic, which -no-reboot turns into qemu exiting.
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log.try_clone()?)
        .spawn()
        .context("cannot run `qemu-system-x86_64` (is qemu-system-x86 installed?)")?;
    let stdout = qemu.stdout.take().context("no stdout from qemu")?;

    // A reader thread, so the main thread can enforce the timeout.
    let (lines, received) = mpsc::channel();
    let reader = thread::spawn(move || -> io::Result<()> {
        let mut stdout = BufReader::new(stdout);
        let mut buf = Vec::new();
        while stdout.read_until(b'\n', &mut buf)? > 0 {
            log.write_all(&buf)?;
            let line = String::from_utf8_lossy(&buf)
                .trim_end_matches(['\r', '\n'])
                .to_owned();
            if lines.send(line).is_err() {
                break;
            }
            buf.clear();
        }
        Ok(())
    });

    let deadline = start + opts.timeout;
    let mut console = Console::default();
    let timed_out = loop {
        match received.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => console.feed(&line, start.elapsed()),
            Err(RecvTimeoutError::Timeout) => break true,
            Err(RecvTimeoutError::Disconnected) => break false,
        }
    };
    // Only needed after a timeout, harmless once qemu has exited.
    qemu.kill().context("killing qemu")?;
    qemu.wait().context("waiting for qemu")?;
    reader
        .join()
        .map_err(|_| anyhow!("console reader thread panicked"))?
        .with_context(|| format!("logging the console to {}", console_log.display()))?;

    if !console.done {
        let why = if timed_out {
            format!("guest timed out after {:?}", opts.timeout)
        } else {
            format!("guest stopped (panic or early poweroff) before {DONE_MARK}")
        };
        bail!(
            "{why}; last console lines ({}):\n{}",
            console_log.display(),
            tail(console_log, 30)
        );
    }
    Ok(console)
}

fn tail(path: &Path, count: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(count)..].join("\n")
        }
        Err(e) => format!("(cannot read it: {e})"),
    }
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
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

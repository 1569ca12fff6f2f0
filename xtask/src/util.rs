//! Running commands with errors that name them, and installing Debian packages.

use std::{
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// Runs `cmd` with inherited stdio; fails on a non-zero exit, naming the command.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Builds the tracer and advise's preload library, release, for `target` (a triple) or this
/// machine.
pub fn build_release(target: Option<&str>) -> Result<()> {
    let mut cargo = Command::new("cargo");
    cargo.args([
        "build",
        "--release",
        "-p",
        "memlock-trace",
        "-p",
        "memlock-preload",
    ]);
    if let Some(target) = target {
        cargo.args(["--target", target]);
    }
    run(&mut cargo)
}

/// Runs `cmd` and returns its stdout; errors name the command line (and, when it cannot
/// start, the program to install).
pub fn output_of(cmd: &mut Command) -> Result<String> {
    let line = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|arg| arg.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let out = cmd.output().with_context(|| {
        format!(
            "cannot run `{line}` (is `{}` installed?)",
            cmd.get_program().display()
        )
    })?;
    if !out.status.success() {
        bail!(
            "`{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Installs those of `packages` (Debian's) that are missing with apt-get, running
/// `apt-get update` only then. Fast and offline when everything is present.
pub fn install_missing_packages(packages: &[&str]) -> Result<()> {
    // dpkg-query exits non-zero when a package is unknown, so only its output counts.
    let query = Command::new("dpkg-query")
        .args(["-W", "-f=${Package} ${db:Status-Abbrev}\n"])
        .args(packages)
        .output()
        .context("cannot run `dpkg-query`")?;
    let listing = String::from_utf8_lossy(&query.stdout);
    let installed: Vec<&str> = listing
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(_, status)| status.starts_with("ii"))
        .map(|(package, _)| package)
        .collect();
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !installed.contains(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    apt_output(Command::new("apt-get").arg("update"))?;
    apt_output(
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| format!("installing {}", missing.join(" ")))?;
    Ok(())
}

/// How long an apt command waits for another apt or dpkg (a fresh cloud machine runs
/// unattended upgrades at boot) before giving up.
const APT_LOCK_WAIT: Duration = Duration::from_secs(20 * 60);

/// Runs an apt-get or apt-cache command like `output_of`, waiting while another process holds
/// apt's or dpkg's lock instead of failing on "Could not get lock". dpkg's own lock is waited
/// for by apt itself (`DPkg::Lock::Timeout`); the package lists' and archives' locks, which
/// `apt-get update` and `download` take, only by retrying.
pub fn apt_output(cmd: &mut Command) -> Result<String> {
    let timeout = APT_LOCK_WAIT.as_secs().to_string();
    cmd.args(["-o", &format!("DPkg::Lock::Timeout={timeout}")]);
    let started = Instant::now();
    let mut said = false;
    loop {
        match output_of(cmd) {
            Err(e) if is_lock_error(&format!("{e:#}")) && started.elapsed() < APT_LOCK_WAIT => {
                if !said {
                    eprintln!(
                        "xtask: another apt or dpkg holds its lock (unattended upgrades?): \
                         waiting up to {} minutes",
                        APT_LOCK_WAIT.as_secs() / 60
                    );
                    said = true;
                }
                thread::sleep(Duration::from_secs(5));
            }
            result => return result,
        }
    }
}

fn is_lock_error(message: &str) -> bool {
    [
        "Could not get lock",
        "Unable to lock",
        "Unable to acquire the dpkg frontend lock",
    ]
    .iter()
    .any(|m| message.contains(m))
}

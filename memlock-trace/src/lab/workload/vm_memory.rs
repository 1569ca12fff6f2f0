//! vm-memory (reference 000, table 2): a qemu guest with `-overcommit mem-lock=on` and with
//! it off. With mem-lock=on qemu calls mlockall(MCL_CURRENT | MCL_FUTURE), so all guest RAM
//! becomes resident and locked at once; off, only what the guest touches.
//!
//! Boots the stock kernel `cargo xtask test` caches, with a busybox initramfs that sleeps
//! and powers off; software emulation (nested KVM fails on this machine).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde_json::{Value, json};

use super::args::ScenarioArgs;

const BUSYBOX: &str = "/bin/busybox";
/// How long the guest stays up after boot, so memory can be sampled.
const GUEST_SECONDS: u32 = 2;

pub fn run(variant: &str, args: &ScenarioArgs) -> Result<Value> {
    let mem_lock = match variant {
        "mem-lock-on" => "on",
        "mem-lock-off" => "off",
        other => bail!("unknown vm-memory variant {other}"),
    };
    let kernel = match &args.kernel {
        Some(k) => k.clone(),
        None => cached_kernel()?,
    };
    let dir = std::env::temp_dir().join(format!("memlock-trace-vm-memory-{}", std::process::id()));
    let initrd = build_initramfs(&dir)?;
    let start = Instant::now();
    let mut qemu = Command::new("qemu-system-x86_64")
        // A small TCG translation cache: the default (1 GiB) would be locked too under
        // mem-lock=on and swamp the guest RAM in the figures.
        .args(["-accel", "tcg,tb-size=64", "-cpu", "max", "-smp", "1", "-m", &args.guest_mib.to_string()])
        .args(["-overcommit", &format!("mem-lock={mem_lock}")])
        .args(["-nographic", "-no-reboot", "-nic", "none", "-kernel"])
        .arg(&kernel)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting qemu-system-x86_64 (installed by `cargo xtask test` / `apt-get install qemu-system-x86`)")?;
    let pid = qemu.id();
    let (mut rss_max, mut lck_max) = (0u64, 0u64);
    let status = loop {
        if let Some(status) = qemu.try_wait()? {
            break status;
        }
        if start.elapsed() > Duration::from_secs(180) {
            let _ = qemu.kill();
            bail!("the qemu guest did not power off within 180 s");
        }
        if let (Ok(rss), Ok(lck)) = (
            super::pid_status_kib(pid, "VmRSS"),
            super::pid_status_kib(pid, "VmLck"),
        ) {
            rss_max = rss_max.max(rss);
            lck_max = lck_max.max(lck);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = fs::remove_dir_all(&dir);
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = qemu.stderr.take() {
            use std::io::Read as _;
            let _ = e.read_to_string(&mut err);
        }
        bail!("qemu exited with {status}: {}", err.trim());
    }
    Ok(json!({
        "mem_lock": mem_lock,
        "guest_mib": args.guest_mib,
        "rss_max_kib": rss_max,
        "locked_max_kib": lck_max,
        "run_secs": start.elapsed().as_secs_f64(),
        "pids": [pid],
    }))
}

fn cached_kernel() -> Result<PathBuf> {
    let dir = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/root".into())
        .join(".cache/memlock-trace/vm/kernel");
    fs::read_dir(&dir)
        .ok()
        .and_then(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("vmlinuz-")))
        })
        .with_context(|| format!("no kernel image in {}: run `cargo xtask test --vm-only` once, or pass --kernel PATH", dir.display()))
}

fn build_initramfs(dir: &Path) -> Result<PathBuf> {
    let root = dir.join("root");
    for d in ["bin", "proc", "sys", "dev"] {
        let d = root.join(d);
        fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    fs::copy(BUSYBOX, root.join("bin/busybox"))
        .context("copying /bin/busybox (apt-get install busybox-static)")?;
    let init = root.join("init");
    fs::write(
        &init,
        format!(
            "#!/bin/busybox sh\n/bin/busybox sleep {GUEST_SECONDS}\n/bin/busybox poweroff -f\n"
        ),
    )
    .with_context(|| format!("cannot write {}", init.display()))?;
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", init.display()))?;
    let initrd = dir.join("initramfs.cpio");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "find . | cpio -o -H newc --quiet > {}",
            initrd.display()
        ))
        .current_dir(&root)
        .status()
        .context("running cpio (apt-get install cpio)")?;
    if !status.success() {
        bail!("building the initramfs with cpio failed");
    }
    Ok(initrd)
}

//! Host files into a guest's root tree (with the shared libraries they load), and the tree
//! into a newc cpio archive: what the initramfs and the third-party programs' archive share.

use std::{
    fs::{self, File},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::util::output_of;

/// Packs the tree under `root` as a newc cpio archive, written to `out` from its offset.
pub(super) fn pack(root: &Path, out: File) -> Result<()> {
    let mut find = Command::new("find")
        .arg(".")
        .current_dir(root)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot run `find`")?;
    let names = find.stdout.take().context("no stdout from `find`")?;
    let packed = output_of(
        Command::new("cpio")
            .args(["-o", "-H", "newc", "--quiet"])
            .current_dir(root)
            .stdin(names)
            .stdout(out),
    );
    // Reap `find` before reporting either failure.
    let found = find.wait()?;
    packed?;
    if !found.success() {
        bail!("`find .` failed in {}", root.display());
    }
    Ok(())
}

/// Copies `host` to the absolute `guest` path under `root`, keeping its permissions.
pub(super) fn install_file(host: &Path, root: &Path, guest: &str) -> Result<()> {
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
pub(super) fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
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

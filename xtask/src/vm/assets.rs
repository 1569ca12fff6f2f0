//! The host side of a guest: the tools (qemu, a static busybox, cpio) installed with
//! apt-get, and the stock cloud kernel image fetched once into the cache.

use std::{
    fs, io,
    path::{Path, PathBuf},
    process::{self, Command},
};

use anyhow::{Context, Result};

use super::ScratchDir;
use crate::util::{install_missing_packages, output_of};

/// Debian packages providing the host tools.
const HOST_PACKAGES: [&str; 3] = ["qemu-system-x86", "busybox-static", "cpio"];
/// Metapackage whose single dependency is the current cloud kernel image.
const KERNEL_METAPACKAGE: &str = "linux-image-cloud-amd64";

/// The host-side ingredients of a guest.
pub struct VmAssets {
    pub vmlinuz: PathBuf,
    pub kernel_release: String,
}

/// Installs the host tools (qemu-system-x86, busybox-static, cpio) with
/// apt-get if any is missing, running `apt-get update` only then, and
/// fetches the stock cloud kernel into `cache_dir/kernel` unless it is there
/// already. Fast and offline when everything is present.
pub fn ensure_assets(cache_dir: &Path) -> Result<VmAssets> {
    install_missing_packages(&HOST_PACKAGES)?;
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
        output_of(Command::new("apt-get").arg("update"))
            .with_context(|| format!("refreshing package lists after: {first_error:#}"))?;
        download_kernel_package(&scratch.0)
    })?;

    let extracted = scratch.0.join("extracted");
    output_of(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&extracted))?;
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
    let depends = output_of(Command::new("apt-cache").args(["depends", KERNEL_METAPACKAGE]))?;
    let package = depends
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .with_context(|| {
            format!("`apt-cache depends {KERNEL_METAPACKAGE}` names no linux-image-* package")
        })?;
    output_of(
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

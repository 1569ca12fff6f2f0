//! The host side of a guest: the tools (qemu, a static busybox, cpio) installed with
//! apt-get, and the stock cloud kernel image fetched once into the cache.

use std::{
    fs, io,
    path::{Path, PathBuf},
    process::{self, Command},
};

use anyhow::{Context, Result};

use super::ScratchDir;
use crate::util::{apt_output, install_missing_packages, output_of};

/// Debian packages providing the host tools.
const HOST_PACKAGES: [&str; 3] = ["qemu-system-x86", "busybox-static", "cpio"];
/// Metapackage whose single dependency is the current cloud kernel image.
const KERNEL_METAPACKAGE: &str = "linux-image-cloud-amd64";

/// A stock kernel the guests can boot, and where its image comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// What `--kernel` takes, e.g. `5.10`.
    pub version: &'static str,
    /// The cache's subdirectory holding its `vmlinuz-*`.
    dir: &'static str,
    source: Source,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// The image `linux-image-cloud-amd64` depends on, from the machine's own apt sources
    /// (bookworm: 6.1).
    Metapackage,
    /// A pinned image package from another Debian suite, fetched with a sources list and
    /// apt state of its own under the cache: the machine's apt configuration is untouched.
    Suite {
        suite: &'static str,
        package: &'static str,
    },
}

/// Every kernel the guests know, oldest first.
pub const KERNELS: [Kernel; 3] = [
    Kernel {
        version: "5.10",
        dir: "kernel-5.10",
        source: Source::Suite {
            suite: "bullseye",
            package: "linux-image-5.10.0-32-cloud-amd64-unsigned",
        },
    },
    Kernel {
        version: "6.1",
        // Where it always was: the vm-memory scenario boots it from there.
        dir: "kernel",
        source: Source::Metapackage,
    },
    Kernel {
        version: "6.12",
        dir: "kernel-6.12",
        source: Source::Suite {
            suite: "trixie",
            package: "linux-image-6.12.117+deb13-cloud-amd64-unsigned",
        },
    },
];

/// The guest kernel `cargo xtask test` boots when none is named.
pub const DEFAULT_KERNEL: Kernel = KERNELS[1];

/// The kernel `--kernel VERSION` names.
pub fn kernel(version: &str) -> Result<Kernel> {
    KERNELS
        .into_iter()
        .find(|k| k.version == version)
        .with_context(|| {
            let known: Vec<&str> = KERNELS.iter().map(|k| k.version).collect();
            format!(
                "unknown kernel {version}: known are host, {}",
                known.join(", ")
            )
        })
}

/// The host-side ingredients of a guest.
pub struct VmAssets {
    pub vmlinuz: PathBuf,
    pub kernel_release: String,
}

/// Installs the host tools (qemu-system-x86, busybox-static, cpio) with
/// apt-get if any is missing, running `apt-get update` only then, and
/// fetches the stock cloud kernel into `cache_dir/kernel` unless it is there
/// already. Fast and offline when everything is present.
pub fn ensure_assets(cache_dir: &Path, kernel: Kernel) -> Result<VmAssets> {
    install_missing_packages(&HOST_PACKAGES)?;
    let kernel_dir = cache_dir.join(kernel.dir);
    if let Some(assets) = cached_kernel(&kernel_dir)? {
        return Ok(assets);
    }
    fetch_kernel(cache_dir, &kernel_dir, kernel.source)
        .with_context(|| format!("kernel {}: fetching its image", kernel.version))?;
    cached_kernel(&kernel_dir)?.with_context(|| {
        format!(
            "kernel {}: no vmlinuz-* in {} after fetching the image",
            kernel.version,
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

fn fetch_kernel(cache_dir: &Path, kernel_dir: &Path, source: Source) -> Result<()> {
    let scratch = ScratchDir::new(cache_dir.join(format!("kernel-fetch-{}", process::id())))?;
    let deb = match source {
        // Package lists may be missing or name a version the mirror has since
        // dropped: refresh them once and retry.
        Source::Metapackage => download_kernel_package(&scratch.0).or_else(|first_error| {
            apt_output(Command::new("apt-get").arg("update"))
                .with_context(|| format!("refreshing package lists after: {first_error:#}"))?;
            download_kernel_package(&scratch.0)
        })?,
        Source::Suite { suite, package } => {
            let dir = cache_dir.join(format!("apt-{suite}"));
            download_from_suite(&dir, suite, package)?;
            let found = find_deb(&dir, package)?;
            let deb = scratch.0.join(found.file_name().expect("a file"));
            fs::rename(&found, &deb)?;
            deb
        }
    };

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

/// The Debian mirror the machine's apt sources use, else deb.debian.org.
fn debian_mirror() -> String {
    let mut sources = String::new();
    for path in [
        "/etc/apt/sources.list",
        "/etc/apt/sources.list.d/debian.sources",
    ] {
        sources.push_str(&fs::read_to_string(path).unwrap_or_default());
        sources.push('\n');
    }
    sources
        .split_whitespace()
        .find(|w| w.starts_with("http") && w.trim_end_matches('/').ends_with("/debian"))
        .unwrap_or("http://deb.debian.org/debian")
        .trim_end_matches('/')
        .to_string()
}

/// `apt-get download PACKAGE` from Debian `suite` into `dir`, with a sources list, package
/// lists and cache of its own in `dir` (ENVIRONMENT.md section 5): never the machine's.
fn download_from_suite(dir: &Path, suite: &str, package: &str) -> Result<()> {
    for sub in ["lists/partial", "cache/archives/partial"] {
        fs::create_dir_all(dir.join(sub))
            .with_context(|| format!("creating {}", dir.join(sub).display()))?;
    }
    let list = dir.join("sources.list");
    fs::write(
        &list,
        format!("deb [trusted=yes] {} {suite} main\n", debian_mirror()),
    )?;
    let apt = |verb: &[&str]| {
        let mut cmd = Command::new("apt-get");
        cmd.arg("-o")
            .arg(format!("Dir::Etc::SourceList={}", list.display()))
            .args(["-o", "Dir::Etc::SourceParts=/dev/null"])
            .arg("-o")
            .arg(format!("Dir::State::Lists={}", dir.join("lists").display()))
            .arg("-o")
            .arg(format!("Dir::Cache={}", dir.join("cache").display()))
            .args(verb)
            .current_dir(dir);
        cmd
    };
    if find_deb(dir, package).is_ok() {
        return Ok(());
    }
    apt_output(&mut apt(&["update"]))
        .with_context(|| format!("apt-get update for Debian {suite}"))?;
    apt_output(&mut apt(&["download", package]))
        .with_context(|| format!("apt-get download {package} from Debian {suite}"))?;
    Ok(())
}

/// The downloaded `PACKAGE_*.deb` in `dir`.
fn find_deb(dir: &Path, package: &str) -> Result<PathBuf> {
    fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| {
            path.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with(&format!("{package}_")) && n.ends_with(".deb")
            })
        })
        .with_context(|| format!("no {package}_*.deb in {}", dir.display()))
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
    apt_output(
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

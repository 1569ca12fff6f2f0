//! The host side of a guest: the tools (qemu, a static busybox, cpio, xz) installed with
//! apt-get, and the stock cloud kernel image with the modules its guest loads fetched once
//! into the cache (for an arm64 guest, with Debian's arm64 static busybox beside it).

use std::{
    fs, io,
    path::{Path, PathBuf},
    process::{self, Command},
};

use anyhow::{Context, Result};

use super::{ScratchDir, arch::GuestArch, modules};
use crate::util::{apt_output, install_missing_packages, output_of};

/// Debian packages providing the host tools, besides the guest's qemu.
const HOST_PACKAGES: [&str; 3] = ["busybox-static", "cpio", "xz-utils"];
/// Metapackage whose single dependency is the current cloud kernel image.
const KERNEL_METAPACKAGE: &str = "linux-image-cloud-amd64";
/// The package of a foreign guest's static busybox.
const BUSYBOX_PACKAGE: &str = "busybox-static";

/// A stock kernel the guests can boot, and where its image comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// What `--kernel` takes, e.g. `5.10`.
    pub version: &'static str,
    pub arch: GuestArch,
    /// The cache's subdirectory holding its `vmlinuz-*`.
    dir: &'static str,
    source: Source,
    /// The modules the guest's `/init` loads, in load order (each after those it depends
    /// on): paths under `lib/modules/RELEASE/kernel/` in the image's package.
    pub modules: &'static [&'static str],
}

/// zram, for swap in the guest (the memory-pressure scenario sets it up itself), where its
/// default compressor is lzo-rle: without that module, writing `disksize` fails (EINVAL).
const ZRAM_LZO_RLE: &[&str] = &[
    "mm/zsmalloc.ko",
    "drivers/block/zram/zram.ko",
    "crypto/lzo-rle.ko",
];

/// zram from 6.12, which defaults to lz4 and depends on both lz4 modules itself.
const ZRAM_LZ4: &[&str] = &[
    "mm/zsmalloc.ko",
    "lib/lz4/lz4_compress.ko",
    "lib/lz4/lz4hc_compress.ko",
    "drivers/block/zram/zram.ko",
];

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
    /// The image a cloud metapackage of a foreign architecture depends on, resolved in
    /// Debian `suites` (the newest wins: a security update's) with apt state of its own.
    Foreign {
        suites: &'static [&'static str],
        metapackage: &'static str,
    },
}

/// Every kernel the guests know: x86_64's oldest first, then arm64's.
pub const KERNELS: [Kernel; 4] = [
    Kernel {
        version: "5.10",
        arch: GuestArch::X86_64,
        dir: "kernel-5.10",
        source: Source::Suite {
            suite: "bullseye",
            package: "linux-image-5.10.0-32-cloud-amd64-unsigned",
        },
        modules: ZRAM_LZO_RLE,
    },
    Kernel {
        version: "6.1",
        arch: GuestArch::X86_64,
        // Where it always was: the vm-memory scenario boots it from there.
        dir: "kernel",
        source: Source::Metapackage,
        modules: ZRAM_LZO_RLE,
    },
    Kernel {
        version: "6.12",
        arch: GuestArch::X86_64,
        dir: "kernel-6.12",
        source: Source::Suite {
            suite: "trixie",
            package: "linux-image-6.12.117+deb13-cloud-amd64-unsigned",
        },
        modules: ZRAM_LZ4,
    },
    // Debian 12's arm64 cloud kernel, the newest of bookworm and its security updates: no
    // trampolines on arm64 before 6.4 (kprobes, the raw syscall dispatchers).
    Kernel {
        version: "6.1-arm64",
        arch: GuestArch::Aarch64,
        dir: "kernel-6.1-arm64",
        source: Source::Foreign {
            suites: &["bookworm", "bookworm-security"],
            metapackage: "linux-image-cloud-arm64",
        },
        modules: ZRAM_LZO_RLE,
    },
];

/// Kernels a guest boots only when `--kernel` names them: a sixth stage beside the others
/// made two timing-bound tests fail under the load on 2 cores (test:memory_limit's 60 s exit
/// on 5.10, test:hugepages on the host), so it stays out of the default run.
pub const OPTIONAL_KERNELS: [Kernel; 1] = [
    // Debian 13's, where arm64 has trampolines: fentry/fexit on `__arm64_sys_*`,
    // `handle_mm_fault` and the VMA functions.
    Kernel {
        version: "6.12-arm64",
        arch: GuestArch::Aarch64,
        dir: "kernel-6.12-arm64",
        source: Source::Foreign {
            suites: &["trixie", "trixie-security"],
            metapackage: "linux-image-cloud-arm64",
        },
        // As 6.12 on x86_64: Debian configures zram alike on both architectures.
        modules: ZRAM_LZ4,
    },
];

/// The guest kernel `cargo xtask test` boots when none is named.
pub const DEFAULT_KERNEL: Kernel = KERNELS[1];

/// The kernel `--kernel VERSION` names.
pub fn kernel(version: &str) -> Result<Kernel> {
    KERNELS
        .into_iter()
        .chain(OPTIONAL_KERNELS)
        .find(|k| k.version == version)
        .with_context(|| {
            let known: Vec<&str> = KERNELS
                .iter()
                .chain(&OPTIONAL_KERNELS)
                .map(|k| k.version)
                .collect();
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
    /// A static busybox of the guest's architecture.
    pub busybox: PathBuf,
    /// [`Kernel::modules`] of this release, uncompressed, in load order.
    pub modules: Vec<PathBuf>,
}

/// Installs the host tools (the guest's qemu, busybox-static, cpio) with
/// apt-get if any is missing, running `apt-get update` only then, and
/// fetches the stock cloud kernel and its modules into `cache_dir/kernel` unless they are
/// there already. Fast and offline when everything is present.
pub fn ensure_assets(cache_dir: &Path, kernel: Kernel) -> Result<VmAssets> {
    install_missing_packages(&HOST_PACKAGES)?;
    install_missing_packages(&[kernel.arch.qemu_package()])?;
    let kernel_dir = cache_dir.join(kernel.dir);
    let busybox = kernel
        .arch
        .host_busybox()
        .map_or_else(|| kernel_dir.join("busybox"), PathBuf::from);
    if let Some(assets) = cached_kernel(&kernel_dir, &busybox, kernel)? {
        return Ok(assets);
    }
    // A cache from before the modules (a vmlinuz alone) is fetched again, whole.
    fetch_kernel(cache_dir, &kernel_dir, kernel)
        .with_context(|| format!("kernel {}: fetching its image", kernel.version))?;
    cached_kernel(&kernel_dir, &busybox, kernel)?.with_context(|| {
        format!(
            "kernel {}: no vmlinuz-*, its modules or busybox in {} after fetching them",
            kernel.version,
            kernel_dir.display()
        )
    })
}

/// The cached `vmlinuz-RELEASE` that has its modules in `RELEASE/`.
fn cached_kernel(kernel_dir: &Path, busybox: &Path, kernel: Kernel) -> Result<Option<VmAssets>> {
    if !busybox.is_file() {
        return Ok(None);
    }
    for release in cached_releases(kernel_dir)? {
        if let Some(modules) = modules::cached(kernel_dir, &release, kernel.modules) {
            return Ok(Some(VmAssets {
                vmlinuz: kernel_dir.join(format!("vmlinuz-{release}")),
                kernel_release: release,
                busybox: busybox.to_path_buf(),
                modules,
            }));
        }
    }
    Ok(None)
}

/// The releases of the `vmlinuz-*` in `kernel_dir`.
fn cached_releases(kernel_dir: &Path) -> Result<Vec<String>> {
    let entries = match fs::read_dir(kernel_dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        entries => entries.with_context(|| format!("reading {}", kernel_dir.display()))?,
    };
    let mut releases = Vec::new();
    for entry in entries {
        let name = entry?.file_name();
        if let Some(release) = name.to_str().and_then(|n| n.strip_prefix("vmlinuz-")) {
            releases.push(release.to_owned());
        }
    }
    Ok(releases)
}

fn fetch_kernel(cache_dir: &Path, kernel_dir: &Path, kernel: Kernel) -> Result<()> {
    let scratch = ScratchDir::new(cache_dir.join(format!("kernel-fetch-{}", process::id())))?;
    fs::create_dir_all(kernel_dir).with_context(|| format!("creating {}", kernel_dir.display()))?;
    let deb = match kernel.source {
        // Package lists may be missing or name a version the mirror has since
        // dropped: refresh them once and retry.
        Source::Metapackage => download_kernel_package(&scratch.0).or_else(|first_error| {
            apt_output(Command::new("apt-get").arg("update"))
                .with_context(|| format!("refreshing package lists after: {first_error:#}"))?;
            download_kernel_package(&scratch.0)
        })?,
        Source::Suite { suite, package } => {
            let apt = SuiteApt::new(
                cache_dir.join(format!("apt-{suite}")),
                &[suite],
                kernel.arch.debian(),
            )?;
            apt.download(package)?;
            apt.take_deb(package, &scratch.0)?
        }
        Source::Foreign {
            suites,
            metapackage,
        } => {
            let arch = kernel.arch.debian();
            let apt = SuiteApt::new(cache_dir.join(format!("apt-{}", kernel.dir)), suites, arch)?;
            let package = apt.dependency(metapackage, "linux-image-")?;
            apt.download(&package)?;
            apt.download(BUSYBOX_PACKAGE)?;
            let busybox_deb = apt.take_deb(BUSYBOX_PACKAGE, &scratch.0)?;
            let unpacked = scratch.0.join("busybox");
            output_of(
                Command::new("dpkg-deb")
                    .arg("-x")
                    .arg(&busybox_deb)
                    .arg(&unpacked),
            )?;
            // Debian 13 moved it to /usr/bin (merged /usr).
            let busybox = ["bin/busybox", "usr/bin/busybox"]
                .map(|path| unpacked.join(path))
                .into_iter()
                .find(|path| path.is_file())
                .with_context(|| format!("{} has no busybox", busybox_deb.display()))?;
            fs::rename(busybox, kernel_dir.join("busybox"))?;
            apt.take_deb(&package, &scratch.0)?
        }
    };

    let extracted = scratch.0.join("extracted");
    output_of(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&extracted))?;
    // Only the kernel image and the guest's few modules are kept: everything else needed is
    // built in (see the parent module's docs).
    let boot = extracted.join("boot");
    let vmlinuz = fs::read_dir(&boot)
        .with_context(|| format!("reading {}", boot.display()))?
        .filter_map(|entry| entry.ok().and_then(|e| e.file_name().into_string().ok()))
        .find(|name| name.starts_with("vmlinuz-"))
        .with_context(|| format!("{} contains no boot/vmlinuz-*", deb.display()))?;
    let release = &vmlinuz["vmlinuz-".len()..];
    // The modules before the image: the cache counts a kernel only once both are there.
    modules::extract(&extracted, release, kernel.modules, kernel_dir)
        .with_context(|| format!("{}: the guest's modules", deb.display()))?;
    // A rename, so an interrupted fetch never leaves a partial vmlinuz in the cache.
    fs::rename(boot.join(&vmlinuz), kernel_dir.join(&vmlinuz))
        .with_context(|| format!("moving {vmlinuz} into {}", kernel_dir.display()))?;
    // An older release the metapackage named before goes, so one vmlinuz-* is left (the
    // vm-memory scenario boots the first it finds).
    for old in cached_releases(kernel_dir)? {
        if old != release {
            fs::remove_file(kernel_dir.join(format!("vmlinuz-{old}")))?;
            modules::remove_dir(&kernel_dir.join(&old))?;
        }
    }
    Ok(())
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

/// apt-get on Debian `suites` of one architecture, with a sources list, package lists and
/// cache of its own in `dir` (ENVIRONMENT.md section 5): never the machine's configuration.
struct SuiteApt {
    dir: PathBuf,
    arch: &'static str,
    updated: std::cell::Cell<bool>,
}

impl SuiteApt {
    fn new(dir: PathBuf, suites: &[&str], arch: &'static str) -> Result<Self> {
        for sub in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let mirror = debian_mirror();
        let list: String = suites
            .iter()
            .map(|suite| {
                // Security updates live beside the archive, in debian-security.
                let archive = match suite.ends_with("-security") {
                    true => format!("{mirror}-security"),
                    false => mirror.clone(),
                };
                format!("deb [trusted=yes arch={arch}] {archive} {suite} main\n")
            })
            .collect();
        fs::write(dir.join("sources.list"), list)?;
        Ok(Self {
            dir,
            arch,
            updated: std::cell::Cell::new(false),
        })
    }

    fn command(&self, program: &str, verb: &[&str]) -> Command {
        let mut cmd = Command::new(program);
        cmd.arg("-o")
            .arg(format!(
                "Dir::Etc::SourceList={}",
                self.dir.join("sources.list").display()
            ))
            .args(["-o", "Dir::Etc::SourceParts=/dev/null"])
            .arg("-o")
            .arg(format!(
                "Dir::State::Lists={}",
                self.dir.join("lists").display()
            ))
            .arg("-o")
            .arg(format!("Dir::Cache={}", self.dir.join("cache").display()))
            .arg("-o")
            .arg(format!("APT::Architecture={}", self.arch))
            .arg("-o")
            .arg(format!("APT::Architectures={}", self.arch))
            .args(verb)
            .current_dir(&self.dir);
        cmd
    }

    fn update(&self) -> Result<()> {
        if !self.updated.get() {
            apt_output(&mut self.command("apt-get", &["update"]))
                .with_context(|| format!("apt-get update in {}", self.dir.display()))?;
            self.updated.set(true);
        }
        Ok(())
    }

    /// `apt-get download PACKAGE` into the directory, unless a .deb of it is there.
    fn download(&self, package: &str) -> Result<()> {
        if self.find_deb(package).is_ok() {
            return Ok(());
        }
        self.update()?;
        apt_output(&mut self.command("apt-get", &["download", package]))
            .with_context(|| format!("apt-get download {package} ({})", self.arch))?;
        Ok(())
    }

    /// The dependency of `metapackage` whose name starts with `prefix`.
    fn dependency(&self, metapackage: &str, prefix: &str) -> Result<String> {
        self.update()?;
        let depends = output_of(&mut self.command("apt-cache", &["depends", metapackage]))?;
        depends
            .lines()
            .filter_map(|line| line.trim().strip_prefix("Depends: "))
            .find(|p| p.starts_with(prefix))
            .map(|p| p.split(':').next().unwrap_or(p).to_owned())
            .with_context(|| {
                format!("`apt-cache depends {metapackage}` names no {prefix}* package")
            })
    }

    /// Moves the downloaded `PACKAGE_*.deb` into `into`.
    fn take_deb(&self, package: &str, into: &Path) -> Result<PathBuf> {
        let found = self.find_deb(package)?;
        let deb = into.join(found.file_name().expect("a file"));
        fs::rename(&found, &deb)?;
        Ok(deb)
    }

    fn find_deb(&self, package: &str) -> Result<PathBuf> {
        fs::read_dir(&self.dir)?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .find(|path| {
                path.file_name().is_some_and(|n| {
                    let n = n.to_string_lossy();
                    n.starts_with(&format!("{package}_")) && n.ends_with(".deb")
                })
            })
            .with_context(|| format!("no {package}_*.deb in {}", self.dir.display()))
    }
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

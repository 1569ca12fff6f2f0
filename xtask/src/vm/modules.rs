//! The kernel modules a guest loads at boot, kept beside the cached `vmlinuz-RELEASE` in a
//! folder named `RELEASE`: a module loads only into the kernel it was built for (vermagic),
//! so both come from the same package and are found together or fetched again together.

use std::{
    fs, io,
    path::{Path, PathBuf},
    process::{self, Command},
};

use anyhow::{Context, Result, bail};

use crate::util::output_of;

/// The cached modules of `release` under `kernel_dir`, in load order, or `None` if any is
/// missing.
pub(super) fn cached(kernel_dir: &Path, release: &str, modules: &[&str]) -> Option<Vec<PathBuf>> {
    let dir = kernel_dir.join(release);
    modules
        .iter()
        .map(|module| {
            let path = dir.join(file_name(module)?);
            path.is_file().then_some(path)
        })
        .collect()
}

/// Copies `modules` (paths under `lib/modules/RELEASE/kernel/`, as `.ko`) out of the
/// unpacked kernel package `extracted` into `kernel_dir/RELEASE`, decompressed.
pub(super) fn extract(
    extracted: &Path,
    release: &str,
    modules: &[&str],
    kernel_dir: &Path,
) -> Result<()> {
    // Debian 13 moved them to /usr/lib (merged /usr).
    let tree = ["lib/modules", "usr/lib/modules"]
        .map(|dir| extracted.join(dir).join(release).join("kernel"))
        .into_iter()
        .find(|dir| dir.is_dir())
        .with_context(|| format!("the kernel package has no lib/modules/{release}/kernel"))?;
    // Filled beside the cache and renamed into place, so an interrupted fetch never
    // leaves a partial set the cache check would take for whole.
    let staging = kernel_dir.join(format!(".{release}-{}", process::id()));
    remove_dir(&staging)?;
    fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    for module in modules {
        let name = file_name(module).with_context(|| format!("module path {module:?}"))?;
        let dest = staging.join(name);
        let plain = tree.join(module);
        // Debian 13 ships them xz-compressed; decompressed here, busybox's insmod needs
        // no xz support and the guest no decompression at boot.
        let xz = tree.join(format!("{module}.xz"));
        if plain.is_file() {
            fs::copy(&plain, &dest).with_context(|| format!("copying {}", plain.display()))?;
        } else if xz.is_file() {
            let out = fs::File::create(&dest)?;
            output_of(
                Command::new("xz")
                    .args(["--decompress", "--stdout"])
                    .arg(&xz)
                    .stdout(out),
            )
            .with_context(|| format!("decompressing {}", xz.display()))?;
        } else {
            bail!("the kernel package has no {} (nor .xz)", plain.display());
        }
    }
    let dir = kernel_dir.join(release);
    remove_dir(&dir)?;
    fs::rename(&staging, &dir)
        .with_context(|| format!("moving {} to {}", staging.display(), dir.display()))
}

/// `zram.ko` of `drivers/block/zram/zram.ko`.
pub(super) fn file_name(module: &str) -> Option<&str> {
    Path::new(module).file_name()?.to_str()
}

pub(super) fn remove_dir(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}

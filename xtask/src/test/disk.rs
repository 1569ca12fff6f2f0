//! Room on disk for the run, checked before anything is built: a full disk otherwise shows
//! only as `could not compile <some crate> due to 1 previous error`, the cause scrolled
//! away among the compiler's progress lines.

use std::path::Path;

use anyhow::{Context as _, Result, bail};

/// What a run from a fresh clone leaves under `target/`, every stage (the lints, the host's
/// and the arm64 guests' test builds, the eBPF objects): 5.75 GiB measured on 2026-12-07
/// (4.1 GiB host, 1.5 GiB arm64), with a margin for dependency updates.
const FRESH_RUN_BYTES: u64 = 7 << 30;

const GIB: f64 = (1u64 << 30) as f64;

/// Fails, naming the space and the fixes, when the file system of `target` has less free
/// than a fresh run needs beyond what `target` already holds.
pub fn ensure_room(target: &Path) -> Result<()> {
    let held = size_of_tree(target);
    let needed = FRESH_RUN_BYTES.saturating_sub(held);
    // `target` may not exist yet on a fresh clone: its parent is on the same file system.
    let probe = if target.exists() {
        target
    } else {
        target.parent().unwrap_or(target)
    };
    let free = free_bytes(probe)?;
    if free < needed {
        bail!(
            "only {:.1} GiB free on the file system of {}; the tests need about {:.1} GiB more \
             there ({:.1} GiB for a run from a fresh clone, {:.1} GiB already built). Free some \
             space there and run it again.",
            free as f64 / GIB,
            target.display(),
            needed as f64 / GIB,
            FRESH_RUN_BYTES as f64 / GIB,
            held as f64 / GIB,
        );
    }
    Ok(())
}

/// Bytes available to an unprivileged user on the file system holding `path`.
fn free_bytes(path: &Path) -> Result<u64> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .with_context(|| format!("{} holds a NUL byte", path.display()))?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is NUL-terminated and `stat` is written by the call before it is read.
    if unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statvfs {}", path.display()));
    }
    // SAFETY: statvfs succeeded.
    let stat = unsafe { stat.assume_init() };
    Ok(stat.f_bavail * stat.f_frsize)
}

/// Bytes of the regular files under `dir` (0 when it does not exist); links are not followed.
fn size_of_tree(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(t) if t.is_dir() => size_of_tree(&entry.path()),
            Ok(t) if t.is_file() => entry.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

//! A memory cgroup made for one experiment: limited below its working set, removed when the
//! experiment ends. v1's `memory` hierarchy where it is mounted (this host), else the unified
//! hierarchy's (the guests), each with its own file names.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result, anyhow};

use crate::process::memory_cgroup::{Version, controller};

/// Every experiment's cgroup is named `PREFIX-PID`, so a later one can remove what a killed
/// one left (its PID no longer alive).
const PREFIX: &str = "memlock-trace-pressure";

/// The cgroup, removed on drop once its processes have gone.
pub struct PressureCgroup {
    pub version: Version,
    pub dir: PathBuf,
    pub limit_bytes: u64,
}

impl PressureCgroup {
    /// Makes `/memlock-trace-pressure-PID` with a memory limit of `limit_bytes`.
    pub fn make(limit_bytes: u64) -> Result<Self> {
        let (version, point) = controller().ok_or_else(|| {
            anyhow!(
                "no memory cgroup controller: neither cgroup v1's `memory` hierarchy nor a \
                 cgroup2 mount offering `memory` is mounted (mount one, e.g. `mount -t cgroup2 \
                 none /sys/fs/cgroup`)"
            )
        })?;
        remove_leftovers(&point);
        if version == Version::V2 {
            // The root hands the controller to its children only when asked.
            write(&point.join("cgroup.subtree_control"), "+memory")?;
        }
        let dir = point.join(format!("{PREFIX}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        let cgroup = Self {
            version,
            dir,
            limit_bytes,
        };
        match version {
            Version::V1 => {
                write(
                    &cgroup.dir.join("memory.limit_in_bytes"),
                    &limit_bytes.to_string(),
                )?;
                // Anonymous memory is all there is to reclaim here: let reclaim swap it as
                // readily as it drops page cache (v2 has no per-cgroup swappiness).
                write(&cgroup.dir.join("memory.swappiness"), "100")?;
            }
            Version::V2 => write(&cgroup.dir.join("memory.max"), &limit_bytes.to_string())?,
        }
        Ok(cgroup)
    }

    /// The file a process writes `0` to, to move itself in.
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// `memory.stat`, by name (v1's own counters, not the `total_` ones of its subtree,
    /// which has no children).
    pub fn stat(&self) -> Result<BTreeMap<String, u64>> {
        read_stat(&self.dir)
    }
}

impl Drop for PressureCgroup {
    fn drop(&mut self) {
        // The experiment's process has been reaped; its memory is uncharged a moment later.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                // And what a killed experiment's process left, if it has gone since.
                if let Some(point) = self.dir.parent() {
                    remove_leftovers(point);
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "memlock-trace: could not remove the memory cgroup {} (remove it with rmdir once \
             its processes have gone)",
            self.dir.display()
        );
    }
}

/// How far a `memory.stat` figure may trail the pages it counts, in kB: the kernel adds
/// per-CPU deltas to it in batches (`MEMCG_CHARGE_BATCH`, 64 pages per online CPU,
/// mm/memcontrol.c), so a reading misses up to that many pages that already moved (seen in
/// the guests: `unevictable` 8,080 kB with 8,192 kB locked, as smaps said).
pub fn stat_lag_kb() -> u64 {
    const CHARGE_BATCH: u64 = 64;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    CHARGE_BATCH * (crate::procfs::PAGE_SIZE / 1024) * cpus
}

/// `memory.stat` of the cgroup at `dir`.
pub fn read_stat(dir: &Path) -> Result<BTreeMap<String, u64>> {
    let path = dir.join("memory.stat");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(' ')?;
            Some((name.to_string(), value.trim().parse().ok()?))
        })
        .collect())
}

/// Removes the cgroups of experiments whose process is gone (killed before they could).
fn remove_leftovers(point: &Path) {
    let Ok(dir) = std::fs::read_dir(point) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| {
            n.strip_prefix(PREFIX)?
                .strip_prefix('-')?
                .parse::<u32>()
                .ok()
        }) else {
            continue;
        };
        if !crate::procfs::is_alive(pid) {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

fn write(file: &Path, value: &str) -> Result<()> {
    std::fs::write(file, value).with_context(|| format!("writing {value} to {}", file.display()))
}

//! Bundled workloads: processes that make known calls, measure themselves, and report what
//! they did, so the tracer's view can be checked against the workload's own.

pub mod args;
pub mod children;
pub mod dynamic_alloc;
pub mod faults;
pub mod first_touch;
pub mod flood;
pub mod fork_inherit;
pub mod huge_pages;
pub mod malloc_vs_mmap;
pub mod memlock_limit;
pub mod memory_pressure;
pub mod scenario;
pub mod syscalls;
pub mod thp_split;
pub mod thread_create;
pub mod thread_stack;
pub mod vm_memory;
pub mod vma_split;

mod region;

use anyhow::{Result, anyhow, bail};
use nix::sys::{
    mman::{MlockAllFlags, mlockall},
    resource::{UsageWho, getrusage},
};
use serde::Serialize;

pub use region::{Region, SmapsFigures};

/// [`crate::procfs::PAGE_SIZE`] as a length.
pub const PAGE_SIZE: usize = crate::procfs::PAGE_SIZE as usize;

/// `getrusage` fault counters: the kernel's own account.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Faults {
    pub minflt: u64,
    pub majflt: u64,
}

impl Faults {
    /// `getrusage(RUSAGE_THREAD)`: the calling thread.
    pub fn thread() -> Self {
        Self::of(UsageWho::RUSAGE_THREAD)
    }

    /// `getrusage(RUSAGE_SELF)`: every thread of the process.
    pub fn process() -> Self {
        Self::of(UsageWho::RUSAGE_SELF)
    }

    /// Zero if the call fails, which it cannot for these two.
    fn of(who: UsageWho) -> Self {
        getrusage(who).map_or_else(
            |_| Self::default(),
            |usage| Self {
                minflt: usage.minor_page_faults() as u64,
                majflt: usage.major_page_faults() as u64,
            },
        )
    }

    pub fn since(self, before: Faults) -> Faults {
        Faults {
            minflt: self.minflt - before.minflt,
            majflt: self.majflt - before.majflt,
        }
    }
}

/// The median of some measurements (0 when there are none).
pub fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A `kB` field of /proc/PID/status, e.g. `VmRSS` or `VmLck`.
pub fn pid_status_kib(pid: u32, field: &str) -> anyhow::Result<u64> {
    status_kib(&format!("/proc/{pid}/status"), field)
}

pub fn proc_status_kib(field: &str) -> anyhow::Result<u64> {
    status_kib("/proc/self/status", field)
}

fn status_kib(path: &str, field: &str) -> anyhow::Result<u64> {
    let status =
        std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {path}: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no {field} in {path}"))
}

/// `Ok` for a system call that returned 0; otherwise `what` and the errno in words.
pub fn syscall_ok(what: &str, ret: impl Into<i64>) -> Result<()> {
    if ret.into() != 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// A `nix` call's result, its error worded as [`syscall_ok`] words it.
pub fn nix_ok<T>(what: &str, result: nix::Result<T>) -> Result<T> {
    result.map_err(|errno| anyhow!("{what}: {}", std::io::Error::from(errno)))
}

/// The `off` / `future` variants shared by several scenarios: `future` runs under
/// `mlockall(MCL_CURRENT | MCL_FUTURE)` (until the variant's process exits).
pub fn lock_all_for(variant: &str, scenario: &str) -> Result<()> {
    match variant {
        "off" => Ok(()),
        "future" => nix_ok(
            "mlockall",
            mlockall(MlockAllFlags::MCL_CURRENT | MlockAllFlags::MCL_FUTURE),
        ),
        other => bail!("unknown {scenario} variant {other}"),
    }
}

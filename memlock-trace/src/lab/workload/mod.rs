//! Bundled workloads: processes that make known calls, measure themselves, and report what
//! they did, so the tracer's view can be checked against the workload's own.

pub mod children;
pub mod dynamic_alloc;
pub mod faults;
pub mod first_touch;
pub mod flood;
pub mod fork_inherit;
pub mod malloc_vs_mmap;
pub mod memlock_limit;
pub mod scenario;
pub mod syscalls;
pub mod thread_create;
pub mod thread_stack;
pub mod vm_memory;
pub mod vma_split;

mod region;

use serde::Serialize;

pub use region::Region;

pub const PAGE_SIZE: usize = 4096;

/// `getrusage(RUSAGE_THREAD)` fault counters: the kernel's own account for this thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Faults {
    pub minflt: u64,
    pub majflt: u64,
}

impl Faults {
    pub fn thread() -> Self {
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer; RUSAGE_THREAD cannot fail for the calling thread.
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
        Self {
            minflt: usage.ru_minflt as u64,
            majflt: usage.ru_majflt as u64,
        }
    }

    /// `getrusage(RUSAGE_SELF)`: every thread of the process.
    pub fn process() -> Self {
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
        Self {
            minflt: usage.ru_minflt as u64,
            majflt: usage.ru_majflt as u64,
        }
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
    let status = std::fs::read_to_string(path)?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no {field} in {path}"))
}

/// The `off` / `future` variants shared by several scenarios: `future` runs under
/// `mlockall(MCL_CURRENT | MCL_FUTURE)` (until the variant's process exits).
pub fn lock_all_for(variant: &str, scenario: &str) -> anyhow::Result<()> {
    use crate::event::{MCL_CURRENT, MCL_FUTURE};
    match variant {
        "off" => Ok(()),
        // SAFETY: plain syscall.
        "future" => match unsafe { libc::mlockall((MCL_CURRENT | MCL_FUTURE) as i32) } {
            0 => Ok(()),
            _ => anyhow::bail!("mlockall: {}", std::io::Error::last_os_error()),
        },
        other => anyhow::bail!("unknown {scenario} variant {other}"),
    }
}

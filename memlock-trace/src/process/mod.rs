//! Which processes are traced: the target set and its filters ([`filters`]), commands
//! launched under the tracer ([`launch`]), the memory cgroup that limits a process
//! ([`memory_cgroup`]), the bounded per-process table that keeps a
//! long session's footprint fixed ([`table`]), and how the kernel's per-process running
//! totals are differenced between two readings ([`counts`]).

pub mod cgroup;
pub mod counts;
pub mod filters;
pub mod identity;
pub mod launch;
pub mod memory_cgroup;
pub mod pids;
pub mod table;

pub use filters::{Cgroup, Filters, ProcessHealth, ProcessHooks};
pub use table::{DEFAULT_MAX_PROCESSES, ProcessTable};

/// Which processes to trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Targets {
    /// Every process on the system.
    All,
    /// Only these thread groups (and ones the tracer adds later: a launched command,
    /// followed children).
    Tgids(Vec<u32>),
}

impl Targets {
    /// Specific processes, rather than the whole system.
    pub fn specific(&self) -> bool {
        matches!(self, Targets::Tgids(_))
    }
}

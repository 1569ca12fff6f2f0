//! What an advice is about, in the words text and JSON output give it.

use std::fmt;

use serde::Serialize;

/// What an advice is about. Its words (text and JSON alike) are [`Kind::as_str`]'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Lock a mapping that faults after start-up.
    Lock,
    /// Lock a mapping whose pages went to swap.
    SwapIns,
    /// Populate a mapping the limit refuses to lock.
    Populate,
    /// Memory handed back to the kernel and faulted in again: the allocator's setting.
    Allocator,
    MajorFaults,
    ThreadStacks,
    OverLimit,
    OverMemory,
    OverCgroup,
    /// Memory that faulted only during start-up (each page when first touched).
    FaultedOnce,
}

impl Kind {
    /// The kind's words, as text and JSON show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::SwapIns => "swap-ins",
            Kind::Populate => "populate",
            Kind::Allocator => "allocator",
            Kind::MajorFaults => "major-faults",
            Kind::ThreadStacks => "thread-stacks",
            Kind::OverLimit => "over-limit",
            Kind::OverMemory => "over-memory",
            Kind::OverCgroup => "over-cgroup",
            Kind::FaultedOnce => "faulted-once",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

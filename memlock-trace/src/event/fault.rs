//! Page-fault records: a sampled fault (`--events`), or the pages one call populated.

use memlock_trace_common::faults::{FaultEvent, fault_flags, major_kind, populate};

use super::comm_of;
use crate::output::Outside;

/// A sampled fault (`--events`), or the pages one call populated (tracepoint hooks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRecord {
    pub raw: FaultEvent,
}

impl FaultRecord {
    /// The name the task had at the event (its comm), as outside text.
    pub fn name(&self) -> Outside {
        comm_of(&self.raw.comm)
    }

    pub fn has(&self, flag: u32) -> bool {
        self.raw.flags & flag != 0
    }

    /// `minor`, `major`, `failed`.
    pub fn kind(&self) -> &'static str {
        if self.has(fault_flags::FAILED) {
            "failed"
        } else if self.has(fault_flags::MAJOR) {
            "major"
        } else {
            "minor"
        }
    }

    /// A timed major fault's kind, when told: `anon_swap_in`, `shmem_swap_in`, `file_read`.
    pub fn major_kind(&self) -> Option<&'static str> {
        major_kind::FLAGS
            .into_iter()
            .zip(major_kind::KEYS)
            .find_map(|(flag, key)| self.has(flag).then_some(key))
    }

    pub fn latency_ns(&self) -> Option<u64> {
        self.has(fault_flags::HAS_LATENCY)
            .then_some(self.raw.latency_ns)
    }

    /// The call that populated the page, for populated faults.
    pub fn syscall(&self) -> Option<&'static str> {
        populate::NAMES.get(self.raw.syscall as usize).copied()
    }

    /// Whether the faulting VMA was VM_LOCKED / VM_LOCKONFAULT, when the hook saw it.
    pub fn locked(&self) -> Option<(bool, bool)> {
        self.has(fault_flags::HAS_VMA).then(|| {
            (
                self.has(fault_flags::VM_LOCKED),
                self.has(fault_flags::VM_LOCKONFAULT),
            )
        })
    }
}

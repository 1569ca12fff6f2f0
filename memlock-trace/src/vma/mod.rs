//! The VMA hook family: what mlock-family calls do to the address space.
//!
//! The semantics come from diffing the two snapshots the kernel side takes around each call
//! (the VMAs covering the call's range and its neighbours, at `sys_enter` and `sys_exit`), so
//! they are the same on every kernel ([`diff`]). The `ma_write` stores and fentry/fexit
//! function events are the mechanism, shown alongside ([`attach`], [`render`]).

pub mod attach;
mod calls;
pub mod config;
pub mod diff;
mod functions;
mod hooks;
mod json;
pub mod render;
pub mod tracker;

pub use diff::{Change, ChangeCounts, diff};
pub use hooks::HookedFunction;
pub use hooks::VmaHooks;
pub use json::{activity_json, summary_json};
pub use render::{activity_lines, flags_str, summary_line};
pub use tracker::{Activity, Tracker, VmaCall};

/// VMA ranges in pages, for the family's unit tests.
#[cfg(test)]
mod test_vmas {
    use memlock_trace_common::vma::{VM_LOCKED, VmaRange};

    use crate::procfs::PAGE_SIZE;

    pub const P: u64 = PAGE_SIZE;
    /// VM_READ|VM_WRITE|VM_MAYREAD|VM_MAYWRITE|VM_MAYEXEC
    pub const RW: u64 = 0x73;
    pub const LO: u64 = VM_LOCKED;

    /// Pages `start..end` with `flags`.
    pub fn v(start: u64, end: u64, flags: u64) -> VmaRange {
        VmaRange {
            start: start * P,
            end: end * P,
            flags,
        }
    }
}

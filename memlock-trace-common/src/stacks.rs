//! `--stacks` for mlock-family calls: calls, pages populated and locked per user call site,
//! counted in the kernel at each call's `sys_exit` (see `memlock-trace-ebpf/src/stacks.rs`).
//! Faults per stack are in [`crate::faults::StackKey`].

use crate::faults::STACK_DEPTH;

/// Entries of `SYSCALL_STACK_COUNTS`; the loader shrinks it to one without `--stacks`.
pub const MAX_SYSCALL_STACKS: u32 = 4096;

/// Names of the maps and globals the loader looks up by name.
pub mod names {
    pub const SYSCALL_STACK_COUNTS: &str = "SYSCALL_STACK_COUNTS";
    pub const SYSCALL_STACK_COUNTERS: &str = "SYSCALL_STACK_COUNTERS";
    /// `u32` global: non-zero with `--stacks`. Read-only once loaded, so without it the
    /// verifier removes the stack code from the exit program altogether.
    pub const SYSCALL_STACKS: &str = "SYSCALL_STACKS";
}

/// Key of `SYSCALL_STACK_COUNTS` (per CPU, LRU): one call of one process from one user call
/// stack. Whole frames rather than a stack id, for the reason given at `StackKey`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SyscallStackKey {
    pub tgid: u32,
    /// The system call's number (`__syscall_nr`).
    pub nr: u32,
    /// Instruction pointers, innermost first (the instruction after the `syscall`), zero
    /// after the last frame.
    pub ips: [u64; STACK_DEPTH],
}

impl Default for SyscallStackKey {
    fn default() -> Self {
        Self {
            tgid: 0,
            nr: 0,
            ips: [0; STACK_DEPTH],
        }
    }
}

/// Value of `SYSCALL_STACK_COUNTS`, per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallStackValue {
    pub calls: u64,
    /// Calls that returned an error.
    pub errors: u64,
    /// Growth of the thread's `min_flt + maj_flt` across the calls.
    pub populated: u64,
    /// Growth / shrinkage of `mm->locked_vm` across the calls, in pages.
    pub locked: u64,
    pub unlocked: u64,
    /// Time inside the calls.
    pub duration_ns: u64,
}

/// Indices of the per-CPU `SYSCALL_STACK_COUNTERS`.
pub mod counter {
    /// Calls whose stack could not be recorded (no user stack, or the map update failed).
    pub const DROPPED: u32 = 0;
    /// New keys inserted: minus the keys present, the LRU's evictions.
    pub const INSERTS: u32 = 1;
    pub const COUNT: u32 = 2;
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: `#[repr(C)]` plain integers, no padding, every bit pattern valid.
    unsafe impl aya::Pod for super::SyscallStackKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SyscallStackValue {}
}

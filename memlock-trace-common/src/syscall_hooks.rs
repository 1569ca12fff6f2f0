//! Which system calls each family's programs on the raw `sys_enter`/`sys_exit` tracepoints
//! handle.
//!
//! Every syscall program is attached (tp_btf) to the two raw tracepoints
//! `raw_syscalls:sys_enter(regs, id)` and `raw_syscalls:sys_exit(regs, ret)` rather than to
//! one `syscalls:sys_{enter,exit}_*` event per call: a perf-attached event costs a kernel
//! grace period (~35 ms) when it is released, one after another under a global mutex, so a
//! session on 31 of them took over a second to end. A raw tracepoint link is released at
//! once. Each program runs at every system call of the machine and returns unless the call
//! has its bit in the `SYSCALL_HOOKS` map, which the loader fills at attach time.

/// Entries of `SYSCALL_HOOKS`, indexed by system call number (x86-64 numbers stop below
/// 470); a larger number is no call any program handles.
pub const MAX_NR: u32 = 512;

/// `TS_COMPAT` in `thread_info.status` (x86): the task is in a 32-bit system call, whose
/// numbers are not the 64-bit ones (ia32 150 is `mlock`, x86-64 150 is `munlock`). The
/// `syscalls:*` events ignore such calls, and so do the programs.
pub const TS_COMPAT: u32 = 0x0002;

/// One bit per program, set in `SYSCALL_HOOKS[nr]` for each call it handles.
pub mod hook {
    /// `sys_enter_mlock_family` (syscalls family).
    pub const SYSCALLS_ENTER: u32 = 1 << 0;
    /// `sys_exit_mlock_family`.
    pub const SYSCALLS_EXIT: u32 = 1 << 1;
    /// `mlock_range_check`/`_rb`: the ranged calls.
    pub const RANGE_CHECK: u32 = 1 << 2;
    /// `vma_enter`/`_rb` (VMA family).
    pub const VMA_ENTER: u32 = 1 << 3;
    /// `vma_exit`/`_rb`.
    pub const VMA_EXIT: u32 = 1 << 4;
    /// `populate_enter`/`_retry` (fault family).
    pub const POPULATE_ENTER: u32 = 1 << 5;
    /// `populate_exit`/`_counted`/`_counted_rb`.
    pub const POPULATE_EXIT: u32 = 1 << 6;
    /// `fault_mappings_changed`: exits of calls that change mappings without populating.
    pub const MAPPINGS_CHANGED: u32 = 1 << 7;
    /// `fault_mappings_going`/`_retry`: entries of calls after which mappings are gone.
    pub const MAPPINGS_GOING: u32 = 1 << 8;
    /// `stacks_mmap_enter` (`--stacks`).
    pub const STACKS_MMAP_ENTER: u32 = 1 << 9;
    /// `stacks_mmap_exit`.
    pub const STACKS_MMAP_EXIT: u32 = 1 << 10;
}

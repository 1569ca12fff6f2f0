//! x86-64 (arch/x86/include/asm/ptrace.h, the same layout on every kernel).

/// Offsets in `struct pt_regs` of the system call's arguments (`di, si, dx, r10, r8, r9`).
pub const SYSCALL_ARGS: [usize; 6] = [112, 104, 96, 56, 72, 64];
/// Offset of `orig_ax`, the call's number, there from entry to exit; 8 bytes.
pub const SYSCALL_NR: usize = 120;

//! x86_64.

/// The prefix of a system call's function (`SYSCALL_DEFINEn` with the pt_regs wrappers,
/// arch/x86/include/asm/syscall_wrapper.h, 4.17 on): `__x64_sys_mlock(const struct pt_regs
/// *regs)` is what the 64-bit call table calls; 32-bit calls go through `__ia32_sys_*`.
pub const SYSCALL_FUNCTION_PREFIX: &str = "__x64_sys_";

//! aarch64 (arm64).

use memlock_trace_common::stacks::StackSample;

/// The architecture's name as `uname -m` and the README say it.
pub const NAME: &str = "aarch64";

/// The prefix of a system call's function (arch/arm64/include/asm/syscall_wrapper.h, 4.19
/// on): `__arm64_sys_mlock(const struct pt_regs *regs)` is what the 64-bit call table calls;
/// 32-bit (compat) calls go through `__arm64_compat_sys_*` or the same function.
pub const SYSCALL_FUNCTION_PREFIX: &str = "__arm64_sys_";

/// framehop's unwinder for this architecture, over the sections of type `D`.
pub type Unwinder<D> = framehop::aarch64::UnwinderAarch64<D>;
pub type UnwindCache = framehop::aarch64::CacheAarch64;

/// Linux gives user space 48-bit virtual addresses unless a program asks for more with an
/// `mmap` hint above them (Documentation/arch/arm64/memory.rst): the bits above are a return
/// address's pointer-authentication code (and the top byte a tag), stripped before lookup.
const USER_ADDRESS_BITS: u32 = 48;

/// The registers framehop unwinds with.
pub type UnwindRegs = framehop::aarch64::UnwindRegsAarch64;

/// The pointer-authentication code and tag of a return address, above the user address bits.
const PTR_AUTH_MASK: framehop::aarch64::PtrAuthMask =
    framehop::aarch64::PtrAuthMask((1 << USER_ADDRESS_BITS) - 1);

/// The registers framehop starts from: `pc` is passed apart, then the link register `x30`
/// (a leaf's return address), `sp` and the frame pointer `x29`, with the
/// pointer-authentication bits stripped from return addresses.
pub fn unwind_regs(s: &StackSample) -> UnwindRegs {
    UnwindRegs::new_with_ptr_auth_mask(PTR_AUTH_MASK, s.lr, s.sp, s.bp)
}

/// The frame pointer and stack pointer of `regs`, for a step by the frame pointer.
pub fn frame_pointer_and_sp(regs: &UnwindRegs) -> (u64, u64) {
    (regs.fp(), regs.sp())
}

/// The caller's registers after a step by the frame pointer: its return address (as its
/// link register, which a non-leaf frame does not use), stack pointer and frame pointer.
pub fn caller_regs(ret: u64, sp: u64, fp: u64) -> UnwindRegs {
    UnwindRegs::new_with_ptr_auth_mask(PTR_AUTH_MASK, ret, sp, fp)
}

/// A return address read from the stack without its pointer-authentication bits.
pub fn return_address(word: u64) -> u64 {
    word & PTR_AUTH_MASK.0
}

/// The field of `thread_info` the kernel side tests for a 32-bit task: `flags`, with
/// `_TIF_32BIT` (arch/arm64/include/asm/thread_info.h).
pub const COMPAT_FIELD: &str = "flags";

/// arm64 has no `exceptions:page_fault_user` (it is x86's): the tracepoint hook set has no
/// start of a fault there, and the fault family needs fentry or kprobes on
/// `handle_mm_fault`.
pub const FAULT_TRACEPOINT: Option<(&str, &str)> = None;

/// Reads this thread's `(ip, sp, fp, lr)` where the macro stands: what the kernel saves at
/// entry, for tests that copy their own stack.
#[cfg(test)]
#[macro_export]
macro_rules! registers_here {
    () => {{
        let (ip, sp, fp, lr): (u64, u64, u64, u64);
        // SAFETY: reads four registers into locals; no memory is touched.
        unsafe {
            std::arch::asm!(
                "adr {ip}, .",
                "mov {sp}, sp",
                "mov {fp}, x29",
                "mov {lr}, x30",
                ip = out(reg) ip,
                sp = out(reg) sp,
                fp = out(reg) fp,
                lr = out(reg) lr,
            );
        }
        (ip, sp, fp, lr)
    }};
}

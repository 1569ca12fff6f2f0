//! x86_64.

use memlock_trace_common::stacks::StackSample;

/// The prefix of a system call's function (`SYSCALL_DEFINEn` with the pt_regs wrappers,
/// arch/x86/include/asm/syscall_wrapper.h, 4.17 on): `__x64_sys_mlock(const struct pt_regs
/// *regs)` is what the 64-bit call table calls; 32-bit calls go through `__ia32_sys_*`.
pub const SYSCALL_FUNCTION_PREFIX: &str = "__x64_sys_";

/// The architecture's name as `uname -m` and the README say it.
pub const NAME: &str = "x86_64";

/// framehop's unwinder for this architecture, over the sections of type `D`.
pub type Unwinder<D> = framehop::x86_64::UnwinderX86_64<D>;
pub type UnwindCache = framehop::x86_64::CacheX86_64;

/// The registers framehop unwinds with.
pub type UnwindRegs = framehop::x86_64::UnwindRegsX86_64;

/// The registers framehop starts from: `rip` is passed apart, then `rsp` and `rbp`.
pub fn unwind_regs(s: &StackSample) -> UnwindRegs {
    UnwindRegs::new(s.ip, s.sp, s.bp)
}

/// The frame pointer and stack pointer of `regs`, for a step by the frame pointer.
pub fn frame_pointer_and_sp(regs: &UnwindRegs) -> (u64, u64) {
    (regs.bp(), regs.sp())
}

/// The caller's registers after a step by the frame pointer: its return address, stack
/// pointer and frame pointer.
pub fn caller_regs(ret: u64, sp: u64, fp: u64) -> UnwindRegs {
    UnwindRegs::new(ret, sp, fp)
}

/// A return address read from the stack, as code addresses go (x86 signs nothing).
pub fn return_address(word: u64) -> u64 {
    word
}

/// The field of `thread_info` the kernel side tests for a 32-bit system call: `status`,
/// with `TS_COMPAT` (arch/x86/include/asm/thread_info.h).
pub const COMPAT_FIELD: &str = "status";

/// The user page-fault tracepoint (arch/x86/include/asm/trace/exceptions.h), which exists
/// on x86 only: the tracepoint hook set's start of a fault.
pub const FAULT_TRACEPOINT: Option<(&str, &str)> = Some(("exceptions", "page_fault_user"));

/// Reads this thread's `(ip, sp, fp, lr)` where the macro stands: what the kernel saves at
/// entry, for tests that copy their own stack.
#[cfg(test)]
#[macro_export]
macro_rules! registers_here {
    () => {{
        let (ip, sp, fp): (u64, u64, u64);
        // SAFETY: reads three registers into locals; no memory is touched.
        unsafe {
            std::arch::asm!(
                "lea {ip}, [rip]",
                "mov {sp}, rsp",
                "mov {fp}, rbp",
                ip = out(reg) ip,
                sp = out(reg) sp,
                fp = out(reg) fp,
            );
        }
        (ip, sp, fp, 0u64)
    }};
}

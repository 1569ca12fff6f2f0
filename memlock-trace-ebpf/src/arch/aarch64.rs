//! arm64 (arch/arm64/include/asm/ptrace.h): `struct pt_regs` begins with `struct
//! user_pt_regs { u64 regs[31]; u64 sp; u64 pc; u64 pstate; }`, then `orig_x0` and the
//! 32-bit `syscallno`; what follows varies by kernel, so the loader hands in its size.

use aya_ebpf::bindings::bpf_user_pt_regs_t;

use super::UserRegs;

/// Offsets in `struct pt_regs` of the system call's arguments: `orig_x0` (x0 holds the
/// result once the call returns; the kernel's own `syscall_get_arguments` reads `orig_x0`
/// too), then `x1`..`x5`.
pub const SYSCALL_ARGS: [usize; 6] = [272, 8, 16, 24, 32, 40];
/// Offset of `syscallno`, the call's number, still there at `sys_exit`.
pub const SYSCALL_NR: usize = 280;
/// The type of [`SYSCALL_NR`]: `syscallno` is an `s32`.
pub type SyscallNr = i32;
/// `NO_SYSCALL`: every entry from EL0 stores it in `syscallno`, and `el0_svc` replaces it
/// with the call's number.
const NO_SYSCALL: i32 = -1;

/// Whether the task whose saved user registers `word(offset)` reads is inside a system
/// call: its `syscallno` is not `NO_SYSCALL` (a page fault's entry left it so).
#[inline(always)]
pub fn in_syscall(word: impl Fn(usize) -> u64) -> bool {
    word(SYSCALL_NR) as u32 as i32 != NO_SYSCALL
}

/// Offset of `sp` in `struct pt_regs`.
pub const PT_REGS_SP: u32 = 31 * 8;
/// In the loader's `task_thread_status` word (`thread_info.flags`): `_TIF_32BIT`
/// (arch/arm64/include/asm/thread_info.h, bit 22), an AArch32 task, whose system call
/// numbers are not the 64-bit table's.
pub const COMPAT_MASK: u32 = 1 << 22;
/// Above the largest user address (52-bit virtual addresses at most).
pub const USER_ADDRESS_END: u64 = 1 << 56;

/// `PSR_MODE_MASK` and `PSR_MODE32_BIT` of `pstate`: mode 0 is EL0 (user), of an AArch64
/// task unless the 32-bit bit is set.
const PSR_MODE_MASK: u64 = 0x0f;
const PSR_MODE32_BIT: u64 = 0x10;

/// The user stack pointer of a perf sample's registers if it interrupted user mode (a
/// kernel-mode sample's sp is the kernel's).
#[inline(always)]
pub fn perf_user_sp(regs: &bpf_user_pt_regs_t) -> Option<u64> {
    (regs.pstate & PSR_MODE_MASK == 0).then_some(regs.sp)
}

/// `struct pt_regs` of 6.1 (336 bytes) and 6.12 (344) fit in these words, read below the top
/// of the kernel stack.
pub const USER_REGS_READ_WORDS: usize = 48;
const FP: usize = 29;
const LR: usize = 30;
const SP: usize = 31;
const PC: usize = 32;
const PSTATE: usize = 33;

/// The user registers in the [`USER_REGS_READ_WORDS`] words read below the top of the
/// kernel stack (`word(0)` the lowest): `task_pt_regs()` is exactly `pt_regs_bytes` below
/// the top. None unless they are an AArch64 task's user-mode registers.
#[inline(always)]
pub fn user_regs_at_stack_top(word: impl Fn(usize) -> u64, pt_regs_bytes: u32) -> Option<UserRegs> {
    let size_words = (pt_regs_bytes / 8) as usize;
    if size_words <= PSTATE || size_words > USER_REGS_READ_WORDS {
        return None;
    }
    let at = USER_REGS_READ_WORDS - size_words;
    let pstate = word(at + PSTATE);
    if pstate & (PSR_MODE_MASK | PSR_MODE32_BIT) != 0 {
        return None;
    }
    Some(UserRegs {
        ip: word(at + PC),
        sp: word(at + SP),
        fp: word(at + FP),
        lr: word(at + LR),
    })
}

/// `mmap` flags that make the call fault its pages in (include/uapi/asm-generic/mman.h and
/// mman-common.h).
pub const MAP_LOCKED: u64 = 0x2000;
pub const MAP_POPULATE: u64 = 0x8000;

//! x86-64 (arch/x86/include/asm/ptrace.h, the same layout on every kernel).

use aya_ebpf::bindings::bpf_user_pt_regs_t;

use super::UserRegs;

/// Offsets in `struct pt_regs` of the system call's arguments (`di, si, dx, r10, r8, r9`).
pub const SYSCALL_ARGS: [usize; 6] = [112, 104, 96, 56, 72, 64];
/// Offset of `orig_ax`, the call's number, still there at `sys_exit`; 8 bytes.
pub const SYSCALL_NR: usize = 120;
/// The type of [`SYSCALL_NR`]: `orig_ax`, a register.
pub type SyscallNr = i64;
/// Offset of `ax` in `struct pt_regs`.
const AX: usize = 80;
/// `-ENOSYS`, which `do_syscall_64` stores in `ax` before dispatching.
const ENOSYS_RET: u64 = -38i64 as u64;

/// Whether the task whose saved user registers `word(offset)` reads is inside a system
/// call: `ax` holds `-ENOSYS` until the call returns (in a page fault, `orig_ax` is the
/// fault's error code rather than a call number).
#[inline(always)]
pub fn in_syscall(word: impl Fn(usize) -> u64) -> bool {
    word(AX) == ENOSYS_RET
}

/// Offset of `sp` in `struct pt_regs` (the 20th word).
pub const PT_REGS_SP: u32 = 19 * 8;
/// In the loader's `task_thread_status` word (`thread_info.status`): `TS_COMPAT`
/// (arch/x86/include/asm/thread_info.h), the task is in a 32-bit system call, whose numbers
/// are not the 64-bit ones (ia32 150 is `mlock`, x86-64 150 is `munlock`). The
/// `syscalls:*` events ignore such calls, and so do the programs.
pub const COMPAT_MASK: u32 = 0x0002;
/// Above the largest user address (4- or 5-level page tables).
pub const USER_ADDRESS_END: u64 = 1 << 56;

/// The user stack pointer of a perf sample's registers if it interrupted user mode (a
/// kernel-mode sample's sp is the kernel's): the privilege level is CS's low two bits.
#[inline(always)]
pub fn perf_user_sp(regs: &bpf_user_pt_regs_t) -> Option<u64> {
    (regs.cs & 3 != 0).then_some(regs.rsp)
}

/// `struct pt_regs`: 21 words; the indices read.
const PT_REGS_WORDS: usize = 21;
const BP: usize = 4;
const IP: usize = 16;
const CS: usize = 17;
const SP: usize = 19;
const SS: usize = 20;
/// `__USER_CS` and `__USER_DS` of a 64-bit task (arch/x86/include/asm/segment.h).
const USER_CS: u64 = 0x33;
const USER_DS: u64 = 0x2b;
/// Words read below the top of the kernel stack: the registers, and 2 more for
/// `TOP_OF_KERNEL_STACK_PADDING`, 16 bytes with `CONFIG_X86_FRED` (6.9+), 0 before.
pub const USER_REGS_READ_WORDS: usize = PT_REGS_WORDS + 2;

/// The user registers in the [`USER_REGS_READ_WORDS`] words read below the top of the
/// kernel stack (`word(0)` the lowest). The segment registers tell where they are (with or
/// without FRED's padding) and that they are a 64-bit task's; otherwise None.
/// `_pt_regs_bytes` (the loader's `sizeof(struct pt_regs)`) is not needed here.
#[inline(always)]
pub fn user_regs_at_stack_top(
    word: impl Fn(usize) -> u64,
    _pt_regs_bytes: u32,
) -> Option<UserRegs> {
    let user = |at: usize| word(at + CS) == USER_CS && word(at + SS) == USER_DS;
    let at = if user(2) {
        2
    } else if user(0) {
        0
    } else {
        return None;
    };
    Some(UserRegs {
        ip: word(at + IP),
        sp: word(at + SP),
        fp: word(at + BP),
        lr: 0,
    })
}

/// `mmap` flags that make the call fault its pages in (include/uapi/asm-generic/mman.h and
/// mman-common.h, which x86's includes).
pub const MAP_LOCKED: u64 = 0x2000;
pub const MAP_POPULATE: u64 = 0x8000;

//! What every family's syscall handlers run from (see `crate::syscall_dispatch`): the
//! per-call fentry/fexit programs on the call's own kernel function (`__x64_sys_mlock(const
//! struct pt_regs *regs)`: argument 0 is `regs`, and at fexit argument 1 the result), or
//! the raw system-call tracepoints (tp_btf `sys_enter(struct pt_regs *regs, long id)` and
//! `sys_exit(struct pt_regs *regs, long ret)`): the same layout but for `sys_enter`'s
//! argument 1, so one context serves all. Which calls are handled, and the calls'
//! arguments and results. See [`memlock_trace_common::syscall_hooks`] for why not the per-call
//! `syscalls:*` events.

use aya_ebpf::{macros::map, maps::Array, programs::BtfTracePointContext};
use memlock_trace_common::syscall_hooks::MAX_NR;

use crate::{
    arch,
    shared::{current_task, offsets, read_kernel},
};

/// The context of a program on `sys_enter` or `sys_exit`, or on fentry/fexit of a call's
/// function (made with `SyscallContext::new(ctx.as_ptr())`).
pub type SyscallContext = BtfTracePointContext;

/// Per system call number, the [`memlock_trace_common::syscall_hooks::hook`] bits of the
/// handlers that want it; written by the loader as the families attach.
#[map]
static SYSCALL_HOOKS: Array<u32> = Array::with_max_entries(MAX_NR, 0);

/// Reads the field of type `T` at `offset` of the call's saved registers
/// ([`arch::SYSCALL_ARGS`], [`arch::SYSCALL_NR`]): a direct load, which the verifier checks
/// against the kernel's BTF of `struct pt_regs`.
#[inline(always)]
fn register<T>(ctx: &SyscallContext, offset: usize) -> T {
    // Argument 0 of both tracepoints and of the calls' functions is the task's
    // `struct pt_regs *`, never NULL.
    let regs: *const u8 = ctx.arg(0);
    // SAFETY: an in-bounds field of `struct pt_regs`; the verifier checks the load against
    // the kernel's BTF and turns it into one that cannot fault.
    unsafe { core::ptr::read_volatile(regs.add(offset).cast::<T>()) }
}

/// At `sys_enter`: the call's number and the [`memlock_trace_common::syscall_hooks::hook`]
/// bits of the handlers that want it, if any does.
#[inline(always)]
pub fn entering(ctx: &SyscallContext) -> Option<(u32, u32)> {
    // Argument 1 of `sys_enter` is the call's number, a `long`.
    let nr: i64 = ctx.arg(1);
    handled(nr)
}

/// At `sys_exit`: as [`entering`].
#[inline(always)]
pub fn exiting(ctx: &SyscallContext) -> Option<(u32, u32)> {
    handled(number(ctx))
}

/// At fentry or fexit of a call's function: as [`entering`]. Only 64-bit calls reach the
/// function (32-bit ones go through the arch's compat functions; x32 numbers are out of
/// range), so there is no compat test.
#[inline(always)]
pub fn calling(ctx: &SyscallContext) -> Option<(u32, u32)> {
    hooks_of(number(ctx))
}

/// The call's number in the saved registers, of the width the architecture keeps it in
/// (x86 `orig_ax`, arm64's 32-bit `syscallno`), there from entry to exit.
#[inline(always)]
#[allow(
    clippy::useless_conversion,
    reason = "the same type on x86-64, a widening on arm64"
)]
fn number(ctx: &SyscallContext) -> i64 {
    i64::from(register::<arch::SyscallNr>(ctx, arch::SYSCALL_NR))
}

#[inline(always)]
fn handled(nr: i64) -> Option<(u32, u32)> {
    let (nr, hooks) = hooks_of(nr)?;
    if in_compat_syscall() {
        return None;
    }
    Some((nr, hooks))
}

#[inline(always)]
fn hooks_of(nr: i64) -> Option<(u32, u32)> {
    if !(0..i64::from(MAX_NR)).contains(&nr) {
        return None;
    }
    let nr = nr as u32;
    let hooks = *SYSCALL_HOOKS.get(nr)?;
    (hooks != 0).then_some((nr, hooks))
}

/// Whether the current task is in a 32-bit system call ([`arch::COMPAT_MASK`]): read only
/// for the calls a handler wants, so no other call pays for it.
#[inline(always)]
fn in_compat_syscall() -> bool {
    let offset = offsets().task_thread_status;
    offset != 0 && read_kernel::<u32>(current_task(), offset) & arch::COMPAT_MASK != 0
}

/// Argument `i` (below 6) of the call, at `sys_enter` or fentry.
#[inline(always)]
pub fn syscall_arg(ctx: &SyscallContext, i: usize) -> u64 {
    match arch::SYSCALL_ARGS.get(i) {
        Some(&offset) => register::<u64>(ctx, offset),
        None => 0,
    }
}

/// The call's result, or `-errno`, at `sys_exit` or fexit.
#[inline(always)]
pub fn syscall_ret(ctx: &SyscallContext) -> i64 {
    // Argument 1 of `sys_exit` is the call's result, a `long`; so is fexit's after `regs`.
    ctx.arg(1)
}

//! What every family's syscall handlers run from (see `crate::syscall_dispatch`): the
//! per-call fentry/fexit programs on the call's own kernel function (`__x64_sys_mlock(const
//! struct pt_regs *regs)`: argument 0 is `regs`, and at fexit argument 1 the result), the
//! per-call `syscalls:sys_{enter,exit}_*` events where the kernel refuses trampolines, or
//! the raw system-call tracepoints (tp_btf `sys_enter(struct pt_regs *regs, long id)` and
//! `sys_exit(struct pt_regs *regs, long ret)`) where it also lacks `bpf_task_pt_regs`
//! (5.15). The handlers read the call through [`SyscallContext`], whichever ran them.
//! Which calls are handled, and the calls' arguments and results. See
//! [`memlock_trace_common::syscall_hooks`] for the costs of each.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    helpers::generated::{bpf_get_current_task_btf, bpf_task_pt_regs},
    macros::map,
    maps::Array,
    programs::BtfTracePointContext,
};
use memlock_trace_common::syscall_hooks::MAX_NR;

use crate::{
    arch,
    shared::{current_task, offsets, read_kernel},
};

/// What a syscall handler reads of the call it runs at, whichever program runs it.
pub trait SyscallContext: EbpfContext {
    /// Argument `i` (below 6) of the call, at its entry.
    fn syscall_arg(&self, i: usize) -> u64;
    /// The call's result, or `-errno`, at its exit.
    fn syscall_ret(&self) -> i64;
}

/// Argument `i` (below 6) of the call, at its entry.
#[inline(always)]
pub fn syscall_arg<C: SyscallContext>(ctx: &C, i: usize) -> u64 {
    ctx.syscall_arg(i)
}

/// The call's result, or `-errno`, at its exit.
#[inline(always)]
pub fn syscall_ret<C: SyscallContext>(ctx: &C) -> i64 {
    ctx.syscall_ret()
}

/// The context of a program on `sys_enter` or `sys_exit`, or on fentry/fexit of a call's
/// function (made with `BtfTracePointContext::new(ctx.as_ptr())`): argument 0 is the
/// task's `struct pt_regs *`, argument 1 `sys_enter`'s number or the result.
impl SyscallContext for BtfTracePointContext {
    #[inline(always)]
    fn syscall_arg(&self, i: usize) -> u64 {
        match arch::SYSCALL_ARGS.get(i) {
            Some(&offset) => register::<u64>(self.arg(0), offset),
            None => 0,
        }
    }

    #[inline(always)]
    fn syscall_ret(&self) -> i64 {
        // Argument 1 of `sys_exit` is the call's result, a `long`; so is fexit's after `regs`.
        self.arg(1)
    }
}

/// The context of a program on a call's own `syscalls:sys_enter_*` or `sys_exit_*` event:
/// its record, `__syscall_nr` (an `int`) at offset 8 and, at the exit, `ret` (a `long`) at
/// 16. The arguments are read from the task's saved registers, as the other programs read
/// them, not from the record: its size is the call's argument count, and a program that
/// reads past it (`munlockall`'s has none) is refused at the attach.
pub struct SyscallTracepointContext {
    ctx: *mut c_void,
}

impl SyscallTracepointContext {
    pub fn new(ctx: *mut c_void) -> Self {
        Self { ctx }
    }

    /// The call's number and the [`memlock_trace_common::syscall_hooks::hook`] bits of the
    /// handlers that want it, if any does (the event of a call no handler wants is not
    /// attached, but another object's may be: each object has its own bits).
    #[inline(always)]
    pub fn call(&self) -> Option<(u32, u32)> {
        handled(i64::from(self.field::<i32>(8)))
    }

    #[inline(always)]
    fn field<T: Copy>(&self, offset: usize) -> T {
        // SAFETY: a field of the record, within its size (checked by the kernel at attach).
        unsafe { core::ptr::read_volatile(self.ctx.cast::<u8>().add(offset).cast::<T>()) }
    }
}

impl EbpfContext for SyscallTracepointContext {
    fn as_ptr(&self) -> *mut c_void {
        self.ctx
    }
}

impl SyscallContext for SyscallTracepointContext {
    #[inline(always)]
    fn syscall_arg(&self, i: usize) -> u64 {
        let Some(&offset) = arch::SYSCALL_ARGS.get(i) else {
            return 0;
        };
        // SAFETY: helpers without arguments to check; `bpf_task_pt_regs` of the current
        // task is its saved user registers, never NULL.
        let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u8;
        register::<u64>(regs, offset)
    }

    #[inline(always)]
    fn syscall_ret(&self) -> i64 {
        self.field::<i64>(16)
    }
}

/// Per system call number, the [`memlock_trace_common::syscall_hooks::hook`] bits of the
/// handlers that want it; written by the loader as the families attach.
#[map]
static SYSCALL_HOOKS: Array<u32> = Array::with_max_entries(MAX_NR, 0);

/// The bits of [`SYSCALL_HOOKS`] this kernel's families can set, written by the loader
/// before load. Read-only data: to the verifier, a handler whose bit is not here is a branch
/// never taken, so the programs that run every handler are verified with those this kernel
/// can use only (the rbtree walks' go where the maple tree is: 6.18's events' programs went
/// from 70,000 and 42,000 instructions verified to 56,000 and 25,000).
#[unsafe(no_mangle)]
static SYSCALL_HOOKS_POSSIBLE: u32 = u32::MAX;

/// Reads the field of type `T` at `offset` of the call's saved registers `regs` (argument 0
/// of the raw tracepoints and of the calls' functions, or `bpf_task_pt_regs`: never NULL;
/// [`arch::SYSCALL_ARGS`], [`arch::SYSCALL_NR`]): a direct load, which the verifier checks
/// against the kernel's BTF of `struct pt_regs`.
#[inline(always)]
fn register<T>(regs: *const u8, offset: usize) -> T {
    // SAFETY: an in-bounds field of `struct pt_regs`; the verifier checks the load against
    // the kernel's BTF and turns it into one that cannot fault.
    unsafe { core::ptr::read_volatile(regs.add(offset).cast::<T>()) }
}

/// At `sys_enter`: the call's number and the [`memlock_trace_common::syscall_hooks::hook`]
/// bits of the handlers that want it, if any does.
#[inline(always)]
pub fn entering(ctx: &BtfTracePointContext) -> Option<(u32, u32)> {
    // Argument 1 of `sys_enter` is the call's number, a `long`.
    let nr: i64 = ctx.arg(1);
    handled(nr)
}

/// At `sys_exit`: as [`entering`].
#[inline(always)]
pub fn exiting(ctx: &BtfTracePointContext) -> Option<(u32, u32)> {
    handled(number(ctx))
}

/// At fentry or fexit of a call's function: as [`entering`]. Only 64-bit calls reach the
/// function (32-bit ones go through the arch's compat functions; x32 numbers are out of
/// range), so there is no compat test.
#[inline(always)]
pub fn calling(ctx: &BtfTracePointContext) -> Option<(u32, u32)> {
    hooks_of(number(ctx))
}

/// The call's number in the saved registers, of the width the architecture keeps it in
/// (x86 `orig_ax`, arm64's 32-bit `syscallno`), there from entry to exit.
#[inline(always)]
#[allow(
    clippy::useless_conversion,
    reason = "the same type on x86-64, a widening on arm64"
)]
fn number(ctx: &BtfTracePointContext) -> i64 {
    i64::from(register::<arch::SyscallNr>(ctx.arg(0), arch::SYSCALL_NR))
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
    // SAFETY: a read of a static, which outlives the program; volatile, else it would be
    // folded to its compile-time value rather than the one the loader wrote.
    let possible = unsafe { core::ptr::read_volatile(&raw const SYSCALL_HOOKS_POSSIBLE) };
    let hooks = *SYSCALL_HOOKS.get(nr)? & possible;
    (hooks != 0).then_some((nr, hooks))
}

/// Whether the current task is in a 32-bit system call ([`arch::COMPAT_MASK`]): read only
/// for the calls a handler wants, so no other call pays for it.
#[inline(always)]
fn in_compat_syscall() -> bool {
    let offset = offsets().task_thread_status;
    offset != 0 && read_kernel::<u32>(current_task(), offset) & arch::COMPAT_MASK != 0
}

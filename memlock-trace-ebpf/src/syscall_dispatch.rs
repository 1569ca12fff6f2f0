//! The two programs every family's system-call handlers run from: one on the raw
//! `sys_enter` tracepoint, one on `sys_exit`, each running the handlers whose bits the call
//! has in `SYSCALL_HOOKS` (see [`memlock_trace_common::syscall_hooks`]). Above the
//! families: it calls them, they never call it.
//!
//! One program per tracepoint, not one per family: the kernel's cost of running a program
//! (~75 ns here, indirect calls through retpolines) is paid at every system call of the
//! machine, so it is paid twice, not once per family. Each handler is a BPF function of its
//! own, so a handler's stack is its own frame plus this program's.
//!
//! Two builds of each: `_find_vma` with every handler, for kernels with `bpf_find_vma` and
//! `bpf_loop` (5.17), and one without the handlers that call them (`hook::NEED_FIND_VMA`),
//! which older kernels refuse to load even on a path never taken.

use aya_ebpf::macros::btf_tracepoint;
use memlock_trace_common::syscall_hooks::hook;

use crate::{
    faults::{mappings, populate},
    stacks,
    syscall_hooks::{SyscallContext, entering, exiting},
    syscalls::{self, range},
    vma,
};

#[btf_tracepoint(function = "sys_enter")]
pub fn syscall_enter(ctx: SyscallContext) -> i32 {
    enter::<false>(&ctx);
    0
}

#[btf_tracepoint(function = "sys_enter")]
pub fn syscall_enter_find_vma(ctx: SyscallContext) -> i32 {
    enter::<true>(&ctx);
    0
}

#[btf_tracepoint(function = "sys_exit")]
pub fn syscall_exit(ctx: SyscallContext) -> i32 {
    exit::<false>(&ctx);
    0
}

#[btf_tracepoint(function = "sys_exit")]
pub fn syscall_exit_find_vma(ctx: SyscallContext) -> i32 {
    exit::<true>(&ctx);
    0
}

/// The entry handlers, in the order the per-call programs ran before: the call's own
/// figures first, then what looks at the mappings.
#[inline(always)]
fn enter<const FIND_VMA: bool>(ctx: &SyscallContext) {
    let Some((nr, hooks)) = entering(ctx) else {
        return;
    };
    let wants = |bit: u32| hooks & bit != 0;
    if wants(hook::SYSCALLS_ENTER) {
        syscalls::on_enter(ctx, nr);
    }
    if wants(hook::RANGE_CHECK_RB) {
        range::on_enter::<true>(ctx);
    }
    if wants(hook::VMA_ENTER_RB) {
        vma::on_enter::<true>(ctx, nr);
    }
    if wants(hook::POPULATE_ENTER) {
        populate::on_enter::<false>(ctx, nr);
    }
    if wants(hook::MAPPINGS_GOING) {
        mappings::on_going::<false>();
    }
    if wants(hook::STACKS_MMAP_ENTER) {
        stacks::on_mmap_enter(ctx);
    }
    if FIND_VMA {
        if wants(hook::RANGE_CHECK) {
            range::on_enter::<false>(ctx);
        }
        if wants(hook::VMA_ENTER) {
            vma::on_enter::<false>(ctx, nr);
        }
        if wants(hook::POPULATE_ENTER_RETRY) {
            populate::on_enter::<true>(ctx, nr);
        }
        if wants(hook::MAPPINGS_GOING_RETRY) {
            mappings::on_going::<true>();
        }
    }
}

#[inline(always)]
fn exit<const FIND_VMA: bool>(ctx: &SyscallContext) {
    let Some((_, hooks)) = exiting(ctx) else {
        return;
    };
    let wants = |bit: u32| hooks & bit != 0;
    if wants(hook::SYSCALLS_EXIT) {
        syscalls::on_exit(ctx);
    }
    if wants(hook::VMA_EXIT_RB) {
        vma::on_exit::<true>();
    }
    if wants(hook::POPULATE_EXIT) {
        populate::on_exit();
    }
    if wants(hook::POPULATE_EXIT_COUNTED_RB) {
        populate::on_exit_counted::<true>(ctx);
    }
    if wants(hook::MAPPINGS_CHANGED) {
        mappings::on_changed();
    }
    if wants(hook::STACKS_MMAP_EXIT) {
        stacks::on_mmap_exit(ctx);
    }
    if FIND_VMA {
        if wants(hook::VMA_EXIT) {
            vma::on_exit::<false>();
        }
        if wants(hook::POPULATE_EXIT_COUNTED) {
            populate::on_exit_counted::<false>(ctx);
        }
    }
}

//! The programs every family's system-call handlers run from: one fentry and one fexit
//! program per hooked call, on the call's own kernel function, where the kernel allows
//! trampolines; else one program on each of the call's `syscalls:sys_{enter,exit}_*`
//! events; else (before 5.15) one program on the raw `sys_enter` tracepoint and one on
//! `sys_exit`. The events' programs are one per edge, like the raw tracepoints', attached
//! to each hooked call's event.
//! Each runs the handlers whose bits the call has in `SYSCALL_HOOKS` (see
//! [`memlock_trace_common::syscall_hooks`]). Above the families: it calls them, they never
//! call it.
//!
//! A trampoline costs only the call it is on; a raw tracepoint program runs at every system
//! call of the machine (~75 ns here, indirect calls through retpolines), so there is one per
//! tracepoint, not one per family. Each handler is a BPF function of its own, so a
//! handler's stack is its own frame plus this program's. A call's programs hold only the
//! handlers its [`calls`] bits name, so each verifies only what its call can need.
//!
//! Two builds of each: `_find_vma` with every handler, for kernels with `bpf_find_vma` and
//! `bpf_loop` (5.17), and one without the handlers that call them (`hook::NEED_FIND_VMA`),
//! which older kernels refuse to load even on a path never taken. The events' programs
//! have the first build only: a kernel without trampolines or `bpf_find_vma` (arm64's
//! 5.15 and 5.16) uses the raw tracepoints.

use aya_ebpf::{
    EbpfContext as _,
    macros::{btf_tracepoint, fentry, fexit, tracepoint},
    programs::{BtfTracePointContext, FEntryContext, FExitContext, TracePointContext},
};
use memlock_trace_common::syscall_hooks::{calls, hook};

use crate::{
    faults::{mappings, populate},
    mapping, stacks,
    syscall_hooks::{SyscallContext, SyscallTracepointContext, calling, entering, exiting},
    syscalls::{self, range},
    vma,
};

/// Every handler: what the raw tracepoints can be asked to run.
const ANY: u32 = u32::MAX;

#[btf_tracepoint(function = "sys_enter")]
pub fn syscall_enter(ctx: BtfTracePointContext) -> i32 {
    if let Some((nr, hooks)) = entering(&ctx) {
        enter::<false, ANY>(&ctx, nr, hooks);
    }
    0
}

#[btf_tracepoint(function = "sys_enter")]
pub fn syscall_enter_find_vma(ctx: BtfTracePointContext) -> i32 {
    if let Some((nr, hooks)) = entering(&ctx) {
        enter::<true, ANY>(&ctx, nr, hooks);
    }
    0
}

#[btf_tracepoint(function = "sys_exit")]
pub fn syscall_exit(ctx: BtfTracePointContext) -> i32 {
    if let Some((_, hooks)) = exiting(&ctx) {
        exit::<false, ANY>(&ctx, hooks);
    }
    0
}

#[btf_tracepoint(function = "sys_exit")]
pub fn syscall_exit_find_vma(ctx: BtfTracePointContext) -> i32 {
    if let Some((_, hooks)) = exiting(&ctx) {
        exit::<true, ANY>(&ctx, hooks);
    }
    0
}

/// On each hooked call's own `syscalls:sys_enter_*` event: one program on every call's
/// event (the record says which call), with every handler, the `bpf_find_vma` build only.
/// It reads the record's `__syscall_nr` (offset 8), which even `munlockall`'s, without
/// arguments, has.
#[tracepoint]
pub fn syscall_enter_event(ctx: TracePointContext) -> u32 {
    let ctx = SyscallTracepointContext::new(ctx.as_ptr());
    if let Some((nr, hooks)) = ctx.call() {
        enter::<true, ANY>(&ctx, nr, hooks);
    }
    0
}

/// On each hooked call's `syscalls:sys_exit_*` event: as [`syscall_enter_event`]; every
/// exit record has `ret` (offset 16).
#[tracepoint]
pub fn syscall_exit_event(ctx: TracePointContext) -> u32 {
    let ctx = SyscallTracepointContext::new(ctx.as_ptr());
    if let Some((_, hooks)) = ctx.call() {
        exit::<true, ANY>(&ctx, hooks);
    }
    0
}

/// One fentry and one fexit program per call, each in both builds: `$call` names the
/// call's [`calls`] bits, the loader attaches the programs to the arch's function of the
/// call (`memlock-trace/src/arch/`).
macro_rules! call_programs {
    ($($call:ident => $enter:ident, $enter_fv:ident, $exit:ident, $exit_fv:ident;)*) => {$(
        #[fentry]
        pub fn $enter(ctx: FEntryContext) -> i32 {
            let ctx = BtfTracePointContext::new(ctx.as_ptr());
            if let Some((nr, hooks)) = calling(&ctx) {
                enter::<false, { calls::$call }>(&ctx, nr, hooks);
            }
            0
        }

        #[fentry]
        pub fn $enter_fv(ctx: FEntryContext) -> i32 {
            let ctx = BtfTracePointContext::new(ctx.as_ptr());
            if let Some((nr, hooks)) = calling(&ctx) {
                enter::<true, { calls::$call }>(&ctx, nr, hooks);
            }
            0
        }

        #[fexit]
        pub fn $exit(ctx: FExitContext) -> i32 {
            let ctx = BtfTracePointContext::new(ctx.as_ptr());
            if let Some((_, hooks)) = calling(&ctx) {
                exit::<false, { calls::$call }>(&ctx, hooks);
            }
            0
        }

        #[fexit]
        pub fn $exit_fv(ctx: FExitContext) -> i32 {
            let ctx = BtfTracePointContext::new(ctx.as_ptr());
            if let Some((_, hooks)) = calling(&ctx) {
                exit::<true, { calls::$call }>(&ctx, hooks);
            }
            0
        }
    )*};
}

// Named `sys_CALL_{enter,exit}[_fv]`, as the loader asks for them (`fv`: find_vma build).
call_programs! {
    MLOCK => sys_mlock_enter, sys_mlock_enter_fv, sys_mlock_exit, sys_mlock_exit_fv;
    MLOCK => sys_mlock2_enter, sys_mlock2_enter_fv, sys_mlock2_exit, sys_mlock2_exit_fv;
    MUNLOCK => sys_munlock_enter, sys_munlock_enter_fv, sys_munlock_exit, sys_munlock_exit_fv;
    MLOCK => sys_mlockall_enter, sys_mlockall_enter_fv, sys_mlockall_exit, sys_mlockall_exit_fv;
    MUNLOCK => sys_munlockall_enter, sys_munlockall_enter_fv, sys_munlockall_exit,
        sys_munlockall_exit_fv;
    MMAP => sys_mmap_enter, sys_mmap_enter_fv, sys_mmap_exit, sys_mmap_exit_fv;
    POPULATE => sys_mremap_enter, sys_mremap_enter_fv, sys_mremap_exit, sys_mremap_exit_fv;
    POPULATE => sys_brk_enter, sys_brk_enter_fv, sys_brk_exit, sys_brk_exit_fv;
    POPULATE => sys_madvise_enter, sys_madvise_enter_fv, sys_madvise_exit, sys_madvise_exit_fv;
    POPULATE => sys_mprotect_enter, sys_mprotect_enter_fv, sys_mprotect_exit,
        sys_mprotect_exit_fv;
    POPULATE => sys_pkey_mprotect_enter, sys_pkey_mprotect_enter_fv, sys_pkey_mprotect_exit,
        sys_pkey_mprotect_exit_fv;
    POPULATE => sys_remap_file_pages_enter, sys_remap_file_pages_enter_fv,
        sys_remap_file_pages_exit, sys_remap_file_pages_exit_fv;
    POPULATE => sys_execve_enter, sys_execve_enter_fv, sys_execve_exit, sys_execve_exit_fv;
    POPULATE => sys_execveat_enter, sys_execveat_enter_fv, sys_execveat_exit,
        sys_execveat_exit_fv;
    MUNMAP => sys_munmap_enter, sys_munmap_enter_fv, sys_munmap_exit, sys_munmap_exit_fv;
    EXIT_GROUP => sys_exit_group_enter, sys_exit_group_enter_fv, sys_exit_group_exit,
        sys_exit_group_exit_fv;
}

/// The entry handlers `CAN` allows whose bits `hooks` has, in the order the per-call
/// tracepoint programs ran before: the call's own figures first, then what looks at the
/// mappings.
#[inline(always)]
fn enter<const FIND_VMA: bool, const CAN: u32>(ctx: &impl SyscallContext, nr: u32, hooks: u32) {
    let wants = |bit: u32| CAN & bit != 0 && hooks & bit != 0;
    if wants(hook::SYSCALLS_ENTER) {
        // Read here, not inside on_enter: a frame of its own below the call's would take
        // 5.10's combined stack past 512 bytes (544 refused).
        syscalls::on_enter(ctx, nr, crate::rss::mapped_pages_or_unknown());
    }
    if wants(hook::RANGE_CHECK_RB) {
        range::on_enter::<{ mapping::RB_WALK }>(ctx);
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
            range::on_enter::<{ mapping::FIND_VMA }>(ctx);
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
fn exit<const FIND_VMA: bool, const CAN: u32>(ctx: &impl SyscallContext, hooks: u32) {
    let wants = |bit: u32| CAN & bit != 0 && hooks & bit != 0;
    if wants(hook::SYSCALLS_EXIT) {
        // As at the entry: the read's frame beside the exit's, not below it.
        syscalls::on_exit(ctx, crate::rss::mapped_pages_or_unknown());
    }
    if wants(hook::VMA_EXIT_RB) {
        vma::on_exit::<true>();
    }
    if wants(hook::POPULATE_EXIT) {
        populate::on_exit();
    }
    if wants(hook::POPULATE_EXIT_COUNTED_RB) {
        populate::on_exit_counted::<{ mapping::RB_WALK }>(ctx);
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
            populate::on_exit_counted::<{ mapping::FIND_VMA }>(ctx);
        }
    }
}

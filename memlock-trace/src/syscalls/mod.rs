//! The syscall hook family: every `mlock`, `mlock2`, `munlock`, `mlockall` and `munlockall`,
//! timed between its `sys_enter` and `sys_exit` tracepoints, with the pages it populated
//! and locked; counted per process, call and outcome in the kernel ([`read`]), with the
//! per-call records aggregated in user space ([`stats`]) for what only they carry; rendered
//! by [`render`];
//! with `--stacks`, counted per user call site in the kernel ([`stacks`]).

pub mod read;
pub mod render;
pub mod stacks;
pub mod stats;
pub mod why;

use anyhow::{Result, bail};

pub use stats::{Aggregator, ProcessSyscalls, SyscallSummary};

use crate::{
    event::Syscall,
    object::{AttachContext, HookFamily, hook_refused},
};

/// The syscall family's programs, attached.
#[derive(Clone, Debug)]
pub struct SyscallHooks {
    /// How a ranged call's range is checked at entry, or why it is not.
    range_check: std::result::Result<&'static str, String>,
}

/// The calls with a range, whose mapping is checked at entry (see `why`).
const RANGED: [Syscall; 3] = [Syscall::Mlock, Syscall::Mlock2, Syscall::Munlock];

impl HookFamily for SyscallHooks {
    const NAME: &'static str = "syscalls";
    type Options = ();

    /// One entry program per call, and one exit program on every call's exit.
    fn attach(cx: &mut AttachContext<'_>, (): &()) -> Result<Self> {
        for syscall in Syscall::ALL {
            let enter = format!("sys_enter_{}", syscall.name());
            cx.tracepoint(&enter)?
                .attach("syscalls", &enter)
                .map_err(|e| hook_refused(&enter, "tracepoint", e))?;
        }
        let exit_prog = "sys_exit_mlock_family";
        for syscall in Syscall::ALL {
            let exit = format!("sys_exit_{}", syscall.name());
            cx.tracepoint(exit_prog)?
                .attach("syscalls", &exit)
                .map_err(|e| hook_refused(&exit, "tracepoint", e))?;
        }
        // Extra: without it a failed call still says its limits, with its range unchecked.
        let range_check = attach_range_check(cx).map_err(|e| format!("{e:#}"));
        Ok(Self { range_check })
    }

    fn describe(&self) -> String {
        let calls =
            "tracepoints syscalls:sys_{enter,exit}_{mlock,mlock2,munlock,mlockall,munlockall}";
        match &self.range_check {
            Ok(how) => format!("{calls} + ranges checked at entry by {how}"),
            Err(why) => format!("{calls} (ranges not checked at entry: {why})"),
        }
    }
}

/// The program that walks an mlock's range at entry: `bpf_find_vma` where the kernel has it,
/// else the rbtree walk (before 6.1; between 5.17 and 6.1 either would do).
fn attach_range_check(cx: &mut AttachContext<'_>) -> Result<&'static str> {
    let (program, how) = if cx.btf.has_find_vma() {
        ("mlock_range_check", "bpf_find_vma")
    } else if cx.btf.mapping_config().is_ok_and(|c| c.rb_valid == 1) {
        ("mlock_range_check_rb", "a walk of mm->mm_rb")
    } else {
        bail!("no bpf_find_vma (5.17) and no VMA rbtree to walk");
    };
    for syscall in RANGED {
        let enter = format!("sys_enter_{}", syscall.name());
        cx.tracepoint(program)?
            .attach("syscalls", &enter)
            .map_err(|e| hook_refused(&enter, "tracepoint", e))?;
    }
    Ok(how)
}

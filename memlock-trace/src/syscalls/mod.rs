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

use anyhow::Result;

pub use stats::{Aggregator, ProcessSyscalls, SyscallSummary};

use crate::{
    event::Syscall,
    object::{AttachContext, HookFamily, hook_refused},
};

/// The syscall family's programs, attached.
#[derive(Clone, Debug)]
pub struct SyscallHooks;

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
        Ok(Self)
    }

    fn describe(&self) -> String {
        "tracepoints syscalls:sys_{enter,exit}_{mlock,mlock2,munlock,mlockall,munlockall}".into()
    }
}

//! The syscall hook family: every `mlock`, `mlock2`, `munlock`, `mlockall` and `munlockall`,
//! timed between its `sys_enter` and `sys_exit` tracepoints, with the pages it populated
//! and locked; counted per process, call and outcome in the kernel ([`read`]), with the
//! per-call records aggregated in user space ([`stats`]) for what only they carry; rendered
//! by [`render`];
//! with `--stacks`, counted per user call site in the kernel ([`stacks`]).

pub mod read;
pub mod render;
pub mod rss;
pub mod stacks;
pub mod stats;
pub mod why;

use anyhow::{Result, bail};

pub use stats::{Aggregator, ProcessSyscalls, SyscallSummary};

use memlock_trace_common::syscall_hooks::hook;

use crate::{
    event::Syscall,
    object::{AttachContext, HookFamily, HookLine, SyscallEdge, SyscallVia},
};

/// The syscall family's programs, attached.
#[derive(Clone, Debug)]
pub struct SyscallHooks {
    /// fentry/fexit on the calls' functions, or the raw tracepoints.
    via: SyscallVia,
    /// How a ranged call's range is checked at entry, or why it is not.
    range_check: std::result::Result<&'static str, String>,
    /// Why the base pages a call populated cannot be read, if they cannot.
    pages_unknown: Option<String>,
}

/// The calls with a range, whose mapping is checked at entry (see `why`).
const RANGED: [Syscall; 3] = [Syscall::Mlock, Syscall::Mlock2, Syscall::Munlock];

impl HookFamily for SyscallHooks {
    const NAME: &'static str = "syscalls";
    /// Where this kernel keeps the RSS counters.
    type Options = memlock_trace_common::rss::RssConfig;

    /// One entry and one exit handler for the five calls.
    fn attach(cx: &mut AttachContext<'_>, rss_config: &Self::Options) -> Result<Self> {
        // Before the calls are traced: with it, every call's pages are known.
        let pages_unknown = rss::learn_cpu_offsets(cx.ebpf, rss_config)
            .err()
            .map(|e| format!("{e:#}"));
        let nrs = Syscall::ALL.map(Syscall::nr);
        let (enter, exit) = (SyscallEdge::Enter, SyscallEdge::Exit);
        cx.syscall_hook(enter, hook::SYSCALLS_ENTER, &nrs)?;
        let via = cx.syscall_hook(exit, hook::SYSCALLS_EXIT, &nrs)?;
        // Extra: without it a failed call still says its limits, with its range unchecked.
        let range_check = attach_range_check(cx).map_err(|e| format!("{e:#}"));
        Ok(Self {
            via,
            range_check,
            pages_unknown,
        })
    }

    fn hook_line(&self) -> HookLine {
        let calls = self.via.describe(None, &Syscall::ALL.map(Syscall::nr));
        let refused = self.via.refused();
        let mut full = format!(
            "{calls}{}",
            refused.as_ref().map_or(String::new(), |r| r.1.clone())
        );
        let mut brief = calls;
        match &self.range_check {
            Ok(how) => {
                let checked = format!(" + ranges checked at entry by {how}");
                brief += &checked;
                full += &checked;
            }
            Err(why) => full += &format!(" (ranges not checked at entry: {why})"),
        }
        if let Some(why) = &self.pages_unknown {
            full += &format!(" (pages populated counted as faults, one per huge page: {why})");
        }
        HookLine::Traced {
            set: self.via.set(),
            brief,
            full,
            refused: refused.into_iter().map(|r| r.0).collect(),
        }
    }
}

/// The program that walks an mlock's range at entry: `bpf_find_vma` where the kernel has it,
/// else the rbtree walk (before 6.1; between 5.17 and 6.1 either would do).
fn attach_range_check(cx: &mut AttachContext<'_>) -> Result<&'static str> {
    let (check, how) = if cx.btf.has_find_vma() {
        (hook::RANGE_CHECK, "bpf_find_vma")
    } else if cx.btf.mapping_config().is_ok_and(|c| c.rb_valid == 1) {
        (hook::RANGE_CHECK_RB, "a walk of mm->mm_rb")
    } else {
        bail!("no bpf_find_vma (5.17) and no VMA rbtree to walk");
    };
    let nrs = RANGED.map(Syscall::nr);
    cx.syscall_hook(SyscallEdge::Enter, check, &nrs)?;
    Ok(how)
}

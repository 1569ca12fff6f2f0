//! The fault family's system-call programs: the populating calls, whose pages the fault
//! hooks charge to the call and (tracepoint set) to the VMA they went into, and the calls
//! that change mappings, where the per-CPU VMA cache is dropped and waiting pages looked up
//! again. All run from fentry/fexit on the calls' functions, from the calls'
//! `syscalls:*` events where the kernel refuses fentry, or from the raw
//! `sys_enter`/`sys_exit` tracepoints where it also refuses those (see
//! [`crate::object::attach_syscall_hook`]).

use anyhow::Result;
use aya::{Btf, Ebpf};
use memlock_trace_common::{faults::populate, syscall_hooks::hook};

use crate::{
    faults::{HookSet, sizing::populate_nrs},
    object::{SyscallEdge, SyscallVia, attach_syscall_hook, call_names},
};

/// Where the fault hooks' cache of VMAs is dropped, besides the populating calls: at the
/// exit of the calls that change mappings without populating, and as `munmap` enters;
/// `retry`: where mappings are about to go (`munmap`, `exit_group`), the waiting pages are
/// also looked up again.
pub(super) fn attach_mappings_changed(
    ebpf: &mut Ebpf,
    btf: &Btf,
    find_vma: bool,
    retry: bool,
) -> Result<String> {
    let changed_at = [libc::SYS_munmap, libc::SYS_munlock, libc::SYS_munlockall].map(nr);
    let exit = SyscallEdge::Exit;
    let via = attach_syscall_hook(
        ebpf,
        btf,
        find_vma,
        exit,
        hook::MAPPINGS_CHANGED,
        &changed_at,
    )?;
    let (going, going_at) = if retry {
        let at = [libc::SYS_munmap, libc::SYS_exit_group].map(nr);
        (hook::MAPPINGS_GOING_RETRY, at.to_vec())
    } else {
        // Exit needs no fresh lookups: only the waiting pages' last chance.
        (hook::MAPPINGS_GOING, vec![nr(libc::SYS_munmap)])
    };
    let enter = SyscallEdge::Enter;
    attach_syscall_hook(ebpf, btf, find_vma, enter, going, &going_at)?;
    let at_exit = via.describe(Some(exit), &changed_at);
    let at_enter = match &via {
        // The enter's tracepoint program is the exit's sibling: said once.
        SyscallVia::RawTracepoints => format!("sys_enter for {}", call_names(&going_at).join(", ")),
        SyscallVia::Fentry | SyscallVia::Tracepoints => via.describe(Some(enter), &going_at),
    };
    Ok(format!(
        "{at_exit} and {at_enter} (VMAs looked up afresh{})",
        if retry {
            "; at the enters, pages that met a busy mmap lock looked up again"
        } else {
            ""
        }
    ))
}

/// The populating calls' entry and exit: with the tracepoint set they count the pages
/// populated and charge them to the VMA they went into (found with `bpf_find_vma`, or
/// before 5.17 by the rbtree walk); with the others they only name the call a populated
/// fault happened in.
pub(super) fn attach_populate(
    ebpf: &mut Ebpf,
    btf: &Btf,
    set: HookSet,
    find_vma: bool,
) -> Result<Vec<String>> {
    let (enter, exit) = match set {
        // The enter also looks up again the pages whose lookup met a busy mmap lock.
        HookSet::Tracepoint if find_vma => {
            (hook::POPULATE_ENTER_RETRY, hook::POPULATE_EXIT_COUNTED)
        }
        HookSet::Tracepoint => (hook::POPULATE_ENTER, hook::POPULATE_EXIT_COUNTED_RB),
        _ => (hook::POPULATE_ENTER, hook::POPULATE_EXIT),
    };
    let nrs: Vec<u32> = populate_nrs()
        .into_iter()
        .enumerate()
        .filter(|&(index, nr)| index != populate::OTHER && nr != u32::MAX)
        .map(|(_, nr)| nr)
        .collect();
    attach_syscall_hook(ebpf, btf, find_vma, SyscallEdge::Enter, enter, &nrs)?;
    let via = attach_syscall_hook(ebpf, btf, find_vma, SyscallEdge::Exit, exit, &nrs)?;
    Ok(vec![via.describe(None, &nrs)])
}

/// A `libc::SYS_*` number as the programs see it.
fn nr(sys: libc::c_long) -> u32 {
    sys as u32
}

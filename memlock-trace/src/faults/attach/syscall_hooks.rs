//! The fault family's system-call programs: the populating calls, whose pages the fault
//! hooks charge to the call and (tracepoint set) to the VMA they went into, and the calls
//! that change mappings, where the per-CPU VMA cache is dropped and waiting pages looked up
//! again. All on the raw `sys_enter`/`sys_exit` tracepoints (see
//! [`memlock_trace_common::syscall_hooks`]).

use anyhow::Result;
use aya::{Btf, Ebpf};
use memlock_trace_common::{faults::populate, syscall_hooks::hook};

use crate::{
    faults::{HookSet, sizing::populate_nrs},
    object::{SyscallEdge, attach_syscall_hook},
};

const POPULATE_ENTER: &str = "populate_enter";
const POPULATE_ENTER_RETRY: &str = "populate_enter_retry";
const POPULATE_EXIT_COUNTED: &str = "populate_exit_counted";
const POPULATE_EXIT_COUNTED_RB: &str = "populate_exit_counted_rb";
const POPULATE_EXIT: &str = "populate_exit";
const MAPPINGS_CHANGED: &str = "fault_mappings_changed";
const MAPPINGS_GOING: &str = "fault_mappings_going";
const MAPPINGS_GOING_RETRY: &str = "fault_mappings_going_retry";

/// Where the fault hooks' cache of VMAs is dropped, besides the populating calls: at the
/// exit of the calls that change mappings without populating, and as `munmap` enters;
/// `retry`: where mappings are about to go (`munmap`, `exit_group`), the waiting pages are
/// also looked up again.
pub(super) fn attach_mappings_changed(ebpf: &mut Ebpf, btf: &Btf, retry: bool) -> Result<String> {
    let changed_at = [libc::SYS_munmap, libc::SYS_munlock, libc::SYS_munlockall].map(nr);
    attach_syscall_hook(
        ebpf,
        btf,
        MAPPINGS_CHANGED,
        SyscallEdge::Exit,
        hook::MAPPINGS_CHANGED,
        &changed_at,
    )?;
    let (going, going_at) = if retry {
        (
            MAPPINGS_GOING_RETRY,
            &[nr(libc::SYS_munmap), nr(libc::SYS_exit_group)][..],
        )
    } else {
        // Exit needs no fresh lookups: only the waiting pages' last chance.
        (MAPPINGS_GOING, &[nr(libc::SYS_munmap)][..])
    };
    attach_syscall_hook(
        ebpf,
        btf,
        going,
        SyscallEdge::Enter,
        hook::MAPPINGS_GOING,
        going_at,
    )?;
    Ok(format!(
        "tp_btf raw_syscalls:sys_exit for munmap, munlock, munlockall and sys_enter for {} \
         (VMAs looked up afresh{})",
        if retry {
            "munmap, exit_group"
        } else {
            "munmap"
        },
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
    let (enter_program, exit_program) = match set {
        // The enter also looks up again the pages whose lookup met a busy mmap lock.
        HookSet::Tracepoint if find_vma => (POPULATE_ENTER_RETRY, POPULATE_EXIT_COUNTED),
        HookSet::Tracepoint => (POPULATE_ENTER, POPULATE_EXIT_COUNTED_RB),
        _ => (POPULATE_ENTER, POPULATE_EXIT),
    };
    let known = populate_nrs();
    let (names, nrs): (Vec<&str>, Vec<u32>) = populate::NAMES
        .iter()
        .zip(known)
        .enumerate()
        .filter(|&(index, (_, nr))| index != populate::OTHER && nr != u32::MAX)
        .map(|(_, (&name, nr))| (name, nr))
        .unzip();
    let edges = [
        (enter_program, SyscallEdge::Enter, hook::POPULATE_ENTER),
        (exit_program, SyscallEdge::Exit, hook::POPULATE_EXIT),
    ];
    for (program, edge, bit) in edges {
        attach_syscall_hook(ebpf, btf, program, edge, bit, &nrs)?;
    }
    Ok(vec![format!(
        "tp_btf raw_syscalls:sys_{{enter,exit}} for {}",
        names.join(", ")
    )])
}

/// A `libc::SYS_*` number as the programs see it.
fn nr(sys: libc::c_long) -> u32 {
    sys as u32
}

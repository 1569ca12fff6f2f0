//! The fault family's syscall tracepoints: the populating calls, whose pages the fault hooks
//! charge to the call and (tracepoint set) to the VMA they went into, and the calls that
//! change mappings, where the per-CPU VMA cache is dropped and waiting pages looked up again.

use std::path::Path;

use anyhow::Result;
use aya::{Ebpf, programs::TracePoint};
use memlock_trace_common::faults::populate;

use crate::{
    faults::{HookSet, sizing::populate_nrs},
    object::{hook_refused, program},
    probe::TRACEFS,
};

const POPULATE_ENTER: &str = "populate_enter";
const POPULATE_ENTER_RETRY: &str = "populate_enter_retry";
const POPULATE_EXIT_COUNTED: &str = "populate_exit_counted";
const POPULATE_EXIT_COUNTED_RB: &str = "populate_exit_counted_rb";
const MAPPINGS_CHANGED: &str = "fault_mappings_changed";
const MAPPINGS_CHANGED_RETRY: &str = "fault_mappings_changed_retry";
/// Calls that change mappings without populating (the populating ones are hooked anyway):
/// the fault hooks' cache of VMAs is dropped at them.
const MAPPINGS_CHANGED_AT: [&str; 3] =
    ["sys_exit_munmap", "sys_exit_munlock", "sys_exit_munlockall"];
/// Where mappings are about to go: with the tracepoint set and `bpf_find_vma`, the pages
/// whose lookup met a busy mmap lock are looked up once more here.
const MAPPINGS_GOING_AT: [&str; 2] = ["sys_enter_munmap", "sys_enter_exit_group"];
const POPULATE_EXIT: &str = "populate_exit";

/// Where the fault hooks' cache of VMAs is dropped, besides the populating calls; `retry`:
/// where mappings are about to go, the waiting pages are also looked up again.
pub(super) fn attach_mappings_changed(ebpf: &mut Ebpf, retry: bool) -> Result<String> {
    let mut at: Vec<(&str, &str)> = MAPPINGS_CHANGED_AT
        .iter()
        .map(|&tp| (MAPPINGS_CHANGED, tp))
        .collect();
    if retry {
        at.extend(MAPPINGS_GOING_AT.map(|tp| (MAPPINGS_CHANGED_RETRY, tp)));
    } else {
        // Exit needs no fresh lookups: only the waiting pages' last chance.
        at.push((MAPPINGS_CHANGED, MAPPINGS_GOING_AT[0]));
    }
    for &(name, tp) in &at {
        attach_syscall(ebpf, name, tp)?;
    }
    let tracepoints: Vec<&str> = at.iter().map(|&(_, tp)| tp).collect();
    Ok(format!(
        "tracepoints syscalls:{{{}}} (VMAs looked up afresh{})",
        tracepoints.join(","),
        if retry {
            "; at the enters, pages that met a busy mmap lock looked up again"
        } else {
            ""
        }
    ))
}

/// The populating calls' enter/exit tracepoints: with the tracepoint set they count the
/// pages populated and charge them to the VMA they went into (found with `bpf_find_vma`,
/// or before 5.17 by the rbtree walk); with the others they only name the call a populated
/// fault happened in.
pub(super) fn attach_populate(
    ebpf: &mut Ebpf,
    set: HookSet,
    find_vma: bool,
) -> Result<Vec<String>> {
    let (enter_program, exit_program) = match set {
        // The enter also looks up again the pages whose lookup met a busy mmap lock.
        HookSet::Tracepoint if find_vma => (POPULATE_ENTER_RETRY, POPULATE_EXIT_COUNTED),
        HookSet::Tracepoint => (POPULATE_ENTER, POPULATE_EXIT_COUNTED_RB),
        _ => (POPULATE_ENTER, POPULATE_EXIT),
    };
    let mut attached = Vec::new();
    for (index, name) in populate::NAMES.iter().enumerate() {
        if index == populate::OTHER || populate_nrs()[index] == u32::MAX {
            continue;
        }
        let enter = format!("sys_enter_{name}");
        let exit = format!("sys_exit_{name}");
        if !Path::new(TRACEFS)
            .join("events/syscalls")
            .join(&enter)
            .exists()
        {
            continue;
        }
        attach_syscall(ebpf, enter_program, &enter)?;
        attach_syscall(ebpf, exit_program, &exit)?;
        attached.push((*name).to_string());
    }
    Ok(vec![format!(
        "tracepoints syscalls:sys_{{enter,exit}}_{{{}}}",
        attached.join(",")
    )])
}

/// Attaches program `name` to `syscalls:tp`, loading it the first time (one program serves
/// several tracepoints).
fn attach_syscall(ebpf: &mut Ebpf, name: &str, tp: &str) -> Result<()> {
    let program: &mut TracePoint = program(ebpf, name)?.try_into()?;
    if program.fd().is_err() {
        program
            .load()
            .map_err(|e| hook_refused(name, "tracepoint", e))?;
    }
    program
        .attach("syscalls", tp)
        .map_err(|e| hook_refused(tp, "tracepoint", e))?;
    Ok(())
}

//! Where every family's system-call handlers run (see
//! [`memlock_trace_common::syscall_hooks`]): fentry/fexit programs of their own on each
//! hooked call's kernel function where the kernel allows trampolines, so that no other call
//! pays; else programs of their own on each hooked call's `syscalls:sys_{enter,exit}_*`
//! events, which other calls pay only the kernel's test of a bit for; else (no
//! `bpf_task_pt_regs` or no `bpf_find_vma`) the two raw `sys_enter`/`sys_exit` tracepoint
//! dispatchers, which run at every system call of the machine. The first attach decides,
//! for the whole object: the first of these its call's program loads for is used from then
//! on.

use std::path::Path;

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Btf, Ebpf,
    maps::Array,
    programs::{BtfTracePoint, FEntry, FExit, ProgramError, TracePoint, TracePointError},
};
use memlock_trace_common::{names, syscall_hooks};

use super::{Refused, hook_refused, load_side_by_side, program};
use crate::{arch::SYSCALL_FUNCTION_PREFIX, btf::KernelBtf};

/// A system call's entry or exit: fentry or fexit of its function, or the raw tracepoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyscallEdge {
    Enter,
    Exit,
}

impl SyscallEdge {
    /// The tracepoint's name, as tp_btf knows it.
    fn tracepoint(self) -> &'static str {
        match self {
            SyscallEdge::Enter => "sys_enter",
            SyscallEdge::Exit => "sys_exit",
        }
    }

    /// The program that runs the handlers at this edge of every call (`memlock-trace-ebpf`'s
    /// `syscall_dispatch`): the build with the `bpf_find_vma` handlers where the kernel has it.
    fn dispatcher(self, find_vma: bool) -> &'static str {
        match (self, find_vma) {
            (SyscallEdge::Enter, false) => "syscall_enter",
            (SyscallEdge::Enter, true) => "syscall_enter_find_vma",
            (SyscallEdge::Exit, false) => "syscall_exit",
            (SyscallEdge::Exit, true) => "syscall_exit_find_vma",
        }
    }

    /// The program on this edge's event of every hooked call (`bpf_find_vma` build only).
    fn event_program(self) -> &'static str {
        match self {
            SyscallEdge::Enter => "syscall_enter_event",
            SyscallEdge::Exit => "syscall_exit_event",
        }
    }

    /// The fentry or fexit program of the call `name` alone.
    fn call_program(self, name: &str, find_vma: bool) -> String {
        let build = if find_vma { "_fv" } else { "" };
        format!("sys_{name}_{}{build}", self.word())
    }

    fn word(self) -> &'static str {
        match self {
            SyscallEdge::Enter => "enter",
            SyscallEdge::Exit => "exit",
        }
    }

    /// The handlers' bits that run at this edge.
    fn handlers(self) -> u32 {
        match self {
            SyscallEdge::Enter => syscall_hooks::hook::AT_ENTER,
            SyscallEdge::Exit => !syscall_hooks::hook::AT_ENTER,
        }
    }
}

/// How the syscall handlers are attached, for the hook lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyscallVia {
    /// fentry/fexit on each call's function.
    Fentry,
    /// The per-call `syscalls:sys_{enter,exit}_*` events.
    Tracepoints,
    /// The raw tracepoints' dispatchers.
    RawTracepoints,
}

/// The kernel's reason for refusing the last fentry program on a call's function that
/// decided an object's syscall hooks (the same for every object of this process: one
/// kernel), for the syscall family's hook line.
static FENTRY_REFUSED: std::sync::Mutex<Option<Refused>> = std::sync::Mutex::new(None);

/// The same for the program on a call's event, where the dispatchers took over.
static EVENT_REFUSED: std::sync::Mutex<Option<Refused>> = std::sync::Mutex::new(None);

/// Why the syscall hooks are on the raw tracepoints, if an object tried fentry.
pub fn fentry_refusal() -> Option<Refused> {
    FENTRY_REFUSED.lock().map_or(None, |r| r.clone())
}

impl SyscallVia {
    /// The hooks of the calls numbered `nrs` at `edge` (both edges: `None`), for a family's
    /// hook line: `fentry/fexit __x64_sys_{mlock,munlock}`, `tracepoint
    /// syscalls:sys_{enter,exit}_{mlock,munlock}` or `tp_btf raw_syscalls:sys_{enter,exit}
    /// for mlock, munlock`.
    pub fn describe(self, edge: Option<SyscallEdge>, nrs: &[u32]) -> String {
        let calls = call_names(nrs);
        // `PREFIX{a,b}`, or `PREFIXa` for one call.
        let each = |prefix: &str| match calls.as_slice() {
            [one] => format!("{prefix}{one}"),
            _ => format!("{prefix}{{{}}}", calls.join(",")),
        };
        match self {
            SyscallVia::Fentry => {
                let kind = match edge {
                    None => "fentry/fexit",
                    Some(SyscallEdge::Enter) => "fentry",
                    Some(SyscallEdge::Exit) => "fexit",
                };
                each(&format!("{kind} {SYSCALL_FUNCTION_PREFIX}"))
            }
            SyscallVia::Tracepoints => {
                let at = edge.map_or("{enter,exit}", SyscallEdge::word);
                each(&format!("tracepoint syscalls:sys_{at}_"))
            }
            SyscallVia::RawTracepoints => {
                let at = match edge {
                    None => "sys_{enter,exit}",
                    Some(edge) => edge.tracepoint(),
                };
                format!("tp_btf raw_syscalls:{at} for {}", calls.join(", "))
            }
        }
    }

    /// Why fentry is not used, if it was refused, with its words for one family's hook
    /// line: ` (fentry on __x64_sys_* refused: REASON)`, and where the dispatchers are, why
    /// the calls' events are not.
    pub fn refused(self) -> Option<(Refused, String)> {
        if self == SyscallVia::Fentry {
            return None;
        }
        let refused = fentry_refusal()?;
        let mut words = format!(
            " (fentry on {SYSCALL_FUNCTION_PREFIX}* refused: {}",
            refused.reason
        );
        let event = EVENT_REFUSED.lock().map_or(None, |r| r.clone());
        if let (SyscallVia::RawTracepoints, Some(event)) = (self, event) {
            words += &format!("; syscalls:* events: {}", event.reason);
        }
        words.push(')');
        Some((refused, words))
    }

    /// The hook set's kind, for the build info.
    pub fn set(self) -> &'static str {
        match self {
            SyscallVia::Fentry => "fentry/fexit",
            SyscallVia::Tracepoints => "tracepoint",
            SyscallVia::RawTracepoints => "tp_btf",
        }
    }
}

/// The names of the calls numbered `nrs` (`?` for one without programs of its own, which
/// [`attach_syscall_hook`] refuses to hook).
pub fn call_names(nrs: &[u32]) -> Vec<&'static str> {
    nrs.iter()
        .map(|&nr| call(nr).map_or("?", |(name, _)| name))
        .collect()
}

/// The call numbered `nr` (`libc::SYS_*`, the target's own) among those with programs of
/// their own ([`syscall_hooks::calls::ALL`]), and the handlers' bits they can run.
fn call(nr: u32) -> Option<(&'static str, u32)> {
    let known: [(libc::c_long, &str); 16] = [
        (libc::SYS_mlock, "mlock"),
        (libc::SYS_mlock2, "mlock2"),
        (libc::SYS_munlock, "munlock"),
        (libc::SYS_mlockall, "mlockall"),
        (libc::SYS_munlockall, "munlockall"),
        (libc::SYS_mmap, "mmap"),
        (libc::SYS_mremap, "mremap"),
        (libc::SYS_brk, "brk"),
        (libc::SYS_madvise, "madvise"),
        (libc::SYS_mprotect, "mprotect"),
        (libc::SYS_pkey_mprotect, "pkey_mprotect"),
        (libc::SYS_remap_file_pages, "remap_file_pages"),
        (libc::SYS_execve, "execve"),
        (libc::SYS_execveat, "execveat"),
        (libc::SYS_munmap, "munmap"),
        (libc::SYS_exit_group, "exit_group"),
    ];
    let (_, name) = known.into_iter().find(|&(n, _)| n as u32 == nr)?;
    syscall_hooks::calls::ALL
        .into_iter()
        .find(|&(n, _)| n == name)
}

/// The handlers' bits this kernel's families can set, for the programs' read-only
/// `SYSCALL_HOOKS_POSSIBLE`: each family picks an rbtree walk only on a kernel without
/// `bpf_find_vma` (the range check, the populating calls) or without the maple tree (the
/// VMA family). [`crate::object::AttachContext::syscall_hook`] refuses any other bit.
pub fn possible_hooks(btf: &KernelBtf) -> u32 {
    if btf.has_find_vma() && btf.has_maple_tree() {
        !syscall_hooks::hook::RB_WALK
    } else {
        u32::MAX
    }
}

/// Has the handler whose bit is `hook` run at `edge` of the calls numbered `nrs`: the calls
/// are marked in `SYSCALL_HOOKS`, and their fentry or fexit programs, or their events'
/// programs, loaded and attached (or, where the kernel refuses both, both edges'
/// dispatching programs, once).
pub fn attach_syscall_hook(
    ebpf: &mut Ebpf,
    btf: &Btf,
    find_vma: bool,
    edge: SyscallEdge,
    hook: u32,
    nrs: &[u32],
) -> Result<SyscallVia> {
    if !find_vma && hook & syscall_hooks::hook::NEED_FIND_VMA != 0 {
        bail!("syscall handler {hook:#x} needs bpf_find_vma, which this kernel lacks");
    }
    if hook & edge.handlers() != hook {
        bail!(
            "syscall handler {hook:#x} does not run at the call's {}",
            edge.word()
        );
    }
    let mut calls = Vec::with_capacity(nrs.len());
    for &nr in nrs {
        let (name, can) =
            call(nr).ok_or_else(|| anyhow!("system call {nr} has no programs of its own"))?;
        if can & hook != hook {
            bail!("the programs of {name} cannot run syscall handler {hook:#x}");
        }
        calls.push((nr, name));
    }
    // The calls that had no handler at this edge yet: where the calls' events are used,
    // theirs is attached now.
    let mut first_here = Vec::new();
    {
        let map = ebpf
            .map_mut(names::SYSCALL_HOOKS)
            .ok_or_else(|| anyhow!("map {} missing from the eBPF object", names::SYSCALL_HOOKS))?;
        let mut hooks: Array<_, u32> = Array::try_from(map)?;
        for &(nr, name) in &calls {
            let bits = hooks.get(&nr, 0).with_context(|| {
                format!(
                    "system call {nr} is past the {} the programs know",
                    hooks.len()
                )
            })?;
            if bits & edge.handlers() == 0 {
                first_here.push((nr, name));
            }
            hooks.set(nr, bits | hook, 0)?;
        }
    }
    let dispatchers = [SyscallEdge::Enter, SyscallEdge::Exit].map(|e| e.dispatcher(find_vma));
    if dispatchers.iter().any(|name| loaded(ebpf, name)) {
        return Ok(SyscallVia::RawTracepoints);
    }
    if EDGES.iter().any(|edge| loaded(ebpf, edge.event_program())) {
        attach_events(ebpf, edge, &first_here)?;
        return Ok(SyscallVia::Tracepoints);
    }
    let mut calls = calls.into_iter();
    if !any_call_loaded(ebpf, find_vma) {
        // The first call decides: a kernel without trampolines refuses them all.
        let Some((_, first)) = calls.next() else {
            return Ok(SyscallVia::Fentry);
        };
        let fentry = edge.call_program(first, find_vma);
        if let Err(refused) = attach_call(ebpf, btf, edge, first, &fentry) {
            if let Ok(mut last) = FENTRY_REFUSED.lock() {
                *last = Some(Refused {
                    reason: format!("{fentry}: {}", refused.reason),
                    too_complex: refused.too_complex,
                });
            }
            let events = if find_vma {
                load_events(ebpf).and_then(|()| attach_events(ebpf, edge, &first_here))
            } else {
                Err(anyhow!("not used without bpf_find_vma (5.17)"))
            };
            if let Err(error) = events {
                if let Ok(mut last) = EVENT_REFUSED.lock() {
                    *last = Some(Refused::of(&error));
                }
                // Whatever was attached goes: the dispatchers run every handler.
                for name in EDGES.map(SyscallEdge::event_program) {
                    let event: Option<&mut TracePoint> =
                        program(ebpf, name).ok().and_then(|p| p.try_into().ok());
                    if let Some(event) = event {
                        let _ = event.unload();
                    }
                }
                attach_dispatchers(ebpf, btf, find_vma)?;
                return Ok(SyscallVia::RawTracepoints);
            }
            return Ok(SyscallVia::Tracepoints);
        }
    }
    for (_, name) in calls {
        let program = edge.call_program(name, find_vma);
        if loaded(ebpf, &program) {
            continue;
        }
        if let Err(refused) = attach_call(ebpf, btf, edge, name, &program) {
            bail!(
                "the kernel refused fentry program `{program}` on {SYSCALL_FUNCTION_PREFIX}{name}: {}",
                refused.reason
            )
        }
    }
    Ok(SyscallVia::Fentry)
}

const EDGES: [SyscallEdge; 2] = [SyscallEdge::Enter, SyscallEdge::Exit];

fn loaded(ebpf: &Ebpf, name: &str) -> bool {
    ebpf.program(name).is_some_and(|p| p.fd().is_ok())
}

/// Whether any call's fentry or fexit program is loaded (fentry was chosen for this
/// object).
fn any_call_loaded(ebpf: &Ebpf, find_vma: bool) -> bool {
    syscall_hooks::calls::ALL.iter().any(|(name, _)| {
        EDGES
            .iter()
            .any(|edge| loaded(ebpf, &edge.call_program(name, find_vma)))
    })
}

/// Loads both edges' event programs side by side (each carries every family's handlers,
/// as the dispatchers do).
fn load_events(ebpf: &mut Ebpf) -> Result<()> {
    let names = EDGES.map(SyscallEdge::event_program);
    load_side_by_side(ebpf, &names, |name, program| {
        let program: &mut TracePoint = program.try_into()?;
        program
            .load()
            .map_err(|e| hook_refused(name, "tracepoint", e))
    })
}

/// Attaches `edge`'s event program to that edge's event of each of `calls`. A call the
/// kernel does not implement has no event (arm64's `pkey_mprotect` before 6.12: it returns
/// ENOSYS, populating nothing): it is skipped.
fn attach_events(ebpf: &mut Ebpf, edge: SyscallEdge, calls: &[(u32, &str)]) -> Result<()> {
    let name = edge.event_program();
    let program: &mut TracePoint = program(ebpf, name)?.try_into()?;
    for (_, call) in calls {
        let event = format!("sys_{}_{call}", edge.word());
        match program.attach("syscalls", &event) {
            Ok(_) => {}
            Err(error) if no_such_event(&error) => {}
            Err(error) => {
                return Err(hook_refused(name, "tracepoint", error))
                    .with_context(|| format!("attaching it to syscalls:{event}"));
            }
        }
    }
    Ok(())
}

/// Whether attaching failed because the event is not among the `syscalls` events, which
/// are there (not because tracefs is missing).
fn no_such_event(error: &ProgramError) -> bool {
    let ProgramError::TracePointError(TracePointError::FileError { filename, io_error }) = error
    else {
        return false;
    };
    let events = filename.parent().and_then(Path::parent);
    io_error.kind() == std::io::ErrorKind::NotFound && events.is_some_and(Path::is_dir)
}

/// Loads and attaches `program` on fentry or fexit of the call `name`'s function; the
/// kernel's reason in one line if it refuses.
fn attach_call(
    ebpf: &mut Ebpf,
    btf: &Btf,
    edge: SyscallEdge,
    name: &str,
    program_name: &str,
) -> std::result::Result<(), Refused> {
    let function = format!("{SYSCALL_FUNCTION_PREFIX}{name}");
    let found = program(ebpf, program_name).map_err(|e| Refused::of(&e))?;
    // A kernel may load the program and refuse only the trampoline (Debian 12's arm64 6.1,
    // without ftrace direct calls: ENOTSUPP at attach): whatever was refused is unloaded, so
    // that the dispatchers take over as where the load is refused (see `any_call_loaded`).
    let result = match edge {
        SyscallEdge::Enter => {
            let p: &mut FEntry = found.try_into().map_err(|e| Refused::of_program(&e))?;
            let attached = p.load(&function, btf).and_then(|()| p.attach().map(drop));
            attached.inspect_err(|_| drop(p.unload()))
        }
        SyscallEdge::Exit => {
            let p: &mut FExit = found.try_into().map_err(|e| Refused::of_program(&e))?;
            let attached = p.load(&function, btf).and_then(|()| p.attach().map(drop));
            attached.inspect_err(|_| drop(p.unload()))
        }
    };
    result.map_err(|e| Refused::of_program(&e))
}

/// Loads both edges' dispatching programs side by side (see [`load_side_by_side`]; they are
/// the largest to verify, all of every family's handlers) and attaches them.
fn attach_dispatchers(ebpf: &mut Ebpf, btf: &Btf, find_vma: bool) -> Result<()> {
    let edges = [SyscallEdge::Enter, SyscallEdge::Exit];
    let names = edges.map(|edge| edge.dispatcher(find_vma));
    load_side_by_side(ebpf, &names, |name, program| {
        let edge = if name == names[0] { edges[0] } else { edges[1] };
        let program: &mut BtfTracePoint = program.try_into()?;
        program
            .load(edge.tracepoint(), btf)
            .map_err(|e| hook_refused(name, "tp_btf", e))
    })?;
    for name in names {
        let program: &mut BtfTracePoint = program(ebpf, name)?.try_into()?;
        program
            .attach()
            .map_err(|e| hook_refused(name, "tp_btf", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_with_programs_has_a_number() {
        for (name, _) in syscall_hooks::calls::ALL {
            let nr =
                (0..syscall_hooks::MAX_NR).find(|&nr| call(nr).is_some_and(|(n, _)| n == name));
            assert!(nr.is_some(), "{name}");
        }
    }

    #[test]
    fn the_hook_lines_name_the_functions_or_the_tracepoints() {
        let calls = [libc::SYS_mlock, libc::SYS_munlock].map(|nr| nr as u32);
        assert_eq!(
            SyscallVia::Fentry.describe(None, &calls),
            format!("fentry/fexit {SYSCALL_FUNCTION_PREFIX}{{mlock,munlock}}")
        );
        assert_eq!(
            SyscallVia::Fentry.describe(Some(SyscallEdge::Exit), &[libc::SYS_munmap as u32]),
            format!("fexit {SYSCALL_FUNCTION_PREFIX}munmap")
        );
        assert_eq!(
            SyscallVia::RawTracepoints.describe(Some(SyscallEdge::Enter), &calls),
            "tp_btf raw_syscalls:sys_enter for mlock, munlock"
        );
        assert_eq!(
            SyscallVia::Tracepoints.describe(None, &calls),
            "tracepoint syscalls:sys_{enter,exit}_{mlock,munlock}"
        );
        assert_eq!(
            SyscallVia::Tracepoints.describe(Some(SyscallEdge::Exit), &[libc::SYS_munmap as u32]),
            "tracepoint syscalls:sys_exit_munmap"
        );
    }
}

//! Detaching every hook at once when a session ends. Closing the last perf event of a
//! tracepoint waits for RCU grace periods (`perf_trace_event_unreg` calls
//! `tracepoint_synchronize_unregister`, 35-40 ms each here) under the kernel's global
//! `event_mutex`, and closing one link after another waits longer still (72 ms each here: 56
//! links, 3.1 s). Closed from a thread each, the waits outside the mutex overlap (1.1 s).
//! Every thread is started before the first descriptor is closed: unhooking rewrites kernel
//! text (fentry trampolines, tracepoints' jump labels), and a thread's stack set-up runs the
//! functions being rewritten (`vma_modify_flags`, `mas_wr_node_store`): a 6.12 guest Oopsed
//! on the int3 of a half-done rewrite when both overlapped.
//!
//! A session on the calls' `syscalls:*` events (kernels without trampolines) has ~40 such
//! events: 1.5 s of grace periods here, however they are closed. That wait is kept off the
//! user's path: once the summary is out, a child of this process takes the hooks over and
//! closes them after this process has exited, so a launched command's exit status and the
//! shell's prompt come at once.

use std::{os::fd::RawFd, sync::Mutex};

/// This process's hook descriptors, by how they are closed: the fentry/fexit links (their
/// trampolines rewritten one by one), and every other (tracepoints and tp_btf as BPF links,
/// perf events: software events, legacy tracepoints and kprobes, fault counters).
#[derive(Default)]
struct HookFds {
    text_patching: Vec<RawFd>,
    others: Vec<RawFd>,
}

fn hook_fds() -> HookFds {
    let mut fds = HookFds::default();
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return fds;
    };
    for e in entries.filter_map(Result::ok) {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        match target.as_os_str().to_str() {
            Some("anon_inode:bpf_link") if is_tracing_link(fd) => fds.text_patching.push(fd),
            Some("anon_inode:bpf_link" | "anon_inode:[perf_event]") => fds.others.push(fd),
            _ => {}
        }
    }
    fds
}

/// Whether a BPF link is an fentry/fexit one (`link_type: tracing` in its fdinfo). Unknown
/// is taken as yes: closed one after another, slower, never unsafe.
fn is_tracing_link(fd: RawFd) -> bool {
    std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).map_or(true, |info| {
        info.lines()
            .filter_map(|l| l.strip_prefix("link_type:"))
            .any(|t| t.trim() == "tracing")
    })
}

/// Closes `fd`, a hook descriptor whose owner is never dropped (see `Tracer::detach_all`),
/// so nothing closes or uses it again.
fn close(fd: RawFd) {
    // SAFETY: as above: closed once, here.
    unsafe {
        libc::close(fd);
    }
}

/// Closes every hook of this process: in a child that outlives it where one can be made
/// ([`hand_off`]), else here, returning once the kernel has unhooked everything.
pub(crate) fn close_all() {
    let fds = hook_fds();
    if !hand_off(&fds) {
        close_now(&fds);
    }
}

/// Forks a child that keeps only the hook descriptors (and none of this process's output,
/// sockets or maps), waits for this process to exit, then closes them ([`close_now`]) and
/// exits. Returns whether the child was made: then this process's own copies are closed by
/// its exit, at no cost, the child's being the last.
fn hand_off(fds: &HookFds) -> bool {
    // SAFETY: plain system calls; the pidfd is this process's own, closed below or by the
    // child.
    let parent = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) } as RawFd;
    if parent < 0 {
        return false;
    }
    let mut keep: Vec<RawFd> = fds
        .text_patching
        .iter()
        .chain(&fds.others)
        .copied()
        .collect();
    keep.push(parent);
    keep.sort_unstable();
    // SAFETY: the child runs only system calls until this process is gone, then
    // `close_now`: its threads and allocations are glibc's, which the fork leaves usable.
    match unsafe { libc::fork() } {
        0 => in_child(&keep, parent, fds),
        -1 => {
            close(parent);
            false
        }
        _ => {
            close(parent);
            true
        }
    }
}

/// The child of [`hand_off`]: never returns.
fn in_child(keep: &[RawFd], parent: RawFd, hooks: &HookFds) -> ! {
    // SAFETY: system calls on this process's own descriptors; `keep` is sorted and not empty.
    unsafe {
        // Whoever reads this process's output (a pipe, a terminal) sees it end with it.
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        for stdio in 0..3 {
            if null >= 0 {
                libc::dup2(null, stdio);
            } else {
                libc::close(stdio);
            }
        }
        let last = keep[keep.len() - 1];
        for fd in 3..=last {
            if keep.binary_search(&fd).is_err() {
                libc::close(fd);
            }
        }
        libc::syscall(libc::SYS_close_range, last + 1, u32::MAX, 0);
        // The pidfd reads ready once the parent has exited, its descriptors closed.
        let mut gone = libc::pollfd {
            fd: parent,
            events: libc::POLLIN,
            revents: 0,
        };
        while libc::poll(&mut gone, 1, -1) < 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
        // Should a close hang, the kernel closes the rest at the child's death.
        libc::alarm(30);
    }
    close_now(hooks);
    // SAFETY: ends the child without running this process's exit handlers twice.
    unsafe { libc::_exit(0) }
}

/// Closes `fds`: a thread for each link and perf event, all started and waiting at a gate;
/// then the fentry/fexit links one after another (their trampolines are rewritten one by
/// one anyway); then the gate opens and the rest close together.
fn close_now(fds: &HookFds) {
    let HookFds {
        text_patching,
        others,
    } = fds;
    let gate = Mutex::new(());
    let closed = gate.lock().unwrap_or_else(|e| e.into_inner());
    std::thread::scope(|scope| {
        let mut inline = Vec::new();
        for &fd in others {
            let gate = &gate;
            let waiting = move || {
                drop(gate.lock());
                close(fd);
            };
            // Without a thread to spare, after the others: slower, never wrong.
            if std::thread::Builder::new()
                .spawn_scoped(scope, waiting)
                .is_err()
            {
                inline.push(fd);
            }
        }
        text_patching.iter().copied().for_each(close);
        drop(closed);
        inline.into_iter().for_each(close);
    });
}

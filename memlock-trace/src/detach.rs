//! Detaching every hook at once when a session ends. Closing the last perf event of a
//! tracepoint waits for RCU grace periods (`perf_trace_event_unreg` calls
//! `tracepoint_synchronize_unregister`, 35-40 ms each here) under the kernel's global
//! `event_mutex`, and closing one link after another waits longer still (72 ms each here: 56
//! links, 3.1 s). Closed from a thread each, the waits outside the mutex overlap (1.1 s).
//! Every thread is started before the first descriptor is closed: unhooking rewrites kernel
//! text (fentry trampolines, tracepoints' jump labels), and a thread's stack set-up runs the
//! functions being rewritten (`vma_modify_flags`, `mas_wr_node_store`): a 6.12 guest Oopsed
//! on the int3 of a half-done rewrite when both overlapped.

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

/// Closes every hook of this process: a thread for each link and perf event, all started
/// and waiting at a gate; then the fentry/fexit links one after another (their trampolines
/// are rewritten one by one anyway); then the gate opens and the rest close together.
/// Returns once the kernel has unhooked everything.
pub(crate) fn close_all() {
    let HookFds {
        text_patching,
        others,
    } = hook_fds();
    let gate = Mutex::new(());
    let closed = gate.lock().unwrap_or_else(|e| e.into_inner());
    std::thread::scope(|scope| {
        let mut inline = Vec::new();
        for fd in others {
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
        text_patching.into_iter().for_each(close);
        drop(closed);
        inline.into_iter().for_each(close);
    });
}

//! Detaching every hook at once when a session ends. Closing the last perf event of a
//! tracepoint waits for RCU grace periods (`perf_trace_event_unreg` calls
//! `tracepoint_synchronize_unregister`, 35-40 ms each here) under the kernel's global
//! `event_mutex`, so a session's few dozen tracepoints take a second to unhook however many
//! threads close them. What can be saved is the waiting on it: the links are closed from
//! their own threads as soon as the session stops, while the last events are read and the
//! summary written; the perf events (counters the summary reads among them) after it.

use std::{os::fd::RawFd, thread::JoinHandle};

/// This process's hook descriptors, by how they are closed: the fentry/fexit links
/// (patched into kernel text), every other BPF link (tracepoints, tp_btf), the perf events
/// (software events, legacy tracepoints and kprobes, fault counters).
#[derive(Default)]
struct HookFds {
    text_patching: Vec<RawFd>,
    links: Vec<RawFd>,
    perf_events: Vec<RawFd>,
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
            Some("anon_inode:bpf_link") => fds.links.push(fd),
            Some("anon_inode:[perf_event]") => fds.perf_events.push(fd),
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

/// Closes `fd`, a hook descriptor whose owner is never dropped (see `Tracer::start_detaching`),
/// so nothing closes or uses it again.
fn close(fd: RawFd) {
    // SAFETY: as above: closed once, here.
    unsafe {
        libc::close(fd);
    }
}

fn close_concurrently(fds: &[RawFd]) {
    std::thread::scope(|scope| {
        for &fd in fds {
            // Without a thread to spare, inline: slower, never wrong.
            if std::thread::Builder::new()
                .spawn_scoped(scope, move || close(fd))
                .is_err()
            {
                close(fd);
            }
        }
    });
}

/// Starts unhooking: the fentry/fexit links now, one after another, before any thread is
/// started (unlinking one rewrites the hooked function's text, and a new thread's stack
/// set-up runs hooked functions such as `vma_modify_flags`: an Oops at
/// `vma_modify_flags+0x5` in a 6.12 guest when both overlapped); then the other links
/// concurrently, on a thread of their own, while the caller goes on.
pub(crate) fn start() -> Option<JoinHandle<()>> {
    let HookFds {
        text_patching,
        links,
        ..
    } = hook_fds();
    text_patching.into_iter().for_each(close);
    let on_thread = links.clone();
    let thread = std::thread::Builder::new()
        .name("detach".into())
        .spawn(move || close_concurrently(&on_thread));
    // Without a thread to spare, here and now.
    thread.map_err(|_| close_concurrently(&links)).ok()
}

/// Ends unhooking: the perf events, concurrently, then waits for the links [`start`] closes.
pub(crate) fn finish(links: Option<JoinHandle<()>>) {
    close_concurrently(&hook_fds().perf_events);
    if let Some(links) = links {
        let _ = links.join();
    }
}

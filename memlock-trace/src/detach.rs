//! Detaching every hook at once when a session ends. Closing the last perf event of a
//! tracepoint waits for RCU grace periods (`perf_trace_event_unreg` calls
//! `tracepoint_synchronize_unregister`, tens of milliseconds on a small VM), and aya closes
//! one link after another: a session's few dozen tracepoints cost seconds between the
//! summary and the exit. Closed from a thread each, the waits overlap, since the kernel
//! serves concurrent waiters with the same grace periods.

use std::os::fd::RawFd;

/// The links of this process's hooks: its BPF links (tp_btf, fentry: patched into kernel
/// text) and its perf events (tracepoints, software events).
fn hook_fds() -> (Vec<RawFd>, Vec<RawFd>) {
    let (mut links, mut perf_events) = (Vec::new(), Vec::new());
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return (links, perf_events);
    };
    for e in entries.filter_map(Result::ok) {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        match std::fs::read_link(e.path()) {
            Ok(t) if t.as_os_str() == "anon_inode:bpf_link" => links.push(fd),
            Ok(t) if t.as_os_str() == "anon_inode:[perf_event]" => perf_events.push(fd),
            _ => {}
        }
    }
    (links, perf_events)
}

/// Closes every hook link of this process; returns how many. The BPF links first, one after
/// another, before any thread is started: unlinking an fentry program rewrites the hooked
/// function's text, and a new thread's stack set-up (mmap, mprotect) runs hooked functions
/// such as `vma_modify_flags` (an Oops at `vma_modify_flags+0x5` in a 6.12 guest when both
/// overlapped). Then the perf events concurrently, a thread each. The objects that owned
/// those descriptors must never be dropped afterwards (see `Tracer::detach_all`).
pub(crate) fn close_hooks_concurrently() -> usize {
    let (links, perf_events) = hook_fds();
    for &fd in &links {
        // SAFETY: `fd` is one of this process's hook links, closed once, here; its owner is
        // forgotten by the caller, so nothing closes or uses it again.
        unsafe {
            libc::close(fd);
        }
    }
    std::thread::scope(|scope| {
        for &fd in &perf_events {
            // SAFETY: as above, for a perf event.
            let close = move || unsafe {
                libc::close(fd);
            };
            // Without a thread to spare, inline: slower, never wrong.
            if std::thread::Builder::new()
                .spawn_scoped(scope, close)
                .is_err()
            {
                close();
            }
        }
    });
    links.len() + perf_events.len()
}

//! Detaching every hook at once when a session ends. Closing the last perf event of a
//! tracepoint waits for RCU grace periods (`perf_trace_event_unreg` calls
//! `tracepoint_synchronize_unregister`, tens of milliseconds on a small VM), and aya closes
//! one link after another: a session's few dozen tracepoints cost seconds between the
//! summary and the exit. Closed from a thread each, the waits overlap, since the kernel
//! serves concurrent waiters with the same grace periods.

use std::os::fd::RawFd;

/// The links of this process's hooks: its perf events (tracepoints, software events) and
/// BPF links (tp_btf, fentry).
fn hook_fds() -> Vec<RawFd> {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|target| {
                let target = target.to_string_lossy();
                target == "anon_inode:[perf_event]" || target == "anon_inode:bpf_link"
            })
        })
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Closes every hook link of this process concurrently; returns how many. The objects that
/// owned those descriptors must never be dropped afterwards (see `Tracer::detach_all`).
pub(crate) fn close_hooks_concurrently() -> usize {
    let fds = hook_fds();
    std::thread::scope(|scope| {
        for &fd in &fds {
            // SAFETY: `fd` is one of this process's hook links, closed once, here; its owner
            // is forgotten by the caller, so nothing closes or uses it again.
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
    fds.len()
}

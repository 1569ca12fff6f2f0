//! What the session traces, said in words: the thread group of `-t`, whether the targets are
//! specific processes, and the note that names them.

use anyhow::Result;

use crate::{UsageError, cli::TraceArgs, output::Outside};

/// The process `tid` belongs to (`Tgid:` in /proc/TID/status).
pub(super) fn thread_group(tid: u32) -> Result<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()
        .filter(|_| tid != 0);
    status
        .as_deref()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Tgid:")))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| {
            UsageError(format!(
                "no thread with tid {tid}: give -t a thread id listed under /proc/PID/task/"
            ))
            .into()
        })
}

pub(super) fn targets_are_specific(args: &TraceArgs) -> bool {
    !args.pids.is_empty() || !args.command.is_empty()
}

pub(super) fn describe_targets(args: &TraceArgs, launched: Option<u32>) -> String {
    let mut parts: Vec<String> = match args.tid {
        Some(tid) => args
            .pids
            .iter()
            .map(|p| format!("thread {tid} of pid {p}"))
            .collect(),
        None => args.pids.iter().map(|p| format!("pid {p}")).collect(),
    };
    if let (Some(pid), Some(cmd)) = (launched, args.command.first()) {
        // The user's own words, but a name can hold anything: escaped like any other.
        let user = args
            .user
            .as_deref()
            .map_or_else(String::new, |u| format!(", as user {}", Outside::from(u)));
        parts.push(format!(
            "`{}` (pid {pid}{user})",
            Outside::from(cmd.as_os_str())
        ));
    }
    if parts.is_empty() {
        "all processes (Ctrl-C to stop)".into()
    } else {
        parts.join(", ")
    }
}

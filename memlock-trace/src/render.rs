//! Human-readable and JSON output.

use std::fmt::Write as _;

use serde_json::json;

use crate::{aggregate::Summary, decode::SyscallRecord, syscall::errno_name};

/// Version of the JSON lines (`"schema"` in every line). Adding a field keeps it; renaming,
/// removing or retyping one bumps it. Documented in the README.
pub const JSON_SCHEMA: u32 = 1;

/// `us` with one decimal below 10 ms, then ms.
pub fn duration(ns: u64) -> String {
    if ns < 10_000_000 {
        format!("{:.1}us", ns as f64 / 1e3)
    } else {
        format!("{:.1}ms", ns as f64 / 1e6)
    }
}

/// One line per call for `--events`.
pub fn syscall_line(rec: &SyscallRecord) -> String {
    let r = &rec.raw;
    let result = match errno_name(r.ret) {
        Some(errno) => format!("-1 {errno}"),
        None => r.ret.to_string(),
    };
    format!(
        "{pid:>7}/{tid:<7} {comm:<16} {call} = {result}  {lat}  populated {pop} pages, locked_vm {locked:+} pages, VMAs {vb} -> {va}",
        pid = r.tgid,
        tid = r.tid,
        comm = rec.comm(),
        call = rec.syscall.describe(r.args),
        lat = duration(r.duration_ns),
        pop = rec.pages_populated(),
        locked = rec.pages_locked(),
        vb = r.map_count_before,
        va = r.map_count_after,
    )
}

/// One JSON line per call for `--events --json`.
pub fn syscall_json(rec: &SyscallRecord) -> serde_json::Value {
    let r = &rec.raw;
    json!({
        "type": "syscall",
        "schema": JSON_SCHEMA,
        "pid": r.tgid,
        "tid": r.tid,
        "comm": rec.comm(),
        "syscall": rec.syscall.name(),
        "args": rec.syscall.describe(r.args),
        "raw_args": r.args,
        "ret": r.ret,
        "errno": errno_name(r.ret),
        "latency_ns": r.duration_ns,
        "pages_populated": rec.pages_populated(),
        "min_flt": r.min_flt,
        "maj_flt": r.maj_flt,
        "pages_locked": rec.pages_locked(),
        "locked_vm_before": r.locked_vm_before,
        "locked_vm_after": r.locked_vm_after,
        "map_count_before": r.map_count_before,
        "map_count_after": r.map_count_after,
    })
}

pub fn summary_text(summary: &Summary) -> String {
    let mut out = String::new();
    if summary.processes.is_empty() {
        out.push_str("no mlock-family calls traced\n");
    }
    for p in &summary.processes {
        // A reused pid: the start time tells the processes apart.
        let started = if summary.processes.iter().filter(|q| q.pid == p.pid).count() > 1 {
            format!(", started {:.3}s after boot", p.start_ns as f64 / 1e9)
        } else {
            String::new()
        };
        let _ = writeln!(out, "pid {} ({}){started}", p.pid, p.comm);
        let _ = writeln!(
            out,
            "  {:<11} {:>7}  {:>9} {:>9} {:>9} {:>9}  {:>10} {:>10}  errors",
            "syscall", "calls", "p50", "p90", "p99", "max", "populated", "locked"
        );
        for (name, s) in &p.syscalls {
            let errors = if s.errors.is_empty() {
                "-".to_string()
            } else {
                s.errors
                    .iter()
                    .map(|(e, n)| format!("{e} x{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                out,
                "  {:<11} {:>7}  {:>9} {:>9} {:>9} {:>9}  {:>10} {:>+10}  {}",
                name,
                s.count,
                duration(s.latency_ns.p50),
                duration(s.latency_ns.p90),
                duration(s.latency_ns.p99),
                duration(s.latency_ns.max),
                s.pages_populated,
                s.pages_locked,
                errors
            );
        }
    }
    let h = &summary.health;
    let _ = writeln!(
        out,
        "dropped events: {}{}",
        h.dropped_events,
        if h.untracked_calls + h.failed_reads + h.dropped_vma_records > 0 {
            format!(
                " (calls not tracked: {}, failed kernel reads: {}, VMA records dropped: {})",
                h.untracked_calls, h.failed_reads, h.dropped_vma_records
            )
        } else {
            String::new()
        }
    );
    let p = &h.processes;
    if p.children_not_followed + p.evicted_processes > 0 {
        let _ = writeln!(
            out,
            "children not followed (target map full): {}, processes evicted from this summary \
             (--max-processes): {}",
            p.children_not_followed, p.evicted_processes
        );
    }
    out
}

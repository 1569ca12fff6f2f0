//! Human-readable and JSON output.

use std::fmt::Write as _;

use serde_json::json;

use crate::{
    aggregate::Summary,
    decode::{FaultRecord, SyscallRecord},
    faults::{FaultHooks, FaultSummary},
    syscall::errno_name,
};

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

/// One line per sampled fault for `--events`.
pub fn fault_line(rec: &FaultRecord) -> String {
    let r = &rec.raw;
    let mut line = format!(
        "{pid:>7}/{tid:<7} {comm:<16} fault {kind} {addr:#x}",
        pid = r.tgid,
        tid = r.tid,
        comm = rec.comm(),
        kind = rec.kind(),
        addr = r.address,
    );
    if let Some(call) = rec.syscall() {
        let _ = write!(line, " populated by {call}");
        if r.count != 1 {
            let _ = write!(line, " ({} pages)", r.count);
        }
    }
    if let Some(ns) = rec.latency_ns() {
        let _ = write!(line, "  {}", duration(ns));
    }
    if rec.has(memlock_trace_common::faults::fault_flags::RETRIED) {
        line.push_str("  retried");
    }
    match rec.locked() {
        Some((true, _)) => line.push_str("  VM_LOCKED"),
        Some((_, true)) => line.push_str("  VM_LOCKONFAULT"),
        _ => {}
    }
    let _ = write!(line, "  cpu {}", r.cpu);
    line
}

/// One JSON line per sampled fault for `--events --json`.
pub fn fault_json(rec: &FaultRecord) -> serde_json::Value {
    let r = &rec.raw;
    use memlock_trace_common::faults::fault_flags;
    json!({
        "type": "fault",
        "schema": JSON_SCHEMA,
        "pid": r.tgid,
        "tid": r.tid,
        "comm": rec.comm(),
        "kind": rec.kind(),
        "address": format!("{:#x}", r.address),
        "populated": rec.has(fault_flags::POPULATED),
        "syscall": rec.syscall(),
        "pages": r.count,
        "retried": rec.has(fault_flags::RETRIED),
        "latency_ns": rec.latency_ns(),
        "vm_locked": rec.locked().map(|(l, _)| l),
        "vm_lockonfault": rec.locked().map(|(_, f)| f),
        "cpu": r.cpu,
        "time_ns": r.time_ns,
    })
}

/// The hook set line: which hooks, and why better ones were refused.
pub fn fault_hooks_text(hooks: &FaultHooks) -> String {
    let mut out = format!(
        "page faults traced with {} hooks{}",
        hooks.hook_set.name(),
        if hooks.latency { "" } else { " (counts only)" }
    );
    for r in &hooks.refused {
        let reason = r.reason.lines().next().unwrap_or_default();
        let _ = write!(out, "\n  {} refused: {reason}", r.hook_set.name());
    }
    if !hooks.unobserved.is_empty() {
        let _ = write!(
            out,
            "\n  not observable with these hooks: {}",
            hooks.unobserved.join(", ")
        );
    }
    out.push('\n');
    out
}

fn or_na(v: Option<u64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| v.to_string())
}

/// The faults block of one process (or thread), indented.
pub fn faults_text(out: &mut String, f: &FaultSummary, indent: &str) {
    let mut populated_by: Vec<String> = f
        .populated_by
        .iter()
        .map(|(c, n)| format!("{c} {n}"))
        .collect();
    if populated_by.is_empty() {
        populated_by.push("-".into());
    }
    let _ = writeln!(
        out,
        "{indent}page faults: {} minor, {} major = {} user + {} populated ({}); retried {}, failed {}",
        f.minor,
        f.major,
        f.user,
        f.populated,
        populated_by.join(", "),
        or_na(f.retried),
        or_na(f.failed),
    );
    if let (Some(locked), Some(onfault)) = (f.in_locked_vma, f.in_lockonfault_vma) {
        let _ = writeln!(
            out,
            "{indent}  in VM_LOCKED VMAs: {locked}, in VM_LOCKONFAULT VMAs: {onfault}"
        );
    }
    if !f.latency_ns.is_empty() {
        let _ = writeln!(
            out,
            "{indent}  {:<10} {:>9}  {:>9} {:>9} {:>9} {:>9} {:>9}",
            "latency", "faults", "p50", "p90", "p99", "p99.9", "max"
        );
        for (class, l) in &f.latency_ns {
            let _ = writeln!(
                out,
                "{indent}  {:<10} {:>9}  {:>9} {:>9} {:>9} {:>9} {:>9}",
                class,
                l.count,
                duration(l.p50),
                duration(l.p90),
                duration(l.p99),
                duration(l.p99_9),
                duration(l.max)
            );
        }
        if f.latency_unmatched > 0 {
            let _ = writeln!(
                out,
                "{indent}  ({} faults counted without a latency: start not seen)",
                f.latency_unmatched
            );
        }
    }
    if !f.by_mapping.is_empty() {
        let _ = writeln!(out, "{indent}  {:>9}  {:<14}  mapping", "faults", "locked");
        for m in &f.by_mapping {
            let locked = match (m.locked, m.lockonfault) {
                (Some(true), Some(true)) => "LOCKONFAULT",
                (Some(true), _) => "VM_LOCKED",
                (Some(false), _) => "no",
                (None, _) => "?",
            };
            let source = if m.locked_source == "unknown" {
                ""
            } else {
                m.locked_source
            };
            let range = if m.end.is_empty() {
                m.start.clone()
            } else {
                format!("{}-{}", m.start, m.end)
            };
            let _ = writeln!(
                out,
                "{indent}  {:>9}  {:<14}  {} {range}",
                m.faults,
                format!("{locked} ({source})").replace(" ()", ""),
                m.mapping,
            );
        }
    }
}

/// Frames of a stack shown in the text summary (the JSON has them all).
const TEXT_FRAMES: usize = 16;

/// `--stacks`: a process's top stacks, innermost frame first.
fn stacks_text(out: &mut String, stacks: &[crate::stacks::StackFaults], indent: &str) {
    let _ = writeln!(
        out,
        "{indent}  {:>9}  user call stack (innermost first)",
        "faults"
    );
    if stacks.is_empty() {
        let _ = writeln!(out, "{indent}  {:>9}  (no stack recorded)", "-");
    }
    for stack in stacks {
        let mut count = stack.faults.to_string();
        for frame in stack.frames.iter().take(TEXT_FRAMES) {
            let place = match (&frame.file, frame.line) {
                (Some(file), Some(line)) => format!("  {file}:{line}"),
                (Some(file), None) => format!("  {file}"),
                _ => String::new(),
            };
            let inlined = if frame.inlined { " (inlined)" } else { "" };
            let _ = writeln!(
                out,
                "{indent}  {count:>9}  {}{inlined}{place}",
                frame.symbol
            );
            count.clear();
        }
        if stack.frames.len() > TEXT_FRAMES {
            let _ = writeln!(
                out,
                "{indent}  {count:>9}  ... {} more frames",
                stack.frames.len() - TEXT_FRAMES
            );
        } else if stack.frames.is_empty() {
            let _ = writeln!(out, "{indent}  {count:>9}  (stack not found)");
        }
    }
}

pub fn summary_text(summary: &Summary) -> String {
    let mut out = String::new();
    if let Some(hooks) = &summary.fault_hooks {
        out.push_str(&fault_hooks_text(hooks));
    }
    if summary.processes.is_empty() {
        out.push_str("no mlock-family calls or page faults traced\n");
    }
    for p in &summary.processes {
        // A reused pid: the start time tells the processes apart.
        let started = if summary.processes.iter().filter(|q| q.pid == p.pid).count() > 1 {
            format!(", started {:.3}s after boot", p.start_ns as f64 / 1e9)
        } else {
            String::new()
        };
        let _ = writeln!(out, "pid {} ({}){started}", p.pid, p.comm);
        if let Some(f) = &p.faults {
            faults_text(&mut out, f, "  ");
            if let Some(stacks) = &f.stacks {
                stacks_text(&mut out, stacks, "  ");
            }
            for t in &f.threads {
                let _ = writeln!(out, "  thread {} ({})", t.tid, t.comm);
                faults_text(&mut out, &t.faults, "    ");
            }
        }
        if p.syscalls.is_empty() {
            continue;
        }
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
    if let Some(f) = &summary.fault_health {
        let _ = writeln!(
            out,
            "fault maps: {} processes evicted, {} histograms evicted, {} regions evicted, {} updates failed, {} fault events dropped",
            f.stats_evicted,
            f.histograms_evicted,
            f.regions_evicted,
            f.update_failed,
            f.events_dropped
        );
        if let (Some(dropped), Some(evicted)) = (f.stacks_dropped, f.stacks_evicted) {
            let _ = writeln!(
                out,
                "fault stacks: {dropped} faults without a recorded stack, {evicted} stack counts evicted"
            );
        }
    }
    out
}

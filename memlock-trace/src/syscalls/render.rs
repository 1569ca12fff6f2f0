//! Syscall events as text lines and JSON (`--events`), and the per-process syscall table.

use std::{collections::BTreeMap, fmt::Write as _};

use serde_json::json;

use super::{stats::SyscallSummary, why::LockFigures};
use crate::{
    event::{SyscallRecord, errno_name},
    output::{JSON_SCHEMA, Unit, hist::Log2Hist},
    symbolize::TEXT_FRAMES,
};

/// The latency histogram of each call (`--hist`), under the table.
pub fn hists(
    out: &mut String,
    calls: &BTreeMap<&'static str, Vec<(u64, u64)>>,
    unit: Unit,
    indent: &str,
) {
    // libbpf-tools' default: usecs unless -m.
    let unit = if unit == Unit::Ms { Unit::Ms } else { Unit::Us };
    for (name, values) in calls {
        let _ = writeln!(out, "{indent}{name} latency");
        Log2Hist::of(unit, values.iter().copied()).render(out, unit, indent);
    }
}

/// One line per call for `--events`; a failed call says what it was checked against.
pub fn syscall_line(rec: &SyscallRecord, unit: Unit) -> String {
    let r = &rec.raw;
    let result = match errno_name(r.ret) {
        Some(errno) => format!("-1 {errno}: {}", LockFigures::of(rec).describe()),
        None => r.ret.to_string(),
    };
    format!(
        "{pid:>7}/{tid:<7} {comm:<16} {call} = {result}  {lat}  populated {pop}, locked_vm {locked:+} pages, map_count {vb} -> {va}",
        pid = r.tgid,
        tid = r.tid,
        comm = rec.name(),
        call = rec.syscall.describe(r.args),
        lat = unit.fit([r.duration_ns]).format(r.duration_ns),
        pop = populated(rec.pages_populated(), rec.faults_populated()),
        locked = rec.pages_locked(),
        vb = r.map_count_before,
        va = r.map_count_after,
    )
}

/// `N pages`, base pages; where huge pages made them fewer faults, also the bytes and the
/// faults: `16384 pages (64 MiB) in 32 faults`.
pub fn populated(pages: u64, faults: u64) -> String {
    if pages == faults {
        format!("{pages} pages")
    } else {
        format!(
            "{pages} pages ({}) in {faults} faults",
            super::why::size(pages * crate::procfs::PAGE_SIZE)
        )
    }
}

/// One JSON line per call for `--events --json`.
pub fn syscall_json(rec: &SyscallRecord) -> serde_json::Value {
    let r = &rec.raw;
    let why = LockFigures::of(rec);
    json!({
        "type": "syscall",
        "schema": JSON_SCHEMA,
        "pid": r.tgid,
        "tid": r.tid,
        "comm": rec.name(),
        "syscall": rec.syscall.name(),
        "args": rec.syscall.describe(r.args),
        "raw_args": r.args,
        "ret": r.ret,
        "errno": errno_name(r.ret),
        "latency_ns": r.duration_ns,
        "pages_populated": rec.pages_populated(),
        "bytes_populated": rec.pages_populated() * crate::procfs::PAGE_SIZE,
        "faults_populated": rec.faults_populated(),
        "min_flt": r.min_flt,
        "maj_flt": r.maj_flt,
        "pages_locked": rec.pages_locked(),
        "locked_vm_before": r.locked_vm_before,
        "locked_vm_after": r.locked_vm_after,
        "map_count_before": r.map_count_before,
        "map_count_after": r.map_count_after,
        "rlimit_memlock_bytes": why.rlimit_memlock_bytes,
        "rlimit_memlock_unlimited": why.rlimit_memlock_unlimited,
        "locked_bytes_before": why.locked_bytes_before,
        "asked_bytes": why.asked_bytes,
        "cap_ipc_lock": why.cap_ipc_lock,
        "range_mapped": why.range_mapped,
        "first_unmapped": why.first_unmapped,
        "failed_check": why.failed_check,
        "left_locked_bytes": why.left_locked_bytes,
        "hole_at_or_after": why.hole_at_or_after,
    })
}

/// One process's syscall table, indented under its `pid` line; each latency column in one
/// unit (`unit` fixed, or fitted to the column).
pub fn table(out: &mut String, syscalls: &BTreeMap<&'static str, SyscallSummary>, unit: Unit) {
    if syscalls.is_empty() {
        return;
    }
    let column = |pick: fn(&SyscallSummary) -> u64| unit.fit(syscalls.values().map(pick));
    let units = [
        column(|s| s.latency_ns.p50),
        column(|s| s.latency_ns.p90),
        column(|s| s.latency_ns.p99),
        column(|s| s.latency_ns.max),
    ];
    let _ = writeln!(
        out,
        "  {:<11} {:>7}  {:>9} {:>9} {:>9} {:>9}  {:>16} {:>13}  errors",
        "syscall", "calls", "p50", "p90", "p99", "max", "populated pages", "locked pages"
    );
    for (name, s) in syscalls {
        let errors = errors_cell(&s.errors);
        let _ = writeln!(
            out,
            "  {:<11} {:>7}  {:>9} {:>9} {:>9} {:>9}  {:>16} {:>+13}  {}",
            name,
            s.count,
            units[0].format(s.latency_ns.p50),
            units[1].format(s.latency_ns.p90),
            units[2].format(s.latency_ns.p99),
            units[3].format(s.latency_ns.max),
            s.pages_populated,
            s.pages_locked,
            errors
        );
    }
    // Where huge pages populated them (one fault, many pages), under the table.
    for (name, s) in syscalls {
        if s.faults_populated != s.pages_populated {
            let _ = writeln!(
                out,
                "  {name} populated {}: one fault maps many pages (huge pages, a file's \
                 fault-around)",
                populated(s.pages_populated, s.faults_populated)
            );
        }
    }
    // Why the calls failed, under the table: one line per call and errno.
    for (name, s) in syscalls {
        for (errno, why) in &s.last_failure {
            let _ = writeln!(out, "  {name} {errno} (last): {}", why.describe());
        }
    }
}

/// A table's errors cell: each errno with its count (`ENOMEM x2, EPERM x1`), or `-`.
pub fn errors_cell(errors: &BTreeMap<String, u64>) -> String {
    if errors.is_empty() {
        return "-".to_string();
    }
    errors
        .iter()
        .map(|(e, n)| format!("{e} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--stacks`: a process's mlock-family call sites, each with its calls and pages, then its
/// frames innermost first.
pub fn call_sites_text(out: &mut String, sites: &[super::stacks::CallSite], indent: &str) {
    let _ = writeln!(
        out,
        "{indent}  {:<10} {:>7} {:>16} {:>13}  user call site (innermost first)",
        "syscall", "calls", "populated pages", "locked pages"
    );
    if sites.is_empty() {
        let _ = writeln!(out, "{indent}  (no call site recorded)");
    }
    for site in sites {
        let locked = match (site.pages_locked, site.pages_unlocked) {
            (0, 0) => "0".to_string(),
            (l, 0) => format!("+{l}"),
            (0, u) => format!("-{u}"),
            (l, u) => format!("+{l}/-{u}"),
        };
        let mut figures = format!(
            "{:<10} {:>7} {:>16} {:>13}",
            site.syscall, site.calls, site.pages_populated, locked
        );
        let blank = " ".repeat(figures.len());
        for frame in site.frames.iter().take(TEXT_FRAMES) {
            let _ = writeln!(out, "{indent}  {figures}  {}", frame.text());
            figures.clone_from(&blank);
        }
        if site.frames.len() > TEXT_FRAMES {
            let _ = writeln!(
                out,
                "{indent}  {figures}  ... {} more frames",
                site.frames.len() - TEXT_FRAMES
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Syscall;

    #[test]
    fn event_line_names_map_count_not_vmas() {
        let mut rec = SyscallRecord::fixture(Syscall::Mlock, 7, 0, 21_800, 8, 8, "t");
        rec.raw.map_count_before = 120;
        rec.raw.map_count_after = 122;
        let line = syscall_line(&rec, Unit::Auto);
        // "VMAs" is kept for the region's VMAs (the VMA family's line): one word per thing.
        assert!(line.ends_with("map_count 120 -> 122"), "{line}");
        assert!(!line.contains("VMAs"), "{line}");
    }

    #[test]
    fn huge_pages_populated_say_pages_bytes_and_faults() {
        assert_eq!(populated(8, 8), "8 pages");
        assert_eq!(populated(16_384, 32), "16384 pages (64 MiB) in 32 faults");
        assert_eq!(populated(0, 0), "0 pages");
    }
}

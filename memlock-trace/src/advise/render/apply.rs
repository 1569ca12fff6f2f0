//! `--apply`'s text after the report: the two runs side by side, the mappings that faulted
//! most in either, the preload library's log and the verdict.

use std::fmt::Write as _;

use super::{NAME_WIDTH, name_cell, push_wrapped, shown, text};
use crate::{
    advise::{
        apply::{Comparison, Side},
        rules::Advice,
        table::{Phase, Table},
        units::{count, ms},
    },
    syscalls::why::size,
};

pub fn apply_text(t: &Table, advice: &[Advice], c: &Comparison) -> String {
    let mut out = text(t, advice);
    out.push('\n');
    let Some(after) = &c.after else {
        out.push_str(&format!("--apply: {}\n", c.verdict));
        return out;
    };
    let env: Vec<String> = c
        .environment
        .iter()
        .map(|(k, v)| format!("{k}={}", shown(v)))
        .collect();
    push_wrapped(
        &mut out,
        "--apply: the command run again with",
        &env.join(" "),
        4,
    );
    side_by_side(&mut out, &c.before, after);
    if !c.mappings.is_empty() {
        let _ = writeln!(
            out,
            "{:<NAME_WIDTH$} {:>10} {:>22} {:>22}",
            "FAULTS AFTER START-UP PER MAPPING", "SIZE", "BEFORE", "AFTER"
        );
        for p in &c.mappings {
            // A run without the row had no fault there (or no such mapping).
            let cell = |x: Option<(u64, u64)>| {
                x.map_or("0".into(), |(n, ns)| format!("{} ({})", count(n), ms(ns)))
            };
            let _ = writeln!(
                out,
                "{:<NAME_WIDTH$} {:>10} {:>22} {:>22}",
                name_cell(&p.mapping),
                size(p.size_bytes),
                cell(p.before),
                cell(p.after)
            );
        }
    }
    if after.after_startup.populated > 0 && !after.populated_timed {
        push_wrapped(
            &mut out,
            "",
            "(this hook set counts the faults the kernel populated but does not time them: \
             their cost is in the call that populated them, mmap, mlock2 or madvise)",
            1,
        );
    }
    for l in &c.preload_log {
        let _ = writeln!(out, "preload library: {}", shown(l));
    }
    push_wrapped(&mut out, "verdict:", &c.verdict, 4);
    out
}

fn side_by_side(out: &mut String, b: &Side, a: &Side) {
    let _ = writeln!(out, "{:<44} {:>16} {:>16}", "", "BEFORE", "AFTER");
    let mut row = |label: &str, x: String, y: String| {
        let _ = writeln!(out, "{label:<44} {x:>16} {y:>16}");
    };
    let n = |p: &Phase| count(p.minor + p.major);
    row(
        "faults during start-up",
        n(&b.during_startup),
        n(&a.during_startup),
    );
    row(
        "faults after start-up",
        n(&b.after_startup),
        n(&a.after_startup),
    );
    for (label, f) in [
        ("  minor", (|p: &Phase| p.minor) as fn(&Phase) -> u64),
        ("  major", |p: &Phase| p.major),
        ("  taken by the program's code", |p: &Phase| p.user),
        ("  populated by the kernel", |p: &Phase| p.populated),
    ] {
        row(
            label,
            count(f(&b.after_startup)),
            count(f(&a.after_startup)),
        );
    }
    row(
        "time in faults after start-up",
        ms(b.after_startup.fault_ns),
        ms(a.after_startup.fault_ns),
    );
    row(
        "  in the program's code",
        ms(b.after_startup.user_fault_ns),
        ms(a.after_startup.user_fault_ns),
    );
    let lat = |v: Option<u64>| v.map_or("-".into(), crate::output::duration);
    row("fault latency p50", lat(b.user_p50_ns), lat(a.user_p50_ns));
    row("fault latency p99", lat(b.user_p99_ns), lat(a.user_p99_ns));
    let secs = |v: Option<u64>| v.map_or("-".into(), |ns| format!("{:.2} s", ns as f64 / 1e9));
    row("the command's wall time", secs(b.wall_ns), secs(a.wall_ns));
    row(
        "locked by mlock-family calls (kernel's count)",
        size(b.locked_by_calls_bytes),
        size(a.locked_by_calls_bytes),
    );
    row(
        "locked at most (smaps, sampled)",
        size(b.locked_max_bytes),
        size(a.locked_max_bytes),
    );
    let own = |v: Option<u64>| v.map_or("-".into(), count);
    row(
        "faults the process counted (/proc/PID/stat)",
        own(b.own_faults),
        own(a.own_faults),
    );
    let status = |v: Option<i32>| v.map_or("-".into(), |c| c.to_string());
    row("exit status", status(b.exit_code), status(a.exit_code));
}

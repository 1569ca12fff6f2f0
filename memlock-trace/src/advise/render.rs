//! The advice as text (a header, the mapping table, the ranked advice; with `--apply`, the
//! two runs side by side and the verdict) or as one JSON object.

use std::fmt::Write as _;

mod apply;

pub use self::apply::apply_text;
use super::{
    apply::Comparison,
    rules::{Advice, Kind, Verdict},
    sample::MemlockLimit,
    table::{Phase, StartupHow, Table},
    units::{count, ms},
};
use crate::{
    output::{COLUMNS, JSON_SCHEMA, WallClock, wrap},
    syscalls::why::size,
};

/// Mappings listed in the text table.
const TABLE_ROWS: usize = 12;

/// A name the traced process chose (a path, its comm), as text output shows every such name.
fn shown(name: &str) -> String {
    crate::output::escape(name.as_bytes())
}

/// A reason of advise's own, quoting such names: escaped, never cut.
fn sentence(text: &str) -> String {
    crate::output::escape_uncut(text.as_bytes())
}

/// Width of the mapping column, in the mapping table and in `--apply`'s comparison alike.
const NAME_WIDTH: usize = 34;

/// A mapping's name as every table shows it: escaped, and when longer than the column cut at
/// its start, where `…` stands (a path's end tells it apart), from a `/` when the cut leaves
/// one early enough: the same file reads the same in every row of every table.
fn name_cell(name: &str) -> String {
    let name = shown(name);
    let len = name.chars().count();
    if len <= NAME_WIDTH {
        return name;
    }
    let tail: String = name.chars().skip(len - (NAME_WIDTH - 1)).collect();
    let tail = match tail.find('/') {
        Some(i) if i > 0 && i <= NAME_WIDTH / 2 => tail[i..].to_string(),
        _ => tail,
    };
    format!("…{tail}")
}

/// `text` wrapped to the terminal's width after `first`, its other lines indented by
/// `indent`, each line ended.
fn push_wrapped(out: &mut String, first: &str, text: &str, indent: usize) {
    for l in wrap(first, text, COLUMNS, indent) {
        out.push_str(&l);
        out.push('\n');
    }
}

fn phase_line(label: &str, p: &Phase) -> String {
    format!(
        "faults {label}: {} ({} minor, {} major; {} taken by the program's code, {} populated \
         by the kernel), {} in faults",
        count(p.minor + p.major),
        count(p.minor),
        count(p.major),
        count(p.user),
        count(p.populated),
        ms(p.fault_ns)
    )
}

/// The report of one run and its advice.
pub fn text(t: &Table, advice: &[Advice]) -> String {
    let mut out = String::new();
    let mut line = |s: String| push_wrapped(&mut out, "", &s, 4);
    line(header(t));
    line(match t.startup.how {
        StartupHow::Detected => format!(
            "start-up: the first {:.2} s (detected: until the last executable file was \
             mapped; --startup SECS sets it)",
            t.startup.secs
        ),
        StartupHow::Flag => format!("start-up: the first {:.2} s (--startup)", t.startup.secs),
        StartupHow::None => {
            "start-up: not seen (a running process): every fault counts as steady state; \
              --startup SECS sets a window"
                .to_string()
        }
    });
    line(phase_line("during start-up", &t.during_startup));
    line(phase_line("after start-up", &t.after_startup));
    let latency = match t.latency_ns.get("user") {
        Some(l) => format!(
            "fault latency (program's code): p50 {}, p99 {}, max {}",
            crate::output::duration(l.p50),
            crate::output::duration(l.p99),
            crate::output::duration(l.max)
        ),
        None => "fault latency: not measured".into(),
    };
    line(format!(
        "{latency}; time in faults: {}; per mapping: its faults x the interval's mean latency \
         (the kernel times faults per process, counts them per mapping); major faults are \
         counted per process only",
        t.time_basis
    ));
    if let Some(own) = own_faults(t) {
        line(own);
    }
    line(limits(t));
    if t.lost > 0 {
        line(format!(
            "warning: the tracer lost {} records or map entries: the figures are short",
            t.lost
        ));
    }
    for (pid, comm, faults) in &t.others {
        line(format!(
            "also traced: pid {pid} ({}), {} faults, not advised on",
            shown(comm),
            count(*faults)
        ));
    }
    out.push('\n');
    mapping_table(&mut out, t);
    out.push('\n');
    advice_text(&mut out, t, advice);
    out
}

/// The report's first line: what was traced, for how long, and how it ended.
fn header(t: &Table) -> String {
    match t.exit_code {
        Some(code) => format!(
            "advise: {} (pid {}, {}), traced {:.2} s, exit status {code}",
            t.described,
            t.pid,
            shown(&t.comm),
            t.traced_secs
        ),
        None => format!(
            "advise: {} ({}), traced {:.2} s from the tracer's attach; {}",
            t.described,
            shown(&t.comm),
            t.traced_secs,
            if t.running_at_end {
                "left running"
            } else {
                "it exited during the trace (its exit status is its parent's)"
            }
        ),
    }
}

/// What the process counted itself (/proc/PID/stat) beside what was traced: for a running
/// process, the share of its faults while the tracer was attached that the advice saw, and
/// the faults before, which it did not.
fn own_faults(t: &Table) -> Option<String> {
    let own = t.own_faults?;
    let Some(before) = t.own_faults_before_attach else {
        return Some(format!(
            "the process itself counted {} faults from its fork to its exit (/proc/PID/stat \
             minflt + majflt, pages populated inside calls included)",
            count(own)
        ));
    };
    let p = [&t.during_startup, &t.after_startup];
    let traced: u64 = p.iter().map(|p| p.minor + p.major).sum();
    let seen = if traced <= own {
        format!(
            "traced {} of the {} faults the process made while the tracer was attached \
             ({:.0}%, /proc/PID/stat minflt + majflt)",
            count(traced),
            count(own),
            traced as f64 * 100.0 / own.max(1) as f64
        )
    } else {
        format!(
            "traced {} faults; the process counted {} while the tracer was attached \
             (/proc/PID/stat minflt + majflt, read every 10 ms around the attach and the end)",
            count(traced),
            count(own)
        )
    };
    Some(format!(
        "{seen}; the {} it made before the attach were not seen: the advice rests on the \
         faults traced",
        count(before)
    ))
}

fn limits(t: &Table) -> String {
    let limit = match t.limits.memlock_limit {
        Some(MemlockLimit::Bytes(b)) => size(b),
        Some(MemlockLimit::Unlimited) => "unlimited".into(),
        None => "unknown".into(),
    };
    let cap = match t.limits.cap_ipc_lock {
        Some(true) => " (the process has CAP_IPC_LOCK: the limit does not apply)",
        Some(false) => " (no CAP_IPC_LOCK)",
        None => "",
    };
    let cgroup = match &t.limits.memory_cgroup {
        Some(c) => format!(
            "; memory cgroup {} (cgroup {}): {}",
            c.path,
            c.version.name(),
            c.binding()
                .map_or_else(|| "no limit".into(), |l| super::room::limit_text(t, l))
        ),
        None => String::new(),
    };
    let swap = if t.limits.swap_max_bytes > 0 {
        format!(
            "; on swap at most {} (VmSwap; {} resident and swapped at the largest)",
            size(t.limits.swap_max_bytes),
            size(t.limits.footprint_max_bytes)
        )
    } else {
        String::new()
    };
    format!(
        "limits: RLIMIT_MEMLOCK {limit}{cap}; MemAvailable {}{cgroup}; locked at most \
         {}{swap}; {} thread{}",
        t.mem_available_bytes.map_or("unknown".into(), size),
        size(t.limits.locked_max_bytes),
        t.limits.threads_max,
        if t.limits.threads_max == 1 { "" } else { "s" }
    )
}

fn mapping_table(out: &mut String, t: &Table) {
    let _ = writeln!(
        out,
        "{:<NAME_WIDTH$} {:>10} {:>10} {:>9} {:>9} {:>11} {:>6}",
        "MAPPING", "SIZE", "RESIDENT", "START-UP", "AFTER", "TIME AFTER", "LOCKED"
    );
    for m in t.mappings.iter().take(TABLE_ROWS) {
        let _ = writeln!(
            out,
            "{:<NAME_WIDTH$} {:>10} {:>10} {:>9} {:>9} {:>11} {:>6}",
            name_cell(&m.mapping),
            size(m.size_bytes),
            m.resident_bytes.map_or("?".into(), size),
            count(m.faults_startup),
            count(m.faults_after),
            ms(m.fault_ns_after),
            if m.locked { "yes" } else { "no" }
        );
    }
    if t.mappings.len() > TABLE_ROWS {
        let _ = writeln!(
            out,
            "... {} more mappings (--json lists them all)",
            t.mappings.len() - TABLE_ROWS
        );
    }
}

fn advice_text(out: &mut String, t: &Table, advice: &[Advice]) {
    let mut push = |first: &str, text: &str| push_wrapped(out, first, text, 6);
    let ranked: Vec<&Advice> = advice.iter().filter(|a| a.verdict == Verdict::Do).collect();
    let refused = advice
        .iter()
        .any(|a| matches!(a.kind, Kind::OverCgroup | Kind::OverMemory));
    if ranked.is_empty() && refused {
        push(
            "",
            "advice: nothing safe to lock or populate: what would remove faults does not fit in the memory there is (see \"do not\")",
        );
    } else if ranked.is_empty() {
        push(
            "",
            "advice: nothing worth locking or populating: no mapping took 64 or more faults after start-up that locking or an allocator setting would remove",
        );
    } else {
        push(
            "",
            "advice, ranked by the fault time each takes out of the steady state per MiB it \
             keeps resident:",
        );
    }
    for (i, a) in ranked.iter().enumerate() {
        push(&format!("  {}. {}:", i + 1, a.kind), &sentence(&a.what));
        push("     ", &sentence(&a.how));
        let mut saving = saving(a);
        if let Some(step) = &a.apply {
            let step = match step {
                super::rules::ApplyStep::Preload(r) => format!("preload rule {r}"),
                super::rules::ApplyStep::Tunable(t) => format!("GLIBC_TUNABLES={t}"),
            };
            saving.push_str(&format!("; --apply: {}", shown(&step)));
        }
        push("     ", &saving);
        for site in sites_text(t, a) {
            push("     ", &site);
        }
    }
    for (verdict, title) in [
        (Verdict::CannotHelp, "locking cannot help:"),
        (Verdict::DoNot, "do not:"),
    ] {
        let items: Vec<&Advice> = advice.iter().filter(|a| a.verdict == verdict).collect();
        if items.is_empty() {
            continue;
        }
        push("", title);
        for a in items {
            push(&format!("  - {}:", a.kind), &sentence(&a.what));
            push("     ", &sentence(&a.how));
            for site in sites_text(t, a) {
                push("     ", &site);
            }
        }
    }
    if let Some(command) = &t.flamegraph_command {
        push("", "every sampled stack as a flame graph:");
        // Not wrapped: a command to copy.
        let _ = writeln!(out, "  {command}");
    }
}

/// What an advice does to the steady state's faults, in words that hold: locking or
/// populating a mapping does not make its faults go, it moves them (and their time) into
/// the call that populates the pages; keeping an allocator's block, or keeping pages from
/// swap, removes the faults after the first.
fn saving(a: &Advice) -> String {
    let (verb, to) = match a.kind {
        Kind::Lock => (
            "moves",
            " into the mlock or mmap call that populates its pages",
        ),
        Kind::Populate => (
            "moves",
            " into the mmap or madvise call that populates its pages",
        ),
        _ => ("removes", ""),
    };
    format!(
        "{verb} {} faults after start-up and their {} of fault time{to}; keeps {} resident \
         ({} of fault time {} per MiB kept resident)",
        count(a.faults_removed),
        ms(a.saved_ns),
        size(a.pinned_bytes),
        ms(a.saved_ns_per_mib as u64),
        if verb == "moves" { "moved" } else { "removed" }
    )
}

/// `--stacks`: the code that faulted most in the mapping `a` is about, a line each.
fn sites_text(t: &Table, a: &Advice) -> Vec<String> {
    let Some(m) = a
        .start
        .and_then(|start| t.mappings.iter().find(|m| m.start == start))
    else {
        return Vec::new();
    };
    m.sites
        .iter()
        .map(|site| {
            let names: Vec<String> = site.frames.iter().map(|f| shown(&f.symbol)).collect();
            format!(
                "faulted there: {} faults (counted from sampled stacks) at {}",
                count(site.faults),
                crate::output::stack_line(&names)
            )
        })
        .collect()
}

pub fn json(t: &Table, advice: &[Advice]) -> String {
    report_json(t, advice, None)
}

pub fn apply_json(t: &Table, advice: &[Advice], c: &Comparison) -> String {
    report_json(t, advice, Some(c))
}

/// The report as one JSON line; `apply`: with `--apply`'s comparison.
fn report_json(t: &Table, advice: &[Advice], apply: Option<&Comparison>) -> String {
    let mut v = serde_json::json!({
        "type": "advise",
        "schema": JSON_SCHEMA,
        "time_ns": WallClock::now_ns(),
        "process": t,
        "advice": advice,
    });
    if let Some(c) = apply {
        v["apply"] = serde_json::json!(c);
    }
    format!(
        "{v}
"
    )
}

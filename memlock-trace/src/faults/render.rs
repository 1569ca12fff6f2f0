//! Page faults as text and JSON: sampled fault events (`--events`), the hook-set line, and
//! each process's (or thread's) faults block with its mappings and stacks.

use std::{fmt::Write as _, time::Duration};

use memlock_trace_common::faults::fault_flags;
use serde_json::json;

use super::{
    FaultHooks,
    mappings::MappingFaults,
    stacks::StackFaults,
    summary::{ClassLatency, FaultSummary},
};
use crate::{
    event::FaultRecord,
    output::{JSON_SCHEMA, Outside, TextStyle, Unit, hist::Log2Hist, or_na, stack_line},
    procfs::{Mapping, MappingCache},
    symbolize::TEXT_FRAMES,
};

/// Where a sampled fault was, as the process's last mappings read say: the mapping its
/// address is in, and the module (and offset in it) of its instruction pointer, as perf
/// script prints `ip sym+off (dso)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultPlace {
    /// The name of the mapping holding the address: a path, `[heap]`, `anonymous`...
    pub mapping: Option<Outside>,
    /// The mapping holding the instruction pointer, and the ip's offset in its file.
    pub code: Option<(Outside, u64)>,
}

/// How old a process's mappings may be to place an event with; an event whose address or
/// instruction pointer they do not hold has them read again if they were read before it
/// (what it hit may have been mapped since), at most once per event (`/proc/PID/maps`,
/// read for this, walks no page table).
const EVENT_MAPS_AGE: Duration = Duration::from_secs(1);

/// `rec`'s mapping and code, from `mappings` (read again when older than they may be, or
/// when read before the event and missing what it hit).
pub fn place(rec: &FaultRecord, mappings: &mut MappingCache) -> FaultPlace {
    let (pid, address, ip) = (rec.raw.tgid, rec.raw.address, rec.raw.ip);
    // The mappings holding the address and the ip (0: not known, nothing to look for).
    let holding = |mappings: &MappingCache| {
        let at = |addr: u64| -> Option<Mapping> {
            let maps = mappings.get(pid).filter(|_| addr != 0)?;
            maps.iter()
                .find(|m| (m.start..m.end).contains(&addr))
                .cloned()
        };
        (at(address), at(ip))
    };
    mappings.refresh(pid, EVENT_MAPS_AGE);
    let mut found = holding(mappings);
    let missed = (address != 0 && found.0.is_none()) || (ip != 0 && found.1.is_none());
    if missed && mappings.read_before(pid, rec.raw.time_ns) {
        mappings.refresh(pid, Duration::ZERO);
        found = holding(mappings);
    }
    FaultPlace {
        mapping: found.0.map(|m| m.name),
        code: found.1.map(|m| (m.name, ip - m.start + m.offset)),
    }
}

/// One line per sampled fault for `--events`: its address and the mapping it hit, the
/// instruction pointer and its module, as far as `place` knows them.
pub fn fault_line(rec: &FaultRecord, place: &FaultPlace, unit: Unit) -> String {
    let r = &rec.raw;
    let mut line = format!(
        "{pid:>7}/{tid:<7} {comm:<16} fault {kind} {addr:#x}",
        pid = r.tgid,
        tid = r.tid,
        comm = rec.name(),
        kind = rec.kind(),
        addr = r.address,
    );
    if let Some(kind) = rec.major_kind() {
        let _ = write!(line, " ({})", kind.replace('_', " "));
    }
    if let Some(mapping) = &place.mapping {
        let _ = write!(line, " in {mapping}");
    }
    if r.ip != 0 {
        let _ = write!(line, "  ip {:#x}", r.ip);
        if let Some((module, offset)) = &place.code {
            let _ = write!(line, " ({module}+{offset:#x})");
        }
    }
    if let Some(call) = rec.syscall() {
        let _ = write!(line, " populated by {call}");
        if r.count != 1 {
            let _ = write!(line, " ({} pages)", r.count);
        }
    }
    if let Some(ns) = rec.latency_ns() {
        let _ = write!(line, "  {}", unit.fit([ns]).format(ns));
        if let Some(caused) = super::causes::of_event(rec) {
            let _ = write!(line, " ({})", caused.parts());
        }
    }
    if rec.has(fault_flags::RETRIED) {
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
pub fn fault_json(rec: &FaultRecord, place: &FaultPlace) -> serde_json::Value {
    let r = &rec.raw;
    json!({
        "type": "fault",
        "schema": JSON_SCHEMA,
        "pid": r.tgid,
        "tid": r.tid,
        "comm": rec.name(),
        "kind": rec.kind(),
        "address": format!("{:#x}", r.address),
        "mapping": place.mapping,
        "ip": (r.ip != 0).then(|| format!("{:#x}", r.ip)),
        "ip_module": place.code.as_ref().map(|(module, _)| module),
        "ip_offset": place.code.as_ref().map(|(_, offset)| format!("{offset:#x}")),
        "populated": rec.has(fault_flags::POPULATED),
        "syscall": rec.syscall(),
        "pages": r.count,
        "retried": rec.has(fault_flags::RETRIED),
        "major_kind": rec.major_kind(),
        "latency_ns": rec.latency_ns(),
        "causes_ns": super::causes::of_event(rec).map(|c| c.causes_ns),
        "vm_locked": rec.locked().map(|(l, _)| l),
        "vm_lockonfault": rec.locked().map(|(_, f)| f),
        "cpu": r.cpu,
        // bpf_ktime_get_ns (CLOCK_MONOTONIC); the session adds the wall-clock `time_ns`.
        "ktime_ns": r.time_ns,
    })
}

/// `-v`: the hook set with every line of each refusal's reason, once on stderr.
pub fn fault_hooks_detail(hooks: &FaultHooks) -> String {
    let mut out = format!(
        "page faults traced with {} hooks{}: {}\n",
        hooks.hook_set.name(),
        match (hooks.latency, hooks.latency_sample) {
            (false, _) => " (counts only)".to_string(),
            (true, 1) => String::new(),
            (true, n) => format!(" (latency sampled: 1 in {n} faults timed)"),
        },
        hooks.hooks.join(", ")
    );
    for r in &hooks.refused {
        let _ = writeln!(out, "  {} refused:", r.hook_set.name());
        for line in r.refused.reason.lines() {
            let _ = writeln!(out, "    {line}");
        }
    }
    if !hooks.unobserved.is_empty() {
        let _ = writeln!(
            out,
            "  not observable with these hooks: {}",
            hooks
                .unobserved
                .iter()
                .map(|u| u.name())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for reason in hooks.causes.iter().flat_map(|c| &c.not_measured) {
        let _ = writeln!(out, "  fault time by cause, not measured: {reason}");
    }
    out
}

/// The faults block of one process (or thread), indented.
pub fn faults_text(out: &mut String, f: &FaultSummary, indent: &str, style: TextStyle) {
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
    if let Some(sample) = f.latency_sample {
        let _ = writeln!(
            out,
            "{indent}  latency sampled (1 in {} faults timed: {} timed); counts exact",
            sample.every, sample.timed
        );
    }
    if !f.latency_ns.is_empty() {
        latency_text(out, f, indent, style);
    }
    if let Some(t) = &f.time_by_cause {
        super::causes::cause_text(out, t, indent);
    }
    if !f.by_mapping.is_empty() || f.by_mapping_left_out.mappings > 0 {
        mappings_text(out, f, indent);
    }
}

/// The latency table of a faults block: a row per class, then why some faults have none.
fn latency_text(out: &mut String, f: &FaultSummary, indent: &str, style: TextStyle) {
    let unit = style.unit;
    // Wide enough for the longest class shown (`major_shmem_swap_in`).
    let w = f
        .latency_ns
        .keys()
        .map(|c| c.len())
        .max()
        .unwrap_or(0)
        .max(10);
    let _ = writeln!(
        out,
        "{indent}  {:<w$} {:>9}  {:>9} {:>9} {:>9} {:>9} {:>9}",
        "latency", "faults", "p50", "p90", "p99", "p99.9", "max"
    );
    let lat = f.latency_ns.values();
    let column = |pick: fn(&ClassLatency) -> u64| unit.fit(lat.clone().map(pick));
    let units = [
        column(|l| l.p50),
        column(|l| l.p90),
        column(|l| l.p99),
        column(|l| l.p99_9),
        column(|l| l.max),
    ];
    for (class, l) in f.latency_ns.iter().filter(|(c, _)| shown_class(f, c)) {
        let _ = writeln!(
            out,
            "{indent}  {:<w$} {:>9}  {:>9} {:>9} {:>9} {:>9} {:>9}",
            class,
            l.count,
            units[0].format(l.p50),
            units[1].format(l.p90),
            units[2].format(l.p99),
            units[3].format(l.p99_9),
            units[4].format(l.max)
        );
    }
    if let Some(note) = untimed_note(f) {
        let _ = writeln!(out, "{indent}  ({note})");
    }
    if let Some(untold) = kinds_untold(f) {
        let _ = writeln!(
            out,
            "{indent}  ({} of no kind told: the backing of its VMA was not read)",
            counted(untold, "timed major fault")
        );
    }
    if f.latency_unmatched > 0 {
        let _ = writeln!(
            out,
            "{indent}  ({} counted without a latency: start not seen)",
            counted(f.latency_unmatched, "fault")
        );
    }
    if style.hist {
        hists_text(out, f, indent, unit);
    }
}

/// A mapping row's cells: its faults, its major faults, its lock flags (and who told), its
/// name and range (and what pages back it).
fn mapping_cells(m: &MappingFaults) -> (String, String, String, String) {
    let locked = match (m.locked, m.lockonfault) {
        (Some(true), Some(true)) => "LOCKONFAULT",
        (Some(true), _) => "VM_LOCKED",
        (Some(false), _) => "no",
        (None, _) => "?",
    };
    let locked = if m.partly_locked && m.locked == Some(true) {
        format!("partly {locked}")
    } else {
        locked.to_string()
    };
    let locked = match m.locked_source {
        "unknown" => locked,
        source => format!("{locked} ({source})"),
    };
    let range = if m.end.is_empty() {
        m.start.clone()
    } else {
        format!("{}-{}", m.start, m.end)
    };
    let pages = m.pages.as_ref().map_or_else(String::new, page_tag);
    (
        m.faults.to_string(),
        m.majors.map_or_else(|| "-".to_string(), |n| n.to_string()),
        locked,
        format!("{} {range}{pages}", m.mapping),
    )
}

/// The faults per mapping of a faults block, with each row's sampled stacks.
fn mappings_text(out: &mut String, f: &FaultSummary, indent: &str) {
    type Cells = (String, String, String, String);
    let rows: Vec<Cells> = f.by_mapping.iter().map(mapping_cells).collect();
    // Each column as wide as its widest cell (`VM_LOCKED (smaps)` included).
    let width = |cell: fn(&Cells) -> &String, title: &str| {
        rows.iter()
            .map(|r| cell(r).len())
            .chain([title.len()])
            .max()
    };
    let faults_w = width(|r| &r.0, "faults").unwrap_or(6).max(9);
    let major_w = width(|r| &r.1, "major").unwrap_or(5);
    let locked_w = width(|r| &r.2, "locked").unwrap_or(6);
    let _ = writeln!(
        out,
        "{indent}  {:>faults_w$}  {:>major_w$}  {:<locked_w$}  mapping",
        "faults", "major", "locked"
    );
    for ((faults, major, locked, mapping), m) in rows.iter().zip(&f.by_mapping) {
        let _ = writeln!(
            out,
            "{indent}  {faults:>faults_w$}  {major:>major_w$}  {locked:<locked_w$}  {mapping}"
        );
        for stack in m.stacks.iter().flatten() {
            let _ = writeln!(
                out,
                "{indent}  {:>faults_w$}  {:>major_w$}  {:<locked_w$}    {} faults at {}",
                "",
                "",
                "",
                stack.faults,
                stack_line(&stack.frames.iter().map(|f| &f.symbol).collect::<Vec<_>>())
            );
        }
    }
    let left_out = f.by_mapping_left_out;
    if left_out.mappings > 0 {
        let majors = left_out
            .majors
            .map_or_else(String::new, |n| format!(", {n} major"));
        let _ = writeln!(
            out,
            "{indent}  ... {} more {}, {}{majors} (--top-mappings N lists more)",
            left_out.mappings,
            plural(left_out.mappings, "mapping"),
            counted(left_out.faults, "fault")
        );
    }
    if f.by_mapping
        .iter()
        .any(|m| m.pages.is_some_and(|p| p.huge()))
    {
        let _ = writeln!(
            out,
            "{indent}  (huge pages: one fault there maps a whole huge page, 512 base pages \
             or more, which the kernel zeroes and may first compact memory for: such faults \
             are fewer, and each far slower than a 4 KiB one)"
        );
    }
}

/// `1 fault`, `2 faults`.
fn counted(n: u64, thing: &str) -> String {
    format!("{n} {}", plural(n, thing))
}

/// `fault` for 1, `faults` for 2.
fn plural(n: u64, thing: &str) -> String {
    format!("{thing}{}", if n == 1 { "" } else { "s" })
}

/// Whether a latency class gets a row (and a histogram): `user` only when some populated
/// faults were timed too; without them it is minor and major together, row for row.
fn shown_class(f: &FaultSummary, class: &str) -> bool {
    class != "user" || f.latency_ns.contains_key("populated")
}

/// Timed major faults in none of the kind rows, when the rows are there.
fn kinds_untold(f: &FaultSummary) -> Option<u64> {
    let major = f.latency_ns.get("major")?.count;
    let told: u64 = memlock_trace_common::faults::major_kind::ROWS
        .iter()
        .filter_map(|k| f.latency_ns.get(k))
        .map(|l| l.count)
        .sum();
    (told > 0 && told < major).then(|| major - told)
}

/// Why the latency rows count fewer faults than the header: the rows hold timed faults only,
/// and the faults the kernel populated (mlock, `MAP_POPULATE`) are timed only by the hook
/// sets that enter `handle_mm_fault` itself (fentry, kprobe); the tracepoint set starts the
/// clock at the page-fault exception, which a populated fault never takes.
fn untimed_note(f: &FaultSummary) -> Option<String> {
    let timed: u64 = ["minor", "major"]
        .iter()
        .filter_map(|c| f.latency_ns.get(c))
        .map(|l| l.count)
        .sum();
    let counted = f.minor + f.major;
    let populated_timed = f.latency_ns.get("populated").map_or(0, |l| l.count);
    if timed >= counted || f.populated == 0 || populated_timed > 0 {
        return None;
    }
    Some(format!(
        "latency rows count timed faults only: {timed} of the {counted} above; the {} populated \
         by the kernel are counted, not timed: the clock starts at the page-fault exception, \
         which they never take",
        f.populated
    ))
}

/// What backs a mapping row, after its range: nothing for base pages alone;
/// ` [hugetlb 2 MiB pages]`, ` [THP 62 MiB of 64 MiB resident]`, ` [THP-eligible]`.
fn page_tag(p: &super::mappings::RowPages) -> String {
    let size = crate::output::size;
    if p.hugetlb {
        format!(" [hugetlb {} pages]", size(p.page_bytes))
    } else if p.thp_bytes > 0 {
        format!(
            " [THP {} of {} resident]",
            size(p.thp_bytes),
            size(p.rss_bytes)
        )
    } else if p.thp_eligible {
        " [THP-eligible]".into()
    } else {
        String::new()
    }
}

/// `--hist`: a log2 histogram of fault latency per class, from the kernel's buckets.
fn hists_text(out: &mut String, f: &FaultSummary, indent: &str, unit: Unit) {
    // libbpf-tools' default: usecs unless -m.
    let unit = if unit == Unit::Ms { Unit::Ms } else { Unit::Us };
    for (class, values) in f.latency_values.iter().filter(|(c, _)| shown_class(f, c)) {
        let _ = writeln!(out, "{indent}  {class} fault latency");
        Log2Hist::of(unit, values.iter().copied()).render(out, unit, &format!("{indent}  "));
    }
}

/// `--stacks`: a process's top stacks, innermost frame first.
pub fn stacks_text(out: &mut String, stacks: &[StackFaults], indent: &str) {
    let _ = writeln!(
        out,
        "{indent}  {:>9}  user call stack (innermost first; faults sampled 1 in --stack-sample, \
         each counted as that many)",
        "faults"
    );
    if stacks.is_empty() {
        let _ = writeln!(out, "{indent}  {:>9}  (no stack recorded)", "-");
    }
    for stack in stacks {
        let mut count = stack.faults.to_string();
        for frame in stack.frames.iter().take(TEXT_FRAMES) {
            let _ = writeln!(out, "{indent}  {count:>9}  {}", frame.text());
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

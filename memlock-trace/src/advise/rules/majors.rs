//! Faults that read pages back in: swap-ins, which locking the mapping removes, told apart
//! from a file's pages read in, which it cannot.

use super::{
    Advice, ApplyStep, Kind, MAJOR_AT_STARTUP, MappingFigures, Table, Verdict, attributed, count,
    limit_text,
    lock::{against_limit, lock_fits, makers_in, preload_rule},
    ms, range, room, size,
};

/// Of a swapped mapping's faults after start-up, those that read its pages back from swap:
/// all but one first touch per page not touched during start-up, and no more than the
/// process's major faults after start-up.
fn swap_ins_of(table: &Table, m: &MappingFigures) -> u64 {
    if !m.swapped() {
        return 0;
    }
    let first = m
        .pages()
        .saturating_sub(m.faults_startup)
        .min(m.faults_after);
    (m.faults_after - first).min(table.after_startup.major)
}

/// The process's major faults as the tracer timed them: mean, p50, p99 (ns).
fn major_latency(table: &Table) -> Option<(u64, u64, u64)> {
    let l = table.latency_ns.get("major").filter(|l| l.count > 0)?;
    Some((l.total / l.count, l.p50, l.p99))
}

/// A mapping whose pages went to swap and were faulted back: locking removes those
/// swap-ins (and its first touches), weighed against the memory cgroup's limit.
pub(super) fn swap_ins(table: &Table, m: &MappingFigures, locking: &mut u64) -> Vec<Advice> {
    let swap_ins = swap_ins_of(table, m);
    let timed = match major_latency(table) {
        Some((mean, p50, p99)) => format!(
            "the process's major faults took {} each on average (p50 {}, p99 {}): about {} in \
             swap-ins",
            crate::output::duration(mean),
            crate::output::duration(p50),
            crate::output::duration(p99),
            ms(swap_ins * mean)
        ),
        None => "major faults were not timed".to_string(),
    };
    let what = format!(
        "{} {} ({}, {} resident, up to {} in swap) took {} faults after start-up, {} in \
         faults: about {} of them swap-ins (its faults past one first touch per page), its \
         pages evicted under memory pressure and read back from swap; {timed}",
        m.mapping,
        range(m),
        size(m.size_bytes),
        m.resident_bytes.map_or("?".into(), size),
        size(m.swap_bytes.unwrap_or(0)),
        count(m.faults_after),
        ms(m.fault_ns_after),
        count(swap_ins)
    );
    let pinned = m.size_bytes;
    let need = *locking + pinned;
    if !lock_fits(table, need) {
        let how = format!(
            "do not mlock it under this limit (mlock fails with ENOMEM): keeping it out of \
             swap needs RLIMIT_MEMLOCK of at least {} ({} now, no CAP_IPC_LOCK), and \
             populating cannot (populated pages are reclaimed like any other); memlock-trace \
             never raises a limit",
            size(need),
            limit_text(table.limits.memlock_limit)
        );
        return vec![Advice::new(Verdict::DoNot, Kind::OverLimit, what, how).on(m)];
    }
    let weighed = match room::weigh_swapped(table, pinned, need) {
        Some(Err(reason)) => {
            return vec![Advice::new(Verdict::DoNot, Kind::OverCgroup, what, reason).on(m)];
        }
        Some(Ok(note)) => format!("; {note}"),
        None => String::new(),
    };
    *locking = need;
    let against = against_limit(table, need);
    let rule = preload_rule(m, &makers_in(table, m), "lock");
    let how = format!(
        "lock it: locked pages are never swapped out, so these swap-ins go (000: never \
         swapped; populating would not keep it, reclaim takes populated pages too): mlock2(addr, \
         len, 0) or mmap(..., MAP_POPULATE | MAP_LOCKED) at the allocation site; pins {} \
         ({against}){weighed}",
        size(pinned)
    );
    let mut a = Advice::new(Verdict::Do, Kind::SwapIns, what, how)
        .on(m)
        .saving(pinned, m.fault_ns_after, m.faults_after);
    a.apply = rule.map(ApplyStep::Preload);
    vec![a]
}

pub(super) fn major_faults(table: &Table) -> Option<Advice> {
    let (during, after) = (table.during_startup.major, table.after_startup.major);
    // Majors that were swap-ins of a mapping seen on swap: advised on with that mapping.
    let swap_ins = table
        .mappings
        .iter()
        .filter(|m| attributed(m))
        .map(|m| swap_ins_of(table, m))
        .sum::<u64>()
        .min(after);
    let other_after = after - swap_ins;
    // A few majors at start-up (the binary's own pages read in) are no finding.
    if other_after == 0 && during < MAJOR_AT_STARTUP {
        return None;
    }
    let what = if swap_ins > 0 {
        format!(
            "{} major faults ({} during start-up, {} after); about {} of those after were \
             swap-ins of mappings seen on swap (advised on above), the other {}: pages read \
             from a file",
            count(during + after),
            count(during),
            count(after),
            count(swap_ins),
            count(during + other_after)
        )
    } else {
        let swap = if table.limits.swap_max_bytes > 0 {
            format!(
                " (the process had up to {} on swap, in no mapping that faulted enough to \
                 advise on)",
                size(table.limits.swap_max_bytes)
            )
        } else {
            String::new()
        };
        format!(
            "{} major faults ({} during start-up, {} after): pages read from a file{swap}",
            count(during + after),
            count(during),
            count(after)
        )
    };
    let how = "locking cannot remove a first read from a file: mlock only moves it into the \
               mlock call, and keeps the page once read. A file's pages evicted and read again \
               are a memory-pressure problem: more memory, or MADV_WILLNEED / readahead to read \
               them earlier"
        .to_string();
    Some(Advice::new(
        Verdict::CannotHelp,
        Kind::MajorFaults,
        what,
        how,
    ))
}

//! Advice on the process as a whole rather than one mapping: the mappings the limit refuses
//! to lock, named in one advice; thread stacks under `mlockall(MCL_FUTURE)`; memory that
//! faulted only during start-up.

use super::{
    Advice, Kind, MappingFigures, PAGE_SIZE, StartupHow, Table, Verdict, limit_text, listed, size,
};

/// Start-up-only memory listed under "do not" from this size on.
const TOUCHED_ONCE_MIN: u64 = 1 << 20;

/// One "do not lock under this limit" for all the mappings the limit refuses: the last one
/// names the limit all of them need.
pub(super) fn coalesce_over_limit(table: &Table, advice: &mut Vec<Advice>) {
    let over: Vec<Advice> = advice
        .iter()
        .filter(|a| a.kind == Kind::OverLimit)
        .cloned()
        .collect();
    if over.len() < 2 {
        return;
    }
    advice.retain(|a| a.kind != Kind::OverLimit);
    let names = over.iter().map(|a| {
        let mapping = a.mapping.as_deref().unwrap_or("?");
        format!("{mapping} {}", size(a.mapped_bytes()))
    });
    let total: u64 = over.iter().map(Advice::mapped_bytes).sum();
    let what = format!(
        "{} mappings the advice would lock, {} in all: {}",
        over.len(),
        size(total),
        listed(names, over.len(), 4)
    );
    let how = format!(
        "do not mlock them under this limit (mlock fails with ENOMEM, mlockall with ENOMEM or \
         EAGAIN): locking them all needs RLIMIT_MEMLOCK of at least {} ({} now, no \
         CAP_IPC_LOCK); memlock-trace never raises a limit",
        size(table.limits.locked_max_bytes + total),
        limit_text(table.limits.memlock_limit)
    );
    advice.push(Advice::new(Verdict::DoNot, Kind::OverLimit, what, how));
}

/// An anonymous mapping a thread ran on (see [`MappingFigures::stack`]). Never advised for
/// locking: a thread uses a little of a large stack, and locking pins all of it for every
/// thread (the mlock paper's table 4).
pub(super) fn thread_stack(m: &MappingFigures) -> bool {
    m.stack && m.mapping == "anonymous"
}

pub(super) fn thread_stacks(table: &Table) -> Option<Advice> {
    let stacks: Vec<&MappingFigures> = table.mappings.iter().filter(|m| thread_stack(m)).collect();
    // Short-lived threads may come and go between two samples of the thread count; their
    // stacks are still seen faulting.
    if table.limits.threads_max < 2 && stacks.len() < 2 {
        return None;
    }
    let reserved: u64 = stacks.iter().map(|m| m.size_bytes).sum();
    let resident = stacks
        .iter()
        .filter_map(|m| m.resident_bytes)
        .reduce(|a, b| a + b)
        .map_or_else(String::new, |r| format!(", {} resident", size(r)));
    let threads = if stacks.len() > table.limits.threads_max as usize {
        format!(
            "{} thread stacks seen faulting (threads came and went between the samples, which \
             saw at most {} at once)",
            stacks.len(),
            table.limits.threads_max
        )
    } else {
        format!(
            "{} threads; thread stacks seen faulting: {}",
            table.limits.threads_max,
            stacks.len()
        )
    };
    let what = format!("{threads}, {} reserved{resident}", size(reserved));
    let how = "do not mlockall(MCL_FUTURE) to cover them: every new thread's whole stack is \
               then populated and locked, not the part it uses (the mlock paper's table 4: \
               2000 threads with 10 MB stacks, 1 MB used, took 2000 ms locked against 200 ms), \
               and thread creation slows with the number of processes (table 5). Lock the \
               mappings that fault instead, or add MCL_ONFAULT"
        .to_string();
    Some(Advice::new(
        Verdict::CannotHelp,
        Kind::ThreadStacks,
        what,
        how,
    ))
}

pub(super) fn faulted_once(table: &Table) -> Option<Advice> {
    let once: Vec<&MappingFigures> = table
        .mappings
        .iter()
        .filter(|m| m.faults_after == 0 && m.faults_startup * PAGE_SIZE >= TOUCHED_ONCE_MIN)
        .collect();
    if once.is_empty() || table.startup.how == StartupHow::None {
        return None;
    }
    let bytes: u64 = once.iter().map(|m| m.size_bytes).sum();
    let names = once.iter().map(|m| m.mapping.clone());
    let what = format!(
        "{} mapping{} ({}: {}) faulted only during start-up",
        once.len(),
        if once.len() == 1 { "" } else { "s" },
        size(bytes),
        listed(names, once.len(), 3)
    );
    let how = "do not lock them: their pages faulted in during start-up and never faulted \
               again (a page faults when it is first touched, not each time it is used: they \
               may be used often since, from memory already resident); locking would pin them \
               for no steady-state gain"
        .to_string();
    Some(Advice::new(Verdict::DoNot, Kind::FaultedOnce, what, how))
}

//! The advice drawn from a [`Table`]: what to lock or populate (ranked by the fault time it
//! removes from the steady state per MiB it pins), what locking cannot help (memory handed
//! back to the kernel and faulted in again, major faults, thread stacks under
//! `MCL_FUTURE`), and what not to do (over the limit, over the memory available or the
//! memory cgroup's room, memory touched only at start-up).

use super::units::{count, ms};
use super::{
    room::{self, memlock_text as limit_text},
    sample::MemlockLimit,
    table::{MappingFigures, StartupHow, Table},
};
use crate::{procfs::PAGE_SIZE, syscalls::why::size};

mod advice;
mod allocator;
mod lock;
mod majors;
mod overall;

pub use self::advice::{Advice, ApplyStep, Kind, Verdict};
use self::{
    allocator::{allocator, refaulted},
    lock::lock_or_populate,
    majors::{major_faults, swap_ins},
    overall::{coalesce_over_limit, thread_stack, thread_stacks, touched_once},
};

/// Faults after start-up below which a mapping is not worth advice.
const MIN_STEADY_FAULTS: u64 = 64;
/// Major faults during start-up worth a note when none came after.
const MAJOR_AT_STARTUP: u64 = 64;
const MIB: f64 = 1_048_576.0;

/// The advice for `table`: the ranked `Do` list first, then what locking cannot help, then
/// what not to do.
pub fn advise(table: &Table) -> Vec<Advice> {
    let mut advice = Vec::new();
    // Bytes the lock advice pins so far, against the limit.
    let mut locking = table.limits.locked_max_bytes;
    // Bytes the lock and populate advice adds to the memory cgroup's charge so far.
    let mut charging = 0;
    for m in &table.mappings {
        if m.swapped() && m.faults_after >= MIN_STEADY_FAULTS && !m.locked && attributed(m) {
            // Its refaults are swap-ins, not an allocator's rounds.
            advice.extend(swap_ins(table, m, &mut locking));
        } else if refaulted(m) {
            advice.extend(allocator(table, m));
        } else if m.faults_after >= MIN_STEADY_FAULTS
            && !m.locked
            && attributed(m)
            && !thread_stack(m)
        {
            advice.extend(lock_or_populate(table, m, &mut locking, &mut charging));
        }
    }
    coalesce_over_limit(table, &mut advice);
    advice.extend(major_faults(table));
    advice.extend(thread_stacks(table));
    advice.extend(touched_once(table));
    let rank = |a: &Advice| match a.verdict {
        Verdict::Do => 0,
        Verdict::CannotHelp => 1,
        Verdict::DoNot => 2,
    };
    advice.sort_by(|a, b| {
        rank(a)
            .cmp(&rank(b))
            .then(b.saved_ns_per_mib.total_cmp(&a.saved_ns_per_mib))
    });
    advice
}

fn attributed(m: &MappingFigures) -> bool {
    !matches!(m.mapping.as_str(), "unmapped" | "unknown")
}

fn range(m: &MappingFigures) -> String {
    format!("{:#x}-{:#x}", m.start, m.end)
}

/// `a, b, c, ...`: the first `shown` of `names`, and the dots when there were more.
fn listed(names: impl Iterator<Item = String>, all: usize, shown: usize) -> String {
    let names: Vec<String> = names.take(shown).collect();
    format!(
        "{}{}",
        names.join(", "),
        if all > shown { ", ..." } else { "" }
    )
}

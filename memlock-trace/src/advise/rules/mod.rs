//! The advice drawn from a [`Table`]: what to lock or populate (ranked by the fault time it
//! removes from the steady state per MiB it pins), what locking cannot help (memory handed
//! back to the kernel and faulted in again, major faults, thread stacks under
//! `MCL_FUTURE`), and what not to do (over the limit, over the memory available or the
//! memory cgroup's room, memory that faulted only during start-up).

use serde::Serialize;

use super::units::{count, ms};
use super::{
    room::{self, memlock_text as limit_text},
    sample::MemlockLimit,
    table::{MappingFigures, StartupHow, Table},
};
use crate::{procfs::PAGE_SIZE, syscalls::why::size};

mod allocator;
mod kind;
mod lock;
mod majors;
mod overall;

pub use self::kind::Kind;
use self::{
    allocator::{allocator, refaulted},
    lock::lock_or_populate,
    majors::{major_faults, swap_ins},
    overall::{coalesce_over_limit, faulted_once, thread_stack, thread_stacks},
};

/// Faults after start-up below which a mapping is not worth advice.
const MIN_STEADY_FAULTS: u64 = 64;
/// Major faults during start-up worth a note when none came after.
const MAJOR_AT_STARTUP: u64 = 64;
const MIB: f64 = 1_048_576.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Worth doing: ranked.
    Do,
    /// Locking cannot help this.
    CannotHelp,
    /// Do not.
    DoNot,
}

/// How `--apply` carries an advice out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyStep {
    /// A rule of the preload library (`MEMLOCK_PRELOAD_RULES`).
    Preload(String),
    /// A glibc tunable (`GLIBC_TUNABLES`).
    Tunable(String),
}

#[derive(Clone, Debug, Serialize)]
pub struct Advice {
    pub verdict: Verdict,
    pub kind: Kind,
    pub mapping: Option<String>,
    pub start: Option<u64>,
    pub end: Option<u64>,
    /// Bytes the advice keeps resident (locked, populated or kept by the allocator).
    pub pinned_bytes: u64,
    /// Fault time it removes from the steady state, and the faults.
    pub saved_ns: u64,
    pub faults_removed: u64,
    pub saved_ns_per_mib: f64,
    /// What was seen, in a sentence.
    pub what: String,
    /// What to do (or why not).
    pub how: String,
    pub apply: Option<ApplyStep>,
}

impl Advice {
    fn new(verdict: Verdict, kind: Kind, what: String, how: String) -> Self {
        Self {
            verdict,
            kind,
            mapping: None,
            start: None,
            end: None,
            pinned_bytes: 0,
            saved_ns: 0,
            faults_removed: 0,
            saved_ns_per_mib: 0.0,
            what,
            how,
            apply: None,
        }
    }

    fn on(mut self, m: &MappingFigures) -> Self {
        self.mapping = Some(m.mapping.clone());
        self.start = Some(m.start);
        self.end = Some(m.end);
        self
    }

    fn saving(mut self, pinned: u64, saved_ns: u64, faults: u64) -> Self {
        self.pinned_bytes = pinned;
        self.saved_ns = saved_ns;
        self.faults_removed = faults;
        self.saved_ns_per_mib = saved_ns as f64 / (pinned.max(PAGE_SIZE) as f64 / MIB);
        self
    }

    /// The bytes of the mapping it is about (0 for advice on no mapping).
    fn mapped_bytes(&self) -> u64 {
        self.end.unwrap_or(0) - self.start.unwrap_or(0)
    }
}

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
    advice.extend(faulted_once(table));
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

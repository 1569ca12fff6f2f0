//! One piece of advice: its verdict, its kind, the mapping it is about, what it saves and
//! pins, and how `--apply` carries it out.

use std::fmt;

use serde::Serialize;

use super::MIB;
use crate::{advise::table::MappingFigures, procfs::PAGE_SIZE};

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

/// What an advice is about. Its words (text and JSON alike) are [`Kind::as_str`]'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Lock a mapping that faults after start-up.
    Lock,
    /// Lock a mapping whose pages went to swap.
    SwapIns,
    /// Populate a mapping the limit refuses to lock.
    Populate,
    /// Memory handed back to the kernel and faulted in again: the allocator's setting.
    Allocator,
    MajorFaults,
    ThreadStacks,
    OverLimit,
    OverMemory,
    OverCgroup,
    TouchedOnce,
}

impl Kind {
    /// The kind's words, as text and JSON show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::SwapIns => "swap-ins",
            Kind::Populate => "populate",
            Kind::Allocator => "allocator",
            Kind::MajorFaults => "major-faults",
            Kind::ThreadStacks => "thread-stacks",
            Kind::OverLimit => "over-limit",
            Kind::OverMemory => "over-memory",
            Kind::OverCgroup => "over-cgroup",
            Kind::TouchedOnce => "touched-once",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
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
    pub(super) fn new(verdict: Verdict, kind: Kind, what: String, how: String) -> Self {
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

    pub(super) fn on(mut self, m: &MappingFigures) -> Self {
        self.mapping = Some(m.mapping.clone());
        self.start = Some(m.start);
        self.end = Some(m.end);
        self
    }

    pub(super) fn saving(mut self, pinned: u64, saved_ns: u64, faults: u64) -> Self {
        self.pinned_bytes = pinned;
        self.saved_ns = saved_ns;
        self.faults_removed = faults;
        self.saved_ns_per_mib = saved_ns as f64 / (pinned.max(PAGE_SIZE) as f64 / MIB);
        self
    }

    /// The bytes of the mapping it is about (0 for advice on no mapping).
    pub(super) fn mapped_bytes(&self) -> u64 {
        self.end.unwrap_or(0) - self.start.unwrap_or(0)
    }
}

//! The advice drawn from a [`Table`]: what to lock or populate (ranked by the fault time it
//! removes from the steady state per MiB it pins), what locking cannot help (memory handed
//! back to the kernel and faulted in again, major faults, thread stacks under
//! `MCL_FUTURE`), and what not to do (over the limit, over the memory available or the
//! memory cgroup's room, memory touched only at start-up).

use std::collections::BTreeMap;

use serde::Serialize;

use super::units::{count, ms};
use super::{
    room::{self, memlock_text as limit_text},
    sample::MemlockLimit,
    table::{MappingFigures, Table},
};
use crate::{procfs::PAGE_SIZE, syscalls::why::size};

mod majors;

use self::majors::{major_faults, swap_ins};

/// Faults after start-up below which a mapping is not worth advice.
const MIN_STEADY_FAULTS: u64 = 64;
/// Faults per page above which a region was given back and faulted in again: a private
/// page faults at most twice (a read of the zero page, then a write) while it stays mapped.
const REFAULTS_PER_PAGE: f64 = 2.0;
/// Start-up-only memory listed under "do not" from this size on.
const TOUCHED_ONCE_MIN: u64 = 1 << 20;
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
    /// `lock`, `swap-ins` (lock a mapping whose pages went to swap), `populate`,
    /// `allocator`, `major-faults`, `thread-stacks`, `over-limit`,
    /// `over-memory`, `over-cgroup`, `touched-once`.
    pub kind: &'static str,
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
    fn new(verdict: Verdict, kind: &'static str, what: String, how: String) -> Self {
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
}

/// The advice for `table`: the ranked `Do` list first, then what locking cannot help, then
/// what not to do.
pub fn advise(table: &Table) -> Vec<Advice> {
    let mut advice = Vec::new();
    // Bytes the lock advice pins so far, against the limit.
    let mut locking = table.locked_max_bytes;
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

/// One "do not lock under this limit" for all the mappings the limit refuses: the last one
/// names the limit all of them need.
fn coalesce_over_limit(table: &Table, advice: &mut Vec<Advice>) {
    let over: Vec<Advice> = advice
        .iter()
        .filter(|a| a.kind == "over-limit")
        .cloned()
        .collect();
    if over.len() < 2 {
        return;
    }
    advice.retain(|a| a.kind != "over-limit");
    let names: Vec<String> = over
        .iter()
        .take(4)
        .map(|a| {
            let bytes = a.end.unwrap_or(0) - a.start.unwrap_or(0);
            format!("{} {}", a.mapping.as_deref().unwrap_or("?"), size(bytes))
        })
        .collect();
    let total: u64 = over
        .iter()
        .map(|a| a.end.unwrap_or(0) - a.start.unwrap_or(0))
        .sum();
    let what = format!(
        "{} mappings the advice would lock, {} in all: {}{}",
        over.len(),
        size(total),
        names.join(", "),
        if over.len() > 4 { ", ..." } else { "" }
    );
    let how = format!(
        "do not mlock them under this limit (mlock fails with ENOMEM, mlockall with ENOMEM or \
         EAGAIN): locking them all needs RLIMIT_MEMLOCK of at least {} ({} now, no \
         CAP_IPC_LOCK); memlock-trace never raises a limit",
        size(table.locked_max_bytes + total),
        limit_text(table.memlock_limit)
    );
    advice.push(Advice::new(Verdict::DoNot, "over-limit", what, how));
}

fn attributed(m: &MappingFigures) -> bool {
    !matches!(m.mapping.as_str(), "unmapped" | "unknown")
}

/// Anonymous memory that faulted more than its pages can while mapped: handed back to the
/// kernel (munmap, a shrinking brk, MADV_DONTNEED) and faulted in again.
fn refaulted(m: &MappingFigures) -> bool {
    m.anonymous()
        && !m.shared_anonymous()
        && m.faults_after >= MIN_STEADY_FAULTS
        && (m.faults() as f64 > REFAULTS_PER_PAGE * m.pages() as f64
            || (m.lifetimes >= 2 && m.faults() > m.pages()))
}

fn allocator(table: &Table, m: &MappingFigures) -> Vec<Advice> {
    let rounds = m.faults() as f64 / m.pages() as f64;
    let seen_again = if m.lifetimes >= 2 {
        format!(", and was seen mapped {} times at this place", m.lifetimes)
    } else {
        String::new()
    };
    let what = format!(
        "{} {} ({}) faulted {} times, {rounds:.1} times its {} pages{seen_again}: the \
         allocator gives it back to the kernel and faults it in again. Locking cannot help: \
         a lock ends with the mapping, and mlockall(MCL_FUTURE) would only move each \
         round's faults into the mmap call.",
        m.mapping,
        range(m),
        size(m.size_bytes),
        count(m.faults()),
        count(m.pages())
    );
    // Keeping one block of this size: everything after its first round is saved.
    let kept = m.faults_after.saturating_sub(m.pages());
    let saved = (m.fault_ns_after as f64 * kept as f64 / m.faults_after.max(1) as f64) as u64;
    if !table.glibc_malloc {
        let how = "the program does not allocate with glibc's malloc: keep freed memory with \
                   its own allocator's setting (jemalloc: retain, dirty_decay_ms; tcmalloc: \
                   release rate)"
            .to_string();
        return vec![Advice::new(Verdict::CannotHelp, "allocator", what, how).on(m)];
    }
    let block = m.size_bytes;
    let (tunable, how) = if m.mapping == "[heap]" {
        let trim = block.next_power_of_two() * 2;
        (
            format!("glibc.malloc.trim_threshold={trim}"),
            format!(
                "keep the heap's top instead of trimming it: GLIBC_TUNABLES=glibc.malloc.\
                 trim_threshold={trim} (or mallopt(M_TRIM_THRESHOLD, {trim}))"
            ),
        )
    } else {
        // Above the block, so malloc serves it from the heap; trimming kept above it too.
        let threshold = (block + PAGE_SIZE).next_power_of_two();
        let trim = threshold * 2;
        (
            format!("glibc.malloc.mmap_threshold={threshold}:glibc.malloc.trim_threshold={trim}"),
            format!(
                "serve it from the heap and keep it there: GLIBC_TUNABLES=glibc.malloc.\
                 mmap_threshold={threshold}:glibc.malloc.trim_threshold={trim} (or \
                 mallopt(M_MMAP_THRESHOLD, {threshold}) and mallopt(M_TRIM_THRESHOLD, {trim})); \
                 glibc's own threshold stops growing at 32 MiB"
            ),
        )
    };
    let mut a = Advice::new(Verdict::Do, "allocator", what, how)
        .on(m)
        .saving(block, saved, kept);
    a.apply = Some(ApplyStep::Tunable(tunable));
    vec![a]
}

fn lock_or_populate(
    table: &Table,
    m: &MappingFigures,
    locking: &mut u64,
    charging: &mut u64,
) -> Vec<Advice> {
    let mut out = Vec::new();
    let pinned = m.size_bytes;
    let appeared = match m.first_seen_secs {
        Some(t) if table.startup.how == "none" => format!(", first seen {t:.2} s into the trace"),
        Some(t) if t > table.startup.secs => format!(", mapped after start-up (at {t:.2} s)"),
        _ => String::new(),
    };
    let what = format!(
        "{} {} ({}, {} resident) took {} faults after start-up, {} in faults{appeared}",
        m.mapping,
        range(m),
        size(m.size_bytes),
        m.resident_bytes.map_or("?".into(), size),
        count(m.faults_after),
        ms(m.fault_ns_after)
    );
    if let Some(available) = table.mem_available_bytes
        && pinned > available / 2
    {
        let how = format!(
            "do not lock or populate it: {} is more than half of MemAvailable ({})",
            size(pinned),
            size(available)
        );
        out.push(Advice::new(Verdict::DoNot, "over-memory", what, how).on(m));
        return out;
    }
    // Locking and populating both charge the cgroup: neither is safe past its room.
    let charge = *charging + room::new_charge(m);
    if let Some(how) = room::over_cgroup(table, pinned, charge) {
        out.push(Advice::new(Verdict::DoNot, "over-cgroup", what, how).on(m));
        return out;
    }
    *charging = charge;
    let cgroup = room::cgroup_note(table, charge).map_or_else(String::new, |n| format!("; {n}"));
    let exempt = table.cap_ipc_lock == Some(true);
    let limit = table.memlock_limit;
    let need = *locking + pinned;
    let fits = exempt
        || match limit {
            Some(MemlockLimit::Unlimited) => true,
            Some(MemlockLimit::Bytes(b)) => need <= b,
            None => false,
        };
    let limit_text = limit_text(limit);
    let blocks = blocks_in(table, m);
    let rule_for = |action: &str| match preload_kind(m) {
        _ if !blocks.is_empty() => Some(
            blocks
                .iter()
                .map(|b| format!("{action}:alloc:{}", b.len))
                .collect::<Vec<_>>()
                .join(";"),
        ),
        kind => kind.map(|k| format!("{action}:{k}")),
    };
    let (kind, how, step) = if fits {
        *locking = need;
        let against = if exempt {
            format!("{limit_text}, not applied: the process has CAP_IPC_LOCK")
        } else {
            format!("{} locked in all, within {limit_text}", size(need))
        };
        (
            "lock",
            format!(
                "lock it as soon as it is mapped: mlock2(addr, len, 0), or mmap(..., \
                 MAP_POPULATE | MAP_LOCKED) at the allocation site; pins {} ({against}){cgroup}. \
                 mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) would keep its pages once \
                 touched but not remove these first-touch faults",
                size(pinned)
            ),
            rule_for("lock"),
        )
    } else {
        out.push(
            Advice::new(
                Verdict::DoNot,
                "over-limit",
                what.clone(),
                format!(
                    "do not mlock it under this limit (mlock fails with ENOMEM, mlockall \
                     with ENOMEM or EAGAIN): locking it needs RLIMIT_MEMLOCK of at least {} \
                     ({limit_text} now, no CAP_IPC_LOCK); memlock-trace never raises a limit",
                    size(need)
                ),
            )
            .on(m),
        );
        (
            "populate",
            format!(
                "populate it as soon as it is mapped (no limit applies): mmap(..., \
                 MAP_POPULATE) at the allocation site, or madvise(addr, len, \
                 MADV_POPULATE_WRITE) right after; keeps {} resident, reclaimable{cgroup}",
                size(pinned)
            ),
            rule_for("populate"),
        )
    };
    let how = if !blocks.is_empty() {
        let made: Vec<String> = blocks
            .iter()
            .map(|b| format!("{} x {}", count(b.count), size(b.len)))
            .collect();
        format!(
            "{how}. malloc made it ({} blocks; in the run that learned this, the first of \
             --apply): --apply {}s each block of these sizes as malloc or calloc returns it",
            made.join(", "),
            kind
        )
    } else if step.is_none() {
        format!(
            "{how}. --apply cannot: {} grows inside libc (brk, the stack), not through mmap",
            m.mapping
        )
    } else {
        how
    };
    let mut a = Advice::new(Verdict::Do, kind, what, how).on(m).saving(
        pinned,
        m.fault_ns_after,
        m.faults_after,
    );
    a.apply = step.map(ApplyStep::Preload);
    out.push(a);
    out
}

/// Blocks of one size (rounded up to pages) that `malloc`/`calloc` returned inside a mapping.
struct Blocks {
    len: u64,
    count: u64,
}

/// Most sizes of blocks named for one mapping (the preload library takes 16 rules in all).
const BLOCK_SIZES: usize = 4;

/// The large blocks the allocator returned inside `m`, by size, most bytes first: the preload
/// library's `alloc ADDR LEN` lines of the first run of `--apply`. glibc maps such blocks
/// with its internal `mmap`, which the library's `mmap` hook never sees.
fn blocks_in(table: &Table, m: &MappingFigures) -> Vec<Blocks> {
    let mut sizes: BTreeMap<u64, u64> = BTreeMap::new();
    for line in &table.preload_log {
        let mut words = line.split(' ');
        let (Some("alloc"), Some(addr), Some(len)) = (words.next(), words.next(), words.next())
        else {
            continue;
        };
        let addr = addr
            .strip_prefix("0x")
            .and_then(|a| u64::from_str_radix(a, 16).ok());
        if let (Some(addr), Ok(len)) = (addr, len.parse::<u64>())
            && (m.start..m.end).contains(&addr)
        {
            *sizes
                .entry(len.div_ceil(PAGE_SIZE) * PAGE_SIZE)
                .or_default() += 1;
        }
    }
    let mut blocks: Vec<Blocks> = sizes
        .into_iter()
        .map(|(len, count)| Blocks { len, count })
        .collect();
    blocks.sort_by_key(|b| std::cmp::Reverse(b.len * b.count));
    blocks.truncate(BLOCK_SIZES);
    blocks
}

/// The preload library's `KIND:LENGTH[:PATH]` for a mapping it can see being made.
fn preload_kind(m: &MappingFigures) -> Option<String> {
    if m.mapping == "anonymous" || m.shared_anonymous() {
        Some(format!("anon:{}", m.size_bytes))
    } else if m.mapping.starts_with('/') && !m.mapping.ends_with(" (deleted)") {
        Some(format!("file:{}:{}", m.size_bytes, m.mapping))
    } else {
        None
    }
}

/// An anonymous mapping a thread ran on (see [`MappingFigures::stack`]). Never advised for
/// locking: a thread uses a little of a large stack, and locking pins all of it for every
/// thread (the mlock paper's table 4).
fn thread_stack(m: &MappingFigures) -> bool {
    m.stack && m.mapping == "anonymous"
}

fn thread_stacks(table: &Table) -> Option<Advice> {
    let stacks: Vec<&MappingFigures> = table.mappings.iter().filter(|m| thread_stack(m)).collect();
    // Short-lived threads may come and go between two samples of the thread count; their
    // stacks are still seen faulting.
    if table.threads_max < 2 && stacks.len() < 2 {
        return None;
    }
    let reserved: u64 = stacks.iter().map(|m| m.size_bytes).sum();
    let resident = stacks
        .iter()
        .filter_map(|m| m.resident_bytes)
        .reduce(|a, b| a + b)
        .map_or_else(String::new, |r| format!(", {} resident", size(r)));
    let threads = if stacks.len() > table.threads_max as usize {
        format!(
            "{} thread stacks seen faulting (threads came and went between the samples, which \
             saw at most {} at once)",
            stacks.len(),
            table.threads_max
        )
    } else {
        format!(
            "{} threads; thread stacks seen faulting: {}",
            table.threads_max,
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
    Some(Advice::new(Verdict::CannotHelp, "thread-stacks", what, how))
}

fn touched_once(table: &Table) -> Option<Advice> {
    let once: Vec<&MappingFigures> = table
        .mappings
        .iter()
        .filter(|m| m.faults_after == 0 && m.faults_startup * PAGE_SIZE >= TOUCHED_ONCE_MIN)
        .collect();
    if once.is_empty() || table.startup.how == "none" {
        return None;
    }
    let bytes: u64 = once.iter().map(|m| m.size_bytes).sum();
    let names: Vec<String> = once.iter().take(3).map(|m| m.mapping.clone()).collect();
    let what = format!(
        "{} mappings ({}: {}{}) faulted only during start-up",
        once.len(),
        size(bytes),
        names.join(", "),
        if once.len() > 3 { ", ..." } else { "" }
    );
    let how = "do not lock them: their pages were touched once, at start-up, and never faulted \
               again; locking would pin them for no steady-state gain"
        .to_string();
    Some(Advice::new(Verdict::DoNot, "touched-once", what, how))
}

fn range(m: &MappingFigures) -> String {
    format!("{:#x}-{:#x}", m.start, m.end)
}

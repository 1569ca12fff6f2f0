//! Lock or populate a mapping that faults after start-up: weighed against the memory
//! available, the memory cgroup's room and `RLIMIT_MEMLOCK` (over the limit, populating
//! instead), with the preload library's rule that carries it out.

use std::collections::BTreeMap;

use super::{
    Advice, ApplyStep, Kind, MappingFigures, MemlockLimit, PAGE_SIZE, StartupHow, Table, Verdict,
    count, limit_text, ms, range, room, size,
};

pub(super) fn lock_or_populate(
    table: &Table,
    m: &MappingFigures,
    locking: &mut u64,
    charging: &mut u64,
) -> Vec<Advice> {
    let what = steady_faults(table, m);
    let charge = match room_for(table, m, *charging) {
        Ok(charge) => charge,
        Err((kind, how)) => return vec![Advice::new(Verdict::DoNot, kind, what, how).on(m)],
    };
    *charging = charge;
    let cgroup = room::cgroup_note(table, charge).map_or_else(String::new, |n| format!("; {n}"));
    let pinned = m.size_bytes;
    let need = *locking + pinned;
    let mut out = Vec::new();
    let (kind, action, how) = if lock_fits(table, need) {
        *locking = need;
        let how = format!(
            "lock it as soon as it is mapped: mlock2(addr, len, 0), or mmap(..., \
             MAP_POPULATE | MAP_LOCKED) at the allocation site; pins {} ({}){cgroup}. \
             mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) would keep its pages once \
             touched but not remove these first-touch faults",
            size(pinned),
            against_limit(table, need)
        );
        (Kind::Lock, "lock", how)
    } else {
        out.push(over_limit(table, m, what.clone(), need));
        let how = format!(
            "populate it as soon as it is mapped (no limit applies): mmap(..., \
             MAP_POPULATE) at the allocation site, or madvise(addr, len, \
             MADV_POPULATE_WRITE) right after; keeps {} resident, reclaimable{cgroup}",
            size(pinned)
        );
        (Kind::Populate, "populate", how)
    };
    let makers = makers_in(table, m);
    let step = preload_rule(m, &makers, action);
    let how = with_apply_note(how, m, &makers, kind, step.is_some());
    let mut a = Advice::new(Verdict::Do, kind, what, how).on(m).saving(
        pinned,
        m.fault_ns_after,
        m.faults_after,
    );
    a.apply = step.map(ApplyStep::Preload);
    out.push(a);
    out
}

/// What was seen of a mapping faulting after start-up, in a sentence.
fn steady_faults(table: &Table, m: &MappingFigures) -> String {
    let appeared = match m.first_seen_secs {
        Some(t) if table.startup.how == StartupHow::None => {
            format!(", first seen {t:.2} s into the trace")
        }
        Some(t) if t > table.startup.secs => format!(", mapped after start-up (at {t:.2} s)"),
        _ => String::new(),
    };
    format!(
        "{} {} ({}, {} resident) took {} faults after start-up, {} in faults{appeared}",
        m.mapping,
        range(m),
        size(m.size_bytes),
        m.resident_bytes.map_or("?".into(), size),
        count(m.faults_after),
        ms(m.fault_ns_after)
    )
}

/// The memory cgroup's charge with `m` pinned (`charging`: the advice before it), or why
/// neither locking nor populating it is safe: more than half the memory available, or past
/// the cgroup's room.
fn room_for(table: &Table, m: &MappingFigures, charging: u64) -> Result<u64, (Kind, String)> {
    let pinned = m.size_bytes;
    if let Some(available) = table.mem_available_bytes
        && pinned > available / 2
    {
        let how = format!(
            "do not lock or populate it: {} is more than half of MemAvailable ({})",
            size(pinned),
            size(available)
        );
        return Err((Kind::OverMemory, how));
    }
    // Locking and populating both charge the cgroup: neither is safe past its room.
    let charge = charging + room::new_charge(m);
    match room::over_cgroup(table, pinned, charge) {
        Some(how) => Err((Kind::OverCgroup, how)),
        None => Ok(charge),
    }
}

/// Whether `need` bytes locked in all fit under the process's `RLIMIT_MEMLOCK` (or it has
/// `CAP_IPC_LOCK`, which the limit does not bind).
pub(super) fn lock_fits(table: &Table, need: u64) -> bool {
    table.limits.cap_ipc_lock == Some(true)
        || match table.limits.memlock_limit {
            Some(MemlockLimit::Unlimited) => true,
            Some(MemlockLimit::Bytes(b)) => need <= b,
            None => false,
        }
}

/// The lock advice's `need` bytes weighed against the limit, in words.
pub(super) fn against_limit(table: &Table, need: u64) -> String {
    let limit = limit_text(table.limits.memlock_limit);
    if table.limits.cap_ipc_lock == Some(true) {
        format!("{limit}, not applied: the process has CAP_IPC_LOCK")
    } else {
        format!("{} locked in all, within {limit}", size(need))
    }
}

fn over_limit(table: &Table, m: &MappingFigures, what: String, need: u64) -> Advice {
    let how = format!(
        "do not mlock it under this limit (mlock fails with ENOMEM, mlockall with ENOMEM or \
         EAGAIN): locking it needs RLIMIT_MEMLOCK of at least {} ({} now, no CAP_IPC_LOCK); \
         memlock-trace never raises a limit",
        size(need),
        limit_text(table.limits.memlock_limit)
    );
    Advice::new(Verdict::DoNot, Kind::OverLimit, what, how).on(m)
}

/// `how`, with what `--apply` does about the mapping: the calls that made it, or why it
/// cannot act (`applied`: a preload rule carries it out).
fn with_apply_note(
    how: String,
    m: &MappingFigures,
    makers: &[Makers],
    kind: Kind,
    applied: bool,
) -> String {
    if !makers.is_empty() {
        let made: Vec<String> = makers
            .iter()
            .map(|b| {
                let plural = if b.count == 1 { "" } else { "s" };
                let what = b.call.what();
                format!("{} {what}{plural} of {}", count(b.count), size(b.len))
            })
            .collect();
        format!(
            "{how}. The program made it with {} (seen in the first run of --apply): --apply \
             {}s each of these sizes as the call returns it",
            made.join(", "),
            kind
        )
    } else if !applied {
        format!(
            "{how}. --apply cannot: {} grows inside libc (brk, the stack), not through mmap",
            m.mapping
        )
    } else {
        how
    }
}

/// The preload library's rules (`ACTION:alloc:LEN` or `ACTION:anon:LEN` for each size of
/// call that made `m`, else `ACTION:KIND:LENGTH[:PATH]` for the mapping), or None when it
/// cannot see `m` being made.
pub(super) fn preload_rule(m: &MappingFigures, makers: &[Makers], action: &str) -> Option<String> {
    if makers.is_empty() {
        return preload_kind(m).map(|k| format!("{action}:{k}"));
    }
    Some(
        makers
            .iter()
            .map(|b| format!("{action}:{}:{}", b.call.rule_kind(), b.len))
            .collect::<Vec<_>>()
            .join(";"),
    )
}

/// A call of the program's that makes memory, as the preload library logs it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Call {
    /// A block `malloc`/`calloc` returned (`alloc ADDR LEN`).
    Alloc,
    /// An anonymous `mmap` (`mmap ADDR LEN`).
    Mmap,
}

impl Call {
    fn what(self) -> &'static str {
        match self {
            Self::Alloc => "malloc block",
            Self::Mmap => "mmap call",
        }
    }

    fn rule_kind(self) -> &'static str {
        match self {
            Self::Alloc => "alloc",
            Self::Mmap => "anon",
        }
    }
}

/// Calls of one kind and size (rounded up to pages) that made memory inside a mapping.
pub(super) struct Makers {
    call: Call,
    len: u64,
    count: u64,
}

/// Most sizes of calls named for one mapping (the preload library takes 16 rules in all).
const MAKER_SIZES: usize = 4;

/// The calls that made `m`, by kind and size, most bytes first: the preload library's
/// `alloc ADDR LEN` lines of the first run of `--apply`, and its `mmap ADDR LEN` lines of a
/// call that made at least half of `m`. The kernel merges a mapping with its neighbours of
/// the same flags, so a 96 MiB table mapped beside a 4 MiB malloc block is one 100 MiB
/// mapping, whose faults rules for the block alone would miss (glibc maps large blocks with
/// its internal `mmap`, which the library's `mmap` hook never sees: no call is logged
/// twice). A smaller call is left out: a rule acts on every later call of its length, and
/// python's 256 KiB arenas, merged into a 2.4 MiB mapping, would have locked every arena
/// (the advise_pressure test's cgroup then squeezed the interpreter out: 1,785 majors
/// where the table alone locked left under 1,024).
pub(super) fn makers_in(table: &Table, m: &MappingFigures) -> Vec<Makers> {
    let mut sizes: BTreeMap<(Call, u64), u64> = BTreeMap::new();
    for line in &table.preload_log {
        let mut words = line.split(' ');
        let call = match words.next() {
            Some("alloc") => Call::Alloc,
            Some("mmap") => Call::Mmap,
            _ => continue,
        };
        let (Some(addr), Some(len)) = (words.next(), words.next()) else {
            continue;
        };
        let addr = addr
            .strip_prefix("0x")
            .and_then(|a| u64::from_str_radix(a, 16).ok());
        if let (Some(addr), Ok(len)) = (addr, len.parse::<u64>())
            && (m.start..m.end).contains(&addr)
            && (call == Call::Alloc || 2 * len >= m.end - m.start)
        {
            *sizes
                .entry((call, len.div_ceil(PAGE_SIZE) * PAGE_SIZE))
                .or_default() += 1;
        }
    }
    let mut makers: Vec<Makers> = sizes
        .into_iter()
        .map(|((call, len), count)| Makers { call, len, count })
        .collect();
    makers.sort_by_key(|b| std::cmp::Reverse(b.len * b.count));
    makers.truncate(MAKER_SIZES);
    makers
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

//! The room the advice is weighed against besides `RLIMIT_MEMLOCK`: the process's memory
//! cgroup. Locked or populated pages are charged to it (and to each ancestor); locked ones
//! are never reclaimed, so advice that would charge more than the least room any level
//! leaves (limit less usage, at the process's fullest) would make the kernel reclaim the
//! cgroup's other memory and then OOM-kill inside it, however much the host has free.

use super::{
    sample::MemlockLimit,
    table::{MappingFigures, Table},
};
use crate::{process::memory_cgroup::MemoryLimit, syscalls::why::size};

/// What pinning `m` adds to the cgroup's charge: the bytes not resident yet (those resident
/// were charged when they were faulted in).
pub fn new_charge(m: &MappingFigures) -> u64 {
    m.size_bytes.saturating_sub(m.resident_bytes.unwrap_or(0))
}

/// The limit that leaves the process the least room, if its memory cgroup has one.
fn binding(table: &Table) -> Option<&MemoryLimit> {
    table.limits.memory_cgroup.as_ref()?.binding()
}

/// Why `charge` bytes (this advice's and the advice before it) cannot be pinned in the
/// process's memory cgroup, or None when they fit.
pub fn over_cgroup(table: &Table, pinned: u64, charge: u64) -> Option<String> {
    let limit = binding(table).filter(|l| charge > l.headroom())?;
    Some(format!(
        "do not lock or populate it: pinning its {} would charge {} more to the memory \
         cgroup {}, past {}; pages locked or populated are charged there and locked ones are \
         never reclaimed: past the limit the kernel reclaims the cgroup's other memory, \
         then OOM-kills in it (MemAvailable is the host's, not the cgroup's)",
        size(pinned),
        size(charge),
        own_path(table),
        limit_text(table, limit)
    ))
}

/// What `charge` bytes do to the memory cgroup, for advice that fits: `None` without a
/// limited memory cgroup.
pub fn cgroup_note(table: &Table, charge: u64) -> Option<String> {
    let limit = binding(table)?;
    Some(format!(
        "charges {} more to the memory cgroup {}, within {}",
        size(charge),
        own_path(table),
        limit_text(table, limit)
    ))
}

/// Locking `pinned` bytes of a mapping whose pages went to swap (`locked`: every byte locked
/// with it, this one included), weighed against the memory cgroup's limit: what it leaves
/// for everything else in the cgroup, and whether the rest of the process's working set
/// (its largest footprint, resident and swapped, less this mapping) fits there or in the
/// swap it can still use. `Ok(note)` when locking is safe, `Err(reason)` when the cgroup
/// would OOM-kill; `None` without a limited memory cgroup.
pub fn weigh_swapped(table: &Table, pinned: u64, locked: u64) -> Option<Result<String, String>> {
    let limit = binding(table)?;
    let left = limit.limit_bytes.saturating_sub(locked);
    let rest = table.limits.footprint_max_bytes.saturating_sub(pinned);
    let limit_text = limit_text(table, limit);
    let cgroup = own_path(table);
    if left == 0 {
        return Some(Err(format!(
            "do not lock it: {} locked in all is at or past the memory cgroup {cgroup}'s \
             limit ({limit_text}); locked pages are never reclaimed, so nothing would be left \
             for anything else in the cgroup and the kernel OOM-kills in it",
            size(locked)
        )));
    }
    let leaves = format!(
        "locking it ({} locked in all) leaves {} for everything else in the memory cgroup \
         {cgroup}, under {limit_text}",
        size(locked),
        size(left)
    );
    let working_set = format!(
        "the rest of the process's working set ({}: its largest footprint, {} resident and \
         swapped, less this mapping)",
        size(rest),
        size(table.limits.footprint_max_bytes)
    );
    if rest <= left {
        return Some(Ok(format!("{leaves}; {working_set} fits there")));
    }
    let overflow = rest - left;
    let rest_text = format!(
        "{working_set} does not fit there: {} of it must live on swap",
        size(overflow)
    );
    match table.limits.swap_room_bytes {
        Some(room) if overflow <= room => Some(Ok(format!(
            "{leaves}; {rest_text}, and swap has {} for it (free swap and the process's own, \
             at the least): no OOM risk while that lasts, but the rest's own swap-ins take \
             the place of this mapping's (--apply measures the trade)",
            size(room)
        ))),
        room => Some(Err(format!(
            "do not lock it: {leaves}; {rest_text}, and swap has {} for it: past that the \
             kernel OOM-kills in the cgroup (locked pages are never reclaimed)",
            room.map_or("an unknown amount".into(), size)
        ))),
    }
}

/// The process's own memory cgroup's path.
fn own_path(table: &Table) -> String {
    table
        .limits
        .memory_cgroup
        .as_ref()
        .map_or_else(String::new, |c| c.path.to_string())
}

/// `its memory.max 128 MiB (100 MiB used at the process's fullest, 28 MiB left)`, or
/// `/parent's ...` for an ancestor's limit.
pub fn limit_text(table: &Table, limit: &MemoryLimit) -> String {
    let whose = match &table.limits.memory_cgroup {
        Some(c) if c.path == limit.path => "its".to_string(),
        _ => format!("{}'s", limit.path),
    };
    format!(
        "{whose} {} {} ({} used at the process's fullest, {} left)",
        limit.file,
        size(limit.limit_bytes),
        size(limit.usage_bytes),
        size(limit.headroom())
    )
}

/// `RLIMIT_MEMLOCK 8 MiB`, `unlimited`, `unknown`.
pub fn memlock_text(limit: Option<MemlockLimit>) -> String {
    match limit {
        Some(MemlockLimit::Unlimited) => "RLIMIT_MEMLOCK unlimited".to_string(),
        Some(MemlockLimit::Bytes(b)) => format!("RLIMIT_MEMLOCK {}", size(b)),
        None => "RLIMIT_MEMLOCK unknown".to_string(),
    }
}

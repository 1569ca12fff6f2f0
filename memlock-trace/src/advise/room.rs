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
    table.memory_cgroup.as_ref()?.binding()
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

/// The process's own memory cgroup's path.
fn own_path(table: &Table) -> String {
    table
        .memory_cgroup
        .as_ref()
        .map_or_else(String::new, |c| c.path.to_string())
}

/// `its memory.max 128 MiB (100 MiB used at the process's fullest, 28 MiB left)`, or
/// `/parent's ...` for an ancestor's limit.
pub fn limit_text(table: &Table, limit: &MemoryLimit) -> String {
    let whose = match &table.memory_cgroup {
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

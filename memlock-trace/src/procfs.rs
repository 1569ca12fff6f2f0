//! A process's mappings from `/proc/PID/smaps`: address ranges, names and the `VmFlags`
//! `lo` (VM_LOCKED) / `lf` (VM_LOCKONFAULT), to attribute fault addresses to mappings.
//!
//! The kernel frees a process's mappings at exit, before it can be reaped, so the cache
//! keeps the last snapshot of every process it was asked about: a traced process that exits
//! is still attributed with the mappings it had at the last refresh.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

/// The page size this tool assumes (x86-64's base page).
pub const PAGE_SIZE: u64 = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the mapped file of `start` (0 for anonymous mappings).
    pub offset: u64,
    /// `[heap]`, `[stack]`, `[vdso]`, a file path, or `anonymous`.
    pub name: String,
    pub locked: bool,
    /// None where the kernel does not show `VM_LOCKONFAULT` in smaps (before 6.2).
    pub lockonfault: Option<bool>,
}

/// Whether this kernel's smaps `VmFlags` show `lf` (VM_LOCKONFAULT): added in Linux 6.2
/// (fs/proc/task_mmu.c, commit 8614d6c5eda0).
pub fn smaps_shows_lockonfault(release: &str) -> bool {
    let mut parts = release
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (6, 2)
}

/// Parses `/proc/PID/smaps` text; `shows_lockonfault`: see [`smaps_shows_lockonfault`].
pub fn parse_smaps(text: &str, shows_lockonfault: bool) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some(last) = out.last_mut() {
                for flag in flags.split_whitespace() {
                    match flag {
                        "lo" => last.locked = true,
                        "lf" => last.lockonfault = Some(true),
                        _ => {}
                    }
                }
            }
            continue;
        }
        // A header: `start-end perms offset dev inode [name]`; field lines start with a
        // capitalised key and a colon.
        let mut fields = line.split_whitespace();
        let Some((start, end)) = fields.next().and_then(|range| range.split_once('-')) else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
        else {
            continue;
        };
        // perms, offset, dev, inode, then the name (which may contain spaces).
        let rest: Vec<&str> = fields.collect();
        if rest.len() < 4 {
            continue;
        }
        let name = rest[4..].join(" ");
        out.push(Mapping {
            start,
            end,
            offset: u64::from_str_radix(rest[1], 16).unwrap_or(0),
            name: if name.is_empty() {
                "anonymous".into()
            } else {
                name
            },
            locked: false,
            lockonfault: shows_lockonfault.then_some(false),
        });
    }
    out
}

/// Last known mappings and comm per process.
#[derive(Default)]
pub struct MappingCache {
    entries: HashMap<u32, Snapshot>,
}

struct Snapshot {
    taken: Instant,
    comm: Option<String>,
    mappings: Vec<Mapping>,
}

impl MappingCache {
    /// Re-reads `pid`'s mappings if the snapshot is older than `max_age`; keeps the old one
    /// if the process is gone.
    pub fn refresh(&mut self, pid: u32, max_age: Duration) {
        if self
            .entries
            .get(&pid)
            .is_some_and(|s| s.taken.elapsed() < max_age)
        {
            return;
        }
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/smaps")) else {
            return;
        };
        let shows_lockonfault = smaps_shows_lockonfault(&crate::probe::kernel_release());
        let mappings = parse_smaps(&text, shows_lockonfault);
        // A zombie (or a kernel thread) has no mappings: keep what we saw while it lived.
        if mappings.is_empty() && self.entries.contains_key(&pid) {
            return;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .map(|c| c.trim_end().to_string());
        self.entries.insert(
            pid,
            Snapshot {
                taken: Instant::now(),
                comm,
                mappings,
            },
        );
    }

    pub fn get(&self, pid: u32) -> Option<&[Mapping]> {
        self.entries.get(&pid).map(|s| s.mappings.as_slice())
    }

    pub fn comm(&self, pid: u32) -> Option<String> {
        self.entries.get(&pid).and_then(|s| s.comm.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
Size:                132 kB
VmFlags: rd wr mr mw me ac sd
7f00aa000000-7f00aa100000 rw-p 00000000 00:00 0 
Size:               1024 kB
Locked:             1024 kB
VmFlags: rd wr mr mw me lo ac sd
7f00ab000000-7f00ab010000 r--p 0001a000 08:01 1234                       /usr/lib/with space.so
VmFlags: rd mr mw me lf sd
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
VmFlags: rd wr mr mw me gd ac
";

    #[test]
    fn parses_ranges_names_and_lock_flags() {
        let maps = parse_smaps(SMAPS, true);
        assert_eq!(maps.len(), 4);
        assert_eq!(
            maps[0],
            Mapping {
                start: 0x55d0c0a00000,
                end: 0x55d0c0a21000,
                offset: 0,
                name: "[heap]".into(),
                locked: false,
                lockonfault: Some(false)
            }
        );
        assert_eq!(
            (maps[1].name.as_str(), maps[1].locked, maps[1].lockonfault),
            ("anonymous", true, Some(false))
        );
        assert_eq!(
            (maps[2].name.as_str(), maps[2].locked, maps[2].lockonfault),
            ("/usr/lib/with space.so", false, Some(true))
        );
        assert_eq!(maps[2].offset, 0x1a000);
        assert_eq!(maps[3].name, "[stack]");
        // Before 6.2 a missing `lf` says nothing.
        assert_eq!(parse_smaps(SMAPS, false)[1].lockonfault, None);
    }

    #[test]
    fn lockonfault_shown_from_6_2() {
        assert!(!smaps_shows_lockonfault("6.1.0-57-cloud-amd64"));
        assert!(!smaps_shows_lockonfault("5.15.0"));
        assert!(smaps_shows_lockonfault("6.2.0"));
        assert!(smaps_shows_lockonfault("6.18.44-fc-v857"));
        assert!(smaps_shows_lockonfault("7.0"));
    }

    #[test]
    fn reads_own_smaps() {
        let mut cache = MappingCache::default();
        let pid = std::process::id();
        cache.refresh(pid, Duration::ZERO);
        let maps = cache.get(pid).expect("own smaps");
        assert!(maps.iter().any(|m| m.name == "[stack]"), "{maps:?}");
        assert!(cache.comm(pid).is_some());
    }
}

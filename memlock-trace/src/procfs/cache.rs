//! The mapping cache the fault family attributes fault addresses with: the last snapshot
//! of each process's mappings, re-read as often as its cost allows and soon after a call
//! changes them, kept when the process exits (the kernel frees a process's mappings before
//! it can be reaped).

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use super::{Mapping, is_alive, read_comm, read_smaps, smaps_shows_lockonfault};
use crate::output::Outside;

/// CPU time the calling thread has used.
fn thread_cpu_time() -> Duration {
    Duration::from_nanos(crate::output::thread_cpu_ns())
}

/// Last known mappings and comm per process.
#[derive(Default)]
pub struct MappingCache {
    entries: HashMap<u32, Snapshot>,
    /// VMAs seen by mlock-family calls since the last snapshot, newest last: for a process
    /// that exits before the next snapshot, the only record of a region it mapped since.
    noted: HashMap<u32, Vec<Mapping>>,
    /// Reads of a living process's smaps that failed (other than its exit): its faults are
    /// then attributed to its last snapshot, or `unknown`. Counted in the health line.
    unreadable: u64,
    /// Processes already warned about.
    warned: std::collections::HashSet<u32>,
    /// The file the mappings are read from.
    file: MapsFile,
}

/// Which `/proc/PID/` file a process's mappings are read from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MapsFile {
    /// With `VmFlags` (`locked`, `lockonfault`).
    #[default]
    Smaps,
    /// Names and ranges only. smaps walks every page table of the process for its `Rss:`
    /// figures: 0.5-4.9 s for each 2 GiB qemu guest on a loaded host (maps: 0-0.16 s), which
    /// a system-wide summary paid for every process that faulted, the stop and every
    /// interval included.
    Maps,
}

impl MapsFile {
    pub fn name(self) -> &'static str {
        match self {
            MapsFile::Smaps => "smaps",
            MapsFile::Maps => "maps",
        }
    }

    /// Whether a [`Mapping`] read from it has its `locked`/`lockonfault` flags.
    pub fn has_flags(self) -> bool {
        self == MapsFile::Smaps
    }
}

struct Snapshot {
    taken: Instant,
    /// When its read began, as CLOCK_MONOTONIC ns (the clock of the kernel's event stamps):
    /// a read can take long enough for the process to map and fault meanwhile.
    taken_ns: u64,
    /// How long reading it took: periodic re-reads of a large process are spaced out so that
    /// they cost it at most a twentieth of a CPU. CPU time, not wall time: a read that
    /// waited for the process's mmap lock (held by a long mlock populating huge pages)
    /// cost nothing, and must not put off the next read by twenty times the wait.
    cost: Duration,
    comm: Option<Outside>,
    mappings: Vec<Mapping>,
    /// Mappings earlier reads had and this one has not (nothing mapped over them since),
    /// newest last: what backed a region the process unmapped, often just before it exited,
    /// as the last read that saw it said.
    unmapped: Vec<Mapping>,
    /// The process was gone (or a zombie) at a later refresh: these are its last mappings,
    /// and an address outside them may have been mapped after they were read.
    exited: bool,
    /// An mlock-family call changed the mappings after they were read.
    changed: bool,
}

/// How soon a snapshot that a call has changed is re-read, however long reads take (up to
/// a quarter of a CPU for a read of 125 ms or more): a process that mlocks and soon exits
/// is otherwise summed up with mappings older than the region it locked. At most twice a
/// second per process, for a program locking in a loop.
pub const CHANGED_REREAD: Duration = Duration::from_millis(500);

impl Snapshot {
    /// Whether it is recent enough to keep for `max_age` (zero: never).
    fn fresh(&self, max_age: Duration) -> bool {
        if max_age.is_zero() {
            return false;
        }
        // Reads spaced by twenty times their cost: at most a twentieth of a CPU.
        let spacing = max_age.max(self.cost * 20);
        let age = self.taken.elapsed();
        let changed_spacing = spacing.min(CHANGED_REREAD.max(self.cost * 4));
        age < spacing && !(self.changed && age >= changed_spacing)
    }
}

impl MappingCache {
    /// A cache that reads the mappings from `file`.
    pub fn reading(file: MapsFile) -> Self {
        Self {
            file,
            ..Self::default()
        }
    }

    /// The file the mappings are read from.
    pub fn file(&self) -> MapsFile {
        self.file
    }

    /// Re-reads `pid`'s mappings if the snapshot is older than `max_age` (and than twenty
    /// times what the last read took, or [`CHANGED_REREAD`] where a call changed them);
    /// keeps the old one if the process is gone.
    pub fn refresh(&mut self, pid: u32, max_age: Duration) {
        if self.entries.get(&pid).is_some_and(|s| s.fresh(max_age)) {
            return;
        }
        let started = thread_cpu_time();
        let started_ns = crate::output::WallClock::monotonic_ns();
        let shows_lockonfault = smaps_shows_lockonfault(&crate::probe::kernel_release());
        // Unreadable or unparsable: keep what we had. Gone is the normal end of a process;
        // anything else is said, once per process, and counted.
        let path = format!("/proc/{pid}/{}", self.file.name());
        let entries = match read_smaps(&path, shows_lockonfault) {
            Ok(entries) => entries,
            Err(e) => {
                if is_alive(pid) {
                    self.unreadable += 1;
                    // Each process once; past 1024 of them, counted only.
                    if self.warned.len() < 1024 && self.warned.insert(pid) {
                        eprintln!(
                            "memlock-trace: warning: cannot read the mappings of pid {pid}: \
                             {e:#}; its faults are attributed to its last mappings read, or \
                             `unknown` (counted as `unreadable_mappings` in the health line)"
                        );
                    }
                }
                self.mark_exited(pid);
                return;
            }
        };
        let mappings: Vec<Mapping> = entries.into_iter().map(|e| e.mapping).collect();
        // A zombie (or a kernel thread) has no mappings: keep what we saw while it lived.
        if mappings.is_empty() && self.entries.contains_key(&pid) {
            self.mark_exited(pid);
            return;
        }
        let comm = read_comm(pid);
        // Only smaps says what backs a mapping: from maps, nothing worth keeping.
        let unmapped = match self.entries.remove(&pid) {
            Some(old) if self.file == MapsFile::Smaps => still_unmapped(old, &mappings),
            _ => Vec::new(),
        };
        self.entries.insert(
            pid,
            Snapshot {
                taken: Instant::now(),
                taken_ns: started_ns,
                cost: thread_cpu_time().saturating_sub(started),
                comm,
                mappings,
                unmapped,
                exited: false,
                changed: false,
            },
        );
        // The snapshot has the VMAs noted before it, as they are now (or not, if unmapped).
        self.noted.remove(&pid);
    }

    /// Notes a VMA seen by an mlock-family call (`name` says which). Bounded: system-wide,
    /// nothing re-reads /proc (which would clear them) until a summary, and pids come back:
    /// at 4,096 pids of 256 VMAs each, a reused pid's list grew with every process that had
    /// it (9.7 MiB after 11 minutes of the soak's churn on a host with pid_max 32,768, and
    /// rising). 1,024 pids (`--max-processes`' default) of the last 32 each: 4 MiB at most.
    pub fn note_vma(&mut self, pid: u32, mapping: Mapping) {
        const MAX_PROCESSES: usize = 1024;
        const MAX_PER_PROCESS: usize = 32;
        if self.noted.len() >= MAX_PROCESSES && !self.noted.contains_key(&pid) {
            return;
        }
        if let Some(s) = self.entries.get_mut(&pid) {
            s.changed = true;
        }
        let noted = self.noted.entry(pid).or_default();
        if noted.len() >= MAX_PER_PROCESS {
            noted.remove(0);
        }
        noted.push(mapping);
    }

    /// VMAs noted since the last snapshot, newest last.
    pub fn noted(&self, pid: u32) -> &[Mapping] {
        self.noted.get(&pid).map_or(&[], Vec::as_slice)
    }

    fn mark_exited(&mut self, pid: u32) {
        if let Some(s) = self.entries.get_mut(&pid) {
            s.exited = true;
        }
    }

    /// Whether `pid`'s mappings are the last ones seen before it exited.
    pub fn exited(&self, pid: u32) -> bool {
        self.entries.get(&pid).is_some_and(|s| s.exited)
    }

    /// Whether `pid`'s mappings were read before `ns` (CLOCK_MONOTONIC), or not at all: an
    /// event stamped `ns` may be in a mapping they do not have yet.
    pub fn read_before(&self, pid: u32, ns: u64) -> bool {
        self.entries.get(&pid).is_none_or(|s| s.taken_ns < ns)
    }

    pub fn get(&self, pid: u32) -> Option<&[Mapping]> {
        self.entries.get(&pid).map(|s| s.mappings.as_slice())
    }

    /// The mappings earlier reads of `pid` had and its last read has not, newest last.
    pub fn unmapped(&self, pid: u32) -> &[Mapping] {
        self.entries
            .get(&pid)
            .map_or(&[], |s| s.unmapped.as_slice())
    }

    pub fn comm(&self, pid: u32) -> Option<Outside> {
        self.entries.get(&pid).and_then(|s| s.comm.clone())
    }

    /// Failed reads of living processes' mappings so far.
    pub fn unreadable(&self) -> u64 {
        self.unreadable
    }
}

/// The mappings of `old` (and those it had already lost) that no mapping of a new read
/// `now` (in address order, as the kernel lists them) overlaps: unmapped in between, kept
/// for what their last read said. Bounded per process, the oldest dropped first: a process
/// mapping and unmapping in a loop (a malloc arena, a JIT) would otherwise grow it with
/// every read.
fn still_unmapped(old: Snapshot, now: &[Mapping]) -> Vec<Mapping> {
    const MAX_PER_PROCESS: usize = 32;
    let mapped_over = |m: &Mapping| {
        let first_ending_after = now.partition_point(|n| n.end <= m.start);
        now.get(first_ending_after)
            .is_some_and(|n| n.overlaps((m.start, m.end)))
    };
    let mut unmapped: Vec<Mapping> = old
        .unmapped
        .into_iter()
        .chain(old.mappings)
        .filter(|m| !mapped_over(m))
        .collect();
    let excess = unmapped.len().saturating_sub(MAX_PER_PROCESS);
    unmapped.drain(..excess);
    unmapped
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event stamped after a read began may be in a mapping that read has not: the
    /// tracer's own mappings, read now, were read before an event of a moment from now.
    #[test]
    fn read_before_compares_the_start_of_the_read_with_the_event() {
        let pid = std::process::id();
        let mut cache = MappingCache::reading(MapsFile::Maps);
        assert!(cache.read_before(pid, 0), "never read: before anything");
        let before = crate::output::WallClock::monotonic_ns();
        cache.refresh(pid, Duration::ZERO);
        assert!(!cache.read_before(pid, before), "read after {before}");
        assert!(cache.read_before(pid, crate::output::WallClock::monotonic_ns() + 1));
    }

    #[test]
    fn a_snapshot_a_call_changed_is_reread_sooner_than_its_cost_allows() {
        let snapshot = |age_ms, cost_ms, changed| Snapshot {
            taken: Instant::now() - Duration::from_millis(age_ms),
            taken_ns: 0,
            cost: Duration::from_millis(cost_ms),
            comm: None,
            mappings: Vec::new(),
            unmapped: Vec::new(),
            exited: false,
            changed,
        };
        let tick = Duration::from_millis(40);
        // A read of 100 ms is spaced by 2 s; once a call changed the mappings, by 500 ms.
        assert!(snapshot(600, 100, false).fresh(tick));
        assert!(!snapshot(600, 100, true).fresh(tick));
        assert!(snapshot(400, 100, true).fresh(tick));
        // A read of 1 s: by 20 s, and by 4 s after a change (a quarter of a CPU).
        assert!(snapshot(3_000, 1_000, true).fresh(tick));
        assert!(!snapshot(4_000, 1_000, true).fresh(tick));
        // A cheap read is spaced by the tick either way; zero means now.
        assert!(snapshot(10, 1, true).fresh(tick));
        assert!(!snapshot(50, 1, false).fresh(tick));
        assert!(!snapshot(0, 0, false).fresh(Duration::ZERO));
    }

    #[test]
    fn mappings_a_read_lost_are_kept_until_something_is_mapped_over_them() {
        let m = |start: u64, end: u64| Mapping {
            start,
            end,
            offset: 0,
            name: format!("{start:#x}").into(),
            locked: false,
            lockonfault: None,
            pages: crate::procfs::PageSizes::default(),
        };
        let read = |mappings, unmapped| Snapshot {
            taken: Instant::now(),
            taken_ns: 0,
            cost: Duration::ZERO,
            comm: None,
            mappings,
            unmapped,
            exited: false,
            changed: false,
        };
        let starts = |v: &[Mapping]| v.iter().map(|m| m.start).collect::<Vec<_>>();
        // 0x3000 unmapped; 0x1000 split (still overlapped): only 0x3000 is lost.
        let first = read(vec![m(0x1000, 0x3000), m(0x3000, 0x5000)], Vec::new());
        let lost = still_unmapped(first, &[m(0x1000, 0x2000), m(0x2000, 0x3000)]);
        assert_eq!(starts(&lost), [0x3000]);
        // Kept across reads, newest last, until a new mapping covers part of it.
        let second = read(vec![m(0x1000, 0x2000), m(0x8000, 0x9000)], lost);
        assert_eq!(
            starts(&still_unmapped(second, &[m(0x1000, 0x2000)])),
            [0x3000, 0x8000]
        );
        let third = read(vec![m(0x1000, 0x2000)], vec![m(0x3000, 0x5000)]);
        assert!(still_unmapped(third, &[m(0x1000, 0x2000), m(0x4000, 0x4800)]).is_empty());
        // At most 32, the oldest dropped.
        let many: Vec<Mapping> = (0..40).map(|i| m(i << 12, (i + 1) << 12)).collect();
        let kept = still_unmapped(read(many, Vec::new()), &[]);
        assert_eq!((kept.len(), kept[0].start), (32, 8 << 12));
    }

    #[test]
    fn reads_own_smaps() {
        let mut cache = MappingCache::default();
        let pid = std::process::id();
        cache.refresh(pid, Duration::ZERO);
        let maps = cache.get(pid).expect("own smaps");
        assert!(maps.iter().any(|m| m.name == "[stack]"), "{maps:?}");
        assert!(cache.comm(pid).is_some());
        // System-wide, names and ranges from maps, without flags.
        let mut names = MappingCache::reading(MapsFile::Maps);
        names.refresh(pid, Duration::ZERO);
        assert_eq!(
            (names.file(), cache.file()),
            (MapsFile::Maps, MapsFile::Smaps)
        );
        let named = names.get(pid).expect("own maps");
        assert!(named.iter().any(|m| m.name == "[stack]"), "{named:?}");
        // Our own maps agree with our own smaps about the ranges.
        let maps = read_smaps(&format!("/proc/{pid}/maps"), true).unwrap();
        assert!(maps.iter().any(|e| e.mapping.name == "[stack]"));
    }
}

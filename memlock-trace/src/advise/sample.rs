//! What the tracer's summaries do not hold, read from `/proc` while the target runs: every
//! mapping it had (range, name, permissions, resident and locked bytes, when it was seen
//! and how often it came back), when the last executable file was mapped (the end of
//! start-up), its `RLIMIT_MEMLOCK`, `CAP_IPC_LOCK`, memory cgroup, thread count and its own
//! fault counters.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use serde::Serialize;

use crate::{
    output::{Outside, WallClock},
    probe,
    process::memory_cgroup::{self, MemoryCgroup},
    procfs::{self, PAGE_SIZE},
};

/// How often the target's smaps is read: fine enough to see a library mapped at start-up
/// and a block that lives a few rounds; its cost (a page-table walk) stays small.
const EVERY: Duration = Duration::from_millis(50);
/// How often its fault counters (`/proc/PID/stat`, one small read) are read between two
/// smaps: the readings the counts at the tracer's attach and end are taken from.
const STAT_EVERY: Duration = Duration::from_millis(10);

/// `CAP_IPC_LOCK` in `CapEff:` (include/uapi/linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;

/// One mapping as the samples saw it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Seen {
    pub start: u64,
    pub end: u64,
    pub name: Outside,
    pub perms: String,
    /// CLOCK_REALTIME ns of the first and last sample that held it.
    pub first_ns: u64,
    pub last_ns: u64,
    pub rss_max_bytes: u64,
    pub locked_max_bytes: u64,
    /// Most bytes out on swap in any sample (smaps `Swap:`).
    pub swap_max_bytes: u64,
    /// Times it appeared: 2 or more when it was unmapped and mapped again at the same place.
    pub lifetimes: u32,
    /// A one-page `---p` mapping right below it: a thread stack's guard.
    pub guarded: bool,
}

/// `RLIMIT_MEMLOCK` as `/proc/PID/limits` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemlockLimit {
    Bytes(u64),
    Unlimited,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Samples {
    pub seen: Vec<Seen>,
    /// When the last executable file mapping was first seen (CLOCK_REALTIME ns).
    pub last_exec_mapping_ns: Option<u64>,
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
    #[serde(flatten)]
    pub limits: LimitsSeen,
    /// `/proc/PID/stat` minflt + majflt, every [`STAT_EVERY`]: when (CLOCK_REALTIME ns) and
    /// how many.
    pub stat: Vec<(u64, u64)>,
    /// Process start, ns after boot (`/proc/PID/stat` field 22).
    pub start_boot_ns: Option<u64>,
    pub samples: u32,
}

/// The limits the advice is weighed against and the process's largest figures, as the
/// samples saw them (the table carries them as they are).
#[derive(Clone, Debug, Default, Serialize)]
pub struct LimitsSeen {
    pub memlock_limit: Option<MemlockLimit>,
    pub cap_ipc_lock: Option<bool>,
    /// The memory cgroup as the sample that found the least room saw it (its usage at the
    /// fullest).
    pub memory_cgroup: Option<MemoryCgroup>,
    pub threads_max: u32,
    /// Most bytes locked at once (the sum of smaps `Locked:`).
    pub locked_max_bytes: u64,
    /// Most bytes the process had out on swap (`VmSwap:`), and most resident and swapped
    /// together in one sample (`VmRSS:` + `VmSwap:`: its whole footprint at its largest).
    pub swap_max_bytes: u64,
    pub footprint_max_bytes: u64,
    /// The least swap the process could have used in any sample: the machine's free swap
    /// (`SwapFree:`) and what the process itself held there (`None`: never read).
    pub swap_room_bytes: Option<u64>,
}

/// Where the target's pid comes from.
#[derive(Clone, Copy)]
pub enum Pid {
    Known(u32),
    /// The first child of this process (the tracer's launched command).
    ChildOf(u32),
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    pid: Arc<AtomicU32>,
    thread: JoinHandle<Samples>,
}

impl Sampler {
    pub fn start(pid: Pid) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let found = Arc::new(AtomicU32::new(0));
        let (stop2, found2) = (stop.clone(), found.clone());
        let thread = std::thread::spawn(move || sample_until(pid, &stop2, &found2));
        Self {
            stop,
            pid: found,
            thread,
        }
    }

    /// The target's pid once found.
    pub fn pid(&self) -> Option<u32> {
        Some(self.pid.load(Ordering::Relaxed)).filter(|&p| p != 0)
    }

    pub fn finish(self) -> Samples {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

fn sample_until(pid_source: Pid, stop: &AtomicBool, found: &AtomicU32) -> Samples {
    let lockonfault = procfs::smaps_shows_lockonfault(&probe::kernel_release());
    let mut samples = Samples::default();
    let mut mappings = Mappings::default();
    let launcher = Launcher::of(pid_source);
    let mut known = match pid_source {
        Pid::Known(pid) => Some(pid),
        Pid::ChildOf(_) => None,
    };
    while !stop.load(Ordering::Relaxed) {
        // The counters between two smaps, of the process the last one found.
        for _ in 0..EVERY.as_millis() / STAT_EVERY.as_millis() {
            std::thread::sleep(STAT_EVERY);
            if stop.load(Ordering::Relaxed) {
                break;
            }
            if let Some(pid) = known {
                samples.note_stat(pid);
            }
        }
        let Some(pid) = launcher.target(pid_source) else {
            continue;
        };
        found.store(pid, Ordering::Relaxed);
        known = Some(pid);
        let Ok(entries) = procfs::read_smaps(&format!("/proc/{pid}/smaps"), lockonfault) else {
            continue;
        };
        let now = WallClock::now_ns();
        samples.samples += 1;
        samples.first_ns.get_or_insert(now);
        samples.last_ns = Some(now);
        samples.note_stat(pid);
        if let Some(status) = read(&format!("/proc/{pid}/status")) {
            samples.limits.note_status(&status);
        }
        if let Some(limit) = read(&format!("/proc/{pid}/limits")).and_then(|l| memlock_limit(&l)) {
            samples.limits.memlock_limit = Some(limit);
        }
        if let Some(cgroup) = memory_cgroup::of_process(pid) {
            samples.limits.note_cgroup(cgroup);
        }
        mappings.note(&mut samples, &entries, now);
    }
    samples
}

/// What tells the launched command from the tracer it is forked from, this same binary:
/// until it execs, its mappings are the tracer's. Its command line tells the two apart
/// when the command is this binary too (the suite's advice on its own workloads).
struct Launcher {
    exe: Option<std::path::PathBuf>,
    cmdline: Option<Vec<u8>>,
}

impl Launcher {
    fn of(pid_source: Pid) -> Self {
        Self {
            exe: std::env::current_exe().ok(),
            cmdline: match pid_source {
                Pid::ChildOf(parent) => std::fs::read(format!("/proc/{parent}/cmdline")).ok(),
                Pid::Known(_) => None,
            },
        }
    }

    /// The pid to sample now: the one known, or the launched command once it has exec'd.
    fn target(&self, pid_source: Pid) -> Option<u32> {
        let parent = match pid_source {
            Pid::Known(p) => return Some(p),
            Pid::ChildOf(parent) => parent,
        };
        let pid = first_child(parent)?;
        let not_yet = std::fs::read_link(format!("/proc/{pid}/exe")).ok() == self.exe
            && std::fs::read(format!("/proc/{pid}/cmdline")).ok() == self.cmdline;
        (!not_yet).then_some(pid)
    }
}

impl LimitsSeen {
    /// Threads, `CAP_IPC_LOCK` and swap from `/proc/PID/status`.
    fn note_status(&mut self, status: &str) {
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(str::trim)
        };
        if let Some(t) = field("Threads:").and_then(|t| t.parse().ok()) {
            self.threads_max = self.threads_max.max(t);
        }
        if let Some(caps) = field("CapEff:").and_then(|c| u64::from_str_radix(c, 16).ok()) {
            self.cap_ipc_lock = Some(caps & (1 << CAP_IPC_LOCK) != 0);
        }
        let kb = |k: &str| {
            field(k)
                .and_then(|v| v.trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kb| kb * 1024)
        };
        if let (Some(rss), Some(swap)) = (kb("VmRSS:"), kb("VmSwap:")) {
            self.swap_max_bytes = self.swap_max_bytes.max(swap);
            self.footprint_max_bytes = self.footprint_max_bytes.max(rss + swap);
            if let Some(free) = meminfo_bytes("SwapFree:") {
                let room = free + swap;
                self.swap_room_bytes = Some(self.swap_room_bytes.map_or(room, |r| r.min(room)));
            }
        }
    }

    /// Keeps the memory cgroup as the sample that found the least room saw it.
    fn note_cgroup(&mut self, cgroup: MemoryCgroup) {
        let room = |c: &MemoryCgroup| c.binding().map_or(u64::MAX, |l| l.headroom());
        if self
            .memory_cgroup
            .as_ref()
            .is_none_or(|seen| room(&cgroup) <= room(seen))
        {
            self.memory_cgroup = Some(cgroup);
        }
    }
}

/// A mapping as smaps names it: start, end, name.
type MappingKey = (u64, u64, Outside);

/// The mappings seen so far: where each is in [`Samples::seen`], and those the last sample
/// held (one not held then and held again has come back).
#[derive(Default)]
struct Mappings {
    index: BTreeMap<MappingKey, usize>,
    present: BTreeSet<MappingKey>,
}

impl Mappings {
    /// One sample's smaps `entries`, taken at `now`.
    fn note(&mut self, samples: &mut Samples, entries: &[procfs::SmapsEntry], now: u64) {
        let mut now_present = BTreeSet::new();
        let mut locked = 0;
        for (i, e) in entries.iter().enumerate() {
            let m = &e.mapping;
            let key = (m.start, m.end, m.name.clone());
            locked += e.locked_kb * 1024;
            let guarded = i > 0 && {
                let below = &entries[i - 1];
                below.perms.starts_with("---")
                    && below.mapping.end == m.start
                    && below.mapping.end - below.mapping.start == PAGE_SIZE
            };
            let slot = *self.index.entry(key.clone()).or_insert_with(|| {
                samples.seen.push(Seen {
                    start: m.start,
                    end: m.end,
                    name: m.name.clone(),
                    perms: e.perms.clone(),
                    first_ns: now,
                    ..Seen::default()
                });
                if e.perms.contains('x') && m.name.starts_with("/") {
                    samples.last_exec_mapping_ns = Some(now);
                }
                samples.seen.len() - 1
            });
            let seen = &mut samples.seen[slot];
            if !self.present.contains(&key) {
                seen.lifetimes += 1;
            }
            seen.last_ns = now;
            seen.rss_max_bytes = seen.rss_max_bytes.max(e.rss_kb * 1024);
            seen.locked_max_bytes = seen.locked_max_bytes.max(e.locked_kb * 1024);
            seen.swap_max_bytes = seen.swap_max_bytes.max(e.swap_kb * 1024);
            seen.guarded |= guarded;
            now_present.insert(key);
        }
        samples.limits.locked_max_bytes = samples.limits.locked_max_bytes.max(locked);
        self.present = now_present;
    }
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The first child of `parent`'s main thread.
fn first_child(parent: u32) -> Option<u32> {
    read(&format!("/proc/{parent}/task/{parent}/children"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// minflt + majflt (fields 10 and 12) and the start time (22, in ns after boot).
fn stat(pid: u32) -> Option<(u64, u64)> {
    let text = read(&format!("/proc/{pid}/stat"))?;
    // The comm (field 2) may hold spaces and parentheses: fields are counted after its end.
    let fields: Vec<&str> = text.get(text.rfind(')')? + 2..)?.split(' ').collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    // SAFETY: sysconf reads a constant.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
    Some((
        field(10)? + field(12)?,
        field(22)? * 1_000_000_000 / hz.max(1),
    ))
}

/// Whether `pid` is still the process that started at `start_boot_ns` (not gone, nor its
/// pid taken by another).
pub fn still_running(pid: u32, start_boot_ns: u64) -> bool {
    stat(pid).is_some_and(|(_, start)| start == start_boot_ns)
}

impl Samples {
    /// One reading of `pid`'s fault counters, now.
    fn note_stat(&mut self, pid: u32) {
        if let Some((faults, start)) = stat(pid) {
            self.stat.push((WallClock::now_ns(), faults));
            self.start_boot_ns = Some(start);
        }
    }

    /// The faults the process had counted at `ns` (CLOCK_REALTIME): between the two
    /// readings around it, in proportion; after the last one, the last (the process ended);
    /// None before the first.
    pub fn faults_at(&self, ns: u64) -> Option<u64> {
        let after = self.stat.partition_point(|&(t, _)| t <= ns);
        let (t0, f0) = *self.stat.get(after.checked_sub(1)?)?;
        let Some(&(t1, f1)) = self.stat.get(after) else {
            return Some(f0);
        };
        let share = (ns - t0) as f64 / (t1 - t0).max(1) as f64;
        Some(f0 + (f1.saturating_sub(f0) as f64 * share).round() as u64)
    }
}

/// The soft `Max locked memory` of `/proc/PID/limits`.
fn memlock_limit(limits: &str) -> Option<MemlockLimit> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))?;
    let soft = line["Max locked memory".len()..]
        .split_whitespace()
        .next()?;
    Some(match soft {
        "unlimited" => MemlockLimit::Unlimited,
        bytes => MemlockLimit::Bytes(bytes.parse().ok()?),
    })
}

/// `MemAvailable:` of /proc/meminfo, bytes.
pub fn mem_available() -> Option<u64> {
    meminfo_bytes("MemAvailable:")
}

/// A field of /proc/meminfo (`MemAvailable:`, `SwapFree:`), bytes.
fn meminfo_bytes(field: &str) -> Option<u64> {
    let meminfo = read("/proc/meminfo")?;
    let kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memlock_limit_is_read_from_proc_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max locked memory         8388608              8388608              bytes     \n";
        assert_eq!(memlock_limit(limits), Some(MemlockLimit::Bytes(8 << 20)));
        let unlimited =
            "Max locked memory         unlimited            unlimited            bytes\n";
        assert_eq!(memlock_limit(unlimited), Some(MemlockLimit::Unlimited));
        assert_eq!(memlock_limit("Max open files 1024 1024 files\n"), None);
    }

    #[test]
    fn our_own_stat_and_smaps_are_read() {
        let pid = std::process::id();
        let (faults, start) = stat(pid).expect("own stat");
        assert!(faults > 0 && start > 0);
        assert!(still_running(pid, start) && !still_running(pid, start + 1));
        assert!(mem_available().is_some_and(|b| b > 0));
    }

    #[test]
    fn the_faults_at_an_instant_are_read_between_the_readings_around_it() {
        let samples = Samples {
            stat: vec![(100, 1_000), (110, 1_000), (120, 1_400), (130, 1_500)],
            ..Samples::default()
        };
        assert_eq!(samples.faults_at(99), None);
        assert_eq!(samples.faults_at(105), Some(1_000));
        assert_eq!(samples.faults_at(110), Some(1_000));
        assert_eq!(samples.faults_at(115), Some(1_200));
        assert_eq!(samples.faults_at(130), Some(1_500));
        assert_eq!(samples.faults_at(500), Some(1_500));
    }
}

//! Names for generated (JIT) code from the perf map its runtime writes, `/tmp/perf-PID.map`:
//! one `START SIZE NAME` line per function, hex (node `--perf-basic-prof`, python 3.12+ `-X
//! perf`, the JVM's perf-map agents). perf, bcc, bpftrace and Parca read the same file.
//!
//! The map is read while the process lives (through `/proc/PID/root`, so a container's
//! `/tmp` is the one read, under the pid the process has there) and kept: the stacks of a
//! process that has exited are still named. A runtime appends to its map as it compiles,
//! so it is read again when it grew, and once more at the end if the very same file (same
//! device and inode) is still there; a process that exited before any look is looked for
//! where perf looks, `/tmp/perf-PID.map` in the tracer's own `/tmp`.

use std::{
    collections::{BTreeSet, HashMap},
    fs::File,
    io::Read as _,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::PathBuf,
    time::{Duration, Instant},
};

/// How often a live process's map is looked at again (a stat; a read only if it grew).
const RECHECK: Duration = Duration::from_millis(50);
/// Larger maps are read up to here: a JVM's after hours of compiling is a few MiB.
const MAX_MAP_BYTES: u64 = 256 << 20;

/// One function of generated code.
#[derive(Clone, Debug, PartialEq, Eq)]
struct JitSymbol {
    start: u64,
    end: u64,
    /// Its line in the file: a later line for the same address is newer code.
    line: usize,
    name: String,
}

/// One process's perf map, as last read.
#[derive(Clone, Debug, Default)]
pub struct PerfMap {
    /// Sorted by start, then line.
    symbols: Vec<JitSymbol>,
    /// Where it was found, as the process sees it (`/tmp/perf-NSPID.map`).
    pub path: String,
    dev: u64,
    inode: u64,
    len: u64,
}

impl PerfMap {
    /// Parses a map's text: malformed lines are skipped, as perf skips them.
    fn parse(text: &str) -> Vec<JitSymbol> {
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
        let mut symbols: Vec<JitSymbol> = text
            .lines()
            .enumerate()
            .filter_map(|(line, l)| {
                let mut parts = l.splitn(3, ' ');
                let start = hex(parts.next()?)?;
                let size = hex(parts.next()?)?;
                let name = parts.next()?.trim_end();
                (size > 0 && !name.is_empty()).then(|| JitSymbol {
                    start,
                    end: start.saturating_add(size),
                    line,
                    name: name.to_string(),
                })
            })
            .collect();
        symbols.sort_by_key(|s| (s.start, s.line));
        symbols
    }

    /// The function holding `addr`: of the entries that do, the last written (code moved
    /// or recompiled at the same address). Looks back over at most 64 earlier starts.
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|s| s.start <= addr);
        self.symbols[..i]
            .iter()
            .rev()
            .take(64)
            .filter(|s| s.end > addr)
            .max_by_key(|s| s.line)
            .map(|s| s.name.as_str())
    }

    pub fn len(&self) -> usize {
        self.symbols.len()
    }

    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }
}

/// The perf maps of the traced processes that run generated code.
#[derive(Default)]
pub struct PerfMaps {
    maps: HashMap<u32, PerfMap>,
    checked: HashMap<u32, Instant>,
    /// Processes looked for whose map was never found.
    absent: BTreeSet<u32>,
}

impl PerfMaps {
    pub fn get(&self, tgid: u32) -> Option<&PerfMap> {
        self.maps.get(&tgid)
    }

    /// Processes with generated code and no perf map found (for the note that says so).
    pub fn absent(&self) -> impl Iterator<Item = u32> + '_ {
        self.absent
            .iter()
            .copied()
            .filter(|t| !self.maps.contains_key(t))
    }

    /// Looks at `tgid`'s map unless it was looked at less than [`RECHECK`] ago.
    pub fn refresh(&mut self, tgid: u32) {
        let now = Instant::now();
        if self
            .checked
            .get(&tgid)
            .is_some_and(|t| now.duration_since(*t) < RECHECK)
        {
            return;
        }
        self.checked.insert(tgid, now);
        self.read(tgid, true);
    }

    /// The last look at every map, when the session ends: a process still running is read
    /// as usual; one that has exited, from the same file if it is still there.
    pub fn finish(&mut self, tgids: impl IntoIterator<Item = u32>) {
        for tgid in tgids {
            self.read(tgid, false);
        }
    }

    /// Reads `tgid`'s map if it is new or grew. `live_only`: only through the living
    /// process's root; otherwise, once it has exited, also the file it had, by identity.
    fn read(&mut self, tgid: u32, live_only: bool) {
        let live = nspid(tgid).map(|ns| {
            let path = format!("/tmp/perf-{ns}.map");
            (PathBuf::from(format!("/proc/{tgid}/root{path}")), path)
        });
        let (read_path, shown) = match (live, self.maps.get(&tgid)) {
            (Some(live), _) => live,
            (None, Some(old)) if !live_only => (PathBuf::from(&old.path), old.path.clone()),
            // Gone before any look (a short script on a loaded machine): where perf looks
            // after the fact, this /tmp under the pid it had here.
            (None, None) if !live_only => {
                let path = format!("/tmp/perf-{tgid}.map");
                (PathBuf::from(&path), path)
            }
            _ => return,
        };
        let Some((file, meta)) = open_map(&read_path, tgid) else {
            if !self.maps.contains_key(&tgid) {
                self.absent.insert(tgid);
            }
            return;
        };
        if let Some(old) = self.maps.get(&tgid) {
            let same = (old.dev, old.inode) == (meta.dev(), meta.ino());
            // After the exit, only the very file read before; a file replaced under the
            // same name while the process lives is read afresh.
            if (!same && !live_only) || (same && old.len == meta.len()) {
                return;
            }
        }
        let mut text = Vec::new();
        if file.take(MAX_MAP_BYTES).read_to_end(&mut text).is_err() {
            return;
        }
        // A line the runtime is still writing is left for the next read.
        let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let map = PerfMap {
            symbols: PerfMap::parse(&String::from_utf8_lossy(&text[..complete])),
            path: shown,
            dev: meta.dev(),
            inode: meta.ino(),
            len: complete as u64,
        };
        self.maps.insert(tgid, map);
    }
}

/// The pid `tgid` has in its own pid namespace (the one its runtime names the file by).
fn nspid(tgid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tgid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// Opens a map for reading as root without being led astray: a regular file (not a FIFO
/// that would block, nor a device), not through a final symbolic link, owned by root or by
/// the process's own user (as perf requires).
fn open_map(path: &std::path::Path, tgid: u32) -> Option<(File, std::fs::Metadata)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    let owner_ok = meta.uid() == 0
        || std::fs::metadata(format!("/proc/{tgid}")).map_or(true, |p| p.uid() == meta.uid());
    owner_ok.then_some((file, meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_entry_wins_and_malformed_lines_are_skipped() {
        let map = PerfMap {
            symbols: PerfMap::parse(
                "1000 100 LazyCompile:*touchAll /tmp/n.js:3\n\
                 nonsense\n\
                 0x2000 0x10 Builtins_Foo\n\
                 1000 40 LazyCompile:~touchAll /tmp/n.js:3\n\
                 3000 0 empty\n",
            ),
            ..PerfMap::default()
        };
        assert_eq!(map.len(), 3);
        assert_eq!(
            map.lookup(0x1010),
            Some("LazyCompile:~touchAll /tmp/n.js:3")
        );
        assert_eq!(
            map.lookup(0x1050),
            Some("LazyCompile:*touchAll /tmp/n.js:3")
        );
        assert_eq!(map.lookup(0x200f), Some("Builtins_Foo"));
        assert_eq!(map.lookup(0x2010), None);
        assert_eq!(map.lookup(0xfff), None);
        assert_eq!(map.lookup(0x3000), None);
    }

    /// This very process's map, written where a runtime writes it, read through
    /// `/proc/PID/root`, then kept after the file is gone.
    #[test]
    fn reads_the_map_of_a_live_process() {
        let pid = std::process::id();
        let path = format!("/tmp/perf-{pid}.map");
        std::fs::write(&path, "7f0000001000 20 jitted_one\n7f0000002000 20 half").unwrap();
        let mut maps = PerfMaps::default();
        maps.refresh(pid);
        let map = maps.get(pid).expect("map read");
        assert_eq!((map.len(), map.path.as_str()), (1, path.as_str()));
        assert_eq!(map.lookup(0x7f00_0000_1010), Some("jitted_one"));
        std::fs::remove_file(&path).unwrap();
        maps.finish([pid]);
        assert_eq!(
            maps.get(pid).unwrap().lookup(0x7f00_0000_1010),
            Some("jitted_one")
        );
        assert_eq!(maps.absent().count(), 0);
        // Gone before any look: its map is looked for in this /tmp, under its pid.
        let gone = u32::MAX - 1;
        maps.finish([gone]);
        assert_eq!(maps.absent().collect::<Vec<_>>(), [gone]);
        let path = format!("/tmp/perf-{gone}.map");
        std::fs::write(&path, "7f0000003000 20 jitted_late\n").unwrap();
        maps.finish([gone]);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            maps.get(gone).and_then(|m| m.lookup(0x7f00_0000_3000)),
            Some("jitted_late")
        );
        assert_eq!(maps.absent().count(), 0);
    }
}

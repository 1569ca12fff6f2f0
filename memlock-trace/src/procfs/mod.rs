//! A process's mappings from `/proc/PID/smaps`: the one parser of smaps (and of
//! `/proc/PID/maps`, whose lines are smaps's headers), and the mapping cache the fault family
//! uses to attribute fault addresses to mappings ([`cache`]).

mod cache;

use anyhow::{Context as _, Result, anyhow};

pub use cache::{CHANGED_REREAD, MappingCache, MapsFile};

use crate::output::Outside;

/// The page size (one definition, shared with the kernel side).
pub use memlock_trace_common::PAGE_SIZE;

/// A mapping as the fault family attributes to it: address range, name and the `VmFlags`
/// `lo` (VM_LOCKED) / `lf` (VM_LOCKONFAULT).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the mapped file of `start` (0 for anonymous mappings).
    pub offset: u64,
    /// `[heap]`, `[stack]`, `[vdso]`, a file path (as the bytes the kernel shows: a name
    /// need not be UTF-8), `/memfd:NAME (deleted)`, or `anonymous`.
    pub name: Outside,
    pub locked: bool,
    /// None where the kernel does not show `VM_LOCKONFAULT` in smaps (before 6.2).
    pub lockonfault: Option<bool>,
    /// The page sizes backing it, from smaps (all 0 and false when read from `maps`).
    pub pages: PageSizes,
}

/// What backs a mapping, from its smaps fields: the page size, and how much of it sits in
/// huge pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageSizes {
    /// `KernelPageSize`: 4 kB, or a hugetlb mapping's huge page size (2048 kB, 1048576 kB).
    pub kernel_page_kb: u64,
    /// `Rss`.
    pub rss_kb: u64,
    /// Resident in transparent huge pages: `AnonHugePages` + `ShmemPmdMapped` +
    /// `FilePmdMapped`.
    pub thp_kb: u64,
    /// Resident in hugetlb pages, which `Rss` leaves out: `Private_Hugetlb` +
    /// `Shared_Hugetlb`.
    pub hugetlb_kb: u64,
    /// `VmFlags` `hg` (`MADV_HUGEPAGE`), `nh` (`MADV_NOHUGEPAGE`), `ht` (hugetlb).
    pub thp_advised: bool,
    pub thp_refused: bool,
    pub hugetlb: bool,
}

/// The system's transparent huge page mode, `/sys/kernel/mm/transparent_hugepage/enabled`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThpMode {
    /// `[always]`: every anonymous mapping but those with `MADV_NOHUGEPAGE`.
    Always,
    /// `[madvise]`: only those with `MADV_HUGEPAGE`.
    Madvise,
    /// `[never]`, or no THP in this kernel.
    Never,
}

/// Reads the THP mode (the bracketed word of the sysfs file).
pub fn thp_mode() -> ThpMode {
    let text =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if text.contains("[always]") {
        ThpMode::Always
    } else if text.contains("[madvise]") {
        ThpMode::Madvise
    } else {
        ThpMode::Never
    }
}

impl PageSizes {
    /// Whether a fault here may map a transparent huge page under `mode` (anonymous memory;
    /// a mapping already holding some is eligible whatever the mode says now).
    pub fn thp_eligible(&self, mode: ThpMode) -> bool {
        self.thp_kb > 0
            || (!self.hugetlb
                && !self.thp_refused
                && match mode {
                    ThpMode::Always => true,
                    ThpMode::Madvise => self.thp_advised,
                    ThpMode::Never => false,
                })
    }
}

impl Mapping {
    /// Whether the mapping overlaps the range `[start, end)`.
    pub fn overlaps(&self, (start, end): (u64, u64)) -> bool {
        self.start < end && self.end > start
    }
}

/// One VMA of `/proc/PID/smaps`: the [`Mapping`], and what `verify` and the lab's workloads
/// check besides (permissions, `Rss:`, `Locked:`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmapsEntry {
    pub mapping: Mapping,
    /// `rw-p`, as in /proc/PID/maps.
    pub perms: String,
    /// The mapped file's device (as `stat` encodes it) and inode; 0 and 0 for none.
    pub dev: u64,
    pub inode: u64,
    pub rss_kb: u64,
    pub locked_kb: u64,
    /// `Swap:`: the VMA's pages that are out on a swap device.
    pub swap_kb: u64,
}

/// Whether this kernel's smaps `VmFlags` show `lf` (VM_LOCKONFAULT): added in Linux 6.2
/// (fs/proc/task_mmu.c, commit 8614d6c5eda0).
pub fn smaps_shows_lockonfault(release: &str) -> bool {
    crate::probe::kernel_version(release).is_some_and(|version| version >= (6, 2))
}

/// Parses `/proc/PID/smaps`, or `/proc/PID/maps` (headers only: `Rss`, `Locked` and the
/// flags stay 0), as bytes: a mapped file's name is whatever bytes its creator chose, and one
/// that is not UTF-8 must not cost the other mappings. `shows_lockonfault`: see
/// [`smaps_shows_lockonfault`]. A line that is neither a header nor a `Key: value` field
/// after one is an error.
pub fn parse_smaps(text: &[u8], shows_lockonfault: bool) -> Result<Vec<SmapsEntry>> {
    let mut entries: Vec<SmapsEntry> = Vec::new();
    let text = text.strip_suffix(b"\n").unwrap_or(text);
    for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        // Field lines are `Key: value` (ASCII); a header's first colon (in `dev`, or in a
        // name) comes after a space.
        let field = line
            .iter()
            .position(|&b| b == b':')
            .map(|colon| line.split_at(colon))
            .filter(|(k, _)| !k.contains(&b' ') && !k.contains(&b'-'))
            .and_then(|(k, v)| {
                Some((
                    std::str::from_utf8(k).ok()?,
                    std::str::from_utf8(&v[1..]).ok()?,
                ))
            });
        let Some((key, value)) = field else {
            entries.push(parse_header(line, shows_lockonfault)?);
            continue;
        };
        let line = Outside::from(line);
        let entry = entries
            .last_mut()
            .ok_or_else(|| anyhow!("smaps field before any VMA: `{line}`"))?;
        let kb = || -> Result<u64> {
            let number = value.trim().trim_end_matches("kB").trim();
            number
                .parse()
                .with_context(|| format!("bad smaps value in `{line}`"))
        };
        let pages = &mut entry.mapping.pages;
        match key {
            "Rss" => {
                entry.rss_kb = kb()?;
                pages.rss_kb = entry.rss_kb;
            }
            "Locked" => entry.locked_kb = kb()?,
            "Swap" => entry.swap_kb = kb()?,
            "KernelPageSize" => pages.kernel_page_kb = kb()?,
            "AnonHugePages" | "ShmemPmdMapped" | "FilePmdMapped" => pages.thp_kb += kb()?,
            "Private_Hugetlb" | "Shared_Hugetlb" => pages.hugetlb_kb += kb()?,
            "VmFlags" => {
                for flag in value.split_whitespace() {
                    match flag {
                        "lo" => entry.mapping.locked = true,
                        "lf" => entry.mapping.lockonfault = Some(true),
                        "hg" => entry.mapping.pages.thp_advised = true,
                        "nh" => entry.mapping.pages.thp_refused = true,
                        "ht" => entry.mapping.pages.hugetlb = true,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(entries)
}

/// `7f12..-7f13.. rw-p 00001000 fd:01 123   [name, which may contain spaces]`: five ASCII
/// fields, then (after the kernel's padding) the name, as bytes, exactly.
fn parse_header(line: &[u8], shows_lockonfault: bool) -> Result<SmapsEntry> {
    let shown = Outside::from(line);
    let mut rest = line;
    let mut fields = [""; 5];
    for field in &mut fields {
        rest = rest.trim_ascii_start();
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        *field = std::str::from_utf8(&rest[..end])
            .with_context(|| format!("a maps field is not text in `{shown}`"))?;
        rest = &rest[end..];
    }
    let [range, perms, offset, dev, inode] = fields;
    if range.is_empty() {
        return Err(anyhow!("empty maps line"));
    }
    if perms.is_empty() {
        return Err(anyhow!("no permissions in `{shown}`"));
    }
    let (start, end) = range
        .split_once('-')
        .ok_or_else(|| anyhow!("no range in `{shown}`"))?;
    let hex = |field: &str| {
        u64::from_str_radix(field, 16).with_context(|| format!("bad address in `{shown}`"))
    };
    let (start, end) = (hex(start)?, hex(end)?);
    let offset = if offset.is_empty() { 0 } else { hex(offset)? };
    // `fd:01`: major and minor, hex.
    let dev = dev
        .split_once(':')
        .and_then(|(major, minor)| {
            Some(libc::makedev(
                u32::from_str_radix(major, 16).ok()?,
                u32::from_str_radix(minor, 16).ok()?,
            ))
        })
        .unwrap_or(0);
    let inode = inode.parse().unwrap_or(0);
    let name = rest.trim_ascii_start();
    Ok(SmapsEntry {
        mapping: Mapping {
            start,
            end,
            offset,
            name: if name.is_empty() {
                "anonymous".into()
            } else {
                Outside::from(name)
            },
            locked: false,
            lockonfault: shows_lockonfault.then_some(false),
            pages: PageSizes::default(),
        },
        perms: perms.to_string(),
        dev,
        inode,
        rss_kb: 0,
        locked_kb: 0,
        swap_kb: 0,
    })
}

/// Reads and parses a smaps (or maps) file, e.g. `/proc/PID/task/TID/smaps`.
pub fn read_smaps(path: &str, shows_lockonfault: bool) -> Result<Vec<SmapsEntry>> {
    let text = std::fs::read(path).with_context(|| format!("reading {path}"))?;
    parse_smaps(&text, shows_lockonfault).with_context(|| format!("parsing {path}"))
}

/// A process's name from `/proc/PID/comm` (the bytes it chose, without the newline).
pub fn read_comm(pid: u32) -> Option<Outside> {
    let mut comm = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    if comm.last() == Some(&b'\n') {
        comm.pop();
    }
    Some(Outside::from(comm))
}

/// CLOCK_BOOTTIME now, in ns: the clock of process start times (the kernel's
/// `task_struct.start_boottime`, and `/proc/PID/stat`'s start time in ticks).
pub fn boot_time_ns() -> Result<u64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .context("clock_gettime(CLOCK_BOOTTIME)")?;
    Ok(t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

/// Whether process `pid` exists and has not exited (a zombie has).
pub fn is_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .next()?
                .to_string();
            Some(state != "Z" && state != "X")
        })
        .unwrap_or(false)
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
Rss:                 512 kB
Locked:              512 kB
THPeligible:    0
VmFlags: rd wr mr mw me lo ac sd
7f00ab000000-7f00ab010000 r-xp 0001a000 08:01 1234                       /usr/lib/with space.so
Rss:                   4 kB
Locked:                0 kB
VmFlags: rd ex mr mw me lf sd
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
VmFlags: rd wr mr mw me gd ac
";

    fn mappings(text: &str, shows_lockonfault: bool) -> Vec<Mapping> {
        parse_smaps(text.as_bytes(), shows_lockonfault)
            .unwrap()
            .into_iter()
            .map(|e| e.mapping)
            .collect()
    }

    #[test]
    fn parses_ranges_names_and_lock_flags() {
        let maps = mappings(SMAPS, true);
        assert_eq!(maps.len(), 4);
        assert_eq!(
            maps[0],
            Mapping {
                start: 0x55d0c0a00000,
                end: 0x55d0c0a21000,
                offset: 0,
                name: "[heap]".into(),
                locked: false,
                lockonfault: Some(false),
                pages: PageSizes::default(),
            }
        );
        assert_eq!(
            (
                maps[1].name.to_str().unwrap(),
                maps[1].locked,
                maps[1].lockonfault
            ),
            ("anonymous", true, Some(false))
        );
        assert_eq!(
            (
                maps[2].name.to_str().unwrap(),
                maps[2].locked,
                maps[2].lockonfault
            ),
            ("/usr/lib/with space.so", false, Some(true))
        );
        assert_eq!(maps[2].offset, 0x1a000);
        assert_eq!(maps[3].name, "[stack]");
        // Before 6.2 a missing `lf` says nothing.
        assert_eq!(mappings(SMAPS, false)[1].lockonfault, None);
        assert!(maps[1].overlaps((0x7f00aa0ff000, 0x7f00ab000000)));
        assert!(!maps[1].overlaps((0x7f00aa100000, 0x7f00ab000000)));
    }

    #[test]
    fn parses_permissions_and_sizes() {
        let e = parse_smaps(SMAPS.as_bytes(), true).unwrap();
        assert_eq!(
            (e[1].perms.as_str(), e[1].rss_kb, e[1].locked_kb),
            ("rw-p", 512, 512)
        );
        assert_eq!(
            (e[2].perms.as_str(), e[2].rss_kb, e[2].locked_kb),
            ("r-xp", 4, 0)
        );
        // No Rss/Locked lines: 0.
        assert_eq!((e[0].rss_kb, e[0].locked_kb), (0, 0));
        // `08:01 1234`: the device as stat encodes it.
        assert_eq!((e[2].dev, e[2].inode), (libc::makedev(8, 1), 1234));
        assert_eq!((e[1].dev, e[1].inode), (0, 0));
    }

    #[test]
    fn parses_maps_as_headers_alone() {
        let maps: String = SMAPS
            .lines()
            .filter(|l| l.starts_with(|c: char| c.is_ascii_hexdigit()) && l.contains(' '))
            .map(|l| format!("{l}\n"))
            .collect();
        let e = parse_smaps(maps.as_bytes(), true).unwrap();
        assert_eq!(e.len(), 4);
        assert_eq!(
            e.iter().map(|e| e.perms.as_str()).collect::<Vec<_>>(),
            ["rw-p", "rw-p", "r-xp", "rw-p"]
        );
        assert!(!e[1].mapping.locked);
    }

    #[test]
    fn a_name_that_is_not_utf8_costs_nothing_else() {
        let mut text = SMAPS.as_bytes().to_vec();
        text.extend(
            b"7f00ac000000-7f00ac001000 r--p 00000000 08:01 99   /tmp/bad\xff\x1b[2J  name\n\
              Rss:                   4 kB\nVmFlags: rd mr mw me lo\n",
        );
        let e = parse_smaps(&text, true).unwrap();
        assert_eq!(e.len(), 5);
        assert_eq!(e[2].mapping.name, "/usr/lib/with space.so");
        // Exact bytes, inner spaces kept; shown escaped.
        assert_eq!(e[4].mapping.name.as_bytes(), b"/tmp/bad\xff\x1b[2J  name");
        assert_eq!(e[4].mapping.name.to_string(), "/tmp/bad\\xff\\x1b[2J  name");
        assert!(e[4].mapping.locked);
    }

    #[test]
    fn parses_page_sizes_and_huge_pages() {
        let text = b"7f5822600000-7f5826600000 rw-p 00000000 00:00 0 \n\
            Rss:               65536 kB\nAnonHugePages:     63488 kB\n\
            KernelPageSize:        4 kB\nLocked:            65536 kB\n\
            VmFlags: rd wr mr mw me lo ac sd hg\n\
            7f5830000000-7f5830800000 rw-s 00000000 00:0f 1234   /anon_hugepage (deleted)\n\
            Rss:                   0 kB\nKernelPageSize:     2048 kB\n\
            Shared_Hugetlb:        0 kB\nPrivate_Hugetlb:    4096 kB\n\
            VmFlags: rd wr sh mr mw me ms de ht sd\n\
            7f5840000000-7f5840200000 rw-p 00000000 00:00 0 \n\
            KernelPageSize:        4 kB\nVmFlags: rd wr mr mw me ac sd nh\n";
        let maps: Vec<Mapping> = parse_smaps(text, true)
            .unwrap()
            .into_iter()
            .map(|e| e.mapping)
            .collect();
        let [thp, hugetlb, refused] = [maps[0].pages, maps[1].pages, maps[2].pages];
        assert_eq!(
            (thp.rss_kb, thp.thp_kb, thp.kernel_page_kb),
            (65_536, 63_488, 4)
        );
        assert!(thp.thp_advised && !thp.hugetlb);
        assert!(thp.thp_eligible(ThpMode::Madvise) && thp.thp_eligible(ThpMode::Never));
        assert_eq!((hugetlb.kernel_page_kb, hugetlb.hugetlb_kb), (2048, 4096));
        assert!(hugetlb.hugetlb && !hugetlb.thp_eligible(ThpMode::Always));
        assert!(refused.thp_refused && !refused.thp_eligible(ThpMode::Always));
        assert!(!refused.thp_eligible(ThpMode::Madvise));
        assert!(PageSizes::default().thp_eligible(ThpMode::Always));
        assert!(!PageSizes::default().thp_eligible(ThpMode::Madvise));
    }

    #[test]
    fn rejects_what_is_not_smaps() {
        assert!(parse_smaps(b"Rss: 4 kB\n", true).is_err());
        assert!(parse_smaps(b"zz-7f rw-p 0 0 0\n", true).is_err());
        assert!(parse_smaps(b"7f-8f rw-p 0 0 0\nRss: many kB\n", true).is_err());
    }

    #[test]
    fn lockonfault_shown_from_6_2() {
        assert!(!smaps_shows_lockonfault("6.1.0-57-cloud-amd64"));
        assert!(!smaps_shows_lockonfault("5.15.0"));
        assert!(smaps_shows_lockonfault("6.2.0"));
        assert!(smaps_shows_lockonfault("6.18.44-fc-v857"));
        assert!(smaps_shows_lockonfault("7.0"));
    }
}

//! Huge pages populated by `mlock`, as the machine's own counters see them: `thp` touches
//! 64 MiB under `MADV_HUGEPAGE`, then mlocks another 64 MiB `MADV_HUGEPAGE` region (the
//! program of issue 30); `hugetlb` mlocks 8 MiB of `MAP_HUGETLB` memory (pages reserved with
//! `vm.nr_hugepages` beforehand). Each reports the thread's `getrusage` faults across the
//! mlock and the locked VMA's smaps fields read after it, then waits [`SETTLE`] so that a
//! tracer reads the process's smaps too, unmaps the region and waits again before it exits.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use super::{Faults, PAGE_SIZE, Region, SmapsFigures};
use crate::procfs::{self, ThpMode};

/// What `thp` mlocks (and touches before).
const THP_BYTES: usize = 64 << 20;
/// What `hugetlb` mlocks: four 2 MiB pages.
const HUGETLB_BYTES: usize = 8 << 20;
/// A PMD-sized transparent huge page on x86-64.
pub const THP_SIZE: usize = 2 << 20;
/// Longer than the tracer takes to re-read the smaps of a process whose mlock changed them
/// ([`procfs::CHANGED_REREAD`]), with room for a loaded machine.
const SETTLE: Duration = Duration::from_millis(1500);

/// What the workload saw of its mlock.
#[derive(Clone, Debug, Serialize)]
pub struct Locked {
    pub addr: u64,
    pub len: u64,
    /// `getrusage(RUSAGE_THREAD)` across the mlock.
    pub faults: Faults,
    /// The VMA holding `addr` in `/proc/self/smaps` after the mlock.
    pub smaps: SmapsFigures,
}

/// `huge` transparent huge pages' worth of memory between guard pages, starting on a THP
/// boundary, `MADV_HUGEPAGE`.
pub fn thp_region(huge: usize) -> Result<Region> {
    let region = Region::aligned_hole(huge * THP_SIZE / PAGE_SIZE, THP_SIZE)?;
    region.map(libc::PROT_READ | libc::PROT_WRITE, 0)?;
    // SAFETY: madvise on the mapping just made; it changes no contents.
    if unsafe { libc::madvise(region.addr.cast(), region.len, libc::MADV_HUGEPAGE) } != 0 {
        bail!(
            "madvise(MADV_HUGEPAGE): {} (a kernel without transparent huge pages)",
            std::io::Error::last_os_error()
        );
    }
    Ok(region)
}

/// Writes one byte of every base page of `region`.
fn touch(region: &Region) {
    for offset in (0..region.len).step_by(PAGE_SIZE) {
        // SAFETY: inside the writable mapping `region` holds, which only its maker uses.
        unsafe { region.addr.add(offset).write_volatile(1) };
    }
}

/// A [`thp_region`] with every base page written.
pub struct TouchedThp {
    pub region: Region,
    /// Where the kernel gave fewer huge pages than the region holds (its `AnonHugePages`
    /// in smaps): what was tried and what the kernel's counters said, for the caller.
    pub shortfall: Option<String>,
}

/// A [`thp_region`] of `huge` huge pages with every page written. Where the kernel gives
/// fewer huge pages than that, the region is collapsed (`MADV_COLLAPSE`, 6.1+), and if
/// still short a fresh one tried after room is made ([`make_room_for_huge_pages`], forced
/// from the second try), three times at most: a machine too fragmented even then gives
/// what it gave, and the shortfall says why as far as the kernel's counters tell.
pub fn touched_thp(huge: usize) -> Result<TouchedThp> {
    // SAFETY: a getter; the other arguments must be 0.
    if unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) } == 1 {
        bail!(
            "transparent huge pages are disabled for this process: prctl PR_SET_THP_DISABLE, \
             set here or by an ancestor (fork and exec keep it)"
        );
    }
    let full_kb = (huge * THP_SIZE / 1024) as u64;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let room = make_room_for_huge_pages(huge, attempt > 1);
        let fallbacks_before = thp_fault_fallbacks();
        let region = thp_region(huge)?;
        touch(&region);
        let fallbacks = thp_fault_fallbacks().saturating_sub(fallbacks_before);
        let mut thp_kb = SmapsFigures::of_own(region.start())?.thp_kb;
        let mut collapse = String::new();
        if thp_kb < full_kb {
            collapse = collapsed(&region);
            thp_kb = SmapsFigures::of_own(region.start())?.thp_kb;
        }
        if thp_kb == full_kb || attempt == 3 {
            let shortfall = (thp_kb < full_kb).then(|| {
                Shortfall {
                    thp_kb,
                    full_kb,
                    tries: attempt,
                    room,
                    fallbacks,
                    collapse,
                }
                .to_string()
            });
            return Ok(TouchedThp { region, shortfall });
        }
    }
}

/// What [`touched_thp`] says of a region the kernel gave fewer huge pages than asked.
struct Shortfall {
    thp_kb: u64,
    full_kb: u64,
    tries: u32,
    /// What the last try found and did to make room.
    room: Room,
    /// `thp_fault_fallback` across the last try's touch.
    fallbacks: u64,
    /// `MADV_COLLAPSE`'s outcome on the last try's region.
    collapse: String,
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            thp_kb,
            full_kb,
            tries,
            room,
            fallbacks,
            collapse,
        } = self;
        write!(
            f,
            "the kernel gave {thp_kb} of {full_kb} kB in huge pages after {tries} tries; the \
             last: {room}, thp_fault_fallback +{fallbacks} during its touch"
        )?;
        if *fallbacks == 0 && *thp_kb == 0 {
            // Every fault took base pages without asking for a huge one.
            write!(f, ", so the kernel did not try huge pages for it")?;
        }
        write!(f, ", {collapse}")
    }
}

/// `MADV_COLLAPSE` on `region`, said as its outcome: the kernel allocates the huge pages
/// itself, compacting and reclaiming as it needs, whatever the THP defrag setting (6.1+;
/// older kernels: EINVAL).
fn collapsed(region: &Region) -> String {
    // SAFETY: on the mapping `region` holds; a collapse copies pages, it changes no contents.
    match unsafe { libc::madvise(region.addr.cast(), region.len, libc::MADV_COLLAPSE) } {
        0 => "MADV_COLLAPSE succeeded".into(),
        _ => format!("MADV_COLLAPSE: {}", std::io::Error::last_os_error()),
    }
}

/// `thp_fault_fallback` of `/proc/vmstat`: faults that wanted a huge page and got base
/// pages (all processes; 0 where unreadable).
fn thp_fault_fallbacks() -> u64 {
    let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    vmstat
        .lines()
        .find_map(|line| line.strip_prefix("thp_fault_fallback "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

const COMPACT_MEMORY: &str = "/proc/sys/vm/compact_memory";

/// Free 2 MiB blocks, summed over the zones of `/proc/buddyinfo`.
fn free_huge_blocks() -> usize {
    std::fs::read_to_string("/proc/buddyinfo").map_or(0, |text| huge_blocks_in(&text))
}

/// The 2 MiB blocks `buddyinfo`'s free counts per order make ("Node 0, zone   Normal  1620
/// 689 ...": order 0 first); a block of a higher order makes several. Not the DMA zone's
/// (its 16 MiB serve no huge page).
fn huge_blocks_in(buddyinfo: &str) -> usize {
    let huge_order = (THP_SIZE / PAGE_SIZE).trailing_zeros() as usize;
    buddyinfo
        .lines()
        .filter(|zone| zone.split_whitespace().nth(3) != Some("DMA"))
        .flat_map(|zone| {
            zone.split_whitespace()
                .skip(4)
                .enumerate()
                .skip(huge_order)
                .filter_map(|(order, count)| {
                    Some(count.parse::<usize>().ok()? << (order - huge_order))
                })
        })
        .sum()
}

/// What [`make_room_for_huge_pages`] found and did, in free 2 MiB blocks.
#[derive(Clone, Copy, Debug)]
pub struct Room {
    pub free_before: usize,
    pub compacted: Option<usize>,
    pub dropped_caches: Option<usize>,
}

impl std::fmt::Display for Room {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} free 2 MiB blocks", self.free_before)?;
        if let Some(n) = self.compacted {
            write!(f, ", {n} after compaction")?;
        }
        if let Some(n) = self.dropped_caches {
            write!(
                f,
                ", {n} after dropping clean page cache and compacting again"
            )?;
        }
        Ok(())
    }
}

/// Makes room for `huge` huge pages where the kernel has fewer free 2 MiB blocks than twice
/// that: a machine whose page cache filled its memory has few or none (this host during the
/// test command: 21 of 24 GiB cached, 230 MiB free, one free 2 MiB block in its Normal
/// zone, and `thp-split` got no huge page). Memory is compacted (also when `force`d: a try
/// that came up short although buddyinfo showed the blocks), then, if that was not enough,
/// clean page cache is dropped and memory compacted again: what one does by hand before a
/// huge-page experiment. Not `sync` nor slab: their writeback and stalls hit every other
/// process (with them, a tracer beside this one in the test command went seconds without
/// reading its target's smaps). Root only (else nothing changes, and the caller says what
/// the kernel gave); a drop of the page cache is said on stderr.
pub fn make_room_for_huge_pages(huge: usize, force: bool) -> Room {
    let mut room = Room {
        free_before: free_huge_blocks(),
        compacted: None,
        dropped_caches: None,
    };
    if room.free_before >= 2 * huge && !force {
        return room;
    }
    let _ = std::fs::write(COMPACT_MEMORY, "1");
    let compacted = free_huge_blocks();
    room.compacted = Some(compacted);
    if compacted >= 2 * huge {
        return room;
    }
    if std::fs::write("/proc/sys/vm/drop_caches", "1").is_ok() {
        let _ = std::fs::write(COMPACT_MEMORY, "1");
        room.dropped_caches = Some(free_huge_blocks());
        eprintln!("memlock-trace workload: making room for {huge} huge pages: {room}");
    }
    room
}

/// The program: 64 MiB touched under `MADV_HUGEPAGE`, another 64 MiB mlocked.
pub fn thp() -> Result<Locked> {
    if procfs::thp_mode() == ThpMode::Never {
        bail!(
            "transparent huge pages are off: /sys/kernel/mm/transparent_hugepage/enabled is \
             not `always` or `madvise`"
        );
    }
    make_room_for_huge_pages(2 * THP_BYTES / THP_SIZE, false);
    touch(&thp_region(THP_BYTES / THP_SIZE)?);
    let region = thp_region(THP_BYTES / THP_SIZE)?;
    let locked = mlock_measured(region.addr, region.len)?;
    settle_then_unmap(region)?;
    Ok(locked)
}

/// 8 MiB of `MAP_HUGETLB` memory mlocked.
pub fn hugetlb() -> Result<Locked> {
    let region = Region::anonymous(
        HUGETLB_BYTES / PAGE_SIZE,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_HUGETLB,
    )
    .context("MAP_HUGETLB: reserve huge pages first (sysctl vm.nr_hugepages)")?;
    let locked = mlock_measured(region.addr, region.len)?;
    settle_then_unmap(region)?;
    Ok(locked)
}

/// Waits [`SETTLE`] with `region` mapped, unmaps it and waits again, so that a tracer reads
/// the process's smaps both while the region is there and after it is gone: its summary
/// must still say what backed the region, as for a program that unmaps its large regions
/// just before it exits.
fn settle_then_unmap(region: Region) -> Result<()> {
    std::thread::sleep(SETTLE);
    region.unmap()?;
    std::thread::sleep(SETTLE);
    Ok(())
}

/// `getrusage` across `call`.
fn measured(call: impl FnOnce() -> i32) -> (i32, Faults) {
    let before = Faults::thread();
    let ret = std::hint::black_box(call());
    (ret, Faults::thread().since(before))
}

fn mlock_measured(addr: *mut u8, len: usize) -> Result<Locked> {
    // The measurement's own first faults (its stack, getrusage's) are taken here, by a call
    // that makes no system call the tracer sees: inside the mlock's, only the kernel's.
    // SAFETY: getpid has no preconditions.
    let _ = measured(|| unsafe { libc::getpid() });
    // SAFETY: mlock changes no memory contents.
    let (ret, faults) = measured(|| unsafe { libc::mlock(addr.cast(), len) });
    if ret != 0 {
        bail!("mlock: {}", std::io::Error::last_os_error());
    }
    let smaps = SmapsFigures::of_own(addr as u64)?;
    Ok(Locked {
        addr: addr as u64,
        len: len as u64,
        faults,
        smaps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shortfall_says_what_was_tried_and_what_the_kernel_counted() {
        let room = Room {
            free_before: 1,
            compacted: Some(2),
            dropped_caches: Some(40),
        };
        let untried = Shortfall {
            thp_kb: 0,
            full_kb: 6144,
            tries: 3,
            room,
            fallbacks: 0,
            collapse: "MADV_COLLAPSE: Invalid argument (os error 22)".into(),
        };
        assert_eq!(
            untried.to_string(),
            "the kernel gave 0 of 6144 kB in huge pages after 3 tries; the last: 1 free 2 MiB \
             blocks, 2 after compaction, 40 after dropping clean page cache and compacting \
             again, thp_fault_fallback +0 during its touch, so the kernel did not try huge \
             pages for it, MADV_COLLAPSE: Invalid argument (os error 22)"
        );
        let fragmented = Shortfall {
            thp_kb: 2048,
            fallbacks: 2,
            room: Room {
                free_before: 9,
                compacted: None,
                dropped_caches: None,
            },
            ..untried
        };
        assert_eq!(
            fragmented.to_string(),
            "the kernel gave 2048 of 6144 kB in huge pages after 3 tries; the last: 9 free 2 MiB \
             blocks, thp_fault_fallback +2 during its touch, MADV_COLLAPSE: Invalid argument \
             (os error 22)"
        );
    }

    #[test]
    fn buddyinfo_counts_every_free_2_mib_block() {
        // This host's, with its page cache filling memory.
        let buddyinfo = "Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      3\n\
                         Node 0, zone    DMA32   1119    198     85     65     24     18     11     14     13      3     13\n\
                         Node 0, zone   Normal   1620    689    448    294    348    161     83     25     17      1      0\n";
        // Order 9 blocks once, order 10 twice: DMA32 3 + 26, Normal 1 (DMA's not).
        assert_eq!(huge_blocks_in(buddyinfo), 30);
        assert_eq!(huge_blocks_in(""), 0);
    }
}

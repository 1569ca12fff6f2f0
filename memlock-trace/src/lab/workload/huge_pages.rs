//! Huge pages populated by `mlock`, as the machine's own counters see them: `thp` touches
//! 64 MiB under `MADV_HUGEPAGE`, then mlocks another 64 MiB `MADV_HUGEPAGE` region (the
//! program of issue 30); `hugetlb` mlocks 8 MiB of `MAP_HUGETLB` memory (pages reserved with
//! `vm.nr_hugepages` beforehand). Each reports the thread's `getrusage` faults across the
//! mlock and the locked VMA's smaps fields read after it, then waits [`SETTLE`] so that a
//! tracer reads the process's smaps too, unmaps the region and waits again before it exits.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use super::{Faults, PAGE_SIZE, Region};
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

/// One VMA's smaps fields, in kB as smaps gives them.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct SmapsFigures {
    pub start: u64,
    pub end: u64,
    pub rss_kb: u64,
    /// `AnonHugePages` (and the shmem/file PMD-mapped fields).
    pub thp_kb: u64,
    /// `Private_Hugetlb` + `Shared_Hugetlb`.
    pub hugetlb_kb: u64,
    pub locked_kb: u64,
    pub kernel_page_kb: u64,
}

impl SmapsFigures {
    /// The figures of the VMA holding `addr` in this process's smaps.
    pub fn of_own(addr: u64) -> Result<Self> {
        let shows_lf = procfs::smaps_shows_lockonfault(&crate::probe::kernel_release());
        let entries = procfs::read_smaps("/proc/self/smaps", shows_lf)?;
        let e = entries
            .iter()
            .find(|e| e.mapping.start <= addr && addr < e.mapping.end)
            .with_context(|| format!("no VMA holds {addr:#x} in /proc/self/smaps"))?;
        let p = e.mapping.pages;
        Ok(Self {
            start: e.mapping.start,
            end: e.mapping.end,
            rss_kb: p.rss_kb,
            thp_kb: p.thp_kb,
            hugetlb_kb: p.hugetlb_kb,
            locked_kb: e.locked_kb,
            kernel_page_kb: p.kernel_page_kb,
        })
    }
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

/// A [`thp_region`] of `huge` huge pages with every page written, and the kB of it smaps
/// shows in huge pages (`AnonHugePages`). Where the kernel found fewer free huge pages than
/// that, room is made ([`make_room_for_huge_pages`]) and a fresh region tried, three times
/// at most: a machine too fragmented even then gives what it gave, for the caller to say.
pub fn touched_thp(huge: usize) -> Result<(Region, u64)> {
    let full_kb = (huge * THP_SIZE / 1024) as u64;
    let mut attempt = 0;
    loop {
        make_room_for_huge_pages(huge);
        let region = thp_region(huge)?;
        touch(&region);
        let thp_kb = SmapsFigures::of_own(region.start())?.thp_kb;
        attempt += 1;
        if thp_kb == full_kb || attempt == 3 {
            return Ok((region, thp_kb));
        }
    }
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

/// Makes room for `huge` huge pages where the kernel has fewer free 2 MiB blocks than twice
/// that: a machine whose page cache filled its memory has few or none (this host during the
/// test command: 21 of 24 GiB cached, 230 MiB free, one free 2 MiB block in its Normal
/// zone, and `thp-split` got no huge page). Memory is compacted, then, if that was
/// not enough, clean page cache is dropped and memory compacted again: what one does by
/// hand before a huge-page experiment. Root only (else nothing changes, and the caller says
/// what the kernel gave); a drop of the page cache is said on stderr.
pub fn make_room_for_huge_pages(huge: usize) {
    if free_huge_blocks() >= 2 * huge {
        return;
    }
    let _ = std::fs::write(COMPACT_MEMORY, "1");
    let compacted = free_huge_blocks();
    if compacted >= 2 * huge {
        return;
    }
    if std::fs::write("/proc/sys/vm/drop_caches", "1").is_ok() {
        let _ = std::fs::write(COMPACT_MEMORY, "1");
        eprintln!(
            "memlock-trace workload: {compacted} free 2 MiB blocks for {huge} huge pages after \
             compaction: dropped clean page cache and compacted again, {} now",
            free_huge_blocks()
        );
    }
}

/// The program: 64 MiB touched under `MADV_HUGEPAGE`, another 64 MiB mlocked.
pub fn thp() -> Result<Locked> {
    if procfs::thp_mode() == ThpMode::Never {
        bail!(
            "transparent huge pages are off: /sys/kernel/mm/transparent_hugepage/enabled is \
             not `always` or `madvise`"
        );
    }
    make_room_for_huge_pages(2 * THP_BYTES / THP_SIZE);
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

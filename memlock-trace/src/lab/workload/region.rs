//! Anonymous private mappings of whole pages, for the workloads and for `verify`'s subject,
//! and what this process's smaps says of them.

use std::ptr;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

use super::PAGE_SIZE;
use crate::procfs::{self, SmapsEntry};

/// An anonymous private mapping of whole pages. One made by [`Region::anonymous`] is unmapped
/// on drop; one made by [`Region::hole`] or [`Region::guarded`] lies between two `PROT_NONE`
/// guard pages and stays mapped until the process exits.
pub struct Region {
    pub addr: *mut u8,
    pub len: usize,
    unmap_on_drop: bool,
}

// SAFETY: `addr` is an address in the process's memory map, which all its threads share;
// nothing in `Region` belongs to the thread that made it, so any thread may use or unmap it.
unsafe impl Send for Region {}

impl Region {
    /// A fresh mapping of `pages` pages: `mmap(NULL, .., prot, MAP_PRIVATE | MAP_ANONYMOUS |
    /// extra_flags, -1, 0)`.
    pub fn anonymous(pages: usize, prot: i32, extra_flags: i32) -> Result<Self> {
        let len = pages * PAGE_SIZE;
        // SAFETY: without MAP_FIXED the kernel picks an address that no mapping uses, so no
        // memory in use changes; the result is checked before it is used.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            bail!("mmap of {pages} pages: {}", std::io::Error::last_os_error());
        }
        Ok(Self {
            addr: addr.cast(),
            len,
            unmap_on_drop: true,
        })
    }

    /// A gap of `pages` unmapped pages between two guard pages, for a later [`Region::map`]:
    /// the guards' flags differ from any mapping's, so what is mapped in the gap never merges
    /// with a neighbour outside it.
    pub fn hole(pages: usize) -> Result<Self> {
        Self::aligned_hole(pages, PAGE_SIZE)
    }

    /// A [`Region::hole`] whose start is a multiple of `align` bytes (a power of two): a
    /// transparent huge page's size, for example, so that each huge page of it is one PMD.
    pub fn aligned_hole(pages: usize, align: usize) -> Result<Self> {
        let slack = align / PAGE_SIZE - 1;
        let mut reservation = Self::anonymous(pages + slack + 2, libc::PROT_NONE, 0)?;
        // The guard pages (and the slack) stay for the rest of the process.
        reservation.unmap_on_drop = false;
        let first = reservation.page(1);
        let hole = Self {
            addr: first.wrapping_add((align - first as usize % align) % align),
            len: pages * PAGE_SIZE,
            unmap_on_drop: false,
        };
        // SAFETY: the middle of the reservation just made, which nothing else uses.
        if unsafe { libc::munmap(hole.addr.cast(), hole.len) } != 0 {
            bail!("munmap: {}", std::io::Error::last_os_error());
        }
        Ok(hole)
    }

    /// A fresh mapping of `pages` pages with `prot` between two guard pages (see
    /// [`Region::hole`]).
    pub fn guarded(pages: usize, prot: i32) -> Result<Self> {
        let region = Self::hole(pages)?;
        region.map(prot, 0)?;
        Ok(region)
    }

    /// Maps the hole (MAP_FIXED_NOREPLACE: it must still be free).
    pub fn map(&self, prot: i32, extra_flags: i32) -> Result<()> {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping (the call fails if anything is
        // mapped in the range), so no memory in use changes.
        let addr = unsafe {
            libc::mmap(
                self.addr.cast(),
                self.len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE | extra_flags,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED || addr.cast() != self.addr {
            bail!(
                "mmap at {:#x}: {}",
                self.start(),
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// The address of page `index` (which must be inside the region).
    pub fn page(&self, index: usize) -> *mut u8 {
        assert!(index * PAGE_SIZE < self.len);
        self.addr.wrapping_add(index * PAGE_SIZE)
    }

    pub fn start(&self) -> u64 {
        self.addr as u64
    }

    /// `[start, end)`.
    pub fn window(&self) -> (u64, u64) {
        (self.start(), self.start() + self.len as u64)
    }

    /// Unmaps the region now, a [`Region::hole`]'s mapping too (whose drop leaves it).
    pub fn unmap(mut self) -> Result<()> {
        self.unmap_on_drop = false;
        // SAFETY: the region's own range, which only its maker uses; `self` is gone after.
        if unsafe { libc::munmap(self.addr.cast(), self.len) } != 0 {
            bail!("munmap: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.unmap_on_drop {
            // SAFETY: exactly the mapping `anonymous` made. `Region` hands out raw pointers only,
            // whose users answer for not dereferencing them after the drop.
            unsafe { libc::munmap(self.addr.cast(), self.len) };
        }
    }
}

/// One VMA's smaps fields (or a region's, summed over its VMAs), in kB as smaps gives them.
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
    /// `Swap`: pages out on a swap device.
    pub swap_kb: u64,
    pub kernel_page_kb: u64,
}

impl SmapsFigures {
    /// The figures of the VMA holding `addr` in this process's smaps.
    pub fn of_own(addr: u64) -> Result<Self> {
        let entries = own_smaps()?;
        let e = entries
            .iter()
            .find(|e| e.mapping.start <= addr && addr < e.mapping.end)
            .with_context(|| format!("no VMA holds {addr:#x} in /proc/self/smaps"))?;
        Ok(Self::of_entry(e))
    }

    /// The figures of `region`, summed over the VMAs of this process's smaps inside it (a
    /// region mlocked in part is several).
    pub fn of_region(region: &Region) -> Result<Self> {
        let (start, end) = region.window();
        let mut sum = Self {
            start,
            end,
            ..Self::default()
        };
        for e in own_smaps()?
            .iter()
            .filter(|e| e.mapping.overlaps((start, end)))
        {
            let v = Self::of_entry(e);
            sum.rss_kb += v.rss_kb;
            sum.thp_kb += v.thp_kb;
            sum.hugetlb_kb += v.hugetlb_kb;
            sum.locked_kb += v.locked_kb;
            sum.swap_kb += v.swap_kb;
            sum.kernel_page_kb = v.kernel_page_kb;
        }
        Ok(sum)
    }

    fn of_entry(e: &SmapsEntry) -> Self {
        let p = e.mapping.pages;
        Self {
            start: e.mapping.start,
            end: e.mapping.end,
            rss_kb: p.rss_kb,
            thp_kb: p.thp_kb,
            hugetlb_kb: p.hugetlb_kb,
            locked_kb: e.locked_kb,
            swap_kb: e.swap_kb,
            kernel_page_kb: p.kernel_page_kb,
        }
    }
}

fn own_smaps() -> Result<Vec<SmapsEntry>> {
    let shows_lf = procfs::smaps_shows_lockonfault(&crate::probe::kernel_release());
    procfs::read_smaps("/proc/self/smaps", shows_lf)
}

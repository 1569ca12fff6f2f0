//! thp-split (issue 30): VM_LOCKED on transparent huge pages. Three huge pages are touched
//! under `MADV_HUGEPAGE`, then the range from the middle of the first to the middle of the
//! last is locked: the VMA splits at both ends, and so do the two huge pages the ends cut
//! through (the kernel maps a PMD that a VMA boundary crosses with 4 KiB page-table
//! entries). Unlocking everything merges the VMA back, not the huge pages. Each step is
//! read from /proc/self/smaps.

use anyhow::Result;
use serde_json::{Value, json};

use super::{
    Region,
    huge_pages::{THP_SIZE, touched_thp},
    syscall_ok,
    vma_split::{layout, region_vmas},
};

/// Huge pages in the region: one inside the locked range, one cut at each end.
pub const HUGE_PAGES: usize = 3;

/// What smaps shows of the region after a step.
fn step(name: &str, region: &Region) -> Result<Value> {
    let vmas = region_vmas("self", region.window())?;
    let sum = |kb: fn(&crate::procfs::SmapsEntry) -> u64| vmas.iter().map(kb).sum::<u64>();
    Ok(json!({
        "step": name,
        "vmas": vmas.len(),
        "layout": layout(&vmas),
        "thp_kb": sum(|v| v.mapping.pages.thp_kb),
        "rss_kb": sum(|v| v.rss_kb),
        "locked_kb": sum(|v| v.locked_kb),
    }))
}

pub fn run() -> Result<Value> {
    let touched = touched_thp(HUGE_PAGES)?;
    let region = touched.region;
    let mut steps = vec![step("touched", &region)?];
    let (lock_at, lock_len) = (
        region.addr.wrapping_add(THP_SIZE / 2),
        region.len - THP_SIZE,
    );
    // SAFETY: mlock changes no memory contents, only whether the pages stay resident.
    syscall_ok("mlock", unsafe { libc::mlock(lock_at.cast(), lock_len) })?;
    steps.push(step(
        "mlock from the middle of the first huge page to the middle of the last",
        &region,
    )?);
    // SAFETY: munlock changes no memory contents, only whether the pages stay resident.
    syscall_ok("munlock", unsafe {
        libc::munlock(region.addr.cast(), region.len)
    })?;
    steps.push(step("munlock all", &region)?);
    Ok(json!({
        "huge_pages": HUGE_PAGES,
        "huge_page_kb": THP_SIZE / 1024,
        "region_kb": region.len / 1024,
        "locked_kb": lock_len / 1024,
        "shortfall": touched.shortfall,
        "steps": steps,
    }))
}

//! vma-split (reference 000, section 1 / figure 2): mlock sets VM_LOCKED on whole VMAs, so
//! locking part of one splits it and locking next to an equal-flag locked neighbour merges.
//! Each step is checked against /proc/self/smaps.

use anyhow::{Result, bail};
use serde_json::{Value, json};

use super::{PAGE_SIZE, Region};
use crate::procfs::{SmapsEntry, read_smaps};

/// The VMAs of `pid` ("self" or a number) that overlap `range`.
pub fn region_vmas(pid: &str, range: (u64, u64)) -> Result<Vec<SmapsEntry>> {
    // Only VM_LOCKED is looked at, so whether smaps would show `lf` does not matter.
    Ok(read_smaps(&format!("/proc/{pid}/smaps"), false)?
        .into_iter()
        .filter(|v| v.mapping.overlaps(range))
        .collect())
}

const PAGES: usize = 16;

pub fn run() -> Result<Value> {
    // A PROT_NONE reservation with the region inside it: the guard pages around it have other
    // flags, so the region's VMAs never merge with anything outside it.
    let reservation = Region::anonymous(PAGES + 2, libc::PROT_NONE, 0)?;
    let base = reservation.page(1);
    // SAFETY: MAP_FIXED inside our own reservation.
    let addr = unsafe {
        libc::mmap(
            base.cast(),
            PAGES * PAGE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        bail!("mmap: {}", std::io::Error::last_os_error());
    }
    let range = (base as u64, base as u64 + (PAGES * PAGE_SIZE) as u64);
    let page = |i: usize| base.wrapping_add(i * PAGE_SIZE).cast::<libc::c_void>();
    let len = |n: usize| n * PAGE_SIZE;
    let check = |rc: i32, what: &str| -> Result<()> {
        if rc != 0 {
            bail!("{what}: {}", std::io::Error::last_os_error());
        }
        Ok(())
    };
    let mut steps = Vec::new();
    let mut step = |name: &str, expected_vmas: usize, expected_locked_pages: usize| -> Result<()> {
        let vmas = region_vmas("self", range)?;
        let locked_kib: u64 = vmas.iter().map(|v| v.locked_kb).sum();
        steps.push(json!({
            "step": name,
            "expected_vmas": expected_vmas,
            "expected_locked_kib": expected_locked_pages * PAGE_SIZE / 1024,
            "vmas": vmas.len(),
            "locked_kib": locked_kib,
            "layout": vmas.iter().map(|v| format!("{}{}{}", (v.mapping.end - v.mapping.start) / PAGE_SIZE as u64, v.perms, if v.mapping.locked { "L" } else { "" })).collect::<Vec<_>>(),
        }));
        Ok(())
    };
    // Give the VMA its anon_vma before it is split, so every piece shares it: kernels before
    // 6.x's relaxed rules (6.1 among them) do not merge a VMA without anon_vma into one with.
    // SAFETY: inside our own writable mapping.
    unsafe { base.write_volatile(1) };
    step("initial", 1, 0)?;
    // SAFETY (all calls below): ranges inside our own mapping.
    check(unsafe { libc::mlock(page(4), len(4)) }, "mlock middle")?;
    step("mlock pages 4-7 (middle): split 1 -> 3", 3, 4)?;
    check(unsafe { libc::mlock(page(8), len(4)) }, "mlock adjacent")?;
    step(
        "mlock pages 8-11 (adjacent): merges with the locked VMA",
        3,
        8,
    )?;
    check(unsafe { libc::munlock(page(0), len(PAGES)) }, "munlock")?;
    step("munlock all: back to 1", 1, 0)?;
    check(
        unsafe { libc::mprotect(page(12), len(4), libc::PROT_READ | libc::PROT_EXEC) },
        "mprotect",
    )?;
    step("mprotect pages 12-15 PROT_EXEC: 2 VMAs", 2, 0)?;
    check(
        unsafe { libc::mlock(page(8), len(8)) },
        "mlock across the boundary",
    )?;
    // Only the 4 writable pages count as Locked: mlock populates the read-only private pages
    // with the shared zero page, which smaps does not count.
    step(
        "mlock pages 8-15 across the PROT_EXEC boundary: no merge",
        3,
        4,
    )?;
    check(unsafe { libc::munlock(page(0), len(PAGES)) }, "munlock")?;
    check(
        unsafe { libc::mprotect(page(12), len(4), libc::PROT_READ | libc::PROT_WRITE) },
        "mprotect back",
    )?;
    step("munlock all, PROT_WRITE again: merges back to 1", 1, 0)?;
    let ok = steps
        .iter()
        .all(|s| s["vmas"] == s["expected_vmas"] && s["locked_kib"] == s["expected_locked_kib"]);
    Ok(json!({ "steps": steps, "all_as_expected": ok }))
}

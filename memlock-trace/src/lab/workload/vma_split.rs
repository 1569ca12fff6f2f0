//! vma-split (reference 000, section 1 / figure 2): mlock sets VM_LOCKED on whole VMAs, so
//! locking part of one splits it and locking next to an equal-flag locked neighbour merges.
//! Each step is checked against /proc/self/smaps.

use anyhow::{Result, bail};
use serde_json::{Value, json};

use super::{PAGE_SIZE, Region, syscall_ok};
use crate::procfs::{SmapsEntry, read_smaps};

/// The VMAs of `pid` ("self" or a number) that overlap `range`.
pub fn region_vmas(pid: &str, range: (u64, u64)) -> Result<Vec<SmapsEntry>> {
    // Only VM_LOCKED is looked at, so whether smaps would show `lf` does not matter.
    Ok(read_smaps(&format!("/proc/{pid}/smaps"), false)?
        .into_iter()
        .filter(|v| v.mapping.overlaps(range))
        .collect())
}

/// Each VMA as pages, permissions and `L` when locked: `4rw-p`, `8rw-pL`, `4rw-p`.
pub fn layout(vmas: &[SmapsEntry]) -> Vec<String> {
    vmas.iter()
        .map(|v| {
            let pages = (v.mapping.end - v.mapping.start) / PAGE_SIZE as u64;
            let locked = if v.mapping.locked { "L" } else { "" };
            format!("{pages}{}{locked}", v.perms)
        })
        .collect()
}

const PAGES: usize = 16;

pub fn run() -> Result<Value> {
    // A PROT_NONE reservation with the region inside it: the guard pages around it have other
    // flags, so the region's VMAs never merge with anything outside it.
    let reservation = Region::anonymous(PAGES + 2, libc::PROT_NONE, 0)?;
    let base = reservation.page(1);
    // SAFETY: MAP_FIXED replaces pages 1-16 of our own PROT_NONE reservation, which nothing
    // refers to.
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
    // SAFETY: mlock changes no memory contents, only whether the pages stay resident.
    let mlock = |from: usize, n: usize| unsafe { libc::mlock(page(from), len(n)) };
    // SAFETY: munlock changes no memory contents, only whether the pages stay resident.
    let munlock_all = || unsafe { libc::munlock(page(0), len(PAGES)) };
    // SAFETY: pages 12-15 of the region, which nothing refers to, so no reference sees its
    // memory change protection.
    let mprotect_last_4 = |prot: i32| unsafe { libc::mprotect(page(12), len(4), prot) };
    let mut steps = Vec::new();
    let mut step = |name: &str, expected_vmas: usize, expected_locked_pages: usize| -> Result<()> {
        let vmas = region_vmas("self", range)?;
        let locked_kib: u64 = vmas.iter().map(|v| v.locked_kb).sum();
        let layout = layout(&vmas);
        steps.push(json!({
            "step": name,
            "expected_vmas": expected_vmas,
            "expected_locked_kib": expected_locked_pages * PAGE_SIZE / 1024,
            "vmas": vmas.len(),
            "locked_kib": locked_kib,
            "layout": layout,
        }));
        Ok(())
    };
    // Give the VMA its anon_vma before it is split, so every piece shares it: kernels before
    // 6.x's relaxed rules (6.1 among them) do not merge a VMA without anon_vma into one with.
    // SAFETY: the first byte of the region just mapped writable, which nothing refers to.
    unsafe { base.write_volatile(1) };
    step("initial", 1, 0)?;
    syscall_ok("mlock middle", mlock(4, 4))?;
    step("mlock pages 4-7 (middle): split 1 -> 3", 3, 4)?;
    syscall_ok("mlock adjacent", mlock(8, 4))?;
    step(
        "mlock pages 8-11 (adjacent): merges with the locked VMA",
        3,
        8,
    )?;
    syscall_ok("munlock", munlock_all())?;
    step("munlock all: back to 1", 1, 0)?;
    syscall_ok(
        "mprotect",
        mprotect_last_4(libc::PROT_READ | libc::PROT_EXEC),
    )?;
    step("mprotect pages 12-15 PROT_EXEC: 2 VMAs", 2, 0)?;
    syscall_ok("mlock across the boundary", mlock(8, 8))?;
    // Only the 4 writable pages count as Locked: mlock populates the read-only private pages
    // with the shared zero page, which smaps does not count.
    step(
        "mlock pages 8-15 across the PROT_EXEC boundary: no merge",
        3,
        4,
    )?;
    syscall_ok("munlock", munlock_all())?;
    syscall_ok(
        "mprotect back",
        mprotect_last_4(libc::PROT_READ | libc::PROT_WRITE),
    )?;
    step("munlock all, PROT_WRITE again: merges back to 1", 1, 0)?;
    let ok = steps
        .iter()
        .all(|s| s["vmas"] == s["expected_vmas"] && s["locked_kib"] == s["expected_locked_kib"]);
    Ok(json!({ "steps": steps, "all_as_expected": ok }))
}

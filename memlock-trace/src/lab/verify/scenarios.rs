//! The scenarios: each a sequence of steps on fenced regions, with what every checkpoint
//! should show, from the reference paper's figures and sections.

use anyhow::{Context as _, Result, anyhow, bail};
use nix::{
    sys::{
        mman::{MlockAllFlags, mlockall, munlockall},
        wait::{WaitStatus, waitpid},
    },
    unistd::{ForkResult, fork},
};

use super::{
    ExpectCalls, Message,
    subject::{Scenario, Subject},
};
use crate::{
    event::MLOCK_ONFAULT,
    lab::workload::{
        Region,
        huge_pages::{THP_SIZE, touched_thp},
        nix_ok, syscall_ok,
        thp_split::HUGE_PAGES,
    },
    procfs::PAGE_SIZE,
};

pub(super) const SCENARIOS: &[(&str, Scenario)] = &[
    ("split-merge", split_merge),
    ("exec-neighbour", exec_neighbour),
    ("onfault", onfault),
    ("mlockall-future", mlockall_future),
    ("fork", fork_child),
    ("thread", thread_shares),
    ("thp-split", thp_split),
];

pub(super) const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;
pub(super) const N: bool = false;
pub(super) const Y: bool = true;

pub(super) fn mlock(addr: u64, pages: u64) -> Result<()> {
    // SAFETY: mlock changes no memory contents, only whether the pages stay resident.
    syscall_ok("mlock", unsafe {
        libc::mlock(addr as *const libc::c_void, (pages * PAGE_SIZE) as usize)
    })
}

pub(super) fn munlock(addr: u64, pages: u64) -> Result<()> {
    // SAFETY: munlock changes no memory contents, only whether the pages stay resident.
    syscall_ok("munlock", unsafe {
        libc::munlock(addr as *const libc::c_void, (pages * PAGE_SIZE) as usize)
    })
}

pub(super) fn calls(count: u32) -> ExpectCalls {
    ExpectCalls {
        count: Some(count),
        ..ExpectCalls::default()
    }
}

/// No mlock-family call between two checkpoints.
pub(super) fn no_calls() -> ExpectCalls {
    ExpectCalls {
        splits: Some(0),
        merges: Some(0),
        ..calls(0)
    }
}

/// One call that gains (`pages` > 0) or drops VM_LOCKED on `pages` pages, changing
/// `locked_vm` as much; it splits and merges VMAs as given, each split adding one to
/// `map_count` and each merge taking one away, and faults `populated` pages in.
fn locking_call(pages: i64, splits: u32, merges: u32, populated: u64) -> ExpectCalls {
    ExpectCalls {
        splits: Some(splits),
        merges: Some(merges),
        locked_pages: Some(pages),
        map_count: Some(i64::from(splits) - i64::from(merges)),
        locked_vm: Some(pages),
        populated: Some(populated),
        ..calls(1)
    }
}

/// Figure 2 of the reference paper, step by step: a lock inside one VMA splits it, a lock
/// next to a locked VMA merges with it, unlocking everything merges back to one VMA.
fn split_merge(s: &mut Subject) -> Result<()> {
    let r = Region::guarded(16, RW)?;
    // One page touched first gives the VMA its anon_vma, which every piece then shares. On
    // 6.1 an anon_vma-less piece does not merge with one that has an anon_vma
    // (is_mergeable_anon_vma), newer kernels merge them: without this, munlock-all would leave
    // three VMAs on 6.1 and one on 6.18, for reasons that are not about VM_LOCKED.
    r.touch([0]);
    mlock(r.at(4), 8)?;
    let cp = r.checkpoint(
        "mlock-middle",
        "mlock pages 4-11 of an 16-page VMA (page 0 touched)",
        &[(4, "rw-p", N, N), (8, "rw-p", Y, N), (4, "rw-p", N, N)],
        32,
    );
    s.check(&r, cp.with_rss(36).with_calls(locking_call(8, 2, 0, 8)))?;

    mlock(r.at(12), 2)?;
    let cp = r.checkpoint(
        "mlock-adjacent",
        "mlock pages 12-13, next to the locked 4-11",
        &[(4, "rw-p", N, N), (10, "rw-p", Y, N), (2, "rw-p", N, N)],
        40,
    );
    s.check(&r, cp.with_rss(44).with_calls(locking_call(2, 1, 1, 2)))?;

    munlock(r.start(), 16)?;
    let cp = r.checkpoint(
        "munlock-all",
        "munlock all 16 pages",
        &[(16, "rw-p", N, N)],
        0,
    );
    s.check(&r, cp.with_rss(44).with_calls(locking_call(-10, 0, 2, 0)))
}

/// The paper's PROT_EXEC neighbour: locked pages on both sides of a rw/r-x boundary stay two
/// VMAs, because their other flags differ.
fn exec_neighbour(s: &mut Subject) -> Result<()> {
    let r = Region::guarded(16, RW)?;
    // Populated first, so the r-x half holds real pages rather than the shared zero page.
    r.touch(0..16);
    // SAFETY: pages 8-15 of the region, which nothing in this process refers to: taking
    // PROT_WRITE away cannot invalidate a reference.
    syscall_ok("mprotect", unsafe {
        libc::mprotect(
            r.page(8).cast(),
            (8 * PAGE_SIZE) as usize,
            libc::PROT_READ | libc::PROT_EXEC,
        )
    })?;
    mlock(r.at(4), 8)?;
    let cp = r.checkpoint(
        "mlock-across-prot-exec",
        "mlock pages 4-11 across a PROT_EXEC boundary (rw- | r-x) at page 8",
        &[
            (4, "rw-p", N, N),
            (4, "rw-p", Y, N),
            (4, "r-xp", Y, N),
            (4, "r-xp", N, N),
        ],
        32,
    );
    s.check(&r, cp.with_rss(64).with_calls(locking_call(8, 2, 0, 0)))
}

/// MLOCK_ONFAULT: VM_LOCKED|VM_LOCKONFAULT, nothing populated until touched.
fn onfault(s: &mut Subject) -> Result<()> {
    let r = Region::guarded(16, RW)?;
    // SAFETY: mlock2 changes no memory contents, only whether the pages stay resident.
    let ret = unsafe { libc::syscall(libc::SYS_mlock2, r.at(4), 8 * PAGE_SIZE, MLOCK_ONFAULT) };
    syscall_ok("mlock2(MLOCK_ONFAULT)", ret)?;
    let lf = [(4, "rw-p", N, N), (8, "rw-p", Y, Y), (4, "rw-p", N, N)];
    let cp = r.checkpoint(
        "mlock2-onfault",
        "mlock2(MLOCK_ONFAULT) pages 4-11 of an untouched VMA",
        &lf,
        0,
    );
    let on_fault = ExpectCalls {
        onfault_pages: Some(8),
        ..locking_call(8, 2, 0, 0)
    };
    s.check(&r, cp.with_rss(0).with_calls(on_fault))?;

    r.touch([4, 5, 11]);
    let cp = r.checkpoint(
        "onfault-touch",
        "write to 3 of the on-fault locked pages",
        &lf,
        12,
    );
    s.check(&r, cp.with_rss(12).with_calls(no_calls()))
}

/// mlockall(MCL_FUTURE): the next mmap is born locked; munlockall undoes it for the VMA and for
/// later mappings.
fn mlockall_future(s: &mut Subject) -> Result<()> {
    let first = Region::hole(16)?;
    let second = Region::hole(16)?;
    nix_ok("mlockall(MCL_FUTURE)", mlockall(MlockAllFlags::MCL_FUTURE))?;
    first.map(RW, 0)?;
    let mut cp = first.checkpoint(
        "mlockall-future-mmap",
        "mlockall(MCL_FUTURE), then mmap 16 pages",
        &[(16, "rw-p", Y, N)],
        64,
    );
    cp.born_locked = Some(true);
    let mlockall_call = ExpectCalls {
        splits: Some(0),
        merges: Some(0),
        locked_pages: Some(0),
        locked_vm: Some(0),
        ..calls(1)
    };
    s.check(&first, cp.with_rss(64).with_calls(mlockall_call))?;

    nix_ok("munlockall", munlockall())?;
    let cp = first.checkpoint("munlockall", "munlockall()", &[(16, "rw-p", N, N)], 0);
    let munlockall_call = ExpectCalls {
        locked_vm_after: Some(0),
        ..calls(1)
    };
    s.check(&first, cp.with_rss(64).with_calls(munlockall_call))?;

    second.map(RW, 0)?;
    let mut cp = second.checkpoint(
        "mmap-after-munlockall",
        "mmap 16 pages after munlockall",
        &[(16, "rw-p", N, N)],
        0,
    );
    cp.born_locked = Some(false);
    s.check(&second, cp.with_rss(0).with_calls(no_calls()))
}

/// A forked child does not inherit VM_LOCKED (the paper, section 1).
fn fork_child(s: &mut Subject) -> Result<()> {
    let r = Region::guarded(16, RW)?;
    mlock(r.start(), 16)?;
    let cp = r.checkpoint(
        "mlock-before-fork",
        "mlock all 16 pages",
        &[(16, "rw-p", Y, N)],
        64,
    );
    s.check(&r, cp.with_rss(64).with_calls(locking_call(16, 0, 0, 16)))?;

    // SAFETY: the subject is single-threaded, so the child may allocate and run ordinary
    // Rust code.
    match unsafe { fork() }.context("fork")? {
        ForkResult::Child => {
            let result = (|| -> Result<()> {
                let pid = std::process::id();
                s.send(&Message::Trace { pid })?;
                let mut cp = r.checkpoint(
                    "fork-child",
                    "fork() after mlock; the child's view",
                    &[(16, "rw-p", N, N)],
                    0,
                );
                cp.locked_vm = Some(0);
                s.check(&r, cp.with_calls(no_calls()))
            })();
            if let Err(error) = result {
                let _ = s.send(&Message::Failed {
                    step: "fork-child".into(),
                    error: format!("{error:#}"),
                });
            }
            // SAFETY: _exit ends the child at once, without returning into the subject's
            // scenario (whose process is the parent) or running its destructors twice.
            unsafe { libc::_exit(0) }
        }
        ForkResult::Parent { child } => {
            let status = waitpid(child, None).context("waitpid")?;
            if !matches!(status, WaitStatus::Exited(_, 0)) {
                bail!("the forked child ended with {status:?}");
            }
            Ok(())
        }
    }
}

/// Threads share the mm, so a thread sees the process's locked VMAs.
fn thread_shares(s: &mut Subject) -> Result<()> {
    let r = Region::guarded(16, RW)?;
    mlock(r.start(), 16)?;
    let mut s = s.try_clone()?;
    let thread = std::thread::spawn(move || -> Result<()> {
        let mut cp = r.checkpoint(
            "thread-shares-lock",
            "mlock 16 pages, then look from a new thread",
            &[(16, "rw-p", Y, N)],
            64,
        );
        cp.locked_vm = Some(16);
        let mlock_call = ExpectCalls {
            map_count: None,
            ..locking_call(16, 0, 0, 16)
        };
        s.check(&r, cp.with_rss(64).with_calls(mlock_call))
    });
    thread
        .join()
        .map_err(|_| anyhow!("the checking thread panicked"))?
}

/// VM_LOCKED on transparent huge pages (issue 30): a lock from the middle of the first of
/// three huge pages to the middle of the last splits the VMA in three and the two huge pages
/// it cuts into 4 KiB mappings; munlock merges the VMA back, not the huge pages.
fn thp_split(s: &mut Subject) -> Result<()> {
    let touched = touched_thp(HUGE_PAGES)?;
    if let Some(shortfall) = touched.shortfall {
        bail!("{shortfall}: the split of huge pages cannot be checked");
    }
    let r = touched.region;
    let region_kb = r.len as u64 / 1024;
    let huge = THP_SIZE as u64 / PAGE_SIZE;
    let cut = huge / 2;
    mlock(r.at(cut), 2 * huge)?;
    let mut cp = r.checkpoint(
        "thp-mlock-cut",
        "mlock from the middle of the first of 3 touched huge pages to the middle of the last",
        &[
            (cut, "rw-p", N, N),
            (2 * huge, "rw-p", Y, N),
            (cut, "rw-p", N, N),
        ],
        region_kb * 2 / 3,
    );
    // Every page stays resident; only the huge page inside stays one.
    cp.thp_kb = Some(region_kb / 3);
    let mlock_call = locking_call(2 * huge as i64, 2, 0, 0);
    s.check(&r, cp.with_rss(region_kb).with_calls(mlock_call))?;

    munlock(r.start(), 3 * huge)?;
    let mut cp = r.checkpoint(
        "thp-munlock",
        "munlock all 3 huge pages: the VMA merges, the pages stay split",
        &[(3 * huge, "rw-p", N, N)],
        0,
    );
    cp.thp_kb = Some(region_kb / 3);
    let munlock_call = locking_call(-2 * huge as i64, 0, 2, 0);
    s.check(&r, cp.with_rss(region_kb).with_calls(munlock_call))
}

//! The fault workload's commands, one function each: map a fresh region, fault it in the way
//! the command names, unmap it (unless the command keeps it) and return its address.
//!
//! Raw syscalls and no allocation, as the parent module says: a step's faults are its own.

use std::{
    ffi::CString,
    os::fd::AsRawFd as _,
    ptr,
    sync::atomic::{AtomicUsize, Ordering},
};

use anyhow::{Result, bail};
use nix::{
    fcntl::{OFlag, open},
    sys::{
        mman::{MlockAllFlags, mlockall, munlockall},
        stat::Mode,
    },
};

use super::{FILE_STRIDE, fault_site_alpha, fault_site_beta, mlock_site_gamma};
use crate::{
    event::MLOCK_ONFAULT,
    lab::workload::{PAGE_SIZE, nix_ok, syscall_ok},
};

/// The `PROT_NONE` page of the `segv` step, made readable by the handler.
static SEGV_PAGE: AtomicUsize = AtomicUsize::new(0);

pub(super) extern "C" fn on_segv(_: libc::c_int) {
    let page = SEGV_PAGE.load(Ordering::Relaxed);
    // SAFETY: mprotect is async-signal-safe; the page is the `segv` step's own PROT_NONE
    // page, which nothing refers to, and it only gains PROT_READ.
    unsafe { libc::mprotect(page as *mut libc::c_void, PAGE_SIZE, libc::PROT_READ) };
}

fn map(pages: usize, flags: i32) -> Result<*mut u8> {
    // SAFETY: without MAP_FIXED the kernel picks an address no mapping uses, so no memory in
    // use changes; the result is checked before it is used.
    let addr = unsafe {
        libc::mmap(
            ptr::null_mut(),
            pages * PAGE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        bail!("mmap: {}", std::io::Error::last_os_error());
    }
    Ok(addr.cast())
}

/// A fresh mapping that will take one 4 KiB fault per page: transparent huge pages off.
fn map_small_pages(pages: usize) -> Result<*mut u8> {
    let addr = map(pages, 0)?;
    syscall_ok(
        "madvise(MADV_NOHUGEPAGE)",
        // SAFETY: MADV_NOHUGEPAGE only changes how the kernel backs the fresh mapping, not
        // its contents.
        unsafe { libc::madvise(addr.cast(), pages * PAGE_SIZE, libc::MADV_NOHUGEPAGE) },
    )?;
    Ok(addr)
}

fn unmap(addr: *mut u8, pages: usize) {
    // SAFETY: a mapping this module created, which no reference points into (the module
    // handles it by raw pointer only) and which is not used after this.
    unsafe { libc::munmap(addr.cast(), pages * PAGE_SIZE) };
}

fn touch(addr: *mut u8, pages: usize) {
    for i in 0..pages {
        // SAFETY: inside the caller's writable mapping, which nothing else refers to; volatile
        // so the writes happen.
        unsafe { ptr::write_volatile(addr.add(i * PAGE_SIZE), 1) };
    }
}

/// Runs one command; returns the address of the region used (0 when none).
pub(super) fn step(command: &str, kept: &mut Vec<(*mut u8, usize)>) -> Result<usize> {
    let mut words = command.split_whitespace();
    let name = words.next().unwrap_or("");
    let pages: usize = words.next().map_or(Ok(0), str::parse)?;
    let addr = match name {
        "noop" => ptr::null_mut(),
        "touch" => touch_fresh(pages)?,
        "mtouch" => touch_in_threads(pages, words.next().map_or(Ok(1), str::parse)?)?,
        "mlock" => mlock_fresh(pages)?,
        "site_a" | "site_b" => touch_at_site(name, pages)?,
        "site_mlock" => mlock_at_site(pages)?,
        "populate" => {
            let addr = map(pages, libc::MAP_POPULATE)?;
            unmap(addr, pages);
            addr
        }
        "protect" => lock_read_only_then_write(pages)?,
        "remap" => grow_locked(pages)?,
        "advise" => advise_populate(pages)?,
        "onfault" => lock_on_fault_and_touch(pages, kept)?,
        "file" => read_file_pages(words.next().unwrap_or(""), pages)?,
        "segv" => read_after_segv()?,
        "mlockall" => map_under_mlockall(pages)?,
        other => bail!("unknown command `{other}`"),
    };
    Ok(addr as usize)
}

/// `touch N`.
fn touch_fresh(pages: usize) -> Result<*mut u8> {
    let addr = map_small_pages(pages)?;
    touch(addr, pages);
    unmap(addr, pages);
    Ok(addr)
}

/// `mtouch N T`: each of `threads` threads touches its share of the pages at once.
fn touch_in_threads(pages: usize, threads: usize) -> Result<*mut u8> {
    let addr = map_small_pages(pages)?;
    let share = pages.div_ceil(threads.max(1));
    let base = addr as usize;
    std::thread::scope(|scope| {
        for t in 0..threads.max(1) {
            let first = (t * share).min(pages);
            let count = share.min(pages - first);
            scope.spawn(move || touch((base + first * PAGE_SIZE) as *mut u8, count));
        }
    });
    unmap(addr, pages);
    Ok(addr)
}

/// `mlock N`: the kernel populates the untouched mapping.
fn mlock_fresh(pages: usize) -> Result<*mut u8> {
    let addr = map_small_pages(pages)?;
    syscall_ok(
        "mlock",
        // SAFETY: mlock changes no memory contents, only residency.
        unsafe { libc::mlock(addr.cast(), pages * PAGE_SIZE) },
    )?;
    unmap(addr, pages);
    Ok(addr)
}

/// A fresh mapping of `pages` small pages, or none (a null address) for 0 pages.
fn map_small_pages_if_any(pages: usize) -> Result<*mut u8> {
    if pages > 0 {
        map_small_pages(pages)
    } else {
        Ok(ptr::null_mut())
    }
}

fn unmap_if_any(addr: *mut u8, pages: usize) {
    if pages > 0 {
        unmap(addr, pages);
    }
}

/// `site_a N`, `site_b N`: the touches made in the named call site.
fn touch_at_site(name: &str, pages: usize) -> Result<*mut u8> {
    let addr = map_small_pages_if_any(pages)?;
    if name == "site_a" {
        fault_site_alpha(addr, pages);
    } else {
        fault_site_beta(addr, pages);
    }
    unmap_if_any(addr, pages);
    Ok(addr)
}

/// `site_mlock N`: the mlock made in its own call site.
fn mlock_at_site(pages: usize) -> Result<*mut u8> {
    let addr = map_small_pages_if_any(pages)?;
    let ret = mlock_site_gamma(addr, pages * PAGE_SIZE);
    if ret != 0 {
        bail!("mlock: {}", std::io::Error::from_raw_os_error(-ret as i32));
    }
    unmap_if_any(addr, pages);
    Ok(addr)
}

// The calls that populate only in a locked mapping: a read-only one locked (its pages
// populated by mlock, as the zero page), made writable (populated again by mprotect, each
// copied); a locked one grown in place by mremap (its new pages).

/// `protect N`.
fn lock_read_only_then_write(pages: usize) -> Result<*mut u8> {
    let addr = map(pages, 0)?;
    // SAFETY: mprotect and mlock change this module's fresh mapping's access and
    // residency, not its contents; nothing refers into it.
    unsafe {
        syscall_ok(
            "mprotect",
            libc::mprotect(addr.cast(), pages * PAGE_SIZE, libc::PROT_READ),
        )?;
        syscall_ok("mlock", libc::mlock(addr.cast(), pages * PAGE_SIZE))?;
        syscall_ok(
            "mprotect",
            libc::mprotect(
                addr.cast(),
                pages * PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
            ),
        )?;
    }
    unmap(addr, pages);
    Ok(addr)
}

/// `remap N`.
fn grow_locked(pages: usize) -> Result<*mut u8> {
    let addr = map(pages, libc::MAP_LOCKED)?;
    // SAFETY: grows this module's mapping (moving it if it must), contents kept.
    let grown = unsafe {
        libc::mremap(
            addr.cast(),
            pages * PAGE_SIZE,
            2 * pages * PAGE_SIZE,
            libc::MREMAP_MAYMOVE,
        )
    };
    if grown == libc::MAP_FAILED {
        unmap(addr, pages);
        bail!("mremap: {}", std::io::Error::last_os_error());
    }
    unmap(grown.cast(), 2 * pages);
    Ok(grown.cast())
}

/// `advise N`: MADV_POPULATE_WRITE, a madvise that populates (Linux 5.14; before, EINVAL and
/// nothing populated, which the step answers with address 0, so one test serves every
/// kernel).
fn advise_populate(pages: usize) -> Result<*mut u8> {
    let addr = map_small_pages(pages)?;
    // SAFETY: populating changes residency only, of this module's fresh mapping.
    let ret = unsafe { libc::madvise(addr.cast(), pages * PAGE_SIZE, libc::MADV_POPULATE_WRITE) };
    let error = std::io::Error::last_os_error();
    unmap(addr, pages);
    match ret {
        0 => Ok(addr),
        _ if error.raw_os_error() == Some(libc::EINVAL) => Ok(ptr::null_mut()),
        _ => bail!("madvise(MADV_POPULATE_WRITE): {error}"),
    }
}

/// `onfault N`.
fn lock_on_fault_and_touch(pages: usize, kept: &mut Vec<(*mut u8, usize)>) -> Result<*mut u8> {
    let addr = map_small_pages(pages)?;
    // SAFETY: mlock2 changes no memory contents, only residency.
    let ret = unsafe { libc::syscall(libc::SYS_mlock2, addr, pages * PAGE_SIZE, MLOCK_ONFAULT) };
    syscall_ok("mlock2", ret as libc::c_int)?;
    touch(addr, pages);
    // Kept mapped (and locked) so the test can see the mapping attributed.
    kept.push((addr, pages));
    Ok(addr)
}

/// `file N PATH`.
fn read_file_pages(path: &str, pages: usize) -> Result<*mut u8> {
    let path = CString::new(path)?;
    let fd = nix_ok(
        "open",
        open(path.as_c_str(), OFlag::O_RDONLY, Mode::empty()),
    )?;
    let len = pages * FILE_STRIDE * PAGE_SIZE;
    // SAFETY: a private read-only mapping at an address the kernel picks, so no memory
    // in use changes; the result is checked before it is used.
    let addr = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            fd.as_raw_fd(),
            0,
        )
    };
    drop(fd);
    if addr == libc::MAP_FAILED {
        bail!("mmap of the file: {}", std::io::Error::last_os_error());
    }
    // No read-around: a page not cached costs one read of that page, one major fault.
    syscall_ok(
        "madvise",
        // SAFETY: MADV_RANDOM only changes the kernel's read-ahead, not the contents.
        unsafe { libc::madvise(addr, len, libc::MADV_RANDOM) },
    )?;
    let addr: *mut u8 = addr.cast();
    for i in 0..pages {
        // SAFETY: page `i * FILE_STRIDE` of the `len` bytes mapped readable above.
        unsafe { ptr::read_volatile(addr.add(i * FILE_STRIDE * PAGE_SIZE)) };
    }
    // SAFETY: the mapping made above, which no reference points into and which is not
    // used after this.
    unsafe { libc::munmap(addr.cast(), len) };
    Ok(addr)
}

/// `segv`.
fn read_after_segv() -> Result<*mut u8> {
    // SAFETY: a fresh mapping at an address the kernel picks, so no memory in use
    // changes; the result is checked before it is used.
    let addr = unsafe {
        libc::mmap(
            ptr::null_mut(),
            PAGE_SIZE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        bail!("mmap: {}", std::io::Error::last_os_error());
    }
    SEGV_PAGE.store(addr as usize, Ordering::Relaxed);
    // Faults (SIGSEGV: a failed fault), the handler allows reading, the read is
    // restarted and faults again, successfully.
    // SAFETY: the page mapped above, which the SIGSEGV handler makes readable before
    // the read is restarted.
    unsafe { ptr::read_volatile(addr.cast::<u8>()) };
    unmap(addr.cast(), 1);
    Ok(addr.cast())
}

/// `mlockall N`.
fn map_under_mlockall(pages: usize) -> Result<*mut u8> {
    nix_ok(
        "mlockall",
        mlockall(MlockAllFlags::MCL_CURRENT | MlockAllFlags::MCL_FUTURE),
    )?;
    let addr = map(pages, 0);
    nix_ok("munlockall", munlockall())?;
    let addr = addr?;
    unmap(addr, pages);
    Ok(addr)
}

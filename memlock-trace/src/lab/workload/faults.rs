//! A process that takes page faults on command, for the fault accuracy tests.
//!
//! It reads one command per line on stdin, runs it, answers `ok MINFLT MAJFLT ADDR NS CPU_NS`
//! (its own `getrusage(RUSAGE_SELF)` after the step, the address of the region the step used,
//! the step's wall and CPU time in ns) and blocks reading the next. Between commands it sits in `read(0)`, so a test can compare its
//! `/proc/PID/stat` with the tracer's counts knowing neither moves.
//!
//! Commands (N is a page count):
//! - `noop`: nothing (shows the protocol itself takes no fault once warm);
//! - `touch N`: write one byte to each page of a fresh anonymous mapping (no huge pages);
//! - `mtouch N T`: the same with T threads, each touching its share at once (max fault rate);
//! - `mlock N`: `mlock` a fresh, untouched mapping (the kernel populates it);
//! - `populate N`: `mmap(MAP_POPULATE)`;
//! - `protect N`: map N pages read-only, `mlock` them (the zero page, populated by mlock),
//!   `mprotect` them writable (populated again, each copied);
//! - `remap N`: `mmap(MAP_LOCKED)` N pages, `mremap` to 2N (the new half populated);
//! - `advise N`: `madvise(MADV_POPULATE_WRITE)` a fresh mapping (address 0: EINVAL, before 5.14);
//! - `onfault N`: `mlock2(MLOCK_ONFAULT)` a fresh mapping, then touch it (kept mapped);
//! - `file N PATH`: read one byte of each of N pages of PATH, `FILE_STRIDE` pages apart;
//! - `segv`: touch a `PROT_NONE` page whose SIGSEGV handler makes it readable;
//! - `mlockall N`: `mlockall(MCL_CURRENT|MCL_FUTURE)`, map N new pages, `munlockall`;
//! - `site_a N`, `site_b N`: `touch N`, the touches made in [`fault_site_alpha`] or
//!   [`fault_site_beta`] (distinct call sites for `--stacks`); N may be 0, to fault in their
//!   code before a measured run;
//! - `site_mlock N`: `mlock N`, the system call made in [`mlock_site_gamma`];
//! - `exit`.
//!
//! Everything uses raw syscalls and fixed buffers, so no allocation faults mid-step.

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

use super::{Faults, PAGE_SIZE, nix_ok, syscall_ok};
use crate::event::MLOCK_ONFAULT;

/// Pages between two read pages in `file`: well beyond the 16-page fault-around window, so
/// each read is its own fault.
pub const FILE_STRIDE: usize = 64;

/// The `PROT_NONE` page of the `segv` step, made readable by the handler.
static SEGV_PAGE: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_segv(_: libc::c_int) {
    let page = SEGV_PAGE.load(Ordering::Relaxed);
    // SAFETY: mprotect is async-signal-safe; the page is the `segv` step's own PROT_NONE
    // page, which nothing refers to, and it only gains PROT_READ.
    unsafe { libc::mprotect(page as *mut libc::c_void, PAGE_SIZE, libc::PROT_READ) };
}

/// CPU time of the whole process (all threads): unlike wall time, it leaves out the time
/// other processes held the CPU, which on a shared machine is most of the noise.
fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer to a local; this clock always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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

/// Writes one byte to each of `pages` pages from `addr`, the store itself in this function:
/// a user fault's stack starts at the faulting instruction, and without frame pointers
/// (debug builds omit them) only that frame is certain, so no helper may do the store.
#[inline(always)]
fn store_each_page(addr: *mut u8, pages: usize) {
    for i in 0..pages {
        // SAFETY: `addr` starts a mapping of `pages` pages, so page `i` is inside it.
        let page = unsafe { addr.add(i * PAGE_SIZE) };
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a one-byte store to a page of the caller's writable mapping.
        unsafe {
            std::arch::asm!("mov byte ptr [{page}], 1", page = in(reg) page, options(nostack, preserves_flags));
        }
        #[cfg(not(target_arch = "x86_64"))]
        // SAFETY: a one-byte store to a page of the caller's writable mapping.
        unsafe {
            ptr::write_volatile(page, 1)
        };
    }
}

/// `site_a`: a call site `--stacks` must name (see the `fault_cli` tests).
#[inline(never)]
pub fn fault_site_alpha(addr: *mut u8, pages: usize) {
    store_each_page(addr, pages);
}

/// `site_b`: a second call site, with its own count.
#[inline(never)]
pub fn fault_site_beta(addr: *mut u8, pages: usize) {
    store_each_page(addr, pages);
}

/// `site_mlock`: `mlock(addr, len)`, the `syscall` instruction in this function. Through
/// libc's `mlock` the kernel's frame-pointer unwinding would start in that leaf wrapper and
/// skip its caller (the wrapper pushes no frame), so the call site would be libc's.
#[inline(never)]
pub fn mlock_site_gamma(addr: *mut u8, len: usize) -> i64 {
    #[cfg(target_arch = "x86_64")]
    {
        let ret: i64;
        // SAFETY: the mlock system call on the caller's mapping; `syscall` clobbers rcx, r11.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") libc::SYS_mlock => ret,
                in("rdi") addr,
                in("rsi") len,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: mlock on the caller's mapping changes no memory contents.
    unsafe {
        i64::from(libc::mlock(addr.cast(), len))
    }
}

/// Runs one command; returns the address of the region used (0 when none).
fn step(command: &str, kept: &mut Vec<(*mut u8, usize)>) -> Result<usize> {
    let mut words = command.split_whitespace();
    let name = words.next().unwrap_or("");
    let pages: usize = words.next().map_or(Ok(0), str::parse)?;
    let addr = match name {
        "noop" => ptr::null_mut(),
        "touch" => {
            let addr = map_small_pages(pages)?;
            touch(addr, pages);
            unmap(addr, pages);
            addr
        }
        "mtouch" => {
            let threads: usize = words.next().map_or(Ok(1), str::parse)?;
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
            addr
        }
        "mlock" => {
            let addr = map_small_pages(pages)?;
            syscall_ok(
                "mlock",
                // SAFETY: mlock changes no memory contents, only residency.
                unsafe { libc::mlock(addr.cast(), pages * PAGE_SIZE) },
            )?;
            unmap(addr, pages);
            addr
        }
        "site_a" | "site_b" => {
            let addr = if pages > 0 {
                map_small_pages(pages)?
            } else {
                ptr::null_mut()
            };
            if name == "site_a" {
                fault_site_alpha(addr, pages);
            } else {
                fault_site_beta(addr, pages);
            }
            if pages > 0 {
                unmap(addr, pages);
            }
            addr
        }
        "site_mlock" => {
            let addr = if pages > 0 {
                map_small_pages(pages)?
            } else {
                ptr::null_mut()
            };
            let ret = mlock_site_gamma(addr, pages * PAGE_SIZE);
            if ret != 0 {
                bail!("mlock: {}", std::io::Error::from_raw_os_error(-ret as i32));
            }
            if pages > 0 {
                unmap(addr, pages);
            }
            addr
        }
        "populate" => {
            let addr = map(pages, libc::MAP_POPULATE)?;
            unmap(addr, pages);
            addr
        }
        // The calls that populate only in a locked mapping: a read-only one locked (its
        // pages populated by mlock, as the zero page), made writable (populated again by
        // mprotect, each copied); a locked one grown in place by mremap (its new pages).
        "protect" => {
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
            addr
        }
        "remap" => {
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
            grown.cast()
        }
        // MADV_POPULATE_WRITE: a madvise that populates (Linux 5.14; before, EINVAL and
        // nothing populated, which the step answers with address 0, so one test serves every
        // kernel).
        "advise" => {
            let addr = map_small_pages(pages)?;
            // SAFETY: populating changes residency only, of this module's fresh mapping.
            let ret =
                unsafe { libc::madvise(addr.cast(), pages * PAGE_SIZE, libc::MADV_POPULATE_WRITE) };
            let error = std::io::Error::last_os_error();
            unmap(addr, pages);
            match ret {
                0 => addr,
                _ if error.raw_os_error() == Some(libc::EINVAL) => ptr::null_mut(),
                _ => bail!("madvise(MADV_POPULATE_WRITE): {error}"),
            }
        }
        "onfault" => {
            let addr = map_small_pages(pages)?;
            // SAFETY: mlock2 changes no memory contents, only residency.
            let ret =
                unsafe { libc::syscall(libc::SYS_mlock2, addr, pages * PAGE_SIZE, MLOCK_ONFAULT) };
            syscall_ok("mlock2", ret as libc::c_int)?;
            touch(addr, pages);
            // Kept mapped (and locked) so the test can see the mapping attributed.
            kept.push((addr, pages));
            addr
        }
        "file" => {
            let path = CString::new(words.next().unwrap_or(""))?;
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
            addr
        }
        "segv" => {
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
            addr.cast()
        }
        "mlockall" => {
            nix_ok(
                "mlockall",
                mlockall(MlockAllFlags::MCL_CURRENT | MlockAllFlags::MCL_FUTURE),
            )?;
            let addr = map(pages, 0);
            nix_ok("munlockall", munlockall())?;
            let addr = addr?;
            unmap(addr, pages);
            addr
        }
        other => bail!("unknown command `{other}`"),
    };
    Ok(addr as usize)
}

/// Serves commands on stdin until `exit` or end of input.
pub fn serve() -> Result<()> {
    // SAFETY: an all-zero `sigaction` is valid (no flags, no handler yet); the handler
    // installed only calls mprotect, which is async-signal-safe; the pointers are to locals.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_segv as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        syscall_ok(
            "sigaction",
            libc::sigaction(libc::SIGSEGV, &action, ptr::null_mut()),
        )?;
    }
    let mut kept = Vec::with_capacity(64);
    let mut input = [0u8; 512];
    // Bytes of `input` holding a command not yet complete (no newline yet).
    let mut pending = 0;
    let mut output = [0u8; 128];
    write_all(b"ready\n")?;
    loop {
        // A test writes one line and waits for the answer, but commands piped in ahead of
        // time arrive together: run every complete line of each read.
        // SAFETY: reads into the unfilled tail of `input`, at most its length. (Raw, as the
        // module doc says: std's stdin would allocate its buffer.)
        let n = unsafe {
            libc::read(
                0,
                input[pending..].as_mut_ptr().cast(),
                input.len() - pending,
            )
        };
        if n <= 0 {
            return Ok(());
        }
        let filled = pending + n as usize;
        let mut start_of_line = 0;
        while let Some(end) = input[start_of_line..filled]
            .iter()
            .position(|&b| b == b'\n')
        {
            let line = std::str::from_utf8(&input[start_of_line..start_of_line + end])?.trim();
            start_of_line += end + 1;
            if line == "exit" {
                return Ok(());
            }
            if line.is_empty() {
                continue;
            }
            let start = std::time::Instant::now();
            let cpu_start = process_cpu_ns();
            let result = step(line, &mut kept);
            let ns = start.elapsed().as_nanos();
            let cpu_ns = process_cpu_ns() - cpu_start;
            let answer = match result {
                Ok(addr) => {
                    let Faults { minflt, majflt } = Faults::process();
                    format_into(
                        &mut output,
                        format_args!("ok {minflt} {majflt} {addr:#x} {ns} {cpu_ns}\n"),
                    )
                }
                Err(e) => format_into(&mut output, format_args!("error {e:#}\n")),
            };
            write_all(answer)?;
        }
        input.copy_within(start_of_line..filled, 0);
        pending = filled - start_of_line;
        if pending == input.len() {
            bail!("a command longer than {} bytes", input.len());
        }
    }
}

/// Formats into a fixed buffer (no allocation, so no fault from a fresh heap page).
fn format_into<'a>(buf: &'a mut [u8], args: std::fmt::Arguments<'_>) -> &'a [u8] {
    use std::io::Write as _;
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    let _ = cursor.write_fmt(args);
    let len = cursor.position() as usize;
    &buf[..len]
}

fn write_all(mut bytes: &[u8]) -> Result<()> {
    while !bytes.is_empty() {
        // SAFETY: writes from `bytes`, at most its length.
        let n = unsafe { libc::write(1, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            bail!("writing to stdout: {}", std::io::Error::last_os_error());
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

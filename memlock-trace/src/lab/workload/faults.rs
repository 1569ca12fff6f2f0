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
//! Everything uses raw syscalls and fixed buffers, so no allocation faults mid-step. Here: the
//! protocol and the call sites; `steps` runs the commands.

mod steps;

use std::ptr;

use anyhow::{Result, bail};

use self::steps::{on_segv, step};
use super::{Faults, PAGE_SIZE, syscall_ok};
use crate::output::process_cpu_ns;

/// Pages between two read pages in `file`: well beyond the 16-page fault-around window, so
/// each read is its own fault.
pub const FILE_STRIDE: usize = 64;

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
            // CPU time of the whole process: unlike wall time, it leaves out the time other
            // processes held the CPU, which on a shared machine is most of the noise.
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

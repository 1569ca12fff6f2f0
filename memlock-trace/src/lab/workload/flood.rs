//! As many mlock calls as possible from several threads, each failing fast (ENOMEM on the
//! unmapped page 0): the cheapest call that still goes through the traced entry and exit,
//! to overflow the ring buffer.

use std::io::Read as _;

use anyhow::{Result, bail};
use serde::Serialize;

use super::PAGE_SIZE;

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub threads: u32,
    /// mlock calls made, all threads together.
    pub calls: u64,
    /// Of which failed with ENOMEM (all of them, unless the kernel changed).
    pub enomem: u64,
    /// munlock calls made (`--munlock`: one after each mlock), and those that failed with
    /// ENOMEM.
    pub munlock_calls: u64,
    pub munlock_enomem: u64,
    pub secs: f64,
}

/// With `wait_stdin`, the threads are started, then wait for one byte on stdin, so a test
/// can line up the tracer (and pick a thread by its id in /proc/PID/task).
pub fn run(threads: u32, calls_per_thread: u64, wait_stdin: bool, munlock: bool) -> Result<Report> {
    let start_line = std::sync::Barrier::new(threads as usize + 1);
    let start_line = &start_line;
    // Set when the start signal came: without it the workers make no call.
    let go = &std::sync::atomic::AtomicBool::new(false);
    let mut start = std::time::Instant::now();
    let (enomem, munlock_enomem): (u64, u64) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    start_line.wait();
                    if !go.load(std::sync::atomic::Ordering::Acquire) {
                        return (0u64, 0u64);
                    }
                    let failed =
                        || std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOMEM);
                    let (mut enomem, mut munlock_enomem) = (0u64, 0u64);
                    for _ in 0..calls_per_thread {
                        // SAFETY: page 0 is never mapped; the call only fails.
                        if unsafe { libc::mlock(std::ptr::null(), PAGE_SIZE) } != 0 && failed() {
                            enomem += 1;
                        }
                        if munlock {
                            // SAFETY: as above.
                            let ret = unsafe { libc::munlock(std::ptr::null(), PAGE_SIZE) };
                            if ret != 0 && failed() {
                                munlock_enomem += 1;
                            }
                        }
                    }
                    (enomem, munlock_enomem)
                })
            })
            .collect();
        let signalled = if wait_stdin {
            let mut byte = [0u8; 1];
            std::io::stdin().read(&mut byte).map(|n| n == 1)
        } else {
            Ok(true)
        };
        // Release the workers whatever happened, so the scope can end.
        go.store(
            matches!(signalled, Ok(true)),
            std::sync::atomic::Ordering::Release,
        );
        start = std::time::Instant::now();
        start_line.wait();
        let counts = workers
            .into_iter()
            .map(|w| w.join().unwrap_or((0, 0)))
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
        match signalled {
            Ok(true) => Ok(counts),
            Ok(false) => bail!("stdin closed before the start signal"),
            Err(e) => Err(e.into()),
        }
    })?;
    Ok(Report {
        threads,
        calls: u64::from(threads) * calls_per_thread,
        enomem,
        munlock_calls: if munlock {
            u64::from(threads) * calls_per_thread
        } else {
            0
        },
        munlock_enomem,
        secs: start.elapsed().as_secs_f64(),
    })
}

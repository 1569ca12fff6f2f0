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
    pub secs: f64,
}

/// With `wait_stdin`, reads one byte from stdin first, so a test can line up the tracer.
pub fn run(threads: u32, calls_per_thread: u64, wait_stdin: bool) -> Result<Report> {
    if wait_stdin {
        let mut byte = [0u8; 1];
        if std::io::stdin().read(&mut byte)? != 1 {
            bail!("stdin closed before the start signal");
        }
    }
    let start = std::time::Instant::now();
    let enomem: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let mut enomem = 0;
                    for _ in 0..calls_per_thread {
                        // SAFETY: page 0 is never mapped; the call only fails.
                        if unsafe { libc::mlock(std::ptr::null(), PAGE_SIZE) } != 0
                            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOMEM)
                        {
                            enomem += 1;
                        }
                    }
                    enomem
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or(0)).sum()
    });
    Ok(Report {
        threads,
        calls: u64::from(threads) * calls_per_thread,
        enomem,
        secs: start.elapsed().as_secs_f64(),
    })
}

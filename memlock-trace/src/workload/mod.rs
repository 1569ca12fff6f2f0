//! Bundled workloads: processes that make known calls, measure themselves, and report what
//! they did, so the tracer's view can be checked against the workload's own.

pub mod faults;
pub mod syscalls;

use std::ptr;

use anyhow::{Result, bail};
use serde::Serialize;

pub const PAGE_SIZE: usize = 4096;

/// `getrusage(RUSAGE_THREAD)` fault counters: the kernel's own account for this thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Faults {
    pub minflt: u64,
    pub majflt: u64,
}

impl Faults {
    pub fn thread() -> Self {
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer; RUSAGE_THREAD cannot fail for the calling thread.
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
        Self {
            minflt: usage.ru_minflt as u64,
            majflt: usage.ru_majflt as u64,
        }
    }

    pub fn since(self, before: Faults) -> Faults {
        Faults {
            minflt: self.minflt - before.minflt,
            majflt: self.majflt - before.majflt,
        }
    }
}

/// An anonymous private mapping, unmapped on drop.
pub struct Region {
    pub addr: *mut u8,
    pub len: usize,
}

impl Region {
    pub fn anonymous(pages: usize, prot: i32, extra_flags: i32) -> Result<Self> {
        let len = pages * PAGE_SIZE;
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
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
        Ok(Self { addr: addr.cast(), len })
    }

    pub fn page(&self, index: usize) -> *mut u8 {
        assert!(index * PAGE_SIZE < self.len);
        self.addr.wrapping_add(index * PAGE_SIZE)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping we created.
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}

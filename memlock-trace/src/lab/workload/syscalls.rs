//! One of each mlock-family call, including one that fails, each measured with the thread's
//! own `getrusage` fault counters around it.

use anyhow::Result;
use serde::Serialize;

use super::{Faults, PAGE_SIZE, Region};
use crate::event::{MCL_CURRENT, MCL_FUTURE, MLOCK_ONFAULT, Syscall};

/// What the workload itself saw for one call.
#[derive(Clone, Debug, Serialize)]
pub struct Call {
    pub syscall: &'static str,
    /// 0, or the errno name.
    pub result: String,
    /// `getrusage(RUSAGE_THREAD)` delta across the call.
    pub faults: Faults,
}

/// Runs the calls in order and returns the workload's own record of them.
pub fn run() -> Result<Vec<Call>> {
    let mut calls = Vec::new();
    let region = Region::anonymous(16, libc::PROT_READ | libc::PROT_WRITE, 0)?;
    let middle = Region::anonymous(16, libc::PROT_READ | libc::PROT_WRITE, 0)?;
    let onfault = Region::anonymous(16, libc::PROT_READ | libc::PROT_WRITE, 0)?;
    // Warm up the measurement itself (stack, getrusage) with a call the tracer does not see,
    // so the only faults inside a measurement are the ones the kernel takes for the call.
    let _ = measured(Syscall::Munlock, || i64::from(std::process::id()));

    // The calls are made raw: the workload's record of each needs its -1 and errno. None
    // changes memory contents, only whether pages stay resident.
    // mlock a whole region: all 16 pages are populated and locked.
    calls.push(measured(
        Syscall::Mlock,
        // SAFETY: mlock changes no memory contents.
        || unsafe { libc::mlock(region.addr.cast(), region.len) } as i64,
    ));
    // mlock the middle 8 pages of another: the VMA splits in three.
    // SAFETY: mlock changes no memory contents.
    calls.push(measured(Syscall::Mlock, || unsafe {
        libc::mlock(middle.page(4).cast(), 8 * PAGE_SIZE)
    } as i64));
    // SAFETY: munlock changes no memory contents.
    calls.push(measured(Syscall::Munlock, || unsafe {
        libc::munlock(region.addr.cast(), region.len)
    } as i64));
    // SAFETY: munlock changes no memory contents.
    calls.push(measured(Syscall::Munlock, || unsafe {
        libc::munlock(middle.addr.cast(), middle.len)
    } as i64));
    // MLOCK_ONFAULT locks without populating.
    // SAFETY: mlock2 changes no memory contents.
    calls.push(measured(Syscall::Mlock2, || unsafe {
        libc::syscall(libc::SYS_mlock2, onfault.addr, onfault.len, MLOCK_ONFAULT)
    }));
    // SAFETY: munlock changes no memory contents.
    calls.push(measured(Syscall::Munlock, || unsafe {
        libc::munlock(onfault.addr.cast(), onfault.len)
    } as i64));
    // SAFETY: mlockall changes no memory contents.
    calls.push(measured(Syscall::Mlockall, || unsafe {
        libc::mlockall((MCL_CURRENT | MCL_FUTURE) as i32)
    } as i64));
    calls.push(measured(
        Syscall::Munlockall,
        // SAFETY: munlockall changes no memory contents.
        || unsafe { libc::munlockall() } as i64,
    ));
    // An unmapped range: ENOMEM.
    let hole = Region::anonymous(1, libc::PROT_NONE, 0)?;
    let hole_addr = hole.addr;
    drop(hole);
    calls.push(measured(
        Syscall::Mlock,
        // SAFETY: nothing is mapped there, so the call only fails.
        || unsafe { libc::mlock(hole_addr.cast(), PAGE_SIZE) } as i64,
    ));
    Ok(calls)
}

pub fn measured(syscall: Syscall, call: impl FnOnce() -> i64) -> Call {
    let before = Faults::thread();
    let ret = call();
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    let faults = Faults::thread().since(before);
    let result = if ret == -1 {
        crate::event::errno_name(-i64::from(errno)).unwrap_or_default()
    } else {
        "0".into()
    };
    Call {
        syscall: syscall.name(),
        result,
        faults,
    }
}

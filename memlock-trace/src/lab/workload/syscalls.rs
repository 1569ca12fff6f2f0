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
    let _ = measured(Syscall::Munlock, || unsafe { libc::getpid() }.into());

    // mlock a whole region: all 16 pages are populated and locked.
    calls.push(measured(
        Syscall::Mlock,
        || unsafe { libc::mlock(region.addr.cast(), region.len) } as i64,
    ));
    // mlock the middle 8 pages of another: the VMA splits in three.
    calls.push(measured(Syscall::Mlock, || unsafe {
        libc::mlock(middle.page(4).cast(), 8 * PAGE_SIZE)
    } as i64));
    calls.push(measured(Syscall::Munlock, || unsafe {
        libc::munlock(region.addr.cast(), region.len)
    } as i64));
    calls.push(measured(Syscall::Munlock, || unsafe {
        libc::munlock(middle.addr.cast(), middle.len)
    } as i64));
    // MLOCK_ONFAULT locks without populating.
    calls.push(measured(Syscall::Mlock2, || unsafe {
        libc::syscall(libc::SYS_mlock2, onfault.addr, onfault.len, MLOCK_ONFAULT)
    }));
    calls.push(measured(Syscall::Munlock, || unsafe {
        libc::munlock(onfault.addr.cast(), onfault.len)
    } as i64));
    calls.push(measured(Syscall::Mlockall, || unsafe {
        libc::mlockall((MCL_CURRENT | MCL_FUTURE) as i32)
    } as i64));
    calls.push(measured(
        Syscall::Munlockall,
        || unsafe { libc::munlockall() } as i64,
    ));
    // An unmapped range: ENOMEM.
    let hole = Region::anonymous(1, libc::PROT_NONE, 0)?;
    let hole_addr = hole.addr;
    drop(hole);
    calls.push(measured(
        Syscall::Mlock,
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

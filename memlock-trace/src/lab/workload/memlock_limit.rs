//! memlock-limit (references 000 and 001): an unprivileged process runs into
//! RLIMIT_MEMLOCK for real. As root the scenario first lowers the limit and drops to
//! nobody, so no capability lets it through.

use anyhow::{Result, bail};
use serde_json::{Value, json};

use super::{
    PAGE_SIZE, Region,
    scenario::ScenarioArgs,
    syscalls::{Call, measured},
};
use crate::event::{MCL_CURRENT, MLOCK_ONFAULT, Syscall};

const NOBODY: u32 = 65534;

pub fn run(args: &ScenarioArgs) -> Result<Value> {
    let limit = args.limit_kib * 1024;
    set_memlock_limit(limit)?;
    // SAFETY: plain syscalls; leaving uid 0 drops every capability, CAP_IPC_LOCK included.
    unsafe {
        if libc::geteuid() == 0
            && (libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(NOBODY, NOBODY, NOBODY) != 0
                || libc::setresuid(NOBODY, NOBODY, NOBODY) != 0)
        {
            bail!(
                "dropping to uid {NOBODY}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    let pages = (limit as usize / PAGE_SIZE) * 2;
    let region = Region::anonymous(pages, libc::PROT_READ | libc::PROT_WRITE, 0)?;
    let half = (limit as usize / 2).max(PAGE_SIZE);
    let mut calls: Vec<(&str, Call)> = Vec::new();
    // SAFETY (all calls below): ranges inside our own mapping, or deliberately unmapped.
    calls.push((
        "mlock half the limit",
        measured(Syscall::Mlock, || {
            unsafe { libc::mlock(region.addr.cast(), half) }.into()
        }),
    ));
    calls.push((
        "mlock twice the limit",
        measured(Syscall::Mlock, || {
            unsafe { libc::mlock(region.addr.cast(), region.len) }.into()
        }),
    ));
    calls.push((
        "mlock2(MLOCK_ONFAULT) twice the limit",
        measured(Syscall::Mlock2, || unsafe {
            libc::syscall(libc::SYS_mlock2, region.addr, region.len, MLOCK_ONFAULT)
        }),
    ));
    calls.push((
        "mlockall(MCL_CURRENT) over the limit",
        measured(Syscall::Mlockall, || {
            unsafe { libc::mlockall(MCL_CURRENT as i32) }.into()
        }),
    ));
    calls.push((
        "munlock",
        measured(Syscall::Munlock, || {
            unsafe { libc::munlock(region.addr.cast(), region.len) }.into()
        }),
    ));
    let hole = Region::anonymous(1, libc::PROT_NONE, 0)?;
    let hole_addr = hole.addr;
    drop(hole);
    calls.push((
        "mlock an unmapped page",
        measured(Syscall::Mlock, || {
            unsafe { libc::mlock(hole_addr.cast(), PAGE_SIZE) }.into()
        }),
    ));
    set_memlock_limit(0)?;
    calls.push((
        "mlock with RLIMIT_MEMLOCK 0",
        measured(Syscall::Mlock, || {
            unsafe { libc::mlock(region.addr.cast(), PAGE_SIZE) }.into()
        }),
    ));
    Ok(json!({
        "uid": unsafe { libc::geteuid() },
        "limit_kib": args.limit_kib,
        "calls": calls.iter().map(|(what, c)| json!({ "what": what, "syscall": c.syscall, "result": c.result })).collect::<Vec<_>>(),
    }))
}

fn set_memlock_limit(bytes: u64) -> Result<()> {
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: valid pointer to a local.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) } != 0 {
        bail!(
            "setrlimit(RLIMIT_MEMLOCK, {bytes}): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

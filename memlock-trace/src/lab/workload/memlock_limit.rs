//! memlock-limit (references 000 and 001): an unprivileged process runs into
//! RLIMIT_MEMLOCK for real. As root the scenario first lowers the limit and drops to
//! nobody, so no capability lets it through.

use anyhow::Result;
use nix::{
    sys::resource::{Resource, setrlimit},
    unistd::{Gid, Uid, geteuid, setgroups, setresgid, setresuid},
};
use serde_json::{Value, json};

use super::{
    PAGE_SIZE, Region,
    args::ScenarioArgs,
    nix_ok,
    syscalls::{Call, measured},
};
use crate::event::{MCL_CURRENT, MLOCK_ONFAULT, Syscall};

const NOBODY: u32 = 65534;

pub fn run(args: &ScenarioArgs) -> Result<Value> {
    let limit = args.limit_kib * 1024;
    set_memlock_limit(limit)?;
    // Leaving uid 0 drops every capability, CAP_IPC_LOCK included.
    if geteuid().is_root() {
        let (uid, gid) = (Uid::from_raw(NOBODY), Gid::from_raw(NOBODY));
        nix_ok(
            &format!("dropping to uid {NOBODY}"),
            setgroups(&[])
                .and_then(|()| setresgid(gid, gid, gid))
                .and_then(|()| setresuid(uid, uid, uid)),
        )?;
    }
    let pages = (limit as usize / PAGE_SIZE) * 2;
    let region = Region::anonymous(pages, libc::PROT_READ | libc::PROT_WRITE, 0)?;
    let half = (limit as usize / 2).max(PAGE_SIZE);
    let mut calls: Vec<(&str, Call)> = Vec::new();
    // The calls are made raw: the workload's record of each needs its -1 and errno.
    calls.push((
        "mlock half the limit",
        measured(Syscall::Mlock, || {
            // SAFETY: mlock changes no memory contents, only residency; the range is inside
            // `region`.
            unsafe { libc::mlock(region.addr.cast(), half) }.into()
        }),
    ));
    calls.push((
        "mlock twice the limit",
        measured(Syscall::Mlock, || {
            // SAFETY: mlock changes no memory contents, only residency.
            unsafe { libc::mlock(region.addr.cast(), region.len) }.into()
        }),
    ));
    calls.push((
        "mlock2(MLOCK_ONFAULT) twice the limit",
        // SAFETY: mlock2 changes no memory contents, only residency.
        measured(Syscall::Mlock2, || unsafe {
            libc::syscall(libc::SYS_mlock2, region.addr, region.len, MLOCK_ONFAULT)
        }),
    ));
    calls.push((
        "mlockall(MCL_CURRENT) over the limit",
        measured(Syscall::Mlockall, || {
            // SAFETY: mlockall changes no memory contents, only residency.
            unsafe { libc::mlockall(MCL_CURRENT as i32) }.into()
        }),
    ));
    calls.push((
        "munlock",
        measured(Syscall::Munlock, || {
            // SAFETY: munlock changes no memory contents, only residency.
            unsafe { libc::munlock(region.addr.cast(), region.len) }.into()
        }),
    ));
    let hole = Region::anonymous(1, libc::PROT_NONE, 0)?;
    let hole_addr = hole.addr;
    drop(hole);
    calls.push((
        "mlock an unmapped page",
        measured(Syscall::Mlock, || {
            // SAFETY: nothing is mapped there, so the call only fails.
            unsafe { libc::mlock(hole_addr.cast(), PAGE_SIZE) }.into()
        }),
    ));
    set_memlock_limit(0)?;
    calls.push((
        "mlock with RLIMIT_MEMLOCK 0",
        measured(Syscall::Mlock, || {
            // SAFETY: mlock changes no memory contents, only residency; the range is inside
            // `region`.
            unsafe { libc::mlock(region.addr.cast(), PAGE_SIZE) }.into()
        }),
    ));
    Ok(json!({
        "uid": geteuid().as_raw(),
        "limit_kib": args.limit_kib,
        "calls": calls.iter().map(|(what, c)| json!({ "what": what, "syscall": c.syscall, "result": c.result })).collect::<Vec<_>>(),
    }))
}

fn set_memlock_limit(bytes: u64) -> Result<()> {
    nix_ok(
        &format!("setrlimit(RLIMIT_MEMLOCK, {bytes})"),
        setrlimit(Resource::RLIMIT_MEMLOCK, bytes, bytes),
    )
}

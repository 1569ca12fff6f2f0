//! Forks N children that all exist at once, then each makes K mlock calls and exits: the
//! scenario for `--follow-children`, a full target map and a full per-process table.

use anyhow::{Context as _, Result, bail};
use nix::{
    sys::wait::{WaitStatus, waitpid},
    unistd::{ForkResult, fork, pipe},
};
use serde::Serialize;

use super::{PAGE_SIZE, Region};

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The children's pids, in fork order.
    pub children: Vec<u32>,
    /// Successful mlock calls each child made.
    pub calls_per_child: u32,
    /// The page faults of all the children together, as the kernel handed them to this
    /// process when it reaped them (`getrusage(RUSAGE_CHILDREN)`: minor + major).
    pub children_faults: u64,
}

/// Call only from a single-threaded process (the `workload` subcommand is).
pub fn run(count: u32, calls: u32) -> Result<Report> {
    let region = Region::anonymous(1, libc::PROT_READ | libc::PROT_WRITE, 0)?;
    let (gate_r, gate_w) = pipe().context("pipe")?;
    let mut children = Vec::new();
    for _ in 0..count {
        // SAFETY: this process is single-threaded, so the child may do anything.
        match unsafe { fork() }.context("fork")? {
            ForkResult::Child => {
                drop(gate_w);
                // Wait until every sibling exists: EOF once the parent closes its end.
                let mut byte = [0u8; 1];
                let _ = nix::unistd::read(&gate_r, &mut byte);
                let mut ok = true;
                for _ in 0..calls {
                    // SAFETY: mlock changes no memory contents, only residency.
                    ok &= unsafe { libc::mlock(region.addr.cast(), PAGE_SIZE) } == 0;
                }
                // SAFETY: leave without running the parent's destructors twice.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            ForkResult::Parent { child } => children.push(child.as_raw() as u32),
        }
    }
    drop(gate_w);
    for &pid in &children {
        match waitpid(nix::unistd::Pid::from_raw(pid as i32), None).context("waitpid")? {
            WaitStatus::Exited(_, 0) => {}
            other => bail!("child {pid} did not make its calls: {other:?}"),
        }
    }
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .context("getrusage")?;
    Ok(Report {
        children,
        calls_per_child: calls,
        children_faults: (usage.minor_page_faults() + usage.major_page_faults()) as u64,
    })
}

//! fork-inherit (reference 000, section 1): locks are not inherited across fork, and threads
//! share them (they share the mm). Each side reads its own `/proc/self/smaps`.

use std::io::{Read as _, Write as _};

use anyhow::Result;
use nix::unistd::{ForkResult, fork, pipe};
use serde_json::{Value, json};

use super::{Region, syscall_ok, vma_split::region_vmas};

pub fn run() -> Result<Value> {
    let region = Region::anonymous(16, libc::PROT_READ | libc::PROT_WRITE, 0)?;
    // SAFETY: mlock changes no memory contents, only whether the pages stay resident.
    syscall_ok("mlock", unsafe {
        libc::mlock(region.addr.cast(), region.len)
    })?;
    let range = region.window();
    let parent = summarize(range)?;
    let thread = std::thread::scope(|s| s.spawn(|| summarize(range)).join())
        .map_err(|_| anyhow::anyhow!("thread panicked"))??;

    let (r, w) = pipe()?;
    // SAFETY: the child only reads /proc, writes a pipe and exits; this process holds no lock
    // the child could need (the thread above has been joined).
    let child_pid = match unsafe { fork() }? {
        ForkResult::Child => {
            drop(r);
            let text = summarize(range)
                .map(|v| v.to_string())
                .unwrap_or_else(|e| json!({ "error": e.to_string() }).to_string());
            let mut w = std::fs::File::from(w);
            let _ = w.write_all(text.as_bytes());
            drop(w);
            // SAFETY: leave without running the parent's destructors twice.
            unsafe { libc::_exit(0) }
        }
        ForkResult::Parent { child } => child,
    };
    drop(w);
    let mut text = String::new();
    std::fs::File::from(r).read_to_string(&mut text)?;
    nix::sys::wait::waitpid(child_pid, None)?;
    let child: Value = serde_json::from_str(&text)?;
    // SAFETY: munlock changes no memory contents, only whether the pages stay resident.
    unsafe { libc::munlock(region.addr.cast(), region.len) };
    Ok(json!({
        "region_kib": region.len / 1024,
        "parent": parent,
        "thread": thread,
        "child": child,
        "pids": [std::process::id(), child_pid.as_raw()],
    }))
}

/// Locked KiB and whether every VMA of the range has VM_LOCKED, from /proc/self/smaps.
fn summarize(range: (u64, u64)) -> Result<Value> {
    let vmas = region_vmas("self", range)?;
    Ok(json!({
        "locked_kib": vmas.iter().map(|v| v.locked_kb).sum::<u64>(),
        "vm_locked": !vmas.is_empty() && vmas.iter().all(|v| v.mapping.locked),
        "vmas": vmas.len(),
    }))
}

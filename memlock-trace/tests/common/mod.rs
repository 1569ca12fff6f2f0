//! Shared by the integration tests: they load real programs into the running kernel.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use aya::maps::{MapData, RingBuf};
use memlock_trace::event::{Event, SyscallRecord, decode};

/// Integration tests need root (or CAP_BPF + CAP_PERFMON); say so loudly instead of skipping.
pub fn require_privileges() {
    if let Err(e) = memlock_trace::probe::check_privileges() {
        panic!(
            "this integration test loads eBPF programs into the running kernel ({}) and cannot run: {e:#}",
            memlock_trace::probe::kernel_release()
        );
    }
}

/// Every syscall record in the ring buffer right now.
pub fn drain_syscalls(ring: &mut RingBuf<MapData>) -> Vec<SyscallRecord> {
    let mut out = Vec::new();
    while let Some(item) = ring.next() {
        match decode(&item).expect("every record decodes") {
            Event::Syscall(rec) => out.push(rec),
            // VMA snapshots and stores ride the same ring buffer.
            Event::Vma(_) => {}
            // Sampled faults appear only with `--events`.
            Event::Fault(_) => {}
        }
    }
    out
}

pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

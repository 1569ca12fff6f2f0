//! dynamic-alloc (reference 000, table 6): a large `malloc` with and without
//! `mlockall(MCL_CURRENT | MCL_FUTURE)`. Under MCL_FUTURE the kernel populates every page
//! of the new mapping inside `mmap`; without it, untouched memory costs no faults.
//!
//! The `churn` variant (run alone, for `advise`: not one of the suite's variants) is the
//! allocator pattern the advice is about: a block above glibc's mmap threshold made, touched
//! and freed every round, so each round faults it in again.

use std::time::Instant;

use anyhow::{Result, bail};
use serde_json::{Value, json};

use super::{Faults, args::ScenarioArgs};

pub fn run(variant: &str, args: &ScenarioArgs) -> Result<Value> {
    if variant == "churn" {
        return churn(args);
    }
    super::lock_all_for(variant, "dynamic-alloc")?;
    let bytes = args.alloc_mib << 20;
    let before = Faults::process();
    let t = Instant::now();
    // SAFETY: freed below; never touched, as in the reference experiment.
    // black_box: LLVM may otherwise delete a malloc/free pair whose memory is never used.
    let ptr = std::hint::black_box(unsafe { libc::malloc(bytes) });
    let alloc_ns = t.elapsed().as_nanos() as u64;
    let faults = Faults::process().since(before);
    if ptr.is_null() {
        bail!("malloc of {} MiB failed", args.alloc_mib);
    }
    // SAFETY: the pointer malloc returned.
    unsafe { libc::free(ptr) };
    Ok(json!({
        "bytes": bytes,
        "pages": bytes / super::PAGE_SIZE,
        "alloc_ns": alloc_ns,
        "faults": faults,
    }))
}

/// `churn_rounds` rounds of: malloc a `churn_mib` block, write one byte per page, free it.
fn churn(args: &ScenarioArgs) -> Result<Value> {
    let bytes = args.churn_mib << 20;
    let pages = bytes / super::PAGE_SIZE;
    let before = Faults::process();
    let t = Instant::now();
    let mut per_round = Vec::with_capacity(args.churn_rounds);
    for _ in 0..args.churn_rounds {
        let round = Faults::process();
        // SAFETY: a fresh allocation, written inside its bounds below and freed at once.
        let ptr = unsafe { libc::malloc(bytes) }.cast::<u8>();
        if ptr.is_null() {
            bail!("malloc of {} MiB failed", args.churn_mib);
        }
        for page in 0..pages {
            // SAFETY: `page * PAGE_SIZE < bytes`: inside the block just allocated.
            unsafe { ptr.add(page * super::PAGE_SIZE).write_volatile(1) };
        }
        // SAFETY: the pointer malloc returned, freed once.
        unsafe { libc::free(ptr.cast()) };
        per_round.push(Faults::process().since(round).minflt);
    }
    Ok(json!({
        "bytes": bytes,
        "pages": pages,
        "rounds": args.churn_rounds,
        "churn_ns": t.elapsed().as_nanos() as u64,
        "faults": Faults::process().since(before),
        "faults_per_round": per_round,
    }))
}

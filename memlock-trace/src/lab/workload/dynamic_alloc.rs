//! dynamic-alloc (reference 000, table 6): a large `malloc` with and without
//! `mlockall(MCL_CURRENT | MCL_FUTURE)`. Under MCL_FUTURE the kernel populates every page
//! of the new mapping inside `mmap`; without it, untouched memory costs no faults.

use std::time::Instant;

use anyhow::{Result, bail};
use serde_json::{Value, json};

use super::{Faults, args::ScenarioArgs};

pub fn run(variant: &str, args: &ScenarioArgs) -> Result<Value> {
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

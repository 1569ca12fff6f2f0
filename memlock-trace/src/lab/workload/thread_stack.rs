//! thread-stack (reference 000, table 4): N threads with large stacks of which they use a
//! part. Without mlock only the used part is faulted in; under MCL_FUTURE the whole stack
//! is populated and locked when the thread is created.

use std::{
    hint::black_box,
    sync::{Arc, Barrier},
    time::Instant,
};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};

use super::{Faults, args::ScenarioArgs};

pub fn run(variant: &str, args: &ScenarioArgs) -> Result<Value> {
    super::lock_all_for(variant, "thread-stack")?;
    let n = args.threads;
    let used_kib = args.stack_used_kib;
    let ready = Arc::new(Barrier::new(n + 1));
    let release = Arc::new(Barrier::new(n + 1));
    let before = Faults::process();
    let start = Instant::now();
    let mut handles = Vec::with_capacity(n);
    for _ in 0..n {
        let (ready, release) = (ready.clone(), release.clone());
        handles.push(
            std::thread::Builder::new()
                .stack_size(args.stack_mib << 20)
                .spawn(move || {
                    use_stack(used_kib);
                    ready.wait();
                    release.wait();
                })
                .context("creating a thread")?,
        );
    }
    ready.wait();
    let all_ready_ns = start.elapsed().as_nanos() as u64;
    let faults = Faults::process().since(before);
    let locked_kib = super::proc_status_kib("VmLck")?;
    release.wait();
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("a thread panicked"))?;
    }
    Ok(json!({
        "threads": n,
        "stack_kib": args.stack_mib * 1024,
        "used_kib": used_kib,
        "create_and_touch_ms": all_ready_ns as f64 / 1e6,
        "faults": faults,
        "faults_per_thread": faults.minflt as f64 / n as f64,
        "locked_kib": locked_kib,
    }))
}

/// Touches `kib` KiB of this thread's stack, 16 KiB per frame.
#[inline(never)]
fn use_stack(kib: usize) {
    let mut chunk = [0u8; 16 * 1024];
    for i in (0..chunk.len()).step_by(4096) {
        chunk[i] = 1;
    }
    black_box(&mut chunk);
    if kib > 16 {
        use_stack(kib - 16);
    }
    black_box(&chunk);
}

//! first-touch (reference 001): the cost of the first touch of each page, lazily, after
//! `mlock`, and with `MAP_POPULATE`, then steady-state reads every 64 bytes.

use std::{hint::black_box, time::Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use super::{Faults, PAGE_SIZE, Region, args::ScenarioArgs};

pub fn run(variant: &str, args: &ScenarioArgs) -> Result<Value> {
    let pages = args.touch_mib * 256;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let mut runs = Vec::new();
    for _ in 0..args.runs {
        let faults_before_call = Faults::process();
        let t = Instant::now();
        let region = match variant {
            "lazy" | "mlock" => Region::anonymous(pages, rw, 0)?,
            "populate" => Region::anonymous(pages, rw, libc::MAP_POPULATE)?,
            other => bail!("unknown first-touch variant {other}"),
        };
        if variant == "mlock" {
            // SAFETY: mlock changes no memory contents, only residency.
            if unsafe { libc::mlock(region.addr.cast(), region.len) } != 0 {
                bail!(
                    "mlock of {} MiB: {}",
                    args.touch_mib,
                    std::io::Error::last_os_error()
                );
            }
        }
        let call_ns = t.elapsed().as_nanos() as u64;
        let call_faults = Faults::process().since(faults_before_call);

        let before_touch = Faults::process();
        let t = Instant::now();
        for page in 0..pages {
            // SAFETY: `page` asserts the byte is inside the region, mapped writable above.
            unsafe { region.page(page).write_volatile(1) };
        }
        let touch_ns = t.elapsed().as_nanos() as u64;
        let touch_faults = Faults::process().since(before_touch);

        // The mlock run also reads an unlocked region of the same size, touched the same
        // way, pass for pass in turn with the locked one: a read costs 0.7 to 2.5 ns/line
        // here from one process to the next, so "the same with or without mlock" is measured
        // within one process, the fastest pass of each.
        let unlocked = match variant {
            "mlock" => {
                let other = Region::anonymous(pages, rw, 0)?;
                for page in 0..pages {
                    // SAFETY: as above, `other` is mapped writable.
                    unsafe { other.page(page).write_volatile(1) };
                }
                Some(other)
            }
            _ => None,
        };
        let (mut steady, mut steady_unlocked) = (f64::MAX, f64::MAX);
        for _ in 0..8 {
            steady = steady.min(read_pass(&region));
            if let Some(other) = &unlocked {
                steady_unlocked = steady_unlocked.min(read_pass(other));
            }
        }
        let mut run = json!({
            "call_ns": call_ns,
            "call_ns_per_page": call_ns as f64 / pages as f64,
            "call_faults": call_faults,
            "touch_ns_per_page": touch_ns as f64 / pages as f64,
            "touch_faults": touch_faults,
            "steady_ns_per_line": steady,
        });
        if unlocked.is_some() {
            run["steady_unlocked_ns_per_line"] = json!(steady_unlocked);
        }
        runs.push(run);
    }
    let median = |key: &str| super::median(runs.iter().map(|r| r[key].as_f64().unwrap_or(0.0)));
    let mut result = json!({
        "pages": pages,
        "page_size": PAGE_SIZE,
        "runs": runs,
        "call_ns_per_page": median("call_ns_per_page"),
        "touch_ns_per_page": median("touch_ns_per_page"),
        "steady_ns_per_line": median("steady_ns_per_line"),
        "touch_faults_per_run": runs[0]["touch_faults"]["minflt"],
        "call_faults_per_run": runs[0]["call_faults"]["minflt"],
    });
    if variant == "mlock" {
        result["steady_unlocked_ns_per_line"] = json!(median("steady_unlocked_ns_per_line"));
    }
    Ok(result)
}

/// Reads every 64th byte of `region` once: ns per line read.
fn read_pass(region: &Region) -> f64 {
    let lines = region.len / 64;
    let t = Instant::now();
    let mut sum = 0u64;
    for line in 0..lines {
        // SAFETY: `line * 64 < region.len`: inside the region, mapped readable.
        sum += u64::from(unsafe { region.addr.add(line * 64).read_volatile() });
    }
    black_box(sum);
    t.elapsed().as_nanos() as f64 / lines as f64
}

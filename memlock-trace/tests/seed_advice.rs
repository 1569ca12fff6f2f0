//! Runs on: host only: advise --apply runs each seed again with the preload library, which the
//! guest's initramfs does not carry (the seeds themselves: test:suite, in a guest too)
//!
//! `cargo xtask run`'s advice section: `advise --apply` on the seed scenarios, its verdicts
//! checked against the references and the workload's own counts.
#![cfg(feature = "lab")]

mod common;
mod support;

use std::process::Command;

use common::require_privileges;
use serde_json::Value;
use support::{BIN, suite_report};

/// The seeds, answered: `advise --apply` on first-touch's lazy run must name the region and
/// move its first-touch faults out of the timed loop; on malloc-vs-mmap's malloc run name
/// malloc's block and move its faults out of the timed writes into `malloc` (where
/// `MAP_LOCKED` pays them in `mmap`), though glibc maps the block itself; on thread-stack's
/// threads (too short-lived for /proc to show their stacks) warn against `MCL_FUTURE` and
/// pin no stack; and on dynamic-alloc's churn say locking cannot help, set glibc's
/// tunables, and cut the refaults, all as the workload counts them itself.
#[test]
fn the_advice_agrees_with_the_references_on_every_seed() {
    require_privileges();
    let out_dir = std::env::temp_dir().join(format!("memlock-trace-advice-{}", std::process::id()));
    let report = suite_report(
        Command::new(BIN)
            .args(["suite", "--tiny", "--scenario", "first-touch"])
            .args(["--scenario", "malloc-vs-mmap", "--scenario", "thread-stack"])
            .args(["--scenario", "dynamic-alloc", "--out"])
            .arg(&out_dir),
        &out_dir,
    );
    let advice = report["advice"].as_array().unwrap();
    let names: Vec<&str> = advice
        .iter()
        .map(|a| a["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "first-touch",
            "malloc-vs-mmap",
            "thread-stack",
            "dynamic-alloc"
        ]
    );
    for a in advice {
        let name = a["scenario"].as_str().unwrap();
        assert!(a["error"].is_null(), "{name}: {}", a["error"]);
        let verdicts = a["verdicts"].as_array().unwrap();
        assert_eq!(verdicts.len(), 2, "{name}: {verdicts:?}");
        for v in verdicts {
            assert_eq!(v["verdict"], "agrees", "{name}: {v}");
        }
        // Both runs' own measurements are there, and the figures say what the verdict says.
        let (before, after) = (&a["workload"][0], &a["workload"][1]);
        match name {
            "first-touch" => {
                let pages = before["pages"].as_u64().unwrap();
                assert!(before["touch_faults_per_run"].as_u64().unwrap() >= pages);
                assert!(after["touch_faults_per_run"].as_u64().unwrap() <= pages / 10);
                // The faults moved into the mmap call (the preload library's mlock2).
                assert!(after["call_faults_per_run"].as_u64().unwrap() >= pages);
            }
            "malloc-vs-mmap" => {
                let pages = before["bytes"].as_u64().unwrap() / 4096;
                let faults = |run: &Value, key: &str| run[key].as_f64().unwrap() as u64;
                assert!(faults(before, "write_faults") >= pages * 9 / 10, "{before}");
                assert!(faults(after, "write_faults") <= pages / 100, "{after}");
                // Populated by the preload library as malloc returned the block.
                assert!(faults(after, "alloc_faults") >= pages, "{after}");
            }
            "thread-stack" => {
                // No stack is advised for locking, so normally nothing is applied and the
                // command runs once; a second run must not fault more per thread nor lock.
                assert_eq!(before["locked_kib"], 0, "{before}");
                if !after.is_null() {
                    let per_thread = |run: &Value| run["faults_per_thread"].as_f64().unwrap();
                    assert!(
                        per_thread(after) <= per_thread(before) * 1.1,
                        "{before} {after}"
                    );
                    assert_eq!(after["locked_kib"], 0, "no stack locked: {after}");
                }
            }
            _ => {
                let (pages, rounds) = (
                    before["pages"].as_u64().unwrap(),
                    before["rounds"].as_u64().unwrap(),
                );
                assert!(before["faults"]["minflt"].as_u64().unwrap() >= pages * rounds);
                // Kept by the allocator after its first round.
                assert!(after["faults"]["minflt"].as_u64().unwrap() < pages * 2);
            }
        }
    }
    assert!(
        std::fs::read_to_string(out_dir.join("report.md"))
            .unwrap()
            .contains("## Advice, checked against the references")
    );
    std::fs::remove_dir_all(&out_dir).ok();
}

//! Runs on: host only: runs the command a second time with the preload library, which the
//! guest's initramfs does not carry (the fault figures advise reads: test:intervals and
//! test:faults, in the guests too)
//!
//! Packages: python3
//!
//! What advise's words claim, checked against what the program did and what the kernel
//! counted for it (issue 47 point 9). tests/third_party/lazy_table.py maps a 64 MiB table
//! and, after a pause, writes one byte per page: 16,384 pages, each faulting once.
//!
//! - Locking the table does not make its 16,384 faults go: the kernel takes them inside the
//!   lock call instead (the process's own /proc/PID/stat count stays), so the advice says it
//!   moves them, and --apply's verdict says where they went, not "saves".
//! - Memory that faulted only during start-up was called "touched once": a page faults when
//!   first touched, not each time it is used; the advice says it faulted once.

#[path = "support/advice.rs"]
mod advice;
mod common;
mod support;

use std::process::Command;

use common::require_privileges;
use memlock_trace::advise::units::count;
use serde_json::Value;
use support::{BIN, PYTHON, advise_json, require_preload, require_python, scratch_dir, succeeded};

const LAZY_TABLE: &str = include_str!("third_party/lazy_table.py");
const TABLE_BYTES: u64 = 64 << 20;
const PAGES: u64 = TABLE_BYTES / 4096;

/// lazy_table.py's arguments in a scratch directory of its own.
fn lazy_table(name: &str) -> [String; 3] {
    require_python();
    let dir = scratch_dir(&format!("advise-wording-{name}"), 0o700);
    let script = dir.join("lazy_table.py");
    std::fs::write(&script, LAZY_TABLE).unwrap();
    let report = dir.join("report.json");
    [
        script.display().to_string(),
        report.display().to_string(),
        TABLE_BYTES.to_string(),
    ]
}

/// The figures of a side-by-side row of --apply's text: before and after.
fn row(text: &str, label: &str) -> (u64, u64) {
    let line = text
        .lines()
        .find(|l| {
            l.strip_prefix(label)
                .is_some_and(|rest| rest.starts_with("  "))
        })
        .unwrap_or_else(|| panic!("no row {label:?} in:\n{text}"));
    let n: Vec<u64> = line[label.len()..]
        .split_whitespace()
        .map(|w| w.replace(',', "").parse().unwrap())
        .collect();
    (n[0], n[1])
}

#[test]
fn locking_moves_the_faults_and_says_so() {
    require_privileges();
    require_preload();
    let [script, report, size] = lazy_table("moves");
    let out = Command::new(BIN)
        .args(["advise", "--apply", "--", PYTHON, &script, &report, &size])
        .output()
        .unwrap();
    let text = succeeded("advise --apply", &out);
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(!flat.contains("saves "), "{text}");
    // The table's faults after start-up, as its row in the comparison gives them.
    let table = text
        .lines()
        .find(|l| l.starts_with("/dev/zero (deleted)") && l.contains(" ms) "))
        .unwrap_or_else(|| panic!("no table row in:\n{text}"));
    let faults = table.split_whitespace().nth(4).unwrap();
    assert_eq!(faults, count(PAGES), "{table}");
    let advice = format!(
        "moves {faults} faults after start-up and their {}",
        table.split(['(', ')']).nth(3).unwrap()
    );
    assert!(
        flat.contains(&format!(
            "{advice} of fault time into the mlock or mmap call that populates its pages; keeps \
             64 MiB resident ("
        )),
        "{advice}\nnot in:\n{text}"
    );
    // The kernel populated each of the table's pages inside the lock call, once.
    let (startup_before, startup_after) = row(&text, "faults during start-up");
    let (after_before, after_after) = row(&text, "faults after start-up");
    let said = format!(
        "{} more faults were taken up front, inside mmap, mlock2 or madvise (one per page, or \
         per huge page), ",
        count(PAGES)
    );
    assert!(flat.contains(&said), "{said}\nnot in:\n{text}");
    assert!(
        flat.contains(&format!(
            "the cost moved there, it did not go (faults during start-up {} -> {}; faults after \
             start-up {} -> {})",
            count(startup_before),
            count(startup_after),
            count(after_before),
            count(after_after)
        )),
        "{text}"
    );
    // The process's own count (every fault, those inside the call too) stays: within the
    // interpreter's own variation, far less than the table's pages.
    let (own_before, own_after) = row(&text, "faults the process counted (/proc/PID/stat)");
    assert!(
        own_before.abs_diff(own_after) * 20 < PAGES && own_after > PAGES,
        "/proc/PID/stat: {own_before} -> {own_after}\n{text}"
    );
}

#[test]
fn memory_that_faulted_only_at_start_up_is_said_to_have_faulted_not_touched_once() {
    require_privileges();
    let [script, report, size] = lazy_table("once");
    // The whole run is start-up: the table faults in it alone.
    let report: Value = advise_json(&["--startup", "60"], &[PYTHON, &script, &report, &size]);
    let table = report["process"]["mappings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mapping"] == "/dev/zero (deleted)")
        .unwrap_or_else(|| panic!("no table in: {report}"));
    assert_eq!(table["faults_startup"], PAGES, "{table}");
    assert_eq!(table["faults_after"], 0, "{table}");
    let once = advice::of_kind(&report, "faulted-once");
    let what = once["what"].as_str().unwrap();
    assert!(
        what.contains("/dev/zero (deleted)") && what.ends_with(" faulted only during start-up"),
        "{once}"
    );
    let how = once["how"].as_str().unwrap();
    assert!(
        how.starts_with("do not lock them: their pages faulted in during start-up and never faulted again (a page faults when it is first touched, not each time it is used")
            && !how.contains("touched once"),
        "{once}"
    );
}

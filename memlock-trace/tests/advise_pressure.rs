//! Runs on: host only: advise --apply runs python3 again with the preload library, which the
//! guest's initramfs does not carry, in the pressured cgroup (the swap and cgroup figures behind
//! it: test:memory_pressure and test:verify, in the guests too)
//!
//! Packages: python3
//!
//! Issue 44, item 4: `advise` under memory pressure. python3 (tests/third_party/
//! pressure_table.py) maps a 16 MiB hot table and a 112 MiB buffer it streams through, in a
//! 96 MiB memory cgroup with swap (`memlock_trace::lab::pressure`); each pass over the buffer
//! pushes the table out, and each read of the table takes it back from swap. Those major
//! faults are swap-ins, which locking removes: advise must say so on the table, with its
//! swapped bytes and the measured major-fault time, weigh locking it against the cgroup's
//! limit (what it leaves for the rest, and the OOM risk), and must not file them under
//! "locking cannot help" with a file's first read. `--apply`, run again in the same cgroup
//! with the table locked by the preload library, takes the table's swap-ins away.
//!
//! Only the program is in the cgroup: its shell moves itself in before it execs python3.
//! advise and its tracer stay outside (the tracer's BPF maps would be charged to the
//! cgroup of the process that made them).
#![cfg(feature = "lab")]

#[path = "support/advice.rs"]
mod advice;
mod common;
mod support;

use common::require_privileges;
use memlock_trace::lab::pressure::Pressure;
use serde_json::Value;
use support::{PYTHON, advise_apply, require_preload, require_python, scratch_program};

const PROGRAM: &str = include_str!("third_party/pressure_table.py");
const MIB: u64 = 1 << 20;
const LIMIT: u64 = 96 * MIB;
const HOT: u64 = 16 * MIB;
const STREAM: u64 = 112 * MIB;
const ROUNDS: u32 = 3;
const PAGE: u64 = 4096;

fn on_the_table(report: &Value) -> Vec<&Value> {
    advice::on_dev_zero(report)
        .filter(|a| a["end"].as_u64().unwrap() - a["start"].as_u64().unwrap() == HOT)
        .collect()
}

#[test]
fn a_table_swapped_out_under_pressure_is_advised_locked_and_weighed_against_the_cgroup() {
    require_privileges();
    require_python();
    require_preload();
    let (dir, script) = scratch_program("advise-pressure", "pressure_table.py", PROGRAM);
    let own = dir.join("report.json");
    let pressure = Pressure::set_up(LIMIT, 512 * MIB).expect("swap and a memory cgroup");
    let shell = format!(
        "echo 0 > {} && exec {PYTHON} {} {} {HOT} {STREAM} {ROUNDS} 0.3",
        pressure.cgroup.procs_file().display(),
        script.display(),
        own.display()
    );
    let report = advise_apply(&["sh", "-c", &shell]);
    drop(pressure);
    let runs: Vec<Value> = std::fs::read_to_string(&own)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(runs.len(), 2, "the program's own reports: {runs:?}");
    // The pressure reached the table: its reads took it back from swap.
    let pages = HOT / PAGE;
    assert!(
        runs[0]["hot_majflt"].as_u64().unwrap() >= pages,
        "the table was not pushed out: {}",
        runs[0]
    );

    for a in report["advice"].as_array().unwrap() {
        eprintln!(
            "advice {} {} {}: {}\n    {}",
            a["verdict"], a["kind"], a["mapping"], a["what"], a["how"]
        );
    }
    eprintln!("program: {runs:?}");
    let process = &report["process"];
    assert!(
        process["swap_max_bytes"].as_u64().unwrap() > 0,
        "VmSwap never seen: {process}"
    );
    let advice = on_the_table(&report);
    let lock = advice::find(&advice, &report, "swap-in", |a| a["kind"] == "swap-ins");
    assert_eq!(lock["verdict"], "do", "{lock}");
    assert_eq!(lock["pinned_bytes"], HOT, "{lock}");
    let what = lock["what"].as_str().unwrap();
    let table = process["mappings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["start"] == lock["start"])
        .unwrap();
    let swapped = table["swap_bytes"].as_u64().unwrap();
    assert!(swapped > 0, "{table}");
    assert!(
        what.contains("in swap") && what.contains("swap-ins") && what.contains("major fault"),
        "{what}"
    );
    let how = lock["how"].as_str().unwrap();
    // Weighed against the cgroup: what it leaves, and the rest of the working set.
    assert!(
        how.contains("leaves") && how.contains("96 MiB") && how.contains("the rest"),
        "{how}"
    );
    assert_eq!(
        lock["apply"]["preload"],
        format!("lock:anon:{HOT}"),
        "{lock}"
    );
    // Nothing says the table's faults are a file's first reads.
    for a in report["advice"].as_array().unwrap() {
        if a["kind"] == "major-faults" {
            let what = a["what"].as_str().unwrap();
            assert!(!what.contains("or from swap"), "{what}");
        }
    }
    // The buffer would not fit: locking it is refused with the cgroup's figures.
    let buffer = report["advice"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| {
            a["end"]
                .as_u64()
                .zip(a["start"].as_u64())
                .map(|(e, s)| e - s)
                == Some(STREAM)
        })
        .unwrap_or_else(|| panic!("no advice on the buffer: {}", report["advice"]));
    assert_eq!(buffer["verdict"], "do-not", "{buffer}");

    // --apply: the table locked in the second run, under the same pressure.
    assert_eq!(runs[1]["cold_refused"], ROUNDS, "not locked: {}", runs[1]);
    // Its reads' majors are the interpreter's own pages now, fewer than the unlocked run's
    // (the table's and the interpreter's); how many varies with what the locked table leaves
    // it (CI once saw 1,424). The table's own faults are its mapping row's, below.
    assert!(
        runs[1]["hot_majflt"].as_u64().unwrap() < runs[0]["hot_majflt"].as_u64().unwrap(),
        "locking the table took no major fault away: {runs:?}"
    );
    let apply = &report["apply"];
    let row = apply["mappings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["size_bytes"] == HOT)
        .unwrap_or_else(|| panic!("no table row: {apply}"));
    // Unlocked, each round took the table back from swap (`before`: a fault per page per
    // round). Locked, a page faults once at most: none when mlock populated it, one first
    // touch where the population, short of room in the cgroup, left it to the program (CI
    // once saw all 4,096 so).
    let after = row["after"][0].as_u64().unwrap_or(0);
    assert!(after <= pages, "{row}");
}

//! Runs on: host only: the memory cgroup's limits and usage are files advise reads in user space,
//! the same on every kernel (the per-interval fault figures advise weighs: test:intervals and
//! test:faults, in the guests too)
//!
//! Packages: python3
//!
//! `advise` in a memory cgroup: python3 maps a 256 MiB table and touches one page in four
//! (64 MiB) inside a real memory cgroup the test makes, nested two deep
//! (`/memlock-trace-test-advise-PID/inner`). Locking the table would charge the 192 MiB not
//! yet resident; the host has gigabytes available, the cgroup far less. With the outer
//! cgroup's limit at 160 MiB the advice must refuse to lock or populate it and name that
//! limit (the lowest room wins, though the inner limit is the higher one); with the outer
//! limit raised, it locks and names what it charges against the inner limit.
//!
//! The memory controller is v1's where it is mounted (hybrid hosts, this one), else the
//! unified hierarchy's (where the root offers `memory`); a host with neither fails loudly.

#[path = "support/advice.rs"]
mod advice;
mod common;
mod support;

use std::path::{Path, PathBuf};

use common::require_privileges;
use serde_json::Value;
use support::{
    PYTHON, advise_json,
    memory_cgroup::{self, Controller},
    require_python, scratch_dir,
};

const LAZY_TABLE: &str = include_str!("third_party/lazy_table.py");
const MIB: u64 = 1 << 20;
const TABLE_BYTES: u64 = 256 * MIB;
/// One page in four is touched: 64 MiB resident of 256.
const STRIDE: u64 = 4;
const PAGE: u64 = 4096;
/// Seconds the program holds its table after touching it: advise samples every 50 ms, and a
/// program that exits at once can leave before a loaded machine's sampler sees it at its
/// fullest (CI: 61 of 64 MiB seen).
const HOLD_S: f64 = 0.5;

/// `/memlock-trace-test-advise-PID/inner`, made for the test and removed on drop.
struct Nested {
    memory: Controller,
    outer: PathBuf,
    inner: PathBuf,
}

impl Nested {
    fn new() -> Self {
        let memory = Controller::find();
        let outer = memory.make(
            &memory.point,
            &format!("memlock-trace-test-advise-{}", std::process::id()),
        );
        let inner = memory.make(&outer, "inner");
        Self {
            memory,
            outer,
            inner,
        }
    }

    fn limit(&self, dir: &Path, bytes: u64) {
        self.memory.limit(dir, bytes);
    }

    /// A path as `/proc/PID/cgroup` shows it (the hierarchy's root mounted, root namespace).
    fn shown(&self, dir: &Path) -> String {
        format!(
            "/{}",
            dir.strip_prefix(&self.memory.point).unwrap().display()
        )
    }

    fn peak(&self) -> u64 {
        let file = self.inner.join(self.memory.peak_file());
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        text.trim().parse().unwrap()
    }
}

impl Drop for Nested {
    fn drop(&mut self) {
        memory_cgroup::remove(&self.inner);
        memory_cgroup::remove(&self.outer);
    }
}

/// `advise --json` on the table program moved into `cgroup` by its shell before it execs;
/// the report, and the program's own account of its timed phase.
fn advise_in(cgroup: &Nested, dir: &Path) -> (Value, Value) {
    let script = dir.join("lazy_table.py");
    std::fs::write(&script, LAZY_TABLE).unwrap();
    let own = dir.join("report.json");
    let _ = std::fs::remove_file(&own);
    let shell = format!(
        "echo $$ > {}/cgroup.procs && exec {PYTHON} {} {} {TABLE_BYTES} {STRIDE} {HOLD_S}",
        cgroup.inner.display(),
        script.display(),
        own.display()
    );
    let report = advise_json(&[], &["sh", "-c", &shell]);
    let own: Value = serde_json::from_str(std::fs::read_to_string(&own).unwrap().trim()).unwrap();
    (report, own)
}

fn table_advice(report: &Value) -> Vec<&Value> {
    advice::on_dev_zero(report).collect()
}

#[test]
fn a_table_the_cgroup_has_no_room_for_is_not_locked_and_the_lowest_limit_is_named() {
    require_privileges();
    require_python();
    let dir = scratch_dir("advise-cg", 0o755);
    let cgroup = Nested::new();
    let limit_file = cgroup.memory.limit_file();
    // The inner limit is the higher; the outer one leaves the least room.
    cgroup.limit(&cgroup.inner, 1 << 30);
    cgroup.limit(&cgroup.outer, 160 * MIB);
    let (report, own) = advise_in(&cgroup, &dir);
    let touched = TABLE_BYTES / PAGE / STRIDE;
    assert_eq!(own["touched"], touched, "{own}");
    assert!(own["timed_minflt"].as_u64().unwrap() >= touched, "{own}");
    let cg = &report["process"]["memory_cgroup"];
    assert_eq!(
        cg["version"],
        if cgroup.memory.v1 { "v1" } else { "v2" },
        "{cg}"
    );
    assert_eq!(cg["path"], cgroup.shown(&cgroup.inner), "{cg}");
    let limits = cg["limits"].as_array().unwrap();
    let found: Vec<(&str, &str, u64)> = limits
        .iter()
        .map(|l| {
            (
                l["path"].as_str().unwrap(),
                l["file"].as_str().unwrap(),
                l["limit_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    let (inner, outer) = (cgroup.shown(&cgroup.inner), cgroup.shown(&cgroup.outer));
    assert_eq!(
        found,
        [
            (inner.as_str(), limit_file, 1 << 30),
            (outer.as_str(), limit_file, 160 * MIB)
        ],
        "{cg}"
    );
    // The usage advise saw at the fullest: the table's touched part at least, and no more
    // than the kernel's own peak for the cgroup.
    let used = limits[0]["usage_bytes"].as_u64().unwrap();
    let peak = cgroup.peak();
    assert!(
        used >= touched * PAGE && used <= peak,
        "advise saw {used} bytes charged; touched {}, the kernel's peak {peak}",
        touched * PAGE
    );
    let advice = table_advice(&report);
    assert!(
        !advice.iter().any(|a| a["verdict"] == "do"),
        "the table must not be ranked: {advice:?}"
    );
    let refused = advice::find(&advice, &report, "over-cgroup", |a| {
        a["kind"] == "over-cgroup"
    });
    assert_eq!(refused["verdict"], "do-not");
    let how = refused["how"].as_str().unwrap();
    assert!(
        how.contains(&format!(
            "more to the memory cgroup {inner}, past {outer}'s {limit_file} 160 MiB"
        )),
        "{how}"
    );

    // Room enough above: the table is locked, and the lowest room now is the inner cgroup's.
    cgroup.limit(&cgroup.outer, 4 << 30);
    let (report, _) = advise_in(&cgroup, &dir);
    let advice = table_advice(&report);
    let lock = advice::find(&advice, &report, "ranked", |a| a["verdict"] == "do");
    assert_eq!(lock["kind"], "lock", "{lock}");
    let how = lock["how"].as_str().unwrap();
    assert!(
        how.contains(&format!(
            "more to the memory cgroup {inner}, within its {limit_file} 1 GiB"
        )),
        "{how}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

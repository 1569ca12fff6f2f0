//! `memlock-trace verify`: runs mlock scenarios in child processes under the tracer and checks
//! each step three ways: what the step should do, what the tracer saw, and what the kernel
//! says in /proc/PID/maps and /proc/PID/smaps (`Locked:`, `VmFlags` `lo`/`lf`).
//!
//! Each scenario is a forked child (the "subject") working on regions fenced by PROT_NONE
//! guard pages, so that no step's VMAs can merge with unrelated anonymous mappings. At each
//! checkpoint the subject makes a deliberately invalid `mlock2` (unknown flag: EINVAL, no
//! effect) over the region, whose entry snapshot is the tracer's view of the region's VMAs,
//! then reports the checkpoint over a pipe and waits while the parent drains the ring buffer
//! and reads /proc.
//!
//! Here: the report's types and [`run`]. `runner` forks each scenario and feeds the tracer's
//! records to `checks`, which compares the three views (`proc_view` reads the kernel's);
//! `table` puts them in words; `subject` is the child's side of the pipe and `scenarios` the
//! steps it takes.

mod checks;
mod pressure;
mod proc_view;
mod runner;
mod scenarios;
mod subject;
mod table;

use std::path::Path;

use anyhow::{Context as _, Result};
use memlock_trace_common::vma::{VM_LOCKED, VM_LOCKONFAULT, VmaRange};
use serde::{Deserialize, Serialize};

pub use self::table::{layout_str, table};
use self::{runner::Runner, scenarios::SCENARIOS};
use crate::{
    object::{HookFamily as _, HookLine},
    probe,
    process::Targets,
    tracer::{Options, Tracer},
    vma::{VmaHooks, flags_str},
};

/// The invalid `mlock2` flag of the probe call: the kernel rejects it before touching anything.
const PROBE_FLAG: u64 = 0x4000_0000;

/// One VMA of a region, as expected, traced or reported by /proc.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    pub start: u64,
    pub end: u64,
    /// `rw-p`, as in /proc/PID/maps.
    pub perms: String,
    /// VM_LOCKED (`lo`).
    pub locked: bool,
    /// VM_LOCKONFAULT (`lf`).
    pub onfault: bool,
}

impl Piece {
    fn from_range(v: &VmaRange) -> Self {
        Self {
            start: v.start,
            end: v.end,
            perms: flags_str(v.flags)[..4].to_string(),
            locked: v.flags & VM_LOCKED != 0,
            onfault: v.flags & VM_LOCKONFAULT != 0,
        }
    }
}

/// What the step's own calls (not the probe) should amount to, per the tracer; `None` means
/// "not checked" (e.g. `munlockall` touches VMAs outside the region too).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpectCalls {
    pub count: Option<u32>,
    pub splits: Option<u32>,
    pub merges: Option<u32>,
    /// Pages that gained (+) or lost (-) VM_LOCKED, and VM_LOCKONFAULT.
    pub locked_pages: Option<i64>,
    pub onfault_pages: Option<i64>,
    /// `mm->map_count` change over the calls.
    pub map_count: Option<i64>,
    /// `mm->locked_vm` change over the calls, and its value after the last one (pages).
    pub locked_vm: Option<i64>,
    pub locked_vm_after: Option<u64>,
    /// Pages the kernel faulted in during the calls.
    pub populated: Option<u64>,
}

/// A checkpoint as the subject reports it: where to look and what should be there.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Checkpoint {
    pub step: String,
    /// What the step did, in words.
    pub action: String,
    /// Whose view: /proc/PID/task/TID/smaps, and the thread that makes the probe call.
    pub pid: u32,
    pub tid: u32,
    /// The region `[start, end)`.
    pub window: (u64, u64),
    pub layout: Vec<Piece>,
    /// smaps `Locked:` and `Rss:` over the region.
    pub locked_kb: u64,
    pub rss_kb: Option<u64>,
    /// smaps `AnonHugePages:` over the region: resident in transparent huge pages.
    pub thp_kb: Option<u64>,
    pub calls: Option<ExpectCalls>,
    /// `mm->locked_vm` (pages) when the probe call enters.
    pub locked_vm: Option<u64>,
    /// Whether a VMA covering the region must (true) or must not (false) have been stored
    /// already VM_LOCKED by an `mmap` (mlockall(MCL_FUTURE)).
    pub born_locked: Option<bool>,
    /// Under memory pressure: what smaps `Swap:` and the memory cgroup must show.
    pub pressure: Option<PressureExpect>,
}

/// What a region under memory pressure must show, each as inclusive bounds in kB (`(0, 0)`:
/// none; `(4, size)`: some).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PressureExpect {
    /// smaps `Swap:` over the region.
    pub swap_kb: (u64, u64),
    /// The subject's memory cgroup directory, and its `memory.stat` `unevictable`.
    pub cgroup: std::path::PathBuf,
    pub unevictable_kb: (u64, u64),
}

/// Subject to parent.
#[derive(Debug, Serialize, Deserialize)]
enum Message {
    /// Start tracing this process (a child the subject forked) before it goes on.
    Trace {
        pid: u32,
    },
    Check(Box<Checkpoint>),
    Failed {
        step: String,
        error: String,
    },
}

/// One row of the report.
#[derive(Clone, Debug, Serialize)]
pub struct StepResult {
    pub step: String,
    pub action: String,
    pub pid: u32,
    pub tid: u32,
    pub expected: String,
    pub traced: String,
    pub proc: String,
    pub ok: bool,
    pub mismatches: Vec<String>,
    /// `ma_write` stores during the step's calls.
    pub stores: usize,
    /// Hooked kernel functions entered during the step's calls, in order (fentry kernels).
    pub functions: Vec<String>,
    pub expected_layout: Vec<Piece>,
    pub traced_layout: Vec<Piece>,
    pub proc_layout: Vec<Piece>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub kernel: String,
    pub hooks: String,
    /// Whether this kernel's smaps shows VM_LOCKONFAULT as `lf` (added in 6.2).
    pub smaps_shows_lf: bool,
    pub steps: Vec<StepResult>,
    pub passed: usize,
    pub failed: usize,
}

/// Runs the suite; returns the exit code (0: every step agrees, 1: a mismatch).
pub fn run(json: bool, output: Option<&Path>) -> Result<i32> {
    probe::check_privileges().context("verify needs to load eBPF programs")?;
    // Before the scenarios run, so a bad path costs nothing.
    let mut out = crate::output::Sink::open(output)?;
    // Locking 16 pages at a time needs RLIMIT_MEMLOCK >= 64 KiB or CAP_IPC_LOCK: root has it.
    let report = run_suite()?;
    let rendered = if json {
        let mut value = serde_json::to_value(&report)?;
        value["schema"] = crate::output::JSON_SCHEMA.into();
        value["time_ns"] = crate::output::WallClock::now_ns().into();
        format!("{value}\n")
    } else {
        table(&report)
    };
    out.write_result(rendered.as_bytes())?;
    Ok(if report.failed == 0 { 0 } else { 1 })
}

/// Loads the tracer, runs every scenario and returns the report (also used by the tests).
pub fn run_suite() -> Result<Report> {
    let tracer = Tracer::load_with(
        &Targets::Tgids(Vec::new()),
        &Options {
            require_vma: true,
            ..Options::default()
        },
    )?;
    let hooks = tracer
        .hooks
        .get(VmaHooks::NAME)
        .map(HookLine::full)
        .unwrap_or_default();
    let kernel = probe::kernel_release();
    let shows_lf = crate::procfs::smaps_shows_lockonfault(&kernel);
    let mut runner = Runner::new(tracer, shows_lf)?;
    for (name, scenario) in SCENARIOS {
        runner.scenario(name, *scenario)?;
    }
    // Last, inside the swap and memory cgroup it needs for as long as it runs.
    let environment = pressure::Environment::set_up()?;
    runner.scenario(pressure::NAME, pressure::scenario)?;
    drop(environment);
    let steps = runner.results;
    let failed = steps.iter().filter(|r| !r.ok).count();
    Ok(Report {
        kind: "verify",
        kernel,
        hooks,
        smaps_shows_lf: shows_lf,
        passed: steps.len() - failed,
        failed,
        steps,
    })
}

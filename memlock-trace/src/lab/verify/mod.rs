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

use std::{
    collections::HashMap,
    fmt::Write as _,
    fs::File,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::fd::OwnedFd,
    path::Path,
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::maps::{MapData, RingBuf};
use memlock_trace_common::vma::{VM_LOCKED, VM_LOCKONFAULT, VmaRange, phase};
use nix::{
    fcntl::OFlag,
    sys::wait::{WaitStatus, waitpid},
    unistd::{ForkResult, fork, pipe2},
};
use serde::{Deserialize, Serialize};

use crate::{
    event::{Event, MCL_FUTURE, MLOCK_ONFAULT, Syscall, decode},
    lab::workload::Region,
    probe,
    process::Targets,
    procfs::{PAGE_SIZE, read_smaps},
    tracer::{Options, Tracer},
    vma::{Activity, ChangeCounts, Tracker, VmaCall, VmaHooks, flags_str},
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
    pub calls: Option<ExpectCalls>,
    /// `mm->locked_vm` (pages) when the probe call enters.
    pub locked_vm: Option<u64>,
    /// Whether a VMA covering the region must (true) or must not (false) have been stored
    /// already VM_LOCKED by an `mmap` (mlockall(MCL_FUTURE)).
    pub born_locked: Option<bool>,
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
pub fn run(json: Option<&Path>) -> Result<i32> {
    probe::check_privileges().context("verify needs to load eBPF programs")?;
    // Locking 16 pages at a time needs RLIMIT_MEMLOCK >= 64 KiB or CAP_IPC_LOCK: root has it.
    let report = run_suite()?;
    print!("{}", table(&report));
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    Ok(if report.failed == 0 { 0 } else { 1 })
}

/// Loads the tracer, runs every scenario and returns the report (also used by the tests).
pub fn run_suite() -> Result<Report> {
    let mut tracer = Tracer::load_with(
        &Targets::Tgids(Vec::new()),
        &Options {
            require_vma: true,
            ..Options::default()
        },
    )?;
    let ring = tracer.take_events()?;
    let hooks = tracer.hooks.get("vma").cloned().unwrap_or_default();
    let kernel = probe::kernel_release();
    let mut runner = Runner {
        tracer,
        ring,
        tracker: Tracker::default(),
        activity: HashMap::new(),
        shows_lf: crate::procfs::smaps_shows_lockonfault(&kernel),
        results: Vec::new(),
    };
    for (name, scenario) in SCENARIOS {
        runner.scenario(name, *scenario)?;
    }
    let failed = runner.results.iter().filter(|r| !r.ok).count();
    Ok(Report {
        kind: "verify",
        kernel,
        hooks,
        smaps_shows_lf: runner.shows_lf,
        passed: runner.results.len() - failed,
        failed,
        steps: runner.results,
    })
}

struct Runner {
    tracer: Tracer,
    ring: RingBuf<MapData>,
    tracker: Tracker,
    /// Per traced process, what the tracker completed since its last checkpoint.
    activity: HashMap<u32, Vec<Activity>>,
    shows_lf: bool,
    results: Vec<StepResult>,
}

type Scenario = fn(&mut Subject) -> Result<()>;

impl Runner {
    fn scenario(&mut self, name: &str, scenario: Scenario) -> Result<()> {
        let (msg_r, msg_w) = pipe2(OFlag::O_CLOEXEC).context("pipe")?;
        let (ack_r, ack_w) = pipe2(OFlag::O_CLOEXEC).context("pipe")?;
        // SAFETY: this process is single-threaded (verify runs no runtime), so the child may
        // allocate and run ordinary Rust code.
        match unsafe { fork() }.context("fork")? {
            ForkResult::Child => {
                drop(msg_r);
                drop(ack_w);
                let code = subject_main(name, scenario, msg_w, ack_r);
                // Skip the parent's destructors (the tracer's fds belong to the parent).
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => {
                drop(msg_w);
                drop(ack_r);
                let pid = child.as_raw() as u32;
                let result = self.talk(name, pid, msg_r, ack_w);
                let status = waitpid(child, None).context("waitpid")?;
                result?;
                if !matches!(status, WaitStatus::Exited(_, 0)) {
                    self.failed(
                        name,
                        pid,
                        format!("the scenario's process ended with {status:?}"),
                    );
                }
                Ok(())
            }
        }
    }

    fn talk(&mut self, name: &str, pid: u32, msg: OwnedFd, ack: OwnedFd) -> Result<()> {
        let mut ack = File::from(ack);
        self.tracer.add_target(pid)?;
        // The subject starts only once it is traced.
        ack.write_all(&[1]).context("starting the scenario")?;
        for line in BufReader::new(File::from(msg)).lines() {
            let line = line.context("reading from the scenario")?;
            match serde_json::from_str::<Message>(&line)
                .with_context(|| format!("scenario {name} sent `{line}`"))?
            {
                Message::Trace { pid } => self.tracer.add_target(pid)?,
                Message::Check(cp) => {
                    self.drain();
                    let activity = self.activity.remove(&cp.pid).unwrap_or_default();
                    let result = check(&cp, &activity, self.shows_lf, self.tracer.vma.as_ref());
                    self.results.push(result);
                }
                Message::Failed { step, error } => self.failed(&step, pid, error),
            }
            ack.write_all(&[1]).context("resuming the scenario")?;
        }
        Ok(())
    }

    fn failed(&mut self, step: &str, pid: u32, error: String) {
        self.results.push(StepResult {
            step: step.to_string(),
            action: String::new(),
            pid,
            tid: pid,
            expected: String::new(),
            traced: String::new(),
            proc: String::new(),
            ok: false,
            mismatches: vec![error],
            stores: 0,
            functions: Vec::new(),
            expected_layout: Vec::new(),
            traced_layout: Vec::new(),
            proc_layout: Vec::new(),
        });
    }

    /// Everything the subjects' calls submitted is in the ring by the time they report.
    fn drain(&mut self) {
        while let Some(item) = self.ring.next() {
            let activity = match decode(&item) {
                Ok(Event::Syscall(rec)) => self.tracker.syscall(&rec),
                Ok(Event::Vma(rec)) => self.tracker.record(rec),
                Ok(Event::Fault(_)) | Err(_) => None,
            };
            if let Some(a) = activity {
                self.activity.entry(a.tgid()).or_default().push(a);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Checking

/// What the tracer saw for a checkpoint.
#[derive(Default)]
struct Traced {
    layout: Option<Vec<Piece>>,
    probe_tid: u32,
    probe_locked_vm: u64,
    incomplete: bool,
    calls: Vec<VmaCall>,
    born_locked: bool,
}

fn traced_for(cp: &Checkpoint, activity: &[Activity]) -> Traced {
    let mut t = Traced::default();
    for a in activity {
        match a {
            Activity::Call(call) if is_probe(call) => {
                t.layout = Some(in_window(
                    cp.window,
                    call.before.iter().map(Piece::from_range),
                ));
                t.probe_tid = call.syscall.raw.tid;
                t.probe_locked_vm = call.syscall.raw.locked_vm_before;
                t.incomplete = call.incomplete;
            }
            Activity::Call(call) => t.calls.push((**call).clone()),
            Activity::Store(s) => {
                let covers =
                    s.vma != 0 && s.range.start <= cp.window.0 && s.range.end >= cp.window.1;
                if covers && s.range.flags & VM_LOCKED != 0 && i64::from(s.nr) == libc::SYS_mmap {
                    t.born_locked = true;
                }
            }
            Activity::Func(_) => {}
        }
    }
    t
}

fn is_probe(call: &VmaCall) -> bool {
    let r = &call.syscall.raw;
    call.syscall.syscall == Syscall::Mlock2
        && r.args[2] == PROBE_FLAG
        && r.ret == -i64::from(libc::EINVAL)
}

fn in_window(window: (u64, u64), pieces: impl Iterator<Item = Piece>) -> Vec<Piece> {
    pieces
        .filter(|p| p.start < window.1 && p.end > window.0)
        .collect()
}

/// The calls' totals, as compared with [`ExpectCalls`].
fn call_totals(calls: &[VmaCall]) -> ExpectCalls {
    let mut counts = ChangeCounts::default();
    let (mut map_count, mut locked_vm, mut populated) = (0i64, 0i64, 0u64);
    for c in calls {
        counts.merge(&ChangeCounts::of(&c.changes));
        map_count +=
            i64::from(c.syscall.raw.map_count_after) - i64::from(c.syscall.raw.map_count_before);
        locked_vm += c.syscall.pages_locked();
        populated += c.syscall.pages_populated();
    }
    let pages = |bytes: u64| (bytes / PAGE_SIZE) as i64;
    ExpectCalls {
        count: Some(calls.len() as u32),
        splits: Some(counts.splits),
        merges: Some(counts.merges),
        locked_pages: Some(pages(counts.locked_bytes) - pages(counts.unlocked_bytes)),
        onfault_pages: Some(pages(counts.onfault_bytes) - pages(counts.unonfault_bytes)),
        map_count: Some(map_count),
        locked_vm: Some(locked_vm),
        locked_vm_after: calls.last().map(|c| c.syscall.raw.locked_vm_after),
        populated: Some(populated),
    }
}

fn check(
    cp: &Checkpoint,
    activity: &[Activity],
    shows_lf: bool,
    hooks: Option<&VmaHooks>,
) -> StepResult {
    let mut bad = Vec::new();
    let traced = traced_for(cp, activity);
    let stores: usize = traced.calls.iter().map(|c| c.stores.len()).sum();
    let functions: Vec<String> = traced
        .calls
        .iter()
        .flat_map(|c| &c.functions)
        .filter(|f| f.phase == phase::BEFORE)
        .map(|f| {
            hooks
                .and_then(|h| h.functions.get(f.hook as usize))
                .map_or_else(|| format!("hook {}", f.hook), |h| h.name.clone())
        })
        .collect();
    let proc = ProcView::read(cp, shows_lf);

    // The tracer's view of the region.
    match &traced.layout {
        None => {
            bad.push("the tracer saw no probe call, so no VMA snapshot of the region".to_string())
        }
        Some(layout) => {
            if layout != &cp.layout {
                bad.push(format!(
                    "traced VMAs {} != expected {}",
                    layout_str(cp.window, layout),
                    layout_str(cp.window, &cp.layout)
                ));
            }
            if traced.probe_tid != cp.tid {
                bad.push(format!(
                    "the probe was traced in tid {}, made by tid {}",
                    traced.probe_tid, cp.tid
                ));
            }
        }
    }
    if traced.incomplete {
        bad.push("a VMA snapshot was incomplete".into());
    }
    if let Some(want) = cp.locked_vm
        && traced.layout.is_some()
        && traced.probe_locked_vm != want
    {
        bad.push(format!(
            "traced locked_vm {} pages != expected {want}",
            traced.probe_locked_vm
        ));
    }
    let totals = call_totals(&traced.calls);
    if let Some(want) = &cp.calls {
        compare_calls(want, &totals, &mut bad);
    }
    if let Some(want) = cp.born_locked
        && traced.born_locked != want
    {
        bad.push(if want {
            "the tracer saw no mmap storing the region already VM_LOCKED".to_string()
        } else {
            "the tracer saw an mmap storing the region VM_LOCKED".to_string()
        });
    }

    // The kernel's own account.
    let proc_layout = match &proc {
        Ok(view) => {
            let mut expected = cp.layout.clone();
            let mut got = view.layout.clone();
            if !shows_lf {
                // No `lf` in this kernel's smaps: compare the rest.
                for p in expected.iter_mut().chain(got.iter_mut()) {
                    p.onfault = false;
                }
            }
            if got != expected {
                bad.push(format!(
                    "/proc VMAs {} != expected {}",
                    layout_str(cp.window, &view.layout),
                    layout_str(cp.window, &cp.layout)
                ));
            }
            if view.maps_ranges
                != view
                    .layout
                    .iter()
                    .map(|p| (p.start, p.end, p.perms.clone()))
                    .collect::<Vec<_>>()
            {
                bad.push("/proc/PID/maps and smaps disagree about the region's VMAs".into());
            }
            if view.locked_kb != cp.locked_kb {
                bad.push(format!(
                    "smaps Locked {} kB != expected {} kB",
                    view.locked_kb, cp.locked_kb
                ));
            }
            if let Some(rss) = cp.rss_kb
                && view.rss_kb != rss
            {
                bad.push(format!("smaps Rss {} kB != expected {rss} kB", view.rss_kb));
            }
            view.layout.clone()
        }
        Err(e) => {
            bad.push(format!("reading /proc: {e:#}"));
            Vec::new()
        }
    };

    let expected = {
        let mut s = format!(
            "{} Locked {}k",
            layout_str(cp.window, &cp.layout),
            cp.locked_kb
        );
        if let Some(rss) = cp.rss_kb {
            let _ = write!(s, " Rss {rss}k");
        }
        if let Some(c) = &cp.calls {
            let _ = write!(s, "; {}", calls_str(c));
        }
        if let Some(v) = cp.locked_vm {
            let _ = write!(s, "; locked_vm {v}");
        }
        if cp.born_locked == Some(true) {
            s.push_str("; born locked");
        }
        s
    };
    let traced_str = {
        let mut s = match &traced.layout {
            Some(l) => layout_str(cp.window, l),
            None => "(no snapshot)".into(),
        };
        if cp.calls.is_some() || !traced.calls.is_empty() {
            let names: Vec<&str> = traced
                .calls
                .iter()
                .map(|c| c.syscall.syscall.name())
                .collect();
            let _ = write!(
                s,
                "; {}: {}",
                if names.is_empty() {
                    "no calls".to_string()
                } else {
                    names.join("+")
                },
                calls_str(&totals)
            );
            let _ = write!(s, " [ma_write x{stores}");
            if !functions.is_empty() {
                let _ = write!(s, "; fentry {}", run_lengths(&functions));
            }
            s.push(']');
        }
        if cp.locked_vm.is_some() && traced.layout.is_some() {
            let _ = write!(
                s,
                "; locked_vm {} (tid {})",
                traced.probe_locked_vm, traced.probe_tid
            );
        }
        if cp.born_locked.is_some() {
            s.push_str(if traced.born_locked {
                "; mmap stored it locked"
            } else {
                "; no locked mmap store"
            });
        }
        s
    };
    let proc_str = match &proc {
        Ok(v) => format!(
            "{} Locked {}k Rss {}k{}",
            layout_str(cp.window, &v.layout),
            v.locked_kb,
            v.rss_kb,
            if shows_lf {
                ""
            } else {
                " (no lf in this kernel's smaps)"
            }
        ),
        Err(_) => "(unreadable)".into(),
    };
    StepResult {
        step: cp.step.clone(),
        action: cp.action.clone(),
        pid: cp.pid,
        tid: cp.tid,
        expected,
        traced: traced_str,
        proc: proc_str,
        ok: bad.is_empty(),
        mismatches: bad,
        stores,
        functions,
        expected_layout: cp.layout.clone(),
        traced_layout: traced.layout.unwrap_or_default(),
        proc_layout,
    }
}

/// `mlock_fixup x40 split_vma __split_vma`: repeats in a row counted.
fn run_lengths(names: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < names.len() {
        let run = names[i..].iter().take_while(|n| **n == names[i]).count();
        out.push(if run > 1 {
            format!("{} x{run}", names[i])
        } else {
            names[i].clone()
        });
        i += run;
    }
    out.join(" ")
}

fn compare_calls(want: &ExpectCalls, got: &ExpectCalls, bad: &mut Vec<String>) {
    macro_rules! field {
        ($name:ident, $label:literal) => {
            if let Some(w) = want.$name {
                if got.$name != Some(w) {
                    let got = got
                        .$name
                        .map_or_else(|| "none".to_string(), |g| g.to_string());
                    bad.push(format!("traced {} {got} != expected {w}", $label));
                }
            }
        };
    }
    field!(count, "calls");
    field!(splits, "splits");
    field!(merges, "merges");
    field!(locked_pages, "VM_LOCKED pages");
    field!(onfault_pages, "VM_LOCKONFAULT pages");
    field!(map_count, "map_count change");
    field!(locked_vm, "locked_vm change");
    field!(locked_vm_after, "locked_vm after");
    field!(populated, "pages populated");
}

fn calls_str(c: &ExpectCalls) -> String {
    let mut parts = Vec::new();
    let mut add = |label: &str, v: Option<String>| {
        if let Some(v) = v {
            parts.push(format!("{label}{v}"));
        }
    };
    add("split ", c.splits.map(|v| v.to_string()));
    add("merge ", c.merges.map(|v| v.to_string()));
    add("lo ", c.locked_pages.map(|v| format!("{v:+}p")));
    if c.onfault_pages.is_some_and(|v| v != 0) {
        add("lf ", c.onfault_pages.map(|v| format!("{v:+}p")));
    }
    add("VMAs ", c.map_count.map(|v| format!("{v:+}")));
    add("locked_vm ", c.locked_vm.map(|v| format!("{v:+}")));
    add("locked_vm=", c.locked_vm_after.map(|v| v.to_string()));
    add("populated ", c.populated.map(|v| v.to_string()));
    parts.join(" ")
}

/// `[4 rw][8 rw lo][4 rw]`: sizes in pages from the region's start; a piece that does not
/// start where the previous one ended (or at the region's start) shows its page offset.
pub fn layout_str(window: (u64, u64), pieces: &[Piece]) -> String {
    let mut out = String::new();
    let mut at = window.0;
    for p in pieces {
        out.push('[');
        if p.start != at {
            let offset = (i128::from(p.start) - i128::from(window.0)) / i128::from(PAGE_SIZE);
            let _ = write!(out, "@{offset} ");
        }
        let prot: String = p.perms.chars().take(3).filter(|&c| c != '-').collect();
        let _ = write!(
            out,
            "{} {}",
            p.end.saturating_sub(p.start) / PAGE_SIZE,
            if prot.is_empty() { "--" } else { &prot }
        );
        if p.locked {
            out.push_str(" lo");
        }
        if p.onfault {
            out.push_str(" lf");
        }
        out.push(']');
        at = p.end;
    }
    if at != window.1 {
        let _ = write!(
            out,
            "(ends {:+} pages off)",
            (i128::from(at) - i128::from(window.1)) / i128::from(PAGE_SIZE)
        );
    }
    if pieces.is_empty() {
        out.push_str("(nothing mapped)");
    }
    out
}

/// The region as /proc/PID/task/TID/{maps,smaps} show it.
struct ProcView {
    layout: Vec<Piece>,
    maps_ranges: Vec<(u64, u64, String)>,
    locked_kb: u64,
    rss_kb: u64,
}

impl ProcView {
    fn read(cp: &Checkpoint, shows_lf: bool) -> Result<Self> {
        let dir = format!("/proc/{}/task/{}", cp.pid, cp.tid);
        let smaps = read_smaps(&format!("{dir}/smaps"), shows_lf)?;
        let maps = read_smaps(&format!("{dir}/maps"), shows_lf)?;
        let mut view = ProcView {
            layout: Vec::new(),
            maps_ranges: Vec::new(),
            locked_kb: 0,
            rss_kb: 0,
        };
        for e in smaps.iter().filter(|e| e.mapping.overlaps(cp.window)) {
            view.layout.push(Piece {
                start: e.mapping.start,
                end: e.mapping.end,
                perms: e.perms.clone(),
                locked: e.mapping.locked,
                onfault: e.mapping.lockonfault == Some(true),
            });
            view.locked_kb += e.locked_kb;
            view.rss_kb += e.rss_kb;
        }
        view.maps_ranges = maps
            .into_iter()
            .filter(|e| e.mapping.overlaps(cp.window))
            .map(|e| (e.mapping.start, e.mapping.end, e.perms))
            .collect();
        Ok(view)
    }
}

/// The report as a table: step, expected, traced, /proc says, verdict; then the mismatches.
pub fn table(report: &Report) -> String {
    let mut out = format!(
        "kernel {}; hooks: {}\n",
        report.kernel,
        report.hooks.lines().next().unwrap_or("")
    );
    let headers = ["step", "expected", "traced", "/proc says", "verdict"];
    let rows: Vec<[String; 5]> = report
        .steps
        .iter()
        .map(|r| {
            [
                r.step.clone(),
                r.expected.clone(),
                r.traced.clone(),
                r.proc.clone(),
                if r.ok { "ok".into() } else { "MISMATCH".into() },
            ]
        })
        .collect();
    let mut widths = headers.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 5]| -> String {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i > 0 {
                s.push_str(" | ");
            }
            let _ = write!(s, "{cell:<w$}");
        }
        s.trim_end().to_string() + "\n"
    };
    out.push_str(&line(headers));
    out.push_str(&line(
        widths.map(|w| "-".repeat(w)).each_ref().map(String::as_str),
    ));
    for row in &rows {
        out.push_str(&line(row.each_ref().map(String::as_str)));
    }
    for r in report.steps.iter().filter(|r| !r.ok) {
        let _ = writeln!(
            out,
            "\n{} (pid {}, tid {}): {}",
            r.step, r.pid, r.tid, r.action
        );
        for m in &r.mismatches {
            let _ = writeln!(out, "  - {m}");
        }
    }
    let _ = writeln!(
        out,
        "\n{} steps agree, {} mismatch",
        report.passed, report.failed
    );
    out
}

// ---------------------------------------------------------------------------------------
// The subject side: runs in the forked child.

struct Subject {
    to_parent: File,
    from_parent: File,
}

fn subject_main(name: &str, scenario: Scenario, msg: OwnedFd, ack: OwnedFd) -> i32 {
    let mut subject = Subject {
        to_parent: File::from(msg),
        from_parent: File::from(ack),
    };
    // Wait until the parent has put us in the trace filter.
    if subject.wait().is_err() {
        return 126;
    }
    match scenario(&mut subject) {
        Ok(()) => 0,
        Err(error) => {
            let _ = subject.send(&Message::Failed {
                step: name.to_string(),
                error: format!("{error:#}"),
            });
            1
        }
    }
}

impl Subject {
    fn wait(&mut self) -> Result<()> {
        let mut byte = [0u8];
        self.from_parent
            .read_exact(&mut byte)
            .context("waiting for the verifier")
    }

    fn send(&mut self, message: &Message) -> Result<()> {
        let mut line = serde_json::to_string(message)?;
        line.push('\n');
        self.to_parent
            .write_all(line.as_bytes())
            .context("talking to the verifier")?;
        self.wait()
    }

    /// Probes the region (see the module doc), then hands the checkpoint to the parent.
    fn check(&mut self, region: &Region, cp: Checkpoint) -> Result<()> {
        probe_call(region.start(), region.len as u64)?;
        self.send(&Message::Check(Box::new(cp)))
    }
}

fn probe_call(start: u64, len: u64) -> Result<()> {
    // SAFETY: mlock2 with an unknown flag fails with EINVAL before looking at the range.
    let ret = unsafe { libc::syscall(libc::SYS_mlock2, start, len, PROBE_FLAG) };
    let errno = std::io::Error::last_os_error();
    if ret != -1 || errno.raw_os_error() != Some(libc::EINVAL) {
        bail!("the probe mlock2(.., {PROBE_FLAG:#x}) returned {ret} ({errno}), expected EINVAL");
    }
    Ok(())
}

fn gettid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;

/// What `verify` adds to a region: page addresses as numbers, and checkpoints over it.
impl Region {
    /// The address of page `page` (the end of the region for `page` = its length in pages).
    fn at(&self, page: u64) -> u64 {
        self.start() + page * PAGE_SIZE
    }

    /// Writes one byte to each of these pages (of a region mapped writable).
    fn touch(&self, pages: impl IntoIterator<Item = u64>) {
        for page in pages {
            // SAFETY: `page` asserts the byte is inside the region, which the scenarios touch
            // only where they mapped it writable; nothing else refers to this memory.
            unsafe { self.page(page as usize).write_volatile(1) };
        }
    }

    /// The expected layout from `(pages, perms, locked, onfault)` pieces, in order.
    fn layout(&self, pieces: &[(u64, &str, bool, bool)]) -> Vec<Piece> {
        let mut at = self.start();
        pieces
            .iter()
            .map(|&(pages, perms, locked, onfault)| {
                let piece = Piece {
                    start: at,
                    end: at + pages * PAGE_SIZE,
                    perms: perms.into(),
                    locked,
                    onfault,
                };
                at = piece.end;
                piece
            })
            .collect()
    }

    /// A checkpoint over the region, seen from this thread, with the layout and `Locked:` it
    /// should have; the rest is set by the scenario.
    fn checkpoint(
        &self,
        step: &str,
        action: &str,
        layout: &[(u64, &str, bool, bool)],
        locked_kb: u64,
    ) -> Checkpoint {
        // SAFETY: getpid cannot fail.
        let pid = unsafe { libc::getpid() } as u32;
        Checkpoint {
            step: step.into(),
            action: action.into(),
            pid,
            tid: gettid(),
            window: self.window(),
            layout: self.layout(layout),
            locked_kb,
            rss_kb: None,
            calls: None,
            locked_vm: None,
            born_locked: None,
        }
    }
}

fn sys(what: &str, ret: i64) -> Result<()> {
    if ret != 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn mlock(addr: u64, pages: u64) -> Result<()> {
    // SAFETY: locks our own mapping.
    sys(
        "mlock",
        unsafe { libc::mlock(addr as *const libc::c_void, (pages * PAGE_SIZE) as usize) }.into(),
    )
}

fn munlock(addr: u64, pages: u64) -> Result<()> {
    // SAFETY: unlocks our own mapping.
    sys(
        "munlock",
        unsafe { libc::munlock(addr as *const libc::c_void, (pages * PAGE_SIZE) as usize) }.into(),
    )
}

const N: bool = false;
const Y: bool = true;

fn calls(count: u32) -> ExpectCalls {
    ExpectCalls {
        count: Some(count),
        ..ExpectCalls::default()
    }
}

/// No mlock-family call between two checkpoints.
fn no_calls() -> ExpectCalls {
    ExpectCalls {
        splits: Some(0),
        merges: Some(0),
        ..calls(0)
    }
}

/// Figure 2 of the reference paper, step by step: a lock inside one VMA splits it, a lock
/// next to a locked VMA merges with it, unlocking everything merges back to one VMA.
fn split_merge(s: &mut Subject) -> Result<()> {
    let r = Region::guarded(16, RW)?;
    // One page touched first gives the VMA its anon_vma, which every piece then shares. On
    // 6.1 an anon_vma-less piece does not merge with one that has an anon_vma
    // (is_mergeable_anon_vma), newer kernels merge them: without this, munlock-all would leave
    // three VMAs on 6.1 and one on 6.18, for reasons that are not about VM_LOCKED.
    r.touch([0]);
    mlock(r.at(4), 8)?;
    let mut cp = r.checkpoint(
        "mlock-middle",
        "mlock pages 4-11 of an 16-page VMA (page 0 touched)",
        &[(4, "rw-p", N, N), (8, "rw-p", Y, N), (4, "rw-p", N, N)],
        32,
    );
    cp.rss_kb = Some(36);
    cp.calls = Some(ExpectCalls {
        splits: Some(2),
        merges: Some(0),
        locked_pages: Some(8),
        map_count: Some(2),
        locked_vm: Some(8),
        populated: Some(8),
        ..calls(1)
    });
    s.check(&r, cp)?;

    mlock(r.at(12), 2)?;
    let mut cp = r.checkpoint(
        "mlock-adjacent",
        "mlock pages 12-13, next to the locked 4-11",
        &[(4, "rw-p", N, N), (10, "rw-p", Y, N), (2, "rw-p", N, N)],
        40,
    );
    cp.rss_kb = Some(44);
    cp.calls = Some(ExpectCalls {
        splits: Some(1),
        merges: Some(1),
        locked_pages: Some(2),
        map_count: Some(0),
        locked_vm: Some(2),
        populated: Some(2),
        ..calls(1)
    });
    s.check(&r, cp)?;

    munlock(r.start(), 16)?;
    let mut cp = r.checkpoint(
        "munlock-all",
        "munlock all 16 pages",
        &[(16, "rw-p", N, N)],
        0,
    );
    cp.rss_kb = Some(44);
    cp.calls = Some(ExpectCalls {
        splits: Some(0),
        merges: Some(2),
        locked_pages: Some(-10),
        map_count: Some(-2),
        locked_vm: Some(-10),
        populated: Some(0),
        ..calls(1)
    });
    s.check(&r, cp)
}

/// The paper's PROT_EXEC neighbour: locked pages on both sides of a rw/r-x boundary stay two
/// VMAs, because their other flags differ.
fn exec_neighbour(s: &mut Subject) -> Result<()> {
    let r = Region::guarded(16, RW)?;
    // Populated first, so the r-x half holds real pages rather than the shared zero page.
    r.touch(0..16);
    // SAFETY: changes protection of our own mapping.
    sys(
        "mprotect",
        unsafe {
            libc::mprotect(
                r.at(8) as *mut libc::c_void,
                (8 * PAGE_SIZE) as usize,
                libc::PROT_READ | libc::PROT_EXEC,
            )
        }
        .into(),
    )?;
    mlock(r.at(4), 8)?;
    let mut cp = r.checkpoint(
        "mlock-across-exec",
        "mlock pages 4-11 across a rw-/r-x boundary at page 8",
        &[
            (4, "rw-p", N, N),
            (4, "rw-p", Y, N),
            (4, "r-xp", Y, N),
            (4, "r-xp", N, N),
        ],
        32,
    );
    cp.rss_kb = Some(64);
    cp.calls = Some(ExpectCalls {
        splits: Some(2),
        merges: Some(0),
        locked_pages: Some(8),
        map_count: Some(2),
        locked_vm: Some(8),
        populated: Some(0),
        ..calls(1)
    });
    s.check(&r, cp)
}

/// MLOCK_ONFAULT: VM_LOCKED|VM_LOCKONFAULT, nothing populated until touched.
fn onfault(s: &mut Subject) -> Result<()> {
    let r = Region::guarded(16, RW)?;
    // SAFETY: locks our own mapping.
    let ret = unsafe { libc::syscall(libc::SYS_mlock2, r.at(4), 8 * PAGE_SIZE, MLOCK_ONFAULT) };
    sys("mlock2(MLOCK_ONFAULT)", ret)?;
    let lf = [(4, "rw-p", N, N), (8, "rw-p", Y, Y), (4, "rw-p", N, N)];
    let mut cp = r.checkpoint(
        "mlock2-onfault",
        "mlock2(MLOCK_ONFAULT) pages 4-11 of an untouched VMA",
        &lf,
        0,
    );
    cp.rss_kb = Some(0);
    cp.calls = Some(ExpectCalls {
        splits: Some(2),
        merges: Some(0),
        locked_pages: Some(8),
        onfault_pages: Some(8),
        map_count: Some(2),
        locked_vm: Some(8),
        populated: Some(0),
        ..calls(1)
    });
    s.check(&r, cp)?;

    r.touch([4, 5, 11]);
    let mut cp = r.checkpoint(
        "onfault-touch",
        "write to 3 of the on-fault locked pages",
        &lf,
        12,
    );
    cp.rss_kb = Some(12);
    cp.calls = Some(no_calls());
    s.check(&r, cp)
}

/// mlockall(MCL_FUTURE): the next mmap is born locked; munlockall undoes it for the VMA and for
/// later mappings.
fn mlockall_future(s: &mut Subject) -> Result<()> {
    let first = Region::hole(16)?;
    let second = Region::hole(16)?;
    // SAFETY: plain syscall.
    sys(
        "mlockall(MCL_FUTURE)",
        unsafe { libc::mlockall(MCL_FUTURE as i32) }.into(),
    )?;
    first.map(RW, 0)?;
    let mut cp = first.checkpoint(
        "mlockall-future-mmap",
        "mlockall(MCL_FUTURE), then mmap 16 pages",
        &[(16, "rw-p", Y, N)],
        64,
    );
    cp.rss_kb = Some(64);
    cp.born_locked = Some(true);
    cp.calls = Some(ExpectCalls {
        splits: Some(0),
        merges: Some(0),
        locked_pages: Some(0),
        locked_vm: Some(0),
        ..calls(1)
    });
    s.check(&first, cp)?;

    // SAFETY: plain syscall.
    sys("munlockall", unsafe { libc::munlockall() }.into())?;
    let mut cp = first.checkpoint("munlockall", "munlockall()", &[(16, "rw-p", N, N)], 0);
    cp.rss_kb = Some(64);
    cp.calls = Some(ExpectCalls {
        locked_vm_after: Some(0),
        ..calls(1)
    });
    s.check(&first, cp)?;

    second.map(RW, 0)?;
    let mut cp = second.checkpoint(
        "mmap-after-munlockall",
        "mmap 16 pages after munlockall",
        &[(16, "rw-p", N, N)],
        0,
    );
    cp.rss_kb = Some(0);
    cp.born_locked = Some(false);
    cp.calls = Some(no_calls());
    s.check(&second, cp)
}

/// A forked child does not inherit VM_LOCKED (the paper, section 1).
fn fork_child(s: &mut Subject) -> Result<()> {
    let r = Region::guarded(16, RW)?;
    mlock(r.start(), 16)?;
    let mut cp = r.checkpoint(
        "mlock-before-fork",
        "mlock all 16 pages",
        &[(16, "rw-p", Y, N)],
        64,
    );
    cp.rss_kb = Some(64);
    cp.calls = Some(ExpectCalls {
        splits: Some(0),
        merges: Some(0),
        locked_pages: Some(16),
        map_count: Some(0),
        locked_vm: Some(16),
        populated: Some(16),
        ..calls(1)
    });
    s.check(&r, cp)?;

    // SAFETY: the subject is single-threaded.
    match unsafe { fork() }.context("fork")? {
        ForkResult::Child => {
            let result = (|| -> Result<()> {
                // SAFETY: getpid cannot fail.
                let pid = unsafe { libc::getpid() } as u32;
                s.send(&Message::Trace { pid })?;
                let mut cp = r.checkpoint(
                    "fork-child",
                    "fork() after mlock; the child's view",
                    &[(16, "rw-p", N, N)],
                    0,
                );
                cp.locked_vm = Some(0);
                cp.calls = Some(no_calls());
                s.check(&r, cp)
            })();
            if let Err(error) = result {
                let _ = s.send(&Message::Failed {
                    step: "fork-child".into(),
                    error: format!("{error:#}"),
                });
            }
            unsafe { libc::_exit(0) }
        }
        ForkResult::Parent { child } => {
            let status = waitpid(child, None).context("waitpid")?;
            if !matches!(status, WaitStatus::Exited(_, 0)) {
                bail!("the forked child ended with {status:?}");
            }
            Ok(())
        }
    }
}

/// Threads share the mm, so a thread sees the process's locked VMAs.
fn thread_shares(s: &mut Subject) -> Result<()> {
    let r = Region::guarded(16, RW)?;
    mlock(r.start(), 16)?;
    let mut s = Subject {
        to_parent: s.to_parent.try_clone()?,
        from_parent: s.from_parent.try_clone()?,
    };
    let thread = std::thread::spawn(move || -> Result<()> {
        let mut cp = r.checkpoint(
            "thread-shares-lock",
            "mlock 16 pages, then look from a new thread",
            &[(16, "rw-p", Y, N)],
            64,
        );
        cp.rss_kb = Some(64);
        cp.locked_vm = Some(16);
        cp.calls = Some(ExpectCalls {
            splits: Some(0),
            merges: Some(0),
            locked_pages: Some(16),
            locked_vm: Some(16),
            populated: Some(16),
            ..calls(1)
        });
        s.check(&r, cp)
    });
    thread
        .join()
        .map_err(|_| anyhow!("the checking thread panicked"))?
}

const SCENARIOS: &[(&str, Scenario)] = &[
    ("split-merge", split_merge),
    ("exec-neighbour", exec_neighbour),
    ("onfault", onfault),
    ("mlockall-future", mlockall_future),
    ("fork", fork_child),
    ("thread", thread_shares),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_render_relative_to_the_region() {
        let r = Region::guarded(16, RW).unwrap();
        let l = r.layout(&[(4, "rw-p", N, N), (8, "rw-p", Y, Y), (4, "r-xp", N, N)]);
        assert_eq!(layout_str(r.window(), &l), "[4 rw][8 rw lo lf][4 rx]");
        // A VMA reaching below the region (it merged with a neighbour) shows its offset.
        let merged = [Piece {
            start: r.start() - PAGE_SIZE,
            end: r.at(16),
            perms: "rw-p".into(),
            locked: false,
            onfault: false,
        }];
        assert_eq!(layout_str(r.window(), &merged), "[@-1 17 rw]");
        assert_eq!(
            layout_str(r.window(), &[]),
            "(ends -16 pages off)(nothing mapped)"
        );
    }

    #[test]
    fn repeated_functions_are_counted() {
        let names: Vec<String> = ["mlock_fixup", "split_vma", "split_vma", "mlock_fixup"]
            .map(String::from)
            .to_vec();
        assert_eq!(run_lengths(&names), "mlock_fixup split_vma x2 mlock_fixup");
        assert_eq!(run_lengths(&[]), "");
    }

    /// A probe call as the tracker would hand it over, whose entry snapshot is `before`.
    fn probe_activity(before: &[VmaRange]) -> Activity {
        use memlock_trace_common::{SyscallEvent, event_kind};
        let raw = SyscallEvent {
            kind: event_kind::SYSCALL,
            nr: Syscall::Mlock2.nr(),
            tgid: std::process::id(),
            tid: gettid(),
            args: [0, 0, PROBE_FLAG],
            ret: -i64::from(libc::EINVAL),
            ..SyscallEvent::default()
        };
        Activity::Call(Box::new(VmaCall {
            syscall: crate::event::SyscallRecord {
                syscall: Syscall::Mlock2,
                raw,
            },
            before: before.to_vec(),
            after: before.to_vec(),
            incomplete: false,
            changes: Vec::new(),
            stores: Vec::new(),
            functions: Vec::new(),
        }))
    }

    #[test]
    fn verdicts_compare_expected_traced_and_this_processs_proc() {
        let r = Region::guarded(16, RW).unwrap();
        let rw = 0x73; // VM_READ|VM_WRITE|VM_MAYREAD|VM_MAYWRITE|VM_MAYEXEC
        let truth = [VmaRange {
            start: r.start(),
            end: r.at(16),
            flags: rw,
        }];
        let agree = r.checkpoint("t", "", &[(16, "rw-p", N, N)], 0);
        let result = check(&agree, &[probe_activity(&truth)], true, None);
        assert!(result.ok, "{:?}", result.mismatches);
        assert_eq!(result.proc, "[16 rw] Locked 0k Rss 0k");

        // Expecting a lock that is not there: both the tracer and /proc disagree.
        let wrong = r.checkpoint("t", "", &[(16, "rw-p", Y, N)], 64);
        let result = check(&wrong, &[probe_activity(&truth)], true, None);
        assert_eq!(result.mismatches.len(), 3, "{:?}", result.mismatches);
        assert!(result.mismatches[0].starts_with("traced VMAs [16 rw] != expected [16 rw lo]"));
        assert!(result.mismatches[1].starts_with("/proc VMAs [16 rw] != expected [16 rw lo]"));
        assert_eq!(result.mismatches[2], "smaps Locked 0 kB != expected 64 kB");

        // A tracer that saw a split /proc does not show; and one that saw nothing.
        let split = [
            VmaRange {
                start: r.start(),
                end: r.at(8),
                flags: rw,
            },
            VmaRange {
                start: r.at(8),
                end: r.at(16),
                flags: rw,
            },
        ];
        let result = check(&agree, &[probe_activity(&split)], true, None);
        assert_eq!(
            result.mismatches,
            ["traced VMAs [8 rw][8 rw] != expected [16 rw]"]
        );
        let result = check(&agree, &[], true, None);
        assert_eq!(
            result.mismatches,
            ["the tracer saw no probe call, so no VMA snapshot of the region"]
        );
    }

    #[test]
    fn call_expectations_compare_only_what_is_set() {
        let want = ExpectCalls {
            splits: Some(2),
            map_count: Some(2),
            ..calls(1)
        };
        let got = ExpectCalls {
            count: Some(1),
            splits: Some(2),
            merges: Some(5),
            map_count: Some(1),
            ..ExpectCalls::default()
        };
        let mut bad = Vec::new();
        compare_calls(&want, &got, &mut bad);
        assert_eq!(bad, ["traced map_count change 1 != expected 2"]);
    }
}

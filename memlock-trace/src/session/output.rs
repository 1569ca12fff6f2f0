//! What the event loop does with what arrives: decodes each record, feeds the families'
//! aggregation and the metrics, prints event lines, and puts the summary together.

use std::{collections::BTreeMap, io::Write as _, os::fd::AsRawFd as _, sync::Arc, time::Duration};

use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use memlock_trace_common::vma::{VM_LOCKED, VM_LOCKONFAULT};

use super::{
    order::Reorder,
    summary::{CallSiteHealth, Summary, Window, summary_text},
};
use crate::{
    event::{Event, decode},
    faults::{self, FaultHooks, FaultReport, render as fault_render, stacks::StackSymbolizer},
    metrics::Metrics,
    output::{Sink, TextStyle, WallClock, hms},
    process::table::ProcessKey,
    procfs::{Mapping, MappingCache},
    syscalls::{self, Aggregator, stacks::CallSiteReport},
    tracer::Tracer,
    vma::{self, VmaHooks},
};

/// How long one drain may read before the loop attends to its timers and signals.
const DRAIN_BUDGET: Duration = Duration::from_millis(50);

pub(super) struct Output {
    /// Stdout, or `-o FILE`.
    pub(super) out: Sink,
    pub(super) json: bool,
    pub(super) style: TextStyle,
    /// `-T`: the wall-clock time on every event line.
    pub(super) timestamps: bool,
    pub(super) clock: WallClock,
    /// `-t TID`: only this thread's calls and faults.
    pub(super) tid: Option<u32>,
    /// `--interval`: what the current interval has seen.
    pub(super) window: Option<IntervalState>,
    /// When the session started, CLOCK_REALTIME ns.
    pub(super) started_ns: u64,
    pub(super) syscall_events: bool,
    pub(super) fault_events: bool,
    pub(super) aggregator: Aggregator,
    pub(super) undecodable: u64,
    pub(super) metrics: Option<Arc<Metrics>>,
    pub(super) vma: VmaOutput,
    pub(super) mappings: MappingCache,
    pub(super) top_mappings: usize,
    pub(super) top_stacks: usize,
    pub(super) max_processes: usize,
    pub(super) per_thread: bool,
    /// Keeps the files it parsed from one summary to the next.
    pub(super) symbolizer: StackSymbolizer,
    /// Event lines waiting for their turn in time order.
    pub(super) order: Reorder,
}

/// One interval's own figures: reset when its block is printed.
pub(super) struct IntervalState {
    pub(super) aggregator: Aggregator,
    pub(super) vma_counts: BTreeMap<u32, vma::ChangeCounts>,
    /// The fault maps as read at the interval's start.
    pub(super) faults_before: Option<FaultReport>,
    pub(super) start_ns: u64,
}

/// What a summary covers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
    Interval,
    Session,
}

/// VMA events: paired with their calls by the tracker, counted per process.
#[derive(Default)]
pub(super) struct VmaOutput {
    pub(super) tracker: vma::Tracker,
    pub(super) hooks: Option<VmaHooks>,
    pub(super) counts: BTreeMap<u32, vma::ChangeCounts>,
}

impl Output {
    /// Renders one event (JSON with its wall-clock `time_ns`, or text lines with `-T`'s
    /// time) and holds it for the time-ordered stream. Without a kernel stamp, the time it
    /// was read stands in.
    fn emit(&mut self, ktime_ns: Option<u64>, json: Option<serde_json::Value>, lines: &[String]) {
        let key = ktime_ns.unwrap_or_else(WallClock::monotonic_ns);
        let wall = self.clock.wall_ns(key);
        let mut text = Vec::new();
        if let Some(mut value) = json {
            value["time_ns"] = wall.into();
            let _ = writeln!(text, "{value}");
        } else {
            let stamp = if self.timestamps {
                format!("{} ", hms(wall))
            } else {
                String::new()
            };
            for line in lines {
                let _ = writeln!(text, "{stamp}{line}");
            }
        }
        self.order.push(key, text);
    }

    fn wanted(&self, tid: u32) -> bool {
        self.tid.is_none_or(|t| t == tid)
    }

    /// Reads `ring` to its end, or for [`DRAIN_BUDGET`]. See [`Output::drain_for`].
    pub(super) fn drain(&mut self, ring: &mut RingBuf<MapData>) -> bool {
        self.drain_for(ring, DRAIN_BUDGET, 0)
    }

    /// Reads `ring` until it is empty, or `budget` has passed and at least `at_least_bytes`
    /// were read (records and their 8-byte headers); returns whether it was read to its end. A flood keeps a ring from
    /// ever emptying: unbounded, one drain would keep the loop from its timers and signals
    /// (`--duration` and SIGTERM then waited minutes).
    pub(super) fn drain_for(
        &mut self,
        ring: &mut RingBuf<MapData>,
        budget: Duration,
        at_least_bytes: u64,
    ) -> bool {
        let began = WallClock::monotonic_ns();
        let deadline = std::time::Instant::now() + budget;
        let (mut syscalls, mut vmas, undecodable_before) = (0, 0, self.undecodable);
        let mut read = 0u32;
        let mut bytes = 0u64;
        let mut complete = true;
        loop {
            // Checked before a record is taken (taking one consumes it), every 1024 records:
            // the clock is cheap against their decoding.
            read = read.wrapping_add(1);
            if read.is_multiple_of(1024)
                && bytes >= at_least_bytes
                && std::time::Instant::now() >= deadline
            {
                complete = false;
                break;
            }
            let Some(item) = ring.next() else { break };
            bytes += item.len() as u64 + 8;
            match decode(&item) {
                Ok(Event::Syscall(rec)) => {
                    if !self.wanted(rec.raw.tid) {
                        continue;
                    }
                    syscalls += 1;
                    self.order.saw_call(rec.raw.duration_ns);
                    self.aggregator.record_syscall(&rec);
                    if let Some(window) = &mut self.window {
                        window.aggregator.record_syscall(&rec);
                    }
                    if let Some(metrics) = &self.metrics {
                        metrics.syscalls.record(&rec);
                    }
                    if self.syscall_events {
                        let unit = self.style.unit;
                        let (json, lines) = if self.json {
                            (Some(syscalls::render::syscall_json(&rec)), vec![])
                        } else {
                            (None, vec![syscalls::render::syscall_line(&rec, unit)])
                        };
                        self.emit(Some(rec.raw.enter_ns), json, &lines);
                    }
                    if let Some(activity) = self.vma.tracker.syscall(&rec) {
                        self.vma_activity(&activity);
                    }
                }
                Ok(Event::Vma(record)) => {
                    vmas += 1;
                    if let Some(activity) = self.vma.tracker.record(record)
                        && self.wanted(activity_tid(&activity))
                    {
                        self.vma_activity(&activity);
                    }
                }
                Ok(Event::Fault(rec)) => {
                    if self.fault_events && self.wanted(rec.raw.tid) {
                        let (json, lines) = if self.json {
                            (Some(fault_render::fault_json(&rec)), vec![])
                        } else {
                            (None, vec![fault_render::fault_line(&rec, self.style.unit)])
                        };
                        self.emit(Some(rec.raw.time_ns), json, &lines);
                    }
                }
                Err(_) => self.undecodable += 1,
            }
        }
        // Only a drain that reached the end vouches that nothing older is still to come.
        if complete {
            self.order.drained(ring.as_raw_fd(), began);
        }
        self.order.release(&mut self.out);
        let _ = self.out.flush();
        if let Some(metrics) = &self.metrics {
            metrics.health.record_events(
                &[("syscall", syscalls), ("vma", vmas)],
                self.undecodable - undecodable_before,
            );
        }
        complete
    }

    /// The tracer's health with the aggregator's evictions, and the fault family's figures,
    /// pushed to the metrics.
    pub(super) fn update_health(&self, tracer: &Tracer) -> Result<()> {
        if let Some(metrics) = &self.metrics {
            let mut health = tracer.health()?;
            health.processes.evicted_processes = self.aggregator.evicted_processes();
            metrics.health.update(&health);
            if let (Some(hooks), Some(report)) = (&tracer.fault_hooks, tracer.fault_report()?) {
                self.update_fault_metrics(metrics, hooks, &report);
            }
        }
        Ok(())
    }

    fn update_fault_metrics(&self, metrics: &Metrics, hooks: &FaultHooks, report: &FaultReport) {
        metrics.faults.update(
            &faults::summary::by_process(report),
            hooks,
            &report.health,
            |pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .ok()
                    .map(|c| c.trim_end().to_string())
                    .or_else(|| self.mappings.comm(pid))
            },
        );
    }

    /// `--stacks`: each process's top mlock-family call sites, symbolized with its mappings
    /// (re-read now if it still lives, else its last snapshot).
    fn add_call_sites(&mut self, summary: &mut Summary, sites: &CallSiteReport) {
        for p in &mut summary.processes {
            if p.syscalls.is_empty() && !sites.counts.keys().any(|k| k.tgid == p.pid) {
                continue;
            }
            self.mappings.refresh(p.pid, Duration::ZERO);
            p.call_sites = Some(syscalls::stacks::top_call_sites(
                sites,
                p.pid,
                self.mappings.get(p.pid),
                self.top_stacks,
                &self.symbolizer,
            ));
        }
        summary.call_site_health = Some(CallSiteHealth {
            dropped: sites.dropped,
            evicted: sites.evicted,
        });
    }

    fn vma_activity(&mut self, activity: &vma::Activity) {
        if let vma::Activity::Call(call) = activity {
            // A region mapped and locked after the last /proc read is known from here only.
            for range in &call.after {
                self.mappings.note_vma(
                    activity.tgid(),
                    Mapping {
                        start: range.start,
                        end: range.end,
                        offset: 0,
                        name: format!("VMA seen by {}", call.syscall.syscall.name()),
                        locked: range.flags & VM_LOCKED != 0,
                        lockonfault: Some(range.flags & VM_LOCKONFAULT != 0),
                    },
                );
            }
            let changes = call.counts();
            let counts = self.vma.counts.entry(activity.tgid()).or_default();
            counts.merge(&changes);
            if let Some(window) = &mut self.window {
                let counts = window.vma_counts.entry(activity.tgid()).or_default();
                counts.merge(&changes);
            }
        }
        // VMA changes are shown with the syscall events that caused them.
        if !self.syscall_events {
            return;
        }
        let hooks = self.vma.hooks.as_ref();
        // A call's VMA lines carry the call's time; stores and functions outside calls carry
        // no kernel stamp: the time they were read.
        let ktime = match activity {
            vma::Activity::Call(c) => Some(c.syscall.raw.enter_ns),
            _ => None,
        };
        if self.json {
            self.emit(ktime, Some(vma::activity_json(activity, hooks)), &[]);
        } else {
            self.emit(ktime, None, &vma::activity_lines(activity, hooks));
        }
    }

    /// Snapshots the mappings of every process that has faulted: a process not read yet at
    /// once, the others when their snapshot is older than `max_age` times the number of
    /// processes, so that following many children (a forking server) does not multiply
    /// the re-reads.
    pub(super) fn refresh_mappings(&mut self, tracer: &Tracer, max_age: Duration) {
        if let Ok(pids) = tracer.fault_pids() {
            let max_age = max_age * u32::try_from(pids.len()).unwrap_or(u32::MAX).max(1);
            for pid in pids {
                self.mappings.refresh(pid, max_age);
            }
        }
    }

    pub(super) fn summary(&mut self, tracer: &Tracer, scope: Scope) -> Result<()> {
        // The events a summary covers are printed before it.
        self.order.flush(&mut self.out);
        let now = WallClock::now_ns();
        let mut health = tracer.health()?;
        health.processes.evicted_processes = self.aggregator.evicted_processes();
        let (kind, syscalls, start_ns) = match (&self.window, scope) {
            (Some(w), Scope::Interval) => ("interval", w.aggregator.summaries(), w.start_ns),
            _ => ("summary", self.aggregator.summaries(), self.started_ns),
        };
        let mut summary = Summary::new(kind, syscalls, health);
        summary.time_ns = now;
        summary.window = Window {
            start_ns,
            end_ns: now,
        };
        if let (Some(hooks), Some(report)) = (&tracer.fault_hooks, tracer.fault_report()?) {
            if let Some(metrics) = &self.metrics {
                self.update_fault_metrics(metrics, hooks, &report);
            }
            let shown = match (&mut self.window, scope) {
                (Some(w), Scope::Interval) => {
                    let shown = match &w.faults_before {
                        Some(before) => report.since(before),
                        None => report.clone(),
                    };
                    w.faults_before = Some(report);
                    shown
                }
                _ => report,
            };
            for &tgid in shown.regions.keys() {
                self.mappings.refresh(tgid, Duration::ZERO);
            }
            let mut per_process =
                faults::summarize(&shown, hooks, &mut self.mappings, self.top_mappings);
            if let Some(stacks) = &shown.stacks {
                faults::stacks::add_to(
                    &mut per_process,
                    stacks,
                    &mut self.mappings,
                    self.top_stacks,
                    &self.symbolizer,
                );
            }
            if let Some(tid) = self.tid {
                only_thread(&mut per_process, tid);
            }
            summary.add_faults(hooks.clone(), shown.health, per_process);
        }
        name_exited(&mut summary, &tracer.exit_comms()?);
        super::fold::fold_beyond(&mut summary, self.max_processes);
        if let Some(sites) = tracer.call_sites()? {
            self.add_call_sites(&mut summary, &sites);
        }
        if let Some(metrics) = &self.metrics {
            metrics.health.update(&summary.health);
        }
        let vma_counts = match (&mut self.window, scope) {
            (Some(w), Scope::Interval) => std::mem::take(&mut w.vma_counts),
            _ => self.vma.counts.clone(),
        };
        if let (Some(w), Scope::Interval) = (&mut self.window, scope) {
            // The next interval starts from nothing, as libbpf-tools clearing its maps.
            w.aggregator =
                Aggregator::with_max_processes(self.max_processes).per_thread(self.per_thread);
            w.start_ns = now;
        }
        // Rendered whole, so that a summary the output refuses is printed elsewhere, not lost.
        let mut rendered = Vec::new();
        let out = &mut rendered;
        if self.json {
            // Before the summary, which stays the last line.
            if !vma_counts.is_empty() {
                let mut v = vma::summary_json(&vma_counts);
                v["time_ns"] = now.into();
                v["window"] = serde_json::to_value(summary.window)?;
                writeln!(out, "{v}")?;
            }
            writeln!(out, "{}", serde_json::to_string(&summary)?)?;
        } else {
            // With --interval, a time header over every block, the final one included.
            if self.window.is_some() {
                let title = match scope {
                    Scope::Interval => "interval",
                    Scope::Session => "session summary",
                };
                writeln!(
                    out,
                    "--- {} {title} ({:.1} s) ---",
                    hms(now),
                    now.saturating_sub(start_ns) as f64 / 1e9
                )?;
            }
            for (pid, counts) in &vma_counts {
                writeln!(out, "{}", vma::summary_line(*pid, counts))?;
            }
            write!(out, "{}", summary_text(&summary, self.style))?;
        }
        self.out.write_result(&rendered)
    }
}

/// The thread a VMA activity belongs to.
fn activity_tid(activity: &vma::Activity) -> u32 {
    match activity {
        vma::Activity::Call(c) => c.syscall.raw.tid,
        vma::Activity::Store(s) => s.tid,
        vma::Activity::Func(f) => f.tid,
    }
}

/// `-t TID`: each process's faults become its thread's (the kernel keeps them per thread).
fn only_thread(per_process: &mut BTreeMap<u32, (String, faults::FaultSummary)>, tid: u32) {
    per_process.retain(|_, (_, f)| f.threads.iter().any(|t| t.tid == tid));
    for (comm, f) in per_process.values_mut() {
        let Some(thread) = f.threads.iter().find(|t| t.tid == tid).cloned() else {
            continue;
        };
        *comm = thread.comm;
        let mappings = std::mem::take(&mut f.by_mapping);
        *f = thread.faults;
        // Mappings are counted per process only.
        f.by_mapping = mappings;
    }
}

/// An exited process is named as it was at its exit (after any exec), not by its first
/// event or an older /proc snapshot; so is its main thread.
fn name_exited(summary: &mut Summary, exit_comms: &BTreeMap<ProcessKey, String>) {
    for p in &mut summary.processes {
        let Some(comm) = exit_comms
            .iter()
            .find(|(k, _)| k.tgid == p.pid && (p.start_ns == 0 || k.start_ns == p.start_ns))
            .map(|(_, c)| c)
        else {
            continue;
        };
        p.comm.clone_from(comm);
        if let Some(f) = &mut p.faults {
            for t in f.threads.iter_mut().filter(|t| t.tid == p.pid) {
                t.comm.clone_from(comm);
            }
        }
    }
}

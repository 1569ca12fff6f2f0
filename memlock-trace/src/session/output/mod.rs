//! What the event loop does with what arrives: decodes each record, feeds the families'
//! aggregation and the metrics, prints event lines, and puts the summary together.

use std::{collections::BTreeMap, io::Write as _, os::fd::AsRawFd as _, sync::Arc, time::Duration};

use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use memlock_trace_common::vma::{VM_LOCKED, VM_LOCKONFAULT};

mod config;
mod metrics;
mod naming;
mod profiles;

pub(super) use config::{OutputConfig, OutputStart};
use naming::{name_exited, only_thread};

use super::{
    order::Reorder,
    summary::{CallSiteHealth, Summary, Window, summary_text},
};
use crate::{
    event::{Event, decode},
    faults::{
        self, FaultReport, render as fault_render,
        stacks::{StackReport, StackSymbolizer},
    },
    metrics::Metrics,
    output::{Sink, WallClock, hms},
    process::{
        cgroup::CgroupPaths,
        table::{ProcessKey, ProcessTable},
    },
    procfs::{Mapping, MappingCache},
    syscalls::{self, Aggregator, read::SyscallReport, stacks::CallSiteReport},
    tracer::Tracer,
    unwind::StackCollector,
    vma::{self, VmaHooks},
};

/// How long one drain may read before the loop attends to its timers and signals.
const DRAIN_BUDGET: Duration = Duration::from_millis(50);

pub(super) struct Output {
    /// What the arguments ask of the output.
    pub(super) config: OutputConfig,
    /// Stdout, or `-o FILE`.
    pub(super) out: Sink,
    pub(super) clock: WallClock,
    /// `--interval`: what the current interval has seen.
    pub(super) window: Option<IntervalState>,
    /// When the session started, CLOCK_REALTIME ns.
    pub(super) started_ns: u64,
    pub(super) aggregator: Aggregator,
    pub(super) undecodable: u64,
    pub(super) metrics: Option<Arc<Metrics>>,
    pub(super) vma: VmaOutput,
    pub(super) mappings: MappingCache,
    /// Keeps the files it parsed from one summary to the next.
    pub(super) symbolizer: StackSymbolizer,
    /// `--stacks`: the kept stacks, unwound, and the modules of every process.
    pub(super) stacks: Option<StackCollector>,
    /// Event lines waiting for their turn in time order.
    pub(super) order: Reorder,
    /// Cgroup ids to paths, kept from one summary to the next.
    pub(super) cgroups: CgroupPaths,
    /// When each exited process's fault count can be checked against the kernel's.
    pub(super) exit_check: Option<ExitCheck>,
    /// `--folded`, `--flamegraph`, `--pprof`: written at the end of the session.
    pub(super) profiles: crate::profile::ProfileFiles,
}

/// Which processes the fault family counted from their very start, so that the kernel's
/// count at their exit is what the summary should say.
pub(super) struct ExitCheck {
    /// CLOCK_BOOTTIME when the hooks were attached: processes started later.
    pub(super) attached_ns: u64,
    /// The launched command: its faults before exec are not counted, by design.
    pub(super) launched: Option<u32>,
}

/// One interval's own figures: reset when its block is printed.
pub(super) struct IntervalState {
    pub(super) aggregator: Aggregator,
    pub(super) vma_counts: BTreeMap<u32, vma::ChangeCounts>,
    /// The fault maps as read at the interval's start.
    pub(super) faults_before: Option<FaultReport>,
    /// The kernel's call counts as read at the interval's start.
    pub(super) syscalls_before: Option<SyscallReport>,
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
    /// Per process, bounded as the call statistics are (`--max-processes`, the least
    /// recently changed evicted): keyed by pid, it grew with every process that ever locked
    /// memory, for as long as a system-wide session ran.
    pub(super) counts: ProcessTable<vma::ChangeCounts>,
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
            let stamp = if self.config.timestamps {
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
        self.config.tid.is_none_or(|t| t == tid)
    }

    /// `--stacks`: unwinds the kept stacks waiting in their ring.
    pub(super) fn drain_stacks(&mut self, ring: &mut RingBuf<MapData>) {
        if let Some(stacks) = &mut self.stacks {
            stacks.drain(ring);
            // Generated code is named from its runtime's perf map, read while it runs.
            for tgid in stacks.modules.with_generated_code() {
                self.symbolizer.perf_maps.refresh(tgid);
            }
        }
    }

    /// The kernel's fault aggregation, with the unwound fault stacks (`--stacks`).
    fn fault_report(&self, tracer: &Tracer) -> Result<Option<FaultReport>> {
        let Some(mut report) = tracer.fault_report()? else {
            return Ok(None);
        };
        if let (Some(stacks), Some((_, dropped))) = (&self.stacks, tracer.stacks_dropped()?) {
            report.health.stacks_dropped = Some(dropped);
            report.health.stacks_evicted = Some(0);
            report.health.stacks_sample_every = Some(self.config.stack_sample);
            report.health.stack_unwinding = Some(stacks.health);
            report.stacks = Some(StackReport {
                counts: stacks.faults.clone(),
                sites: stacks.fault_sites.clone(),
                dropped,
                evicted: 0,
                sample_every: self.config.stack_sample,
            });
        }
        Ok(Some(report))
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
                    if self.config.syscall_events {
                        let unit = self.config.style.unit;
                        let (json, lines) = if self.config.json {
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
                    if self.config.fault_events && self.wanted(rec.raw.tid) {
                        let (json, lines) = if self.config.json {
                            (Some(fault_render::fault_json(&rec)), vec![])
                        } else {
                            (
                                None,
                                vec![fault_render::fault_line(&rec, self.config.style.unit)],
                            )
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

    /// `--stacks`: each process's top mlock-family call sites, symbolized with its kept
    /// modules.
    fn add_call_sites(&self, summary: &mut Summary, sites: &CallSiteReport) {
        let Some(stacks) = &self.stacks else { return };
        for p in &mut summary.processes {
            if p.syscalls.is_empty() && !sites.counts.keys().any(|k| k.tgid == p.pid) {
                continue;
            }
            p.call_sites = Some(syscalls::stacks::top_call_sites(
                sites,
                p.pid,
                stacks.modules.get(p.pid),
                self.config.top_stacks,
                &self.symbolizer,
            ));
        }
        summary.call_site_health = Some(CallSiteHealth {
            dropped: sites.dropped,
            evicted: sites.evicted,
            unwinding: stacks.health,
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
                        name: format!("VMA seen by {}", call.syscall.syscall.name()).into(),
                        locked: range.flags & VM_LOCKED != 0,
                        lockonfault: Some(range.flags & VM_LOCKONFAULT != 0),
                        pages: crate::procfs::PageSizes::default(),
                    },
                );
            }
            let changes = call.counts();
            // By pid, as before: a VMA record carries no start time.
            let process = ProcessKey {
                tgid: activity.tgid(),
                _pad: 0,
                start_ns: 0,
            };
            let counts = self
                .vma
                .counts
                .get_or_insert_with(process, Default::default);
            counts.merge(&changes);
            if let Some(window) = &mut self.window {
                let counts = window.vma_counts.entry(activity.tgid()).or_default();
                counts.merge(&changes);
            }
        }
        // VMA changes are shown when asked for (`--events`, `--events=syscalls`, `--events=calls,vma`).
        if !self.config.vma_events {
            return;
        }
        let hooks = self.vma.hooks.as_ref();
        // A call's VMA lines carry the call's time; stores and functions outside calls carry
        // no kernel stamp: the time they were read.
        let ktime = match activity {
            vma::Activity::Call(c) => Some(c.syscall.raw.enter_ns),
            _ => None,
        };
        if self.config.json {
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
        if scope == Scope::Session {
            self.finish_perf_maps();
        }
        let now = WallClock::now_ns();
        let mut health = tracer.health()?;
        health.processes.evicted_processes = self.aggregator.evicted_processes();
        // The counts before the identities (see `update_health`).
        let mut calls = tracer.syscall_report()?;
        let fault_report = self.fault_report(tracer)?;
        let identities = tracer.identities()?;
        if self.config.tid.is_some() {
            // The kernel counts per process: `-t`'s thread is counted from its records.
            calls.counts.clear();
        }
        let syscall_health = calls.health;
        let (kind, events, start_ns, shown) = match (&mut self.window, scope) {
            (Some(w), Scope::Interval) => {
                let shown = match &w.syscalls_before {
                    Some(before) => calls.since(before),
                    None => calls.clone(),
                };
                w.syscalls_before = Some(calls.clone());
                ("interval", w.aggregator.summaries(), w.start_ns, shown)
            }
            _ => (
                "summary",
                self.aggregator.summaries(),
                self.started_ns,
                calls.clone(),
            ),
        };
        // Every process the kernel counted: `fold` below lists the --max-processes most
        // active and keeps the others' calls in their name's totals.
        let syscalls = syscalls::read::merge(events, &shown, &calls, |k| {
            identities.get(k).map(|i| i.comm.clone())
        });
        let mut summary = Summary::new(kind, syscalls, health);
        summary.syscall_health = Some(syscall_health);
        summary.time_ns = now;
        summary.window = Window {
            start_ns,
            end_ns: now,
        };
        if let (Some(hooks), Some(report)) = (&tracer.fault_hooks, fault_report) {
            if let Some(metrics) = self.metrics.clone() {
                // The counts only: the mappings and regions are not the metrics'.
                let counts = FaultReport {
                    stats: report.stats.clone(),
                    hists: report.hists.clone(),
                    health: report.health,
                    ..FaultReport::default()
                };
                self.update_fault_metrics(&metrics, hooks, counts, &identities);
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
                faults::summarize(&shown, hooks, &mut self.mappings, self.config.top_mappings);
            if let (Some(stacks), Some(collector)) = (&shown.stacks, &self.stacks) {
                faults::stacks::add_to(
                    &mut per_process,
                    stacks,
                    &collector.modules,
                    self.config.top_stacks,
                    &self.symbolizer,
                );
            }
            if let Some(tid) = self.config.tid {
                only_thread(&mut per_process, tid);
            }
            summary.add_faults(hooks.clone(), shown.health, per_process);
        }
        self.identify(&mut summary, &identities);
        name_exited(&mut summary, &tracer.exit_comms()?);
        if self.config.by_cgroup {
            summary.cgroups = Some(super::groups::by_cgroup(&summary.processes));
        }
        if let Some(folded) =
            super::fold::fold_beyond(&mut summary.processes, self.config.max_processes)
        {
            summary.folded = Some(folded);
        }
        if let (Some(stacks), Some((dropped, _))) = (&self.stacks, tracer.stacks_dropped()?) {
            let sites = CallSiteReport {
                counts: stacks.calls.clone(),
                dropped,
                evicted: 0,
            };
            self.add_call_sites(&mut summary, &sites);
        }
        summary.health.unreadable_mappings = self.mappings.unreadable();
        if let Some(metrics) = &self.metrics {
            metrics.health.update(&summary.health);
        }
        let vma_counts = match (&mut self.window, scope) {
            (Some(w), Scope::Interval) => std::mem::take(&mut w.vma_counts),
            _ => self.vma.counts.iter().map(|(k, c)| (k.tgid, *c)).collect(),
        };
        let vma_evicted = match scope {
            Scope::Interval if self.window.is_some() => 0,
            _ => self.vma.counts.evicted(),
        };
        if let (Some(w), Scope::Interval) = (&mut self.window, scope) {
            // The next interval starts from nothing, as libbpf-tools clearing its maps.
            w.aggregator = self.config.aggregator();
            w.start_ns = now;
        }
        // Rendered whole, so that a summary the output refuses is printed elsewhere, not lost.
        let mut rendered = Vec::new();
        let out = &mut rendered;
        if self.config.json {
            // Before the summary, which stays the last line.
            if !vma_counts.is_empty() {
                let mut v = vma::summary_json(&vma_counts, vma_evicted);
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
            if vma_evicted > 0 {
                writeln!(
                    out,
                    "VMA changes of {vma_evicted} more processes not listed (--max-processes {})",
                    self.config.max_processes
                )?;
            }
            write!(out, "{}", summary_text(&summary, self.config.style))?;
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

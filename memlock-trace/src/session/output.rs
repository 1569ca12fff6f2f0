//! What the event loop does with what arrives: decodes each record, feeds the families'
//! aggregation and the metrics, prints event lines, and puts the summary together.

use std::{collections::BTreeMap, io::Write as _, sync::Arc, time::Duration};

use anyhow::Result;
use aya::maps::{MapData, RingBuf};

use super::summary::{CallSiteHealth, Summary, summary_text};
use crate::{
    event::{Event, decode},
    faults::{self, FaultHooks, FaultReport, render as fault_render, stacks::StackSymbolizer},
    metrics::Metrics,
    procfs::MappingCache,
    syscalls::{self, Aggregator, stacks::CallSiteReport},
    tracer::Tracer,
    vma::{self, VmaHooks},
};

pub(super) struct Output {
    pub(super) json: bool,
    pub(super) syscall_events: bool,
    pub(super) fault_events: bool,
    pub(super) aggregator: Aggregator,
    pub(super) undecodable: u64,
    pub(super) metrics: Option<Arc<Metrics>>,
    pub(super) vma: VmaOutput,
    pub(super) mappings: MappingCache,
    pub(super) top_mappings: usize,
    pub(super) top_stacks: usize,
    /// Keeps the files it parsed from one summary to the next.
    pub(super) symbolizer: StackSymbolizer,
}

/// VMA events: paired with their calls by the tracker, counted per process.
#[derive(Default)]
pub(super) struct VmaOutput {
    pub(super) tracker: vma::Tracker,
    pub(super) hooks: Option<VmaHooks>,
    pub(super) counts: BTreeMap<u32, vma::ChangeCounts>,
}

impl Output {
    pub(super) fn drain(&mut self, ring: &mut RingBuf<MapData>) {
        let mut stdout = std::io::stdout().lock();
        let (mut syscalls, mut vmas, undecodable_before) = (0, 0, self.undecodable);
        while let Some(item) = ring.next() {
            match decode(&item) {
                Ok(Event::Syscall(rec)) => {
                    syscalls += 1;
                    self.aggregator.record_syscall(&rec);
                    if let Some(metrics) = &self.metrics {
                        metrics.syscalls.record(&rec);
                    }
                    if self.syscall_events {
                        let line = if self.json {
                            syscalls::render::syscall_json(&rec).to_string()
                        } else {
                            syscalls::render::syscall_line(&rec)
                        };
                        let _ = writeln!(stdout, "{line}");
                    }
                    if let Some(activity) = self.vma.tracker.syscall(&rec) {
                        self.vma_activity(&activity, &mut stdout);
                    }
                }
                Ok(Event::Vma(record)) => {
                    vmas += 1;
                    if let Some(activity) = self.vma.tracker.record(record) {
                        self.vma_activity(&activity, &mut stdout);
                    }
                }
                Ok(Event::Fault(rec)) => {
                    if self.fault_events {
                        let line = if self.json {
                            fault_render::fault_json(&rec).to_string()
                        } else {
                            fault_render::fault_line(&rec)
                        };
                        let _ = writeln!(stdout, "{line}");
                    }
                }
                Err(_) => self.undecodable += 1,
            }
        }
        let _ = stdout.flush();
        if let Some(metrics) = &self.metrics {
            metrics.health.record_events(
                &[("syscall", syscalls), ("vma", vmas)],
                self.undecodable - undecodable_before,
            );
        }
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

    fn vma_activity(&mut self, activity: &vma::Activity, out: &mut impl std::io::Write) {
        if let vma::Activity::Call(call) = activity {
            let counts = self.vma.counts.entry(activity.tgid()).or_default();
            counts.merge(&vma::ChangeCounts::of(&call.changes));
        }
        // VMA changes are shown with the syscall events that caused them.
        if !self.syscall_events {
            return;
        }
        let hooks = self.vma.hooks.as_ref();
        if self.json {
            let _ = writeln!(out, "{}", vma::activity_json(activity, hooks));
        } else {
            for line in vma::activity_lines(activity, hooks) {
                let _ = writeln!(out, "{line}");
            }
        }
    }

    /// Snapshots the mappings of every process that has faulted.
    pub(super) fn refresh_mappings(&mut self, tracer: &Tracer, max_age: Duration) {
        if let Ok(pids) = tracer.fault_pids() {
            for pid in pids {
                self.mappings.refresh(pid, max_age);
            }
        }
    }

    pub(super) fn summary(&mut self, tracer: &Tracer, kind: &'static str) -> Result<()> {
        let mut health = tracer.health()?;
        health.processes.evicted_processes = self.aggregator.evicted_processes();
        let mut summary = Summary::new(kind, self.aggregator.summaries(), health);
        if let (Some(hooks), Some(report)) = (&tracer.fault_hooks, tracer.fault_report()?) {
            if let Some(metrics) = &self.metrics {
                self.update_fault_metrics(metrics, hooks, &report);
            }
            for &tgid in report.regions.keys() {
                self.mappings.refresh(tgid, Duration::ZERO);
            }
            let mut per_process =
                faults::summarize(&report, hooks, &mut self.mappings, self.top_mappings);
            if let Some(stacks) = &report.stacks {
                faults::stacks::add_to(
                    &mut per_process,
                    stacks,
                    &mut self.mappings,
                    self.top_stacks,
                    &self.symbolizer,
                );
            }
            summary.add_faults(hooks.clone(), report.health, per_process);
        }
        if let Some(sites) = tracer.call_sites()? {
            self.add_call_sites(&mut summary, &sites);
        }
        if let Some(metrics) = &self.metrics {
            metrics.health.update(&summary.health);
        }
        let mut stdout = std::io::stdout().lock();
        if self.json {
            // Before the summary, which stays the last line.
            if !self.vma.counts.is_empty() {
                writeln!(stdout, "{}", vma::summary_json(&self.vma.counts))?;
            }
            writeln!(stdout, "{}", serde_json::to_string(&summary)?)?;
        } else {
            for (pid, counts) in &self.vma.counts {
                writeln!(stdout, "{}", vma::summary_line(*pid, counts))?;
            }
            if kind == "interval" {
                writeln!(stdout, "--- interval summary ---")?;
            }
            write!(stdout, "{}", summary_text(&summary))?;
        }
        stdout.flush()?;
        Ok(())
    }
}

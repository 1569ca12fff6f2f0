//! The summary of a session or an interval: the families' figures read back, put together
//! per process, and rendered whole (text or JSON) before it is written.

use std::{collections::BTreeMap, io::Write as _, time::Duration};

use anyhow::Result;

use super::{Output, Scope, name_exited, only_thread};
use crate::{
    faults::{self, FaultHooks, FaultReport, stacks::StackReport},
    output::{WallClock, hms},
    process::{identity::Identity, table::ProcessKey},
    session::summary::{CallSiteHealth, Summary, Window, summary_text},
    syscalls::{self, read::SyscallReport, stacks::CallSiteReport},
    tracer::{Health, Tracer},
    vma,
};

impl Output {
    /// The kernel's fault aggregation, with the unwound fault stacks (`--stacks`).
    pub(super) fn fault_report(&self, tracer: &Tracer) -> Result<Option<FaultReport>> {
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

    pub(in crate::session) fn summary(&mut self, tracer: &Tracer, scope: Scope) -> Result<()> {
        // The events a summary covers are printed before it.
        self.order.flush(&mut self.out);
        if scope == Scope::Session {
            self.finish_perf_maps();
        }
        let now = WallClock::now_ns();
        let mut health = tracer.health()?;
        health.processes.evicted_processes = self.aggregator.evicted_processes();
        // The counts before the identities (see `update_health`).
        let calls = tracer.syscall_report()?;
        let fault_report = self.fault_report(tracer)?;
        let identities = tracer.identities()?;
        let mut summary = self.calls_summary(calls, health, &identities, scope, now);
        if let (Some(hooks), Some(report)) = (&tracer.fault_hooks, fault_report) {
            self.add_faults(&mut summary, hooks, report, &identities, scope);
        }
        self.identify(&mut summary, &identities);
        name_exited(&mut summary, &tracer.exit_comms()?);
        if self.config.by_cgroup {
            summary.cgroups = Some(crate::session::groups::by_cgroup(&summary.processes));
        }
        if let Some(folded) =
            crate::session::fold::fold_beyond(&mut summary.processes, self.config.max_processes)
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
        let vma = self.vma_counts(scope, now);
        // Rendered whole, so that a summary the output refuses is printed elsewhere, not lost.
        let rendered = self.render(&summary, scope, &vma)?;
        self.out.write_result(&rendered)
    }

    /// The summary of the mlock-family calls: the interval's (what the kernel counted since
    /// the interval began), or the session's, with the tracer's health.
    fn calls_summary(
        &mut self,
        mut calls: SyscallReport,
        health: Health,
        identities: &BTreeMap<ProcessKey, Identity>,
        scope: Scope,
        now: u64,
    ) -> Summary {
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
        // Every process the kernel counted: `fold` lists the --max-processes most active
        // and keeps the others' calls in their name's totals.
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
        summary
    }

    /// Adds the fault family's part: the interval's faults (or the session's) per process,
    /// attributed to their mappings, with their stacks; the metrics take the counts.
    fn add_faults(
        &mut self,
        summary: &mut Summary,
        hooks: &FaultHooks,
        report: FaultReport,
        identities: &BTreeMap<ProcessKey, Identity>,
        scope: Scope,
    ) {
        if let Some(metrics) = self.metrics.clone() {
            // The counts only: the mappings and regions are not the metrics'.
            let counts = FaultReport {
                stats: report.stats.clone(),
                hists: report.hists.clone(),
                health: report.health,
                ..FaultReport::default()
            };
            self.update_fault_metrics(&metrics, hooks, counts, identities);
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

    /// The VMA changes the summary covers, per pid, and how many processes' were evicted;
    /// an interval's are taken, and the next interval starts from nothing.
    fn vma_counts(&mut self, scope: Scope, now: u64) -> VmaCounts {
        let counts = match (&mut self.window, scope) {
            (Some(w), Scope::Interval) => std::mem::take(&mut w.vma_counts),
            _ => self.vma.counts.iter().map(|(k, c)| (k.tgid, *c)).collect(),
        };
        let evicted = match scope {
            Scope::Interval if self.window.is_some() => 0,
            _ => self.vma.counts.evicted(),
        };
        if let (Some(w), Scope::Interval) = (&mut self.window, scope) {
            // The next interval starts from nothing, as libbpf-tools clearing its maps.
            w.aggregator = self.config.aggregator();
            w.start_ns = now;
        }
        VmaCounts { counts, evicted }
    }

    /// The summary as the output prints it: JSON lines, or text blocks.
    fn render(&self, summary: &Summary, scope: Scope, vma: &VmaCounts) -> Result<Vec<u8>> {
        let now = summary.time_ns;
        let mut rendered = Vec::new();
        let out = &mut rendered;
        if self.config.json {
            // Before the summary, which stays the last line.
            if !vma.counts.is_empty() {
                let mut v = vma::summary_json(&vma.counts, vma.evicted);
                v["time_ns"] = now.into();
                v["window"] = serde_json::to_value(summary.window)?;
                writeln!(out, "{v}")?;
            }
            writeln!(out, "{}", serde_json::to_string(summary)?)?;
            return Ok(rendered);
        }
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
                now.saturating_sub(summary.window.start_ns) as f64 / 1e9
            )?;
        }
        for (pid, counts) in &vma.counts {
            writeln!(out, "{}", vma::summary_line(*pid, counts))?;
        }
        if vma.evicted > 0 {
            writeln!(
                out,
                "VMA changes of {} more processes not listed (--max-processes {})",
                vma.evicted, self.config.max_processes
            )?;
        }
        write!(out, "{}", summary_text(summary, self.config.style))?;
        Ok(rendered)
    }
}

/// The VMA changes a summary covers.
struct VmaCounts {
    /// Per pid.
    counts: BTreeMap<u32, vma::ChangeCounts>,
    /// Processes whose changes were evicted (`--max-processes`).
    evicted: u64,
}

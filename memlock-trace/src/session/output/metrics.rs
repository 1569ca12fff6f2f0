//! The per-process series: each refresh's kernel counts labelled with the name and cgroup
//! the kernel recorded for each process.

use std::collections::BTreeMap;

use anyhow::Result;

use super::Output;
use crate::{
    faults::{self, FaultHooks, FaultReport},
    metrics::Metrics,
    process::{identity::Identity, table::ProcessKey},
    syscalls::read::SyscallReport,
    tracer::Tracer,
};

impl Output {
    /// The tracer's health with the aggregator's evictions, and the fault family's figures,
    /// pushed to the metrics.
    pub(in crate::session) fn update_health(&mut self, tracer: &Tracer) -> Result<()> {
        if let Some(metrics) = self.metrics.clone() {
            let mut health = tracer.health()?;
            health.processes.evicted_processes = self.aggregator.evicted_processes();
            metrics.health.update(&health);
            metrics.maps.update_memory(&tracer.ebpf);
            // The counts before the identities: the kernel records who a process is before
            // its first count, so every process counted here has one (no series without
            // its cgroup label for a process that appeared in between).
            let calls = tracer.syscall_report()?;
            let faults = self.fault_report(tracer)?;
            let identities = tracer.identities()?;
            self.update_call_metrics(&metrics, &calls, &identities);
            if let (Some(hooks), Some(report)) = (&tracer.fault_hooks, faults) {
                metrics.maps.update(&tracer.ebpf, &report.map_entries());
                self.update_fault_metrics(&metrics, hooks, report, &identities);
            }
        }
        Ok(())
    }

    /// A process's name and cgroup path for its series: as the kernel recorded them (after
    /// its last exec, alive or exited), else /proc's or the last mappings' name.
    fn process_labels(
        &mut self,
        key: &ProcessKey,
        identities: &BTreeMap<ProcessKey, Identity>,
    ) -> (Option<String>, String) {
        match identities.get(key) {
            Some(id) => (
                Some(id.comm.to_str_lossy().into_owned()),
                self.cgroups.info(id.cgroup_id).label(),
            ),
            None => (
                crate::procfs::read_comm(key.tgid)
                    .or_else(|| self.mappings.comm(key.tgid))
                    .map(|c| c.to_str_lossy().into_owned()),
                String::new(),
            ),
        }
    }

    fn update_call_metrics(
        &mut self,
        metrics: &Metrics,
        report: &SyscallReport,
        identities: &BTreeMap<ProcessKey, Identity>,
    ) {
        // Asked only for the processes with something new: most have exited.
        metrics.syscalls.update(report, |k| {
            let (comm, cgroup) = self.process_labels(k, identities);
            (comm.unwrap_or_default(), cgroup)
        });
    }

    /// Takes the report: its statistics and histograms move into the per-process view
    /// (see [`faults::summary::by_process`]).
    pub(super) fn update_fault_metrics(
        &mut self,
        metrics: &Metrics,
        hooks: &FaultHooks,
        report: FaultReport,
        identities: &BTreeMap<ProcessKey, Identity>,
    ) {
        let processes = faults::summary::by_process(report.stats, report.hists);
        metrics
            .faults
            .update(processes, hooks, &report.health, |k| {
                self.process_labels(k, identities)
            });
    }
}

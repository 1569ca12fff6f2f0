//! Who each process of a summary is: its name after its last exec and its cgroup, as the
//! kernel recorded them.

use std::collections::BTreeMap;

use super::Output;
use crate::{
    faults,
    output::Outside,
    process::{identity::Identity, table::ProcessKey},
    session::summary::Summary,
};

impl Output {
    /// Names each process as the kernel recorded it (after its last exec, or at its exit)
    /// and gives its cgroup.
    pub(super) fn identify(
        &mut self,
        summary: &mut Summary,
        identities: &BTreeMap<ProcessKey, Identity>,
    ) {
        for p in &mut summary.processes {
            let key = ProcessKey {
                tgid: p.pid,
                _pad: 0,
                start_ns: p.start_ns,
            };
            let Some(id) = identities.get(&key) else {
                continue;
            };
            // A name from the first event is older than /proc's, unless an exec or the exit
            // set it.
            if !id.comm.is_empty() && (id.execed || id.exited || p.comm.is_empty()) {
                p.comm.clone_from(&id.comm);
                if let Some(f) = &mut p.faults {
                    for t in f.threads.iter_mut().filter(|t| t.tid == p.pid) {
                        t.comm.clone_from(&id.comm);
                    }
                }
            }
            p.cgroup = Some(self.cgroups.info(id.cgroup_id));
            let checked = self
                .exit_check
                .as_ref()
                .is_some_and(|c| p.start_ns > c.attached_ns && c.launched != Some(p.pid));
            if let (Some(kernel), true) = (id.exit_faults, checked) {
                let counted = p.faults.as_ref().map_or(0, |f| f.minor + f.major);
                p.kernel_faults = Some(kernel);
                p.faults_missing = Some(kernel.saturating_sub(counted));
            }
        }
    }
}

/// `-t TID`: each process's faults become its thread's (the kernel keeps them per thread).
pub(super) fn only_thread(
    per_process: &mut BTreeMap<ProcessKey, (Outside, faults::FaultSummary)>,
    tid: u32,
) {
    per_process.retain(|_, (_, f)| f.threads.iter().any(|t| t.tid == tid));
    for (comm, f) in per_process.values_mut() {
        let Some(thread) = f.threads.iter().find(|t| t.tid == tid).cloned() else {
            continue;
        };
        *comm = thread.comm;
        let mappings = std::mem::take(&mut f.by_mapping);
        let left_out = f.by_mapping_left_out;
        *f = thread.faults;
        // Mappings are counted per process only.
        f.by_mapping = mappings;
        f.by_mapping_left_out = left_out;
    }
}

/// An exited process is named as it was at its exit (after any exec), not by its first
/// event or an older /proc snapshot; so is its main thread.
pub(super) fn name_exited(summary: &mut Summary, exit_comms: &BTreeMap<ProcessKey, Outside>) {
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

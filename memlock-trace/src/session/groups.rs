//! `--by cgroup`: the summary's processes folded into their cgroups, for operators who ask
//! "which service, which container" before "which process".

use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use super::process_summary::ProcessSummary;
use crate::{
    output::{Outside, Unit},
    process::cgroup::CgroupInfo,
};

/// One cgroup's processes, added up.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CgroupSummary {
    /// `None`: processes the kernel recorded no cgroup for (counted before the identity was
    /// kept, or evicted from its map).
    pub cgroup: Option<CgroupInfo>,
    pub processes: u64,
    /// The names of its processes, each once.
    pub comms: Vec<Outside>,
    pub syscalls: BTreeMap<&'static str, CallTotals>,
    /// Faults minor + major of all its processes.
    pub faults_minor: u64,
    pub faults_major: u64,
}

/// One call's totals over a cgroup's processes (percentiles do not add up; the maximum does).
#[derive(Clone, Debug, Default, Serialize)]
pub struct CallTotals {
    pub count: u64,
    pub errors: BTreeMap<String, u64>,
    pub pages_populated: u64,
    pub pages_locked: i64,
    pub max_latency_ns: u64,
}

/// Folds `processes` by cgroup id, largest activity first.
pub fn by_cgroup(processes: &[ProcessSummary]) -> Vec<CgroupSummary> {
    let mut groups: BTreeMap<Option<u64>, CgroupSummary> = BTreeMap::new();
    for p in processes {
        let g = groups.entry(p.cgroup.as_ref().map(|c| c.id)).or_default();
        g.cgroup.clone_from(&p.cgroup);
        g.processes += 1;
        if !g.comms.contains(&p.comm) {
            g.comms.push(p.comm.clone());
        }
        for (name, s) in &p.syscalls {
            let t = g.syscalls.entry(name).or_default();
            t.count += s.count;
            for (errno, n) in &s.errors {
                *t.errors.entry(errno.clone()).or_default() += n;
            }
            t.pages_populated += s.pages_populated;
            t.pages_locked += s.pages_locked;
            t.max_latency_ns = t.max_latency_ns.max(s.latency_ns.max);
        }
        if let Some(f) = &p.faults {
            g.faults_minor += f.minor;
            g.faults_major += f.major;
        }
    }
    let mut out: Vec<CgroupSummary> = groups.into_values().collect();
    let activity =
        |g: &CgroupSummary| g.syscalls.values().map(|s| s.count).sum::<u64>() + g.faults_minor;
    out.sort_by_key(|g| std::cmp::Reverse(activity(g)));
    out
}

/// The text blocks of `--by cgroup`; the latency column in `unit`, fitted to the column
/// over every cgroup (`-m`/`-u` fix it), as the per-process tables show theirs.
pub fn text(out: &mut String, groups: &[CgroupSummary], unit: Unit) {
    let unit = unit.fit(
        groups
            .iter()
            .flat_map(|g| g.syscalls.values().map(|s| s.max_latency_ns)),
    );
    for g in groups {
        let name = g.cgroup.as_ref().map_or_else(
            || "cgroup unknown".to_string(),
            |c| format!("cgroup {}", Outside::from(c.label())),
        );
        let mut what = Vec::new();
        if let Some(c) = &g.cgroup {
            what.extend(
                c.unit
                    .as_deref()
                    .map(|u| format!("unit {}", Outside::from(u))),
            );
            if let (Some(runtime), Some(id)) = (c.runtime, &c.container_id) {
                let id = Outside::from(&id.as_bytes()[..12.min(id.len())]);
                what.push(format!("{runtime} container {id}"));
            }
            what.extend(
                c.pod_uid
                    .as_deref()
                    .map(|u| format!("pod {}", Outside::from(u))),
            );
        }
        let what = if what.is_empty() {
            String::new()
        } else {
            format!(" ({})", what.join(", "))
        };
        let plural = if g.processes == 1 { "" } else { "es" };
        let _ = writeln!(
            out,
            "{name}{what}: {} process{plural} ({})",
            g.processes,
            g.comms
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        if g.faults_minor + g.faults_major > 0 {
            let _ = writeln!(
                out,
                "  page faults: {} minor, {} major",
                g.faults_minor, g.faults_major
            );
        }
        if !g.syscalls.is_empty() {
            let _ = writeln!(
                out,
                "  {:<11} {:>9}  {:>16} {:>13}  {:>11}  errors",
                "syscall", "calls", "populated pages", "locked pages", "max latency"
            );
        }
        for (name, s) in &g.syscalls {
            let errors = crate::syscalls::render::errors_cell(&s.errors);
            let _ = writeln!(
                out,
                "  {name:<11} {:>9}  {:>16} {:>+13}  {:>11}  {errors}",
                s.count,
                s.pages_populated,
                s.pages_locked,
                unit.format(s.max_latency_ns)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{latency::Latency, process::cgroup, syscalls::SyscallSummary};

    fn process(pid: u32, comm: &str, path: Option<&str>, calls: u64) -> ProcessSummary {
        let cgroup = path.map(|p| CgroupInfo {
            id: p.len() as u64,
            path: Some(p.into()),
            ..cgroup::parse(p)
        });
        let mut syscalls = BTreeMap::new();
        syscalls.insert(
            "mlock",
            SyscallSummary {
                count: calls,
                errors: BTreeMap::from([("ENOMEM".to_string(), 1)]),
                last_failure: BTreeMap::new(),
                latency_ns: Latency {
                    max: 1000 * u64::from(pid),
                    ..Latency::default()
                },
                latency_values: Vec::new(),
                pages_populated: calls,
                faults_populated: calls,
                pages_locked: calls as i64,
            },
        );
        ProcessSummary {
            pid,
            start_ns: 1,
            comm: comm.into(),
            cgroup,
            syscalls,
            faults: None,
            kernel_faults: None,
            faults_missing: None,
            thread_latencies: BTreeMap::new(),
            call_sites: None,
        }
    }

    #[test]
    fn processes_fold_into_their_cgroups() {
        let groups = by_cgroup(&[
            process(1, "db", Some("/system.slice/db.service"), 10),
            process(2, "db", Some("/system.slice/db.service"), 5),
            process(3, "sh", Some("/user.slice/user-0.slice/session-1.scope"), 1),
            process(4, "old", None, 1),
        ]);
        assert_eq!(groups.len(), 3);
        let db = &groups[0];
        assert_eq!(
            (db.processes, db.comms.clone()),
            (2, vec![Outside::from("db")])
        );
        let mlock = &db.syscalls["mlock"];
        assert_eq!((mlock.count, mlock.errors["ENOMEM"]), (15, 2));
        assert_eq!((mlock.pages_locked, mlock.max_latency_ns), (15, 2000));
        let mut text_out = String::new();
        text(&mut text_out, &groups, Unit::Auto);
        assert!(
            text_out.starts_with(
                "cgroup /system.slice/db.service (unit db.service): 2 processes (db)\n"
            ),
            "{text_out}"
        );
        assert!(
            text_out.contains("cgroup unknown: 1 process (old)"),
            "{text_out}"
        );
        // The latency in the unit the other tables use, not raw ns.
        assert!(text_out.contains("      2.0us  ENOMEM x2"), "{text_out}");
    }
}

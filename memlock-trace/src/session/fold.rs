//! `--max-processes` on what a summary says: the processes with the most activity keep
//! their detail, every other one folds into its name's line (calls, failures, pages,
//! faults), and the names themselves are bounded the same way. System-wide for weeks, the
//! kernel's fault maps hold thousands of processes that came and went; a summary listing
//! them one by one grew with churn, not with what the user asked for.

use std::collections::BTreeMap;

use serde::Serialize;

use super::process_summary::ProcessSummary;
use crate::output::Outside;

/// The name the names beyond the bound fold into.
pub const OTHER_NAMES: &str = "(other names)";

/// The processes a summary does not list one by one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Folded {
    /// How many processes were folded.
    pub processes: u64,
    /// `--max-processes`: how many the summary lists one by one.
    pub max_processes: u64,
    /// Per name, most active first; at most `--max-processes` names, the rest in one
    /// [`OTHER_NAMES`] entry.
    pub names: Vec<FoldedName>,
}

/// The folded processes of one name, summed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FoldedName {
    pub comm: Outside,
    pub processes: u64,
    /// mlock-family calls by name.
    pub calls: BTreeMap<&'static str, u64>,
    /// Of those, the calls that failed.
    pub failed_calls: u64,
    pub pages_populated: u64,
    pub minor_faults: u64,
    pub major_faults: u64,
}

impl FoldedName {
    fn add(&mut self, p: &ProcessSummary) {
        self.processes += 1;
        for (name, s) in &p.syscalls {
            *self.calls.entry(name).or_default() += s.count;
            self.failed_calls += s.errors.values().sum::<u64>();
            self.pages_populated += s.pages_populated;
        }
        if let Some(f) = &p.faults {
            self.minor_faults += f.minor;
            self.major_faults += f.major;
        }
    }

    fn merge(&mut self, other: &FoldedName) {
        self.processes += other.processes;
        for (name, n) in &other.calls {
            *self.calls.entry(name).or_default() += n;
        }
        self.failed_calls += other.failed_calls;
        self.pages_populated += other.pages_populated;
        self.minor_faults += other.minor_faults;
        self.major_faults += other.major_faults;
    }

    fn activity(&self) -> u64 {
        self.calls.values().sum::<u64>() + self.minor_faults + self.major_faults
    }
}

/// What a process did, to rank it: its calls and its faults.
fn activity(p: &ProcessSummary) -> u64 {
    let calls: u64 = p.syscalls.values().map(|s| s.count).sum();
    calls + p.faults.as_ref().map_or(0, |f| f.minor + f.major)
}

/// Keeps the `max` most active of `processes` (ties: the lower pid) and folds the others by
/// name: what the summary's `folded` says, or None when none had to be.
pub fn fold_beyond(processes: &mut Vec<ProcessSummary>, max: usize) -> Option<Folded> {
    let max = max.max(1);
    if processes.len() <= max {
        return None;
    }
    let mut ranked = std::mem::take(processes);
    ranked.sort_by(|a, b| {
        activity(b)
            .cmp(&activity(a))
            .then(a.pid.cmp(&b.pid))
            .then(a.start_ns.cmp(&b.start_ns))
    });
    let folded_processes = ranked.split_off(max);
    ranked.sort_by_key(|p| (p.pid, p.start_ns));
    *processes = ranked;

    let mut by_name: BTreeMap<&Outside, FoldedName> = BTreeMap::new();
    for p in &folded_processes {
        by_name
            .entry(&p.comm)
            .or_insert_with(|| FoldedName {
                comm: p.comm.clone(),
                ..FoldedName::default()
            })
            .add(p);
    }
    let mut names: Vec<FoldedName> = by_name.into_values().collect();
    names.sort_by(|a, b| b.activity().cmp(&a.activity()).then(a.comm.cmp(&b.comm)));
    if names.len() > max {
        let mut other = FoldedName {
            comm: OTHER_NAMES.into(),
            ..FoldedName::default()
        };
        // One place short of the bound, so that with the other names' entry it holds.
        for name in names.split_off(max.saturating_sub(1)) {
            other.merge(&name);
        }
        names.push(other);
    }
    Some(Folded {
        processes: folded_processes.len() as u64,
        max_processes: max as u64,
        names,
    })
}

/// The text lines for the folded processes (nothing when none were).
pub fn folded_text(folded: &Folded) -> String {
    use std::fmt::Write as _;

    let mut out = String::new();
    if folded.processes == 0 {
        return out;
    }
    let _ = writeln!(
        out,
        "{} more processes, by name (--max-processes {} lists the most active one by one):",
        folded.processes, folded.max_processes
    );
    for n in &folded.names {
        let calls: u64 = n.calls.values().sum();
        let mut line = format!(
            "  {} ({} process{}): {} faults ({} major)",
            n.comm,
            n.processes,
            if n.processes == 1 { "" } else { "es" },
            n.minor_faults + n.major_faults,
            n.major_faults,
        );
        if calls > 0 {
            let by_call: Vec<String> = n.calls.iter().map(|(c, k)| format!("{c} {k}")).collect();
            let _ = write!(
                line,
                ", {calls} calls ({}; {} failed), {} pages populated",
                by_call.join(", "),
                n.failed_calls,
                n.pages_populated
            );
        }
        let _ = writeln!(out, "{line}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{Syscall, SyscallRecord},
        syscalls::Aggregator,
    };

    fn summary_of(processes: &[(u32, &str, u32)]) -> Vec<ProcessSummary> {
        let mut agg = Aggregator::with_max_processes(1000);
        for &(pid, comm, calls) in processes {
            for _ in 0..calls {
                agg.record_syscall(&SyscallRecord::fixture(
                    Syscall::Mlock,
                    pid,
                    0,
                    1000,
                    2,
                    2,
                    comm,
                ));
            }
        }
        agg.summaries()
            .into_iter()
            .map(ProcessSummary::from)
            .collect()
    }

    #[test]
    fn keeps_the_most_active_and_folds_the_rest_by_name() {
        let mut s = summary_of(&[
            (10, "db", 50),
            (11, "worker", 1),
            (12, "worker", 2),
            (13, "cron", 7),
            (14, "worker", 3),
        ]);
        let folded = fold_beyond(&mut s, 2).unwrap();
        let kept: Vec<u32> = s.iter().map(|p| p.pid).collect();
        assert_eq!(kept, [10, 13]);
        assert_eq!(folded.processes, 3);
        assert_eq!(folded.names.len(), 1);
        let worker = &folded.names[0];
        assert_eq!(
            (
                worker.comm.to_str().unwrap(),
                worker.processes,
                worker.calls["mlock"]
            ),
            ("worker", 3, 6)
        );
        assert_eq!(worker.pages_populated, 12);
    }

    #[test]
    fn names_are_bounded_too() {
        let processes: Vec<(u32, String, u32)> = (0..20)
            .map(|i| (100 + i, format!("n{i:02}"), 20 - i))
            .collect();
        let borrowed: Vec<(u32, &str, u32)> = processes
            .iter()
            .map(|(p, c, n)| (*p, c.as_str(), *n))
            .collect();
        let mut s = summary_of(&borrowed);
        let folded = fold_beyond(&mut s, 3).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(folded.processes, 17);
        let names: Vec<&str> = folded
            .names
            .iter()
            .map(|n| n.comm.to_str().unwrap())
            .collect();
        assert_eq!(names, ["n03", "n04", OTHER_NAMES]);
        let other = folded.names.last().unwrap();
        assert_eq!(other.processes, 15);
        // n05..n19 made 15 + 14 + ... + 1 calls.
        assert_eq!(other.calls["mlock"], (1..=15).sum::<u64>());
        let text = folded_text(&folded);
        assert!(text.starts_with("17 more processes"), "{text}");
        assert!(text.contains("(other names) (15 processes)"), "{text}");
    }

    #[test]
    fn within_the_bound_nothing_folds() {
        let mut s = summary_of(&[(1, "a", 1), (2, "b", 1)]);
        assert!(fold_beyond(&mut s, 2).is_none());
        assert_eq!(s.len(), 2);
    }
}

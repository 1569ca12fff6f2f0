//! The bound on per-process series (`--prometheus-max-names N`): the first N process names
//! with activity keep their own label sets for the whole session; every later name is counted
//! under one `comm="other"` label set (without cgroup or pid), so a host that runs thousands
//! of short-lived distinct names exports a bounded number of series.
//!
//! Membership is decided once per name and never revised, so each series only grows and the
//! sum over all series is the exact total: moving a name's series into `other` later would
//! either lower its own counter or count its history twice.

use std::{
    collections::HashSet,
    hash::{Hash as _, Hasher as _},
    sync::Mutex,
};

use prometheus_client::{metrics::gauge::Gauge, registry::Registry};

use super::Labels;

/// Names kept by default: enough for the processes of interest on a host, small enough that
/// all their series (about 60 each) stay a few thousand.
pub const DEFAULT_MAX_NAMES: u32 = 100;

/// Folded names counted one by one, at most: the gauge stops there (1.2 MiB of hashes at
/// most; a node past it has long been told that names fold).
pub const FOLDED_COUNTED: usize = 65_536;

/// The `comm` label of every name past the cap.
pub const OTHER: &str = "other";

/// Which names keep their own series, shared by the call and fault families so that one
/// cap bounds them both.
pub struct NameCap {
    max: usize,
    pid_label: bool,
    seen: Mutex<Seen>,
    folded: Gauge,
}

/// A name, and its pid with `--prometheus-pid-label` (each process is then its own series).
type Identity = (String, Option<u32>);

#[derive(Default)]
struct Seen {
    kept: HashSet<Identity>,
    /// A 64-bit hash of each folded name, to count each once, up to [`FOLDED_COUNTED`]: a
    /// fleet node meets new names for as long as it runs (cron jobs, build steps; the
    /// soak's churn 30 a second), and the names themselves grew the tracer by ~80 bytes
    /// each. A hash collision (1 in 30 million at a million names) undercounts by one.
    folded: HashSet<u64>,
}

impl NameCap {
    pub fn register(registry: &mut Registry, max_names: u32, pid_label: bool) -> Self {
        let cap = Self {
            max: usize::try_from(max_names).unwrap_or(usize::MAX),
            pid_label,
            seen: Mutex::default(),
            folded: Gauge::default(),
        };
        registry.register(
            "series_names_folded",
            "Process names (name and pid with --prometheus-pid-label) counted under \
             comm=\"other\" because --prometheus-max-names others came first; counted up to \
             65536",
            cap.folded.clone(),
        );
        cap
    }

    /// The label set of a process with activity to add: its own (comm, its cgroup v2 path
    /// when known, and the pid when asked) if its name is kept, else `comm="other"`.
    pub fn labels(&self, comm: String, cgroup: String, pid: u32) -> Labels {
        let identity = (comm, self.pid_label.then_some(pid));
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        // Once the cap is reached nothing joins `kept`, so a folded name never comes back.
        let kept = seen.kept.contains(&identity)
            || (seen.kept.len() < self.max && seen.kept.insert(identity.clone()));
        if !kept {
            if seen.folded.len() < FOLDED_COUNTED && seen.folded.insert(hash_of(&identity)) {
                self.folded
                    .set(i64::try_from(seen.folded.len()).unwrap_or(i64::MAX));
            }
            return vec![("comm", OTHER.to_string())];
        }
        drop(seen);
        let (comm, pid) = identity;
        let mut labels = vec![("comm", comm)];
        if !cgroup.is_empty() {
            labels.push(("cgroup", cgroup));
        }
        if let Some(pid) = pid {
            labels.push(("pid", pid.to_string()));
        }
        labels
    }
}

fn hash_of(identity: &Identity) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    identity.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comm(labels: &Labels) -> &str {
        &labels[0].1
    }

    #[test]
    fn the_first_names_keep_their_series_and_later_ones_fold() {
        let mut registry = Registry::default();
        let cap = NameCap::register(&mut registry, 2, false);
        let labels = |name: &str| cap.labels(name.into(), "/a.slice".into(), 1);
        assert_eq!(
            labels("db"),
            vec![
                ("comm", "db".to_string()),
                ("cgroup", "/a.slice".to_string())
            ]
        );
        assert_eq!(comm(&labels("web")), "web");
        assert_eq!(labels("cron"), vec![("comm", OTHER.to_string())]);
        // Decided once: a kept name stays kept, a folded one stays folded.
        assert_eq!(comm(&labels("db")), "db");
        assert_eq!(comm(&labels("cron")), OTHER);
        assert_eq!(comm(&labels("sh")), OTHER);
        assert_eq!(cap.folded.get(), 2);
    }

    #[test]
    fn with_pid_labels_each_process_counts_against_the_cap() {
        let mut registry = Registry::default();
        let cap = NameCap::register(&mut registry, 1, true);
        assert_eq!(
            cap.labels("db".into(), String::new(), 7),
            vec![("comm", "db".to_string()), ("pid", "7".to_string())]
        );
        assert_eq!(
            cap.labels("db".into(), String::new(), 8),
            vec![("comm", OTHER.to_string())]
        );
        assert_eq!(cap.folded.get(), 1);
    }

    #[test]
    fn folded_names_are_counted_up_to_a_bound() {
        let mut registry = Registry::default();
        let cap = NameCap::register(&mut registry, 0, false);
        for n in 0..FOLDED_COUNTED + 10 {
            cap.labels(format!("job-{n}"), String::new(), 1);
        }
        assert_eq!(cap.folded.get(), FOLDED_COUNTED as i64);
    }

    #[test]
    fn zero_folds_everything() {
        let mut registry = Registry::default();
        let cap = NameCap::register(&mut registry, 0, false);
        assert_eq!(comm(&cap.labels("db".into(), String::new(), 7)), OTHER);
    }
}

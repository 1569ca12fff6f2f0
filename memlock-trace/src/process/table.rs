//! A bounded table of per-process state keyed by (pid, start time): a reused pid starts a
//! new entry, and a tracer running for weeks over short-lived processes keeps a fixed
//! footprint. When full, the process seen least recently is evicted and counted.

use std::collections::BTreeMap;

pub use memlock_trace_common::process::ProcessKey;

/// Default for `--max-processes`. A process's call statistics hold an exact latency
/// histogram per call it made (tens of KiB each): 4096 processes of a system-wide session
/// under churn took hundreds of MiB; a summary lists these most active ones and folds the
/// rest by name.
pub const DEFAULT_MAX_PROCESSES: u32 = 1024;

pub struct ProcessTable<V> {
    entries: BTreeMap<ProcessKey, Entry<V>>,
    capacity: usize,
    /// Increases on every access: the recency order for eviction.
    clock: u64,
    evicted: u64,
}

struct Entry<V> {
    value: V,
    last_seen: u64,
}

impl<V> Default for ProcessTable<V> {
    fn default() -> Self {
        Self::with_capacity(DEFAULT_MAX_PROCESSES as usize)
    }
}

impl<V> ProcessTable<V> {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            entries: BTreeMap::new(),
            capacity: capacity.max(1),
            clock: 0,
            evicted: 0,
        }
    }

    /// The entry for `key`, created with `new` if absent (evicting the least recently seen
    /// process when the table is full).
    pub fn get_or_insert_with(&mut self, key: ProcessKey, new: impl FnOnce() -> V) -> &mut V {
        self.clock += 1;
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            // A linear scan, only when a new process arrives at a full table.
            if let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_seen)
                .map(|(k, _)| *k)
            {
                self.entries.remove(&oldest);
                self.evicted += 1;
            }
        }
        let clock = self.clock;
        let entry = self.entries.entry(key).or_insert_with(|| Entry {
            value: new(),
            last_seen: clock,
        });
        entry.last_seen = clock;
        &mut entry.value
    }

    /// In (pid, start time) order.
    pub fn iter(&self) -> impl Iterator<Item = (&ProcessKey, &V)> {
        self.entries.iter().map(|(k, e)| (k, &e.value))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Processes evicted so far.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tgid: u32, start_ns: u64) -> ProcessKey {
        ProcessKey {
            tgid,
            _pad: 0,
            start_ns,
        }
    }

    #[test]
    fn reused_pid_is_a_new_process() {
        let mut t = ProcessTable::with_capacity(8);
        *t.get_or_insert_with(key(7, 100), || 0) += 1;
        *t.get_or_insert_with(key(7, 900), || 0) += 10;
        *t.get_or_insert_with(key(7, 100), || 0) += 1;
        let all: Vec<_> = t.iter().map(|(k, v)| (k.tgid, k.start_ns, *v)).collect();
        assert_eq!(all, [(7, 100, 2), (7, 900, 10)]);
    }

    #[test]
    fn full_table_evicts_least_recently_seen_and_counts() {
        let mut t = ProcessTable::with_capacity(2);
        t.get_or_insert_with(key(1, 1), || ());
        t.get_or_insert_with(key(2, 2), || ());
        t.get_or_insert_with(key(1, 1), || ()); // 1 is now the most recent
        t.get_or_insert_with(key(3, 3), || ()); // evicts 2
        t.get_or_insert_with(key(4, 4), || ()); // evicts 1
        let left: Vec<u32> = t.iter().map(|(k, ())| k.tgid).collect();
        assert_eq!(left, [3, 4]);
        assert_eq!(t.evicted(), 2);
        assert_eq!(t.len(), 2);
    }
}

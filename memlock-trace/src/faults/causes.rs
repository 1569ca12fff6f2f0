//! Fault time by cause (reclaim, compaction, throttling, time off CPU), as the hooks split
//! timed faults' latencies: per process, its slowest fault's, and per sampled event.

use std::{collections::BTreeMap, fmt::Write as _};

use memlock_trace_common::causes::cause;
use serde::Serialize;

use super::{FaultHooks, read::KeyStats};
use crate::{event::FaultRecord, output::duration};

/// A process's timed faults' time in each cause, and its slowest fault that met one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TimeByCause {
    /// ns by cause key; null for a cause this kernel's hooks cannot time.
    pub causes_ns: BTreeMap<&'static str, Option<u64>>,
    /// The slowest timed fault that met a cause (absent when none did).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slowest: Option<CausedFault>,
}

/// One fault's latency and its parts: each cause it met, and the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CausedFault {
    pub latency_ns: u64,
    pub causes_ns: BTreeMap<&'static str, u64>,
    /// The latency the causes leave: the fault's own work on CPU.
    pub other_ns: u64,
}

impl CausedFault {
    /// `latency` split into the nonzero parts of `parts`, by cause index.
    pub fn of(latency_ns: u64, parts: &[u64; cause::COUNT]) -> Self {
        let causes_ns: BTreeMap<&'static str, u64> = cause::KEYS
            .iter()
            .zip(parts)
            .filter(|(_, ns)| **ns > 0)
            .map(|(key, ns)| (*key, *ns))
            .collect();
        let other_ns = latency_ns.saturating_sub(causes_ns.values().sum());
        Self {
            latency_ns,
            causes_ns,
            other_ns,
        }
    }

    /// `2.41 ms: memcg reclaim 2.10 ms, other 0.31 ms`.
    pub fn text(&self) -> String {
        format!("{}: {}", duration(self.latency_ns), self.parts())
    }

    /// `memcg reclaim 2.10 ms, other 0.31 ms`.
    pub fn parts(&self) -> String {
        let mut out = String::new();
        for (key, ns) in &self.causes_ns {
            let name = cause::KEYS
                .iter()
                .position(|k| k == key)
                .map_or(*key, |i| cause::NAMES[i]);
            let _ = write!(out, "{name} {}, ", duration(*ns));
        }
        let _ = write!(out, "other {}", duration(self.other_ns));
        out
    }
}

/// A sampled fault's latency split into the causes it met, when it met one.
pub fn of_event(rec: &FaultRecord) -> Option<CausedFault> {
    let ns = rec.latency_ns()?;
    let parts = &rec.raw.cause_ns;
    parts
        .iter()
        .any(|&p| p > 0)
        .then(|| CausedFault::of(ns, parts))
}

/// `s`'s time by cause, where the hooks time any cause; None without (faults untimed).
pub fn time_by_cause(s: &KeyStats, hooks: &FaultHooks) -> Option<TimeByCause> {
    let measured = hooks.causes.as_ref()?.measured;
    let causes_ns = cause::KEYS
        .iter()
        .zip(measured)
        .zip(s.cause_ns)
        .map(|((key, measured), ns)| (*key, measured.then_some(ns)))
        .collect();
    let slowest = (s.slowest_ns > 0).then(|| CausedFault::of(s.slowest_ns, &s.slowest_cause_ns));
    Some(TimeByCause { causes_ns, slowest })
}

/// The text lines of a process's time by cause: only when a fault met one.
pub fn cause_text(out: &mut String, t: &TimeByCause, indent: &str) {
    if t.causes_ns.values().all(|ns| ns.unwrap_or(0) == 0) {
        return;
    }
    let (mut met, mut none, mut unmeasured) = (Vec::new(), Vec::new(), Vec::new());
    for (key, name) in cause::KEYS.iter().zip(cause::NAMES) {
        match t.causes_ns.get(key).copied().flatten() {
            Some(0) => none.push(name),
            Some(ns) => met.push(format!("{name} {}", duration(ns))),
            None => unmeasured.push(name),
        }
    }
    let mut line = met.join(", ");
    if !none.is_empty() {
        let _ = write!(line, "; none in {}", none.join(", "));
    }
    if !unmeasured.is_empty() {
        let _ = write!(line, "; not measured: {}", unmeasured.join(", "));
    }
    let _ = writeln!(out, "{indent}  fault time by cause: {line}");
    if let Some(slowest) = &t.slowest {
        let _ = writeln!(
            out,
            "{indent}  slowest fault that met one: {}",
            slowest.text()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a reader meets: the causes met, those not met, those the kernel cannot time, and
    /// the slowest fault's parts adding up to its latency.
    #[test]
    fn the_causes_read_as_measured() {
        let t = TimeByCause {
            causes_ns: BTreeMap::from([
                ("direct_reclaim", Some(0)),
                ("memcg_reclaim", Some(2_100_000)),
                ("compaction", Some(0)),
                ("throttled", None),
                ("off_cpu", Some(0)),
            ]),
            slowest: Some(CausedFault::of(2_410_000, &[0, 2_100_000, 0, 0, 0])),
        };
        let mut out = String::new();
        cause_text(&mut out, &t, "");
        assert_eq!(
            out,
            "  fault time by cause: memcg reclaim 2100.0us; none in direct reclaim, \
             compaction, off CPU; not measured: reclaim throttling\n  slowest fault that met one: \
             2410.0us: memcg reclaim 2100.0us, other 310.0us\n"
        );
        let slowest = t.slowest.unwrap();
        assert_eq!(slowest.other_ns + 2_100_000, slowest.latency_ns);
        // No fault met a cause: no lines.
        let mut quiet = String::new();
        let none = TimeByCause {
            causes_ns: BTreeMap::from([("memcg_reclaim", Some(0)), ("throttled", None)]),
            slowest: None,
        };
        cause_text(&mut quiet, &none, "");
        assert_eq!(quiet, "");
    }

    /// A sampled fault of 1,234 ns, 1,000 of them in memcg reclaim and 100 off CPU; and one
    /// that met none.
    #[test]
    fn an_event_says_its_parts() {
        let mut raw = memlock_trace_common::faults::FaultEvent {
            flags: memlock_trace_common::faults::fault_flags::HAS_LATENCY,
            latency_ns: 1234,
            cause_ns: [0, 1000, 0, 0, 100],
            ..Default::default()
        };
        let caused = of_event(&FaultRecord { raw }).unwrap();
        assert_eq!(
            caused.parts(),
            "memcg reclaim 1.0us, off CPU 0.1us, other 0.1us"
        );
        raw.cause_ns = [0; cause::COUNT];
        assert_eq!(of_event(&FaultRecord { raw }), None);
    }
}

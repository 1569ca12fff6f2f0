//! Prometheus metrics (`--prometheus ADDR`): counters and latency histograms of the traced
//! calls labelled by comm (and pid only with `--prometheus-pid-label`), the first
//! `--prometheus-max-names` names their own and the rest under `comm="other"` (`names.rs`)
//! so the series stay bounded, the tracer's own health, build and process (`process_*`), served as
//! the text format 0.0.4 or OpenMetrics as the scraper asks (`exposition.rs`).
//!
//! Each hook family keeps its families in its own struct and file, registered in
//! [`Metrics::new`] and fed from the session: syscalls from the drain loop, page faults
//! (`faults.rs`) from the fault family's read-back on the session's health ticker.

mod auth;
mod exposition;
mod faults;
mod health;
mod maps;
mod names;
mod process;
pub mod server;
mod syscalls;
pub mod web_config;

use std::{fmt::Write as _, sync::Arc};

use prometheus_client::{
    encoding::{
        prometheus_text,
        text::{encode_eof, encode_registry},
    },
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

use self::names::NameCap;
pub use self::{
    exposition::Format, faults::FaultMetrics, health::HealthMetrics, maps::MapMetrics,
    names::DEFAULT_MAX_NAMES, syscalls::SyscallMetrics,
};

/// Every metric memlock-trace exports, prefixed `memlock_trace_`, and its process's.
pub struct Metrics {
    registry: Registry,
    /// `process_*`, unprefixed as every client library names them.
    process: Registry,
    /// 1, labelled with the version, the kernel and each family's hook set.
    build_info: Family<Vec<(String, String)>, Gauge>,
    pub syscalls: SyscallMetrics,
    pub faults: FaultMetrics,
    pub health: HealthMetrics,
    pub maps: MapMetrics,
}

/// Label sets are built at run time because the pid label is optional.
pub type Labels = Vec<(&'static str, String)>;

impl Metrics {
    /// `max_names`: the process names that keep their own series (`--prometheus-max-names`).
    pub fn new(pid_label: bool, max_names: u32) -> Self {
        let mut registry = Registry::with_prefix("memlock_trace");
        let names = Arc::new(NameCap::register(&mut registry, max_names, pid_label));
        let syscalls = SyscallMetrics::register(&mut registry, names.clone());
        let faults = FaultMetrics::register(&mut registry, names);
        let health = HealthMetrics::register(&mut registry);
        let maps = MapMetrics::register(&mut registry);
        let build_info = Family::default();
        registry.register(
            "build_info",
            "Always 1: memlock-trace's version, the kernel release and the hook set each family \
             attached (labels named after the families)",
            build_info.clone(),
        );
        let mut process = Registry::default();
        process.register_collector(Box::new(process::ProcessCollector));
        Self {
            registry,
            process,
            build_info,
            syscalls,
            faults,
            health,
            maps,
        }
    }

    /// Once the programs are attached: `hook_sets` is (family, hook set) for each family.
    pub fn set_build_info<'a>(&self, hook_sets: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let mut labels = vec![
            ("version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
            ("kernel".to_string(), crate::probe::kernel_release()),
        ];
        labels.extend(
            hook_sets
                .into_iter()
                .map(|(family, set)| (family.to_string(), set.to_string())),
        );
        self.build_info.clear();
        self.build_info.get_or_create(&labels).set(1);
    }

    /// The OpenMetrics text exposition of everything registered.
    pub fn encode(&self) -> String {
        self.encode_as(Format::OpenMetrics)
    }

    /// The exposition in `format`.
    pub fn encode_as(&self, format: Format) -> String {
        let mut out = String::new();
        let encoded = match format {
            Format::OpenMetrics => encode_registry(&mut out, &self.registry)
                .and_then(|()| encode_registry(&mut out, &self.process))
                .and_then(|()| encode_eof(&mut out)),
            Format::Text004 => prometheus_text::encode(&mut out, &self.registry)
                .and_then(|()| prometheus_text::encode(&mut out, &self.process)),
        };
        if encoded.is_err() {
            // Only a failing `fmt::Write` makes encoding fail, and a String never does.
            out.clear();
            if format == Format::OpenMetrics {
                let _ = writeln!(out, "# EOF");
            }
        }
        out
    }
}

/// Bytes per page, to export memory in Prometheus' base unit.
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use memlock_trace_common::{process::ProcessKey, syscalls::SyscallKey};

    use super::*;
    use crate::{
        event::Syscall,
        syscalls::read::{KeyCounts, fixtures},
        tracer::Health,
    };

    fn key(tgid: u32, syscall: Syscall, errno: u32) -> SyscallKey {
        fixtures::key(tgid, 1, syscall, errno)
    }

    fn counts(calls: u64, ns: u64) -> KeyCounts {
        // Huge pages: one fault for the call's four pages.
        fixtures::counts(calls, ns, 1)
    }

    fn db(_: &ProcessKey) -> (String, String) {
        ("db".into(), String::new())
    }

    #[test]
    fn syscalls_and_health_encode_as_openmetrics() {
        let m = Metrics::new(false, DEFAULT_MAX_NAMES);
        let mut report = fixtures::report([
            (key(7, Syscall::Mlock, 0), counts(1, 3_000)),
            (key(8, Syscall::Mlock, 12), counts(1, 1_500)),
        ]);
        m.syscalls.update(&report, db);
        // The kernel's running totals: a second refresh adds only the growth.
        report
            .counts
            .insert(key(7, Syscall::Mlock, 0), counts(2, 3_000));
        m.syscalls.update(&report, db);
        m.health.update(&Health {
            dropped_events: 5,
            ..Default::default()
        });
        m.health.update(&Health {
            dropped_events: 7,
            ..Default::default()
        });
        let text = m.encode();
        let has = |line: &str| assert!(text.contains(line), "{line}\n{text}");
        // Two pids, one comm: one series without a pid label.
        has("memlock_trace_syscalls_total{comm=\"db\",syscall=\"mlock\"} 3\n");
        has(
            "memlock_trace_syscall_errors_total{comm=\"db\",syscall=\"mlock\",errno=\"ENOMEM\"} 1\n",
        );
        has("memlock_trace_syscall_latency_seconds_count{comm=\"db\",syscall=\"mlock\"} 3\n");
        // 1.5 us in [1.024, 2.048) us, 3 us in [2.048, 4.096) us.
        has(
            "memlock_trace_syscall_latency_seconds_bucket{le=\"0.000002048\",comm=\"db\",syscall=\"mlock\"} 1\n",
        );
        has(
            "memlock_trace_syscall_latency_seconds_bucket{le=\"0.000004096\",comm=\"db\",syscall=\"mlock\"} 3\n",
        );
        // 4 pages populated per call, in bytes.
        has(&format!(
            "memlock_trace_syscall_populated_bytes_total{{comm=\"db\",syscall=\"mlock\"}} {}\n",
            12 * page_size()
        ));
        // ... in one fault each: the bytes are the pages', not the faults'.
        has("memlock_trace_syscall_populated_faults_total{comm=\"db\",syscall=\"mlock\"} 3\n");
        // The kernel's running total, not the sum of the updates.
        has("memlock_trace_dropped_events_total 7\n");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn text_format_names_counters_with_total_and_has_build_info() {
        let m = Metrics::new(false, DEFAULT_MAX_NAMES);
        let report = fixtures::report([(key(7, Syscall::Mlock, 0), counts(1, 3_000))]);
        m.syscalls.update(&report, db);
        m.set_build_info([("faults", "tracepoint"), ("syscalls", "tracepoint")]);
        let text = m.encode_as(Format::Text004);
        for line in [
            "# HELP memlock_trace_syscalls_total mlock-family calls completed.\n",
            "# TYPE memlock_trace_syscalls_total counter\n",
            "memlock_trace_syscalls_total{comm=\"db\",syscall=\"mlock\"} 1\n",
            "# TYPE process_resident_memory_bytes gauge\n",
            "# TYPE process_cpu_seconds_total counter\n",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        let info = text
            .lines()
            .find(|l| l.starts_with("memlock_trace_build_info{"))
            .unwrap();
        assert!(
            info.contains("faults=\"tracepoint\"") && info.ends_with("} 1"),
            "{info}"
        );
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        // Every family has its HELP.
        let types = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        let helps = text.lines().filter(|l| l.starts_with("# HELP ")).count();
        assert_eq!(types, helps, "{text}");
    }

    #[test]
    fn names_past_the_cap_are_counted_under_other_and_sums_stay_exact() {
        let m = Metrics::new(false, 1);
        let named = |k: &ProcessKey| (format!("p{}", k.tgid), "/a.slice".to_string());
        let mut report = fixtures::report([(key(7, Syscall::Mlock, 0), counts(2, 1_000))]);
        m.syscalls.update(&report, named);
        for tgid in [8, 9] {
            report
                .counts
                .insert(key(tgid, Syscall::Mlock, 0), counts(1, 1_000));
        }
        // p7 came first and keeps its series as it grows; p8 and p9 are folded.
        report
            .counts
            .insert(key(7, Syscall::Mlock, 0), counts(5, 1_000));
        m.syscalls.update(&report, named);
        let text = m.encode();
        let has = |line: &str| assert!(text.contains(line), "{line}\n{text}");
        has("memlock_trace_syscalls_total{comm=\"p7\",cgroup=\"/a.slice\",syscall=\"mlock\"} 5\n");
        has("memlock_trace_syscalls_total{comm=\"other\",syscall=\"mlock\"} 2\n");
        has("memlock_trace_series_names_folded 2\n");
        let series = text
            .lines()
            .filter(|l| l.starts_with("memlock_trace_syscalls_total{"))
            .count();
        assert_eq!(series, 2, "{text}");
    }

    #[test]
    fn pid_and_cgroup_labels() {
        let m = Metrics::new(true, DEFAULT_MAX_NAMES);
        let report = fixtures::report([(key(42, Syscall::Munlock, 0), counts(1, 1_000))]);
        m.syscalls.update(&report, |_| {
            ("db".into(), "/system.slice/db.service".into())
        });
        let text = m.encode();
        assert!(
            text.contains(
                "memlock_trace_syscalls_total{comm=\"db\",cgroup=\"/system.slice/db.service\",pid=\"42\",syscall=\"munlock\"} 1\n"
            ),
            "{text}"
        );
    }
}

//! The tracer's own process, read from `/proc/self` at each scrape under the names every
//! Prometheus client library uses (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, ...), so the usual dashboards and alerts apply.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Unit,
};

#[derive(Debug, Default)]
pub struct ProcessCollector;

/// What `/proc/self` says, in base units.
#[derive(Debug, Default, PartialEq)]
struct Sample {
    cpu_seconds: f64,
    resident_bytes: i64,
    virtual_bytes: i64,
    start_time_seconds: f64,
    threads: i64,
    open_fds: i64,
    max_fds: i64,
}

impl Sample {
    fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot = std::fs::read_to_string("/proc/stat").ok()?;
        let btime: f64 = boot
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as i64;
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit(2) fills the struct it is given.
        let max_fds = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
            0 => i64::try_from(limit.rlim_cur).unwrap_or(i64::MAX),
            _ => -1,
        };
        // SAFETY: sysconf has no preconditions.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        Self::parse(&stat, btime, ticks as f64, page).map(|s| Self {
            open_fds,
            max_fds,
            ..s
        })
    }

    /// From `/proc/self/stat`: fields after the name, which may hold spaces and parentheses.
    fn parse(stat: &str, btime: f64, ticks: f64, page: i64) -> Option<Self> {
        let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
        // proc(5) numbers fields from 1, the state (3) first after the name.
        let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
        Some(Self {
            cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
            threads: field(20)? as i64,
            start_time_seconds: btime + field(22)? as f64 / ticks,
            virtual_bytes: field(23)? as i64,
            resident_bytes: field(24)? as i64 * page,
            ..Self::default()
        })
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // An unreadable /proc gives no series rather than wrong ones.
        let Some(s) = Sample::read() else {
            return Ok(());
        };
        let seconds = Some(&Unit::Seconds);
        let cpu = ConstCounter::new(s.cpu_seconds);
        let cpu_help = "Total user and system CPU time spent in seconds";
        describe(&mut encoder, "process_cpu", cpu_help, seconds, &cpu)?;
        for (name, help, unit, value) in [
            (
                "process_resident_memory",
                "Resident memory size in bytes",
                Some(&Unit::Bytes),
                s.resident_bytes,
            ),
            (
                "process_virtual_memory",
                "Virtual memory size in bytes",
                Some(&Unit::Bytes),
                s.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                None,
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (RLIMIT_NOFILE)",
                None,
                s.max_fds,
            ),
            ("process_threads", "Number of OS threads", None, s.threads),
        ] {
            describe(&mut encoder, name, help, unit, &ConstGauge::new(value))?;
        }
        let start = ConstGauge::new(s.start_time_seconds);
        let start_help = "Start time of the process since unix epoch in seconds";
        describe(
            &mut encoder,
            "process_start_time",
            start_help,
            seconds,
            &start,
        )
    }
}

/// One metric with its descriptor (name, help, unit and type).
fn describe(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    metric: &impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    metric.encode(encoder.encode_descriptor(name, help, unit, metric.metric_type())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_name_with_spaces_and_parentheses() {
        // Fields 3..=24 of a real line, after a hostile name.
        let stat = "42 (a) b (c) S 1 42 42 0 -1 4194560 1000 0 0 0 250 150 0 0 20 0 7 0 \
                    12345 104857600 2560 18446744073709551615";
        let s = Sample::parse(stat, 1_000.0, 100.0, 4096).unwrap();
        assert_eq!(s.cpu_seconds, 4.0);
        assert_eq!(s.threads, 7);
        assert!((s.start_time_seconds - 1_123.45).abs() < 1e-9);
        assert_eq!(s.virtual_bytes, 104_857_600);
        assert_eq!(s.resident_bytes, 2560 * 4096);
    }

    #[test]
    fn reads_this_process() {
        let s = Sample::read().unwrap();
        assert!(
            s.resident_bytes > 0 && s.threads >= 1 && s.open_fds >= 3,
            "{s:?}"
        );
    }
}

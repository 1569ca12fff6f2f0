//! Latency percentiles from an HdrHistogram, shared by every family that times something.

use hdrhistogram::Histogram;
use serde::Serialize;

/// An auto-resizing histogram with 3 significant digits: exact enough for ns latencies of
/// any size.
pub fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant figures is a valid precision")
}

/// Records into an auto-resizing histogram (`saturating_record` would clamp to the current,
/// tiny, range instead of growing it).
pub fn record_latency(histogram: &mut Histogram<u64>, ns: u64) {
    if histogram.record(ns.max(1)).is_err() {
        histogram.saturating_record(ns.max(1));
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Latency {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub max: u64,
}

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        }
    }
}

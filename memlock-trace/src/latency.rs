//! Latency percentiles from an HdrHistogram, shared by every family that times something.

use hdrhistogram::Histogram;
use serde::Serialize;

/// An auto-resizing histogram with 3 significant digits: exact enough for ns latencies of
/// any size.
pub fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("3 significant figures is a valid precision")
}

/// Latencies of one series (a process's calls of one syscall): the values themselves while
/// they are few, an HdrHistogram past that. Once it has recorded latencies of µs to ms, a
/// 3-digit HdrHistogram holds 24-64 KiB of counters whatever it counted: one per process
/// and call made a system-wide tracer's memory grow by ~50 KiB for each short-lived process
/// it kept (56 of its 68 MiB heap beside the soak's churn, heaptrack), where most such
/// processes make a call or two.
#[derive(Clone, Debug)]
pub enum Latencies {
    /// At most [`Latencies::FEW`] values, in recording order.
    Few(Vec<u64>),
    Many(Box<Histogram<u64>>),
}

impl Default for Latencies {
    fn default() -> Self {
        Self::Few(Vec::new())
    }
}

impl Latencies {
    /// Values kept as they are before a histogram takes over (256 bytes).
    pub const FEW: usize = 32;

    pub fn record(&mut self, ns: u64) {
        match self {
            Self::Few(values) if values.len() < Self::FEW => values.push(ns),
            Self::Few(values) => {
                let mut h = histogram();
                for &v in values.iter() {
                    record_latency(&mut h, v);
                }
                record_latency(&mut h, ns);
                *self = Self::Many(Box::new(h));
            }
            Self::Many(h) => record_latency(h, ns),
        }
    }

    /// The histogram of every value recorded (made for the few values: the same figures
    /// as had they been recorded into one).
    pub fn histogram(&self) -> std::borrow::Cow<'_, Histogram<u64>> {
        match self {
            Self::Few(values) => {
                let mut h = histogram();
                for &v in values {
                    record_latency(&mut h, v);
                }
                std::borrow::Cow::Owned(h)
            }
            Self::Many(h) => std::borrow::Cow::Borrowed(h),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Few values or many, the figures are those of one histogram that recorded them all,
    /// and a handful of calls takes a few bytes, not a histogram's counters.
    #[test]
    fn latencies_give_the_histograms_figures_and_stay_small_while_few() {
        for n in [1, 5, Latencies::FEW, Latencies::FEW + 1, 500] {
            let values: Vec<u64> = (0..n as u64).map(|i| 900 + i * i * 37).collect();
            let mut latencies = Latencies::default();
            let mut whole = histogram();
            for &v in &values {
                latencies.record(v);
                record_latency(&mut whole, v);
            }
            assert_eq!(
                matches!(latencies, Latencies::Few(_)),
                n <= Latencies::FEW,
                "{n}"
            );
            let h = latencies.histogram();
            assert_eq!(Latency::of(&h), Latency::of(&whole), "{n}");
            assert_eq!(h.len(), whole.len());
            assert!(
                h.iter_recorded()
                    .map(|v| (v.value_iterated_to(), v.count_at_value()))
                    .eq(whole
                        .iter_recorded()
                        .map(|v| (v.value_iterated_to(), v.count_at_value()))),
                "{n}"
            );
        }
        assert_eq!(
            Latency::of(&Latencies::default().histogram()),
            Latency::default()
        );
    }
}

//! Wall-clock time for events and records: the kernel stamps with `bpf_ktime_get_ns()`
//! (CLOCK_MONOTONIC); one offset to CLOCK_REALTIME, measured once at start, converts them.

use chrono::{DateTime, Local};
use nix::time::{ClockId, clock_gettime};

#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    /// CLOCK_REALTIME minus CLOCK_MONOTONIC, in ns.
    offset: i128,
}

fn read(clock: ClockId) -> i128 {
    // The standard clocks (realtime, monotonic, this process's and thread's CPU time)
    // always exist on Linux.
    let t = clock_gettime(clock).expect("clock_gettime of a standard clock");
    i128::from(t.tv_sec()) * 1_000_000_000 + i128::from(t.tv_nsec())
}

/// CPU time this process (all its threads) has used, in ns.
pub fn process_cpu_ns() -> u64 {
    u64::try_from(read(ClockId::CLOCK_PROCESS_CPUTIME_ID)).unwrap_or(0)
}

/// CPU time the calling thread has used, in ns.
pub fn thread_cpu_ns() -> u64 {
    u64::try_from(read(ClockId::CLOCK_THREAD_CPUTIME_ID)).unwrap_or(0)
}

impl WallClock {
    /// Measures the offset: the monotonic reading is taken between two realtime readings
    /// and paired with their midpoint. Of a few tries, the narrowest pair wins: a thread
    /// preempted between two readings (a loaded or emulated machine) would otherwise skew
    /// the offset by half the time it lost.
    pub fn measure() -> Self {
        let (_, offset) = (0..8)
            .map(|_| {
                let before = read(ClockId::CLOCK_REALTIME);
                let mono = read(ClockId::CLOCK_MONOTONIC);
                let after = read(ClockId::CLOCK_REALTIME);
                (after - before, before + (after - before) / 2 - mono)
            })
            .min_by_key(|&(window, _)| window)
            .expect("eight tries");
        Self { offset }
    }

    /// A kernel `bpf_ktime_get_ns()` stamp as CLOCK_REALTIME ns.
    pub fn wall_ns(&self, ktime_ns: u64) -> u64 {
        u64::try_from(i128::from(ktime_ns) + self.offset).unwrap_or(0)
    }

    /// CLOCK_REALTIME now, in ns.
    pub fn now_ns() -> u64 {
        u64::try_from(read(ClockId::CLOCK_REALTIME)).unwrap_or(0)
    }

    /// CLOCK_MONOTONIC now, in ns (the kernel's stamps' clock).
    pub fn monotonic_ns() -> u64 {
        u64::try_from(read(ClockId::CLOCK_MONOTONIC)).unwrap_or(0)
    }
}

/// `HH:MM:SS.mmm` in local time, as libbpf-tools' `-T` (which use `localtime`).
pub fn hms(wall_ns: u64) -> String {
    let t = DateTime::from_timestamp_nanos(i64::try_from(wall_ns).unwrap_or(i64::MAX));
    t.with_timezone(&Local).format("%H:%M:%S%.3f").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_stamps_convert_to_realtime() {
        let clock = WallClock::measure();
        let before = WallClock::now_ns();
        let wall = clock.wall_ns(WallClock::monotonic_ns());
        let after = WallClock::now_ns();
        // The offset is good to the microseconds the three readings take.
        assert!(
            wall + 1_000_000 >= before && wall <= after + 1_000_000,
            "{before} <= {wall} <= {after}"
        );
        let text = hms(wall);
        assert_eq!(text.len(), 12, "{text}");
        assert_eq!(&text[2..3], ":");
        assert_eq!(&text[8..9], ".");
    }
}

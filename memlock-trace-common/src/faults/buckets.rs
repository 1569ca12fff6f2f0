//! Latency buckets: log-linear, the same on both sides (the eBPF programs fill them, the
//! loader reads them).

use bytemuck::Zeroable;

/// Log-linear latency buckets: 8 linear buckets of 8 ns below 64 ns, then 8 sub-buckets per
/// power of two up to 2^36 ns (69 s); so a bucket is at most 1/8 of its lower bound wide.
pub const HIST_BUCKETS: usize = 256;
const SUB_BITS: u32 = 3;
const SUB: u64 = 1 << SUB_BITS;
/// Values below this use the linear buckets.
const LINEAR_LIMIT: u64 = 64;

/// Value of `FAULT_HIST` (shared by the CPUs) and of `FAULT_SOLE_HIST` (per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, Zeroable, PartialEq, Eq)]
pub struct Hist {
    pub counts: [u32; HIST_BUCKETS],
}

zeroed_default!(Hist);

/// The bucket of a latency in ns. Written without loops so the eBPF side can use it.
#[inline(always)]
pub fn bucket_of(ns: u64) -> usize {
    if ns < LINEAR_LIMIT {
        return (ns / (LINEAR_LIMIT / SUB)) as usize;
    }
    let msb = 63 - u64::from(ns.leading_zeros());
    let sub = (ns >> (msb - u64::from(SUB_BITS))) & (SUB - 1);
    // msb 6 (64..127 ns) starts at bucket 8.
    let bucket = (msb - 5) * SUB + sub;
    if bucket >= HIST_BUCKETS as u64 {
        HIST_BUCKETS - 1
    } else {
        bucket as usize
    }
}

/// The values `[low, high)` that fall in `bucket`.
pub fn bucket_range(bucket: usize) -> (u64, u64) {
    let b = bucket as u64;
    if b < SUB {
        let width = LINEAR_LIMIT / SUB;
        return (b * width, (b + 1) * width);
    }
    let msb = b / SUB + 5;
    let sub = b % SUB;
    let width = 1u64 << (msb - u64::from(SUB_BITS));
    let low = (1u64 << msb) + sub * width;
    (low, low + width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order() {
        let mut previous = 0;
        for ns in (0..5000u64).chain([1 << 20, (1 << 36) - 1]) {
            let b = bucket_of(ns);
            assert!(b >= previous, "{ns}");
            previous = b;
            let (low, high) = bucket_range(b);
            assert!(
                low <= ns && ns < high,
                "{ns} in bucket {b} = [{low}, {high})"
            );
        }
        assert_eq!(bucket_of(u64::MAX), HIST_BUCKETS - 1);
        assert_eq!(bucket_range(HIST_BUCKETS - 1).1, 1 << 37);
        // Resolution: 1/8 of the value or better above 64 ns.
        for b in 8..HIST_BUCKETS {
            let (low, high) = bucket_range(b);
            assert!((high - low) * 8 <= low, "{b}");
        }
    }
}

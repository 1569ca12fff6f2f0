//! The kernel counts per process in LRU hash maps of running totals. Two readings apart, what
//! a process did in between is the difference, with one exception: the kernel may have
//! evicted the entry and made it anew in between (a full map), and the new entry counts from
//! zero. `--interval` windows and the Prometheus series both difference these totals, so
//! they share this one rule.

use crate::buckets::Buckets;

/// What a running total grew by since `before`. A total that went down belongs to an entry
/// the kernel evicted and re-created in between: its whole count is new (taking it as
/// nothing would drop what the new entry counted).
pub fn growth(now: u64, before: u64) -> u64 {
    if now >= before { now - before } else { now }
}

/// [`growth`] bucket by bucket, dense; `before` is `None` for a histogram not read before.
pub fn bucket_growth<const N: usize>(now: &Buckets, before: Option<&Buckets>) -> [u64; N] {
    let mut grown = [0; N];
    for (b, n) in now.iter() {
        grown[b] = growth(n, before.map_or(0, |o| o.get(b)));
    }
    grown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_total_grows_by_the_difference() {
        assert_eq!(growth(7, 3), 4);
        assert_eq!(growth(3, 3), 0);
        assert_eq!(growth(5, 0), 5);
    }

    /// Issue 46 point 8: the interval windows took an evicted-and-recreated entry's lower
    /// total as 0 while the Prometheus series took all of it; both take all of it now.
    #[test]
    fn an_evicted_and_recreated_entry_is_all_new() {
        assert_eq!(growth(2, 9), 2);
        let before = Buckets::from_dense(&[0u64, 9, 1, 0]);
        let now = Buckets::from_dense(&[1u64, 2, 4, 0]);
        assert_eq!(bucket_growth::<4>(&now, Some(&before)), [1, 2, 3, 0]);
        assert_eq!(bucket_growth::<4>(&now, None), [1, 2, 4, 0]);
    }
}

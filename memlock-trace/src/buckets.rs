//! A latency histogram in the kernel's buckets, kept sparse, for every family that reads
//! one back: the fault family's (`bucket_of`, 256 counters) and the mlock family's
//! (`LATENCY_SLOTS`, 32). A short process fills a dozen buckets. A system-wide session holds
//! one per process and class the kernel maps hold (8,192 fault histograms), in the report,
//! the per-process summary and the metrics' last-seen totals at once: dense, 16 MiB each,
//! 56 MiB at a refresh (`heaptrack` of the soak); sparse, well under one.

/// Counts of the buckets that have any, in bucket order (at most 256 buckets: an index fits
/// a `u8`). Also what keeps other mostly-empty counter arrays small (pages populated per
/// call).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Buckets(Vec<(u8, u64)>);

impl Buckets {
    /// The buckets of a dense histogram (the kernel's `u32` counts or summed `u64` ones).
    pub fn from_dense<T: Copy + Into<u64>, const N: usize>(counts: &[T; N]) -> Self {
        const { assert!(N <= 256) };
        let used = counts.iter().filter(|&&n| n.into() > 0).count();
        let mut out = Vec::with_capacity(used);
        for (bucket, &n) in counts.iter().enumerate() {
            let n: u64 = n.into();
            if n > 0 {
                out.push((bucket as u8, n));
            }
        }
        Buckets(out)
    }

    /// (bucket, count) of every bucket with a count, in bucket order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.0.iter().map(|&(b, n)| (usize::from(b), n))
    }

    pub fn get(&self, bucket: usize) -> u64 {
        self.0
            .binary_search_by_key(&bucket, |&(b, _)| usize::from(b))
            .map_or(0, |i| self.0[i].1)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The highest bucket with a count.
    pub fn last(&self) -> Option<usize> {
        self.0.last().map(|&(b, _)| usize::from(b))
    }

    /// Adds these counts into a dense histogram (the quantiles and the exposition walk
    /// every bucket).
    pub fn add_to<const N: usize>(&self, dense: &mut [u64; N]) {
        for (b, n) in self.iter() {
            dense[b] += n;
        }
    }

    /// Adds `other`'s counts, bucket by bucket.
    pub fn add(&mut self, other: &Buckets) {
        if other.is_empty() {
            return;
        }
        if self.is_empty() {
            self.0.clone_from(&other.0);
            return;
        }
        let (a, b) = (&self.0, &other.0);
        let (mut i, mut j) = (0, 0);
        let mut merged = Vec::with_capacity(a.len() + b.len());
        loop {
            match (a.get(i), b.get(j)) {
                (Some(&(x, n)), Some(&(y, m))) if x == y => {
                    merged.push((x, n + m));
                    (i, j) = (i + 1, j + 1);
                }
                (Some(&p), Some(&(y, _))) if p.0 < y => {
                    merged.push(p);
                    i += 1;
                }
                (Some(&p), None) => {
                    merged.push(p);
                    i += 1;
                }
                (_, Some(&q)) => {
                    merged.push(q);
                    j += 1;
                }
                (None, None) => break,
            }
        }
        merged.shrink_to_fit();
        self.0 = merged;
    }

    /// Takes `earlier`'s counts away, bucket by bucket, none below zero; the buckets left
    /// empty are dropped.
    pub fn saturating_sub(&mut self, earlier: &Buckets) {
        for (b, n) in &mut self.0 {
            *n = n.saturating_sub(earlier.get(usize::from(*b)));
        }
        self.0.retain(|&(_, n)| n > 0);
    }
}

#[cfg(test)]
mod tests {
    use memlock_trace_common::faults::HIST_BUCKETS;

    use super::*;

    fn dense_of(b: &Buckets) -> [u64; HIST_BUCKETS] {
        let mut d = [0u64; HIST_BUCKETS];
        b.add_to(&mut d);
        d
    }

    fn dense(pairs: &[(usize, u64)]) -> [u64; HIST_BUCKETS] {
        let mut d = [0u64; HIST_BUCKETS];
        for &(b, n) in pairs {
            d[b] = n;
        }
        d
    }

    #[test]
    fn keeps_only_the_buckets_with_counts_and_gives_back_the_dense_form() {
        let d = dense(&[(0, 1), (17, 5), (255, 2)]);
        let b = Buckets::from_dense(&d);
        assert_eq!(b.iter().collect::<Vec<_>>(), [(0, 1), (17, 5), (255, 2)]);
        assert_eq!(dense_of(&b), d);
        assert_eq!((b.get(17), b.get(18), b.last()), (5, 0, Some(255)));
        let kernel: [u32; HIST_BUCKETS] = std::array::from_fn(|i| u32::from(i == 3) * 7);
        assert_eq!(
            Buckets::from_dense(&kernel).iter().collect::<Vec<_>>(),
            [(3, 7)]
        );
    }

    #[test]
    fn adds_and_subtracts_as_the_dense_histograms_do() {
        let (x, y) = (
            dense(&[(1, 1), (4, 2), (9, 3)]),
            dense(&[(0, 5), (4, 1), (10, 1)]),
        );
        let mut sum = Buckets::from_dense(&x);
        sum.add(&Buckets::from_dense(&y));
        let want: [u64; HIST_BUCKETS] = std::array::from_fn(|i| x[i] + y[i]);
        assert_eq!(dense_of(&sum), want);
        let mut empty = Buckets::default();
        empty.add(&sum);
        assert_eq!(empty, sum);
        sum.saturating_sub(&Buckets::from_dense(&x));
        assert_eq!(dense_of(&sum), y);
        sum.saturating_sub(&Buckets::from_dense(&dense(&[(0, 9), (4, 1)])));
        assert_eq!(sum.iter().collect::<Vec<_>>(), [(10, 1)]);
    }
}

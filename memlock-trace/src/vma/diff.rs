//! What a call did to the VMAs it touched: the diff of the two snapshots taken around it
//! (splits, merges, lock-flag changes), and their totals.

use std::collections::BTreeSet;

use memlock_trace_common::vma::{VM_LOCKED, VM_LOCKONFAULT, VmaRange};
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    /// The VMA `[start, end)` was cut at `at`.
    Split { start: u64, end: u64, at: u64 },
    /// The VMAs meeting at `at` became one VMA, `[start, end)`.
    Merge { start: u64, end: u64, at: u64 },
    /// `[start, end)` had the `set` flags set and the `cleared` flags cleared.
    Flags {
        start: u64,
        end: u64,
        set: u64,
        cleared: u64,
    },
}

impl Change {
    /// The VMA split or merged, or the range whose flags changed: `[start, end)`.
    pub fn span(&self) -> (u64, u64) {
        match *self {
            Change::Split { start, end, .. }
            | Change::Merge { start, end, .. }
            | Change::Flags { start, end, .. } => (start, end),
        }
    }
}

/// The changes that turn `before` into `after` (both sorted VMA lists of the same stretch of
/// address space): a boundary that appears inside an old VMA is a split, one that disappears
/// inside a new VMA is a merge, and every piece whose flags differ is a flag change.
pub fn diff(before: &[VmaRange], after: &[VmaRange]) -> Vec<Change> {
    let (Some(b0), Some(a0), Some(bn), Some(an)) =
        (before.first(), after.first(), before.last(), after.last())
    else {
        return Vec::new();
    };
    let (lo, hi) = (b0.start.max(a0.start), bn.end.min(an.end));
    if lo >= hi {
        // The two snapshots share no address range (lost or garbled records): nothing to say.
        return Vec::new();
    }
    let containing = |list: &[VmaRange], addr: u64| {
        list.iter()
            .copied()
            .find(|v| v.start <= addr && addr < v.end)
    };
    let edges = |list: &[VmaRange]| -> BTreeSet<u64> {
        list.iter()
            .flat_map(|v| [v.start, v.end])
            .filter(|&x| lo < x && x < hi)
            .collect()
    };
    let (old, new) = (edges(before), edges(after));
    // An edge only one side has, inside a VMA of the other side: that VMA was cut there
    // (split) or is what the two became (merge).
    let changed_at = |edges: &BTreeSet<u64>,
                      but_not: &BTreeSet<u64>,
                      vmas: &[VmaRange],
                      change: fn(u64, u64, u64) -> Change| {
        edges
            .difference(but_not)
            .filter_map(|&at| {
                let v = containing(vmas, at).filter(|v| v.start < at)?;
                Some(change(v.start, v.end, at))
            })
            .collect::<Vec<_>>()
    };
    let mut changes = changed_at(&new, &old, before, |start, end, at| Change::Split {
        start,
        end,
        at,
    });
    changes.extend(changed_at(&old, &new, after, |start, end, at| {
        Change::Merge { start, end, at }
    }));
    // Flag changes over the pieces between all edges, coalesced.
    let cuts: Vec<u64> = std::iter::once(lo)
        .chain(old.union(&new).copied())
        .chain(std::iter::once(hi))
        .collect();
    let mut flags: Vec<Change> = Vec::new();
    for piece in cuts.windows(2) {
        let (s, e) = (piece[0], piece[1]);
        let (Some(b), Some(a)) = (containing(before, s), containing(after, s)) else {
            continue;
        };
        let (set, cleared) = (a.flags & !b.flags, b.flags & !a.flags);
        if set == 0 && cleared == 0 {
            continue;
        }
        match flags.last_mut() {
            Some(Change::Flags {
                end,
                set: ps,
                cleared: pc,
                ..
            }) if *end == s && *ps == set && *pc == cleared => {
                *end = e;
            }
            _ => flags.push(Change::Flags {
                start: s,
                end: e,
                set,
                cleared,
            }),
        }
    }
    changes.extend(flags);
    changes
}

/// Totals over a list of changes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ChangeCounts {
    pub splits: u32,
    pub merges: u32,
    /// Bytes that gained / lost VM_LOCKED.
    pub locked_bytes: u64,
    pub unlocked_bytes: u64,
    /// Bytes that gained / lost VM_LOCKONFAULT.
    pub onfault_bytes: u64,
    pub unonfault_bytes: u64,
    /// `mlockall`/`munlockall` calls whose VMAs could not be read: their bytes are not in
    /// the figures above.
    pub unmeasured_calls: u32,
    /// Calls whose range held more VMAs than a snapshot takes: the VMAs past its end are not
    /// in the figures above (the call's `locked_vm` change counts them all).
    pub incomplete_calls: u32,
}

impl ChangeCounts {
    pub fn of(changes: &[Change]) -> Self {
        let mut c = Self::default();
        for change in changes {
            c.add(change);
        }
        c
    }

    pub fn add(&mut self, change: &Change) {
        match *change {
            Change::Split { .. } => self.splits += 1,
            Change::Merge { .. } => self.merges += 1,
            Change::Flags { set, cleared, .. } => {
                let (start, end) = change.span();
                let len = end - start;
                let bit = |flags: u64, b: u64| if flags & b != 0 { len } else { 0 };
                self.locked_bytes += bit(set, VM_LOCKED);
                self.unlocked_bytes += bit(cleared, VM_LOCKED);
                self.onfault_bytes += bit(set, VM_LOCKONFAULT);
                self.unonfault_bytes += bit(cleared, VM_LOCKONFAULT);
            }
        }
    }

    pub fn merge(&mut self, other: &Self) {
        self.splits += other.splits;
        self.merges += other.merges;
        self.locked_bytes += other.locked_bytes;
        self.unlocked_bytes += other.unlocked_bytes;
        self.onfault_bytes += other.onfault_bytes;
        self.unonfault_bytes += other.unonfault_bytes;
        self.unmeasured_calls += other.unmeasured_calls;
        self.incomplete_calls += other.incomplete_calls;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vma::test_vmas::{LO, P, RW, v};

    fn guard(list: &[VmaRange]) -> Vec<VmaRange> {
        // Neighbours with other flags, as the kernel side snapshots them.
        let mut out = vec![v(list[0].start / P - 1, list[0].start / P, 0x70)];
        out.extend_from_slice(list);
        out.push(v(
            list.last().unwrap().end / P,
            list.last().unwrap().end / P + 1,
            0x70,
        ));
        out
    }

    #[test]
    fn mlock_of_the_middle_is_two_splits_and_a_lock() {
        let before = guard(&[v(100, 116, RW)]);
        let after = guard(&[v(100, 104, RW), v(104, 112, RW | LO), v(112, 116, RW)]);
        let changes = diff(&before, &after);
        assert_eq!(
            changes,
            [
                Change::Split {
                    start: 100 * P,
                    end: 116 * P,
                    at: 104 * P
                },
                Change::Split {
                    start: 100 * P,
                    end: 116 * P,
                    at: 112 * P
                },
                Change::Flags {
                    start: 104 * P,
                    end: 112 * P,
                    set: LO,
                    cleared: 0
                },
            ]
        );
        let c = ChangeCounts::of(&changes);
        assert_eq!(
            (c.splits, c.merges, c.locked_bytes, c.unlocked_bytes),
            (2, 0, 8 * P, 0)
        );
    }

    #[test]
    fn mlock_next_to_a_locked_vma_splits_and_merges() {
        // mlock(112, 2 pages): the snapshot starts at the VMA holding 111 (locked).
        let before = [v(104, 112, RW | LO), v(112, 116, RW)];
        let after = [v(104, 114, RW | LO), v(114, 116, RW)];
        assert_eq!(
            diff(&before, &after),
            [
                Change::Split {
                    start: 112 * P,
                    end: 116 * P,
                    at: 114 * P
                },
                Change::Merge {
                    start: 104 * P,
                    end: 114 * P,
                    at: 112 * P
                },
                Change::Flags {
                    start: 112 * P,
                    end: 114 * P,
                    set: LO,
                    cleared: 0
                },
            ]
        );
    }

    #[test]
    fn munlock_of_everything_merges_back_to_one() {
        let before = guard(&[v(100, 104, RW), v(104, 114, RW | LO), v(114, 116, RW)]);
        let after = guard(&[v(100, 116, RW)]);
        let c = ChangeCounts::of(&diff(&before, &after));
        assert_eq!(
            (c.splits, c.merges, c.locked_bytes, c.unlocked_bytes),
            (0, 2, 0, 10 * P)
        );
    }

    #[test]
    fn different_flags_do_not_merge() {
        // [rw][r-x], mlock across the boundary: two splits, the boundary stays.
        let rx = 0x75;
        let before = guard(&[v(100, 108, RW), v(108, 116, rx)]);
        let after = guard(&[
            v(100, 104, RW),
            v(104, 108, RW | LO),
            v(108, 112, rx | LO),
            v(112, 116, rx),
        ]);
        let changes = diff(&before, &after);
        let c = ChangeCounts::of(&changes);
        assert_eq!((c.splits, c.merges, c.locked_bytes), (2, 0, 8 * P));
        // Two pieces with different flags before stay two flag changes of the same kind,
        // coalesced because the change (set, cleared) is the same.
        assert_eq!(
            changes.last(),
            Some(&Change::Flags {
                start: 104 * P,
                end: 112 * P,
                set: LO,
                cleared: 0
            })
        );
    }

    #[test]
    fn onfault_and_no_change() {
        let before = [v(100, 116, RW)];
        let after = [
            v(100, 104, RW),
            v(104, 112, RW | LO | VM_LOCKONFAULT),
            v(112, 116, RW),
        ];
        let c = ChangeCounts::of(&diff(&before, &after));
        assert_eq!(
            (c.splits, c.locked_bytes, c.onfault_bytes),
            (2, 8 * P, 8 * P)
        );
        assert!(diff(&before, &before).is_empty());
        assert!(diff(&[], &before).is_empty());
        // Disjoint snapshots (a garbled record) give nothing rather than nonsense.
        assert!(diff(&before, &[v(200, 216, RW)]).is_empty());
    }
}

//! Event lines in time order. Syscall and VMA records come from one ring, faults from
//! another, each drained in batches: written as read, a batch of faults would print after
//! the calls that followed them. Rendered lines wait here, keyed by their kernel stamp, and
//! are written once no earlier record can still arrive: a drain reads its ring to the end,
//! so every record submitted before the last drain of every ring began has been read.
//!
//! A syscall sorts by its entry time, which is also its JSON `time_ns`: the call's line
//! comes first and the pages it populated (stamped during or at the end of the call) follow
//! it, as a reader expects ("mlock ..., then what it populated"). The kernel submits a
//! call at its exit, so a record can arrive up to the call's duration late: the hold-back
//! grows with the longest call seen.

use std::{cmp::Reverse, collections::BinaryHeap, io::Write};

use memlock_trace_common::DRAIN_INTERVAL_MS;

/// A margin for a record stamped some time before it is submitted (two drain periods:
/// small against a reader, large against a program's run).
const BASE_LAG_NS: u64 = 2 * DRAIN_INTERVAL_MS * 1_000_000;
/// However long a call was, lines are not held longer than this.
const MAX_LAG_NS: u64 = 1_000_000_000;

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Held {
    key_ns: u64,
    /// Arrival order breaks ties: a call's VMA lines stay after the call's line.
    seq: u64,
    text: Vec<u8>,
}

#[derive(Default)]
pub(super) struct Reorder {
    heap: BinaryHeap<Reverse<Held>>,
    seq: u64,
    /// The longest call seen: how late a call's record can arrive after its entry stamp.
    longest_call_ns: u64,
    /// The newest key written: a record older than that arrived too late to be reordered.
    written_ns: u64,
    /// Records written out of order (arrived after a later one was written).
    pub(super) late: u64,
    /// Each ring (by fd) and when its last drain began (CLOCK_MONOTONIC ns).
    rings: Vec<(i32, u64)>,
}

impl Reorder {
    /// Holds one rendered event (its line or lines, newline-terminated) stamped `key_ns`
    /// (CLOCK_MONOTONIC, as `bpf_ktime_get_ns`).
    pub(super) fn push(&mut self, key_ns: u64, text: Vec<u8>) {
        if key_ns < self.written_ns {
            self.late += 1;
        }
        self.seq += 1;
        self.heap.push(Reverse(Held {
            key_ns,
            seq: self.seq,
            text,
        }));
    }

    /// A call lasted `ns`: its record arrived that much after its stamp.
    pub(super) fn saw_call(&mut self, ns: u64) {
        self.longest_call_ns = self.longest_call_ns.max(ns);
    }

    fn lag_ns(&self) -> u64 {
        (BASE_LAG_NS + self.longest_call_ns).min(MAX_LAG_NS)
    }

    /// A ring whose records go through here: nothing is written until it is drained too.
    pub(super) fn watch(&mut self, ring: i32) {
        self.rings.push((ring, 0));
    }

    /// A drain of `ring` that began at `began_ns` read it to the end.
    pub(super) fn drained(&mut self, ring: i32, began_ns: u64) {
        match self.rings.iter_mut().find(|(fd, _)| *fd == ring) {
            Some((_, at)) => *at = began_ns,
            None => self.rings.push((ring, began_ns)),
        }
    }

    /// Writes every held record older than the last drain of the least recently drained
    /// ring, less the hold-back.
    pub(super) fn release(&mut self, out: &mut impl Write) {
        let drained = self.rings.iter().map(|&(_, at)| at).min().unwrap_or(0);
        self.write_until(drained.saturating_sub(self.lag_ns()), out);
    }

    /// Writes everything held (the session, or an interval, ends).
    pub(super) fn flush(&mut self, out: &mut impl Write) {
        self.write_until(u64::MAX, out);
    }

    fn write_until(&mut self, watermark: u64, out: &mut impl Write) {
        while self
            .heap
            .peek()
            .is_some_and(|Reverse(h)| h.key_ns <= watermark)
        {
            let Some(Reverse(held)) = self.heap.pop() else {
                break;
            };
            self.written_ns = self.written_ns.max(held.key_ns);
            // A refused write is remembered by the sink, which stops the session.
            let _ = out.write_all(&held.text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(s: &str) -> Vec<u8> {
        format!("{s}\n").into_bytes()
    }

    #[test]
    fn lines_from_two_rings_come_out_in_stamp_order() {
        let mut r = Reorder::default();
        let mut out = Vec::new();
        // The syscall ring's batch, then the fault ring's.
        r.push(100, line("mlock"));
        r.push(100, line("  vma split"));
        r.push(300, line("munlock"));
        r.push(50, line("fault a"));
        r.push(150, line("populated by mlock"));
        r.flush(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "fault a\nmlock\n  vma split\npopulated by mlock\nmunlock\n"
        );
        assert_eq!(r.late, 0);
    }

    #[test]
    fn only_records_older_than_every_rings_last_drain_are_released() {
        let mut r = Reorder::default();
        let mut out = Vec::new();
        r.watch(3);
        r.watch(4);
        r.push(1_000, line("old"));
        r.push(BASE_LAG_NS + 5_000, line("recent"));
        // Ring 4 was not read yet: it may hold something older still.
        r.drained(3, BASE_LAG_NS + 2_000);
        r.release(&mut out);
        assert!(out.is_empty());
        r.drained(4, BASE_LAG_NS + 2_000);
        r.release(&mut out);
        assert_eq!(out, line("old"));
        // A long call widens the hold-back by its duration.
        r.saw_call(10_000);
        for ring in [3, 4] {
            r.drained(ring, 2 * BASE_LAG_NS + 6_000);
        }
        r.release(&mut out);
        assert_eq!(
            out,
            line("old"),
            "held: a call that long could be in flight"
        );
        for ring in [3, 4] {
            r.drained(ring, 2 * BASE_LAG_NS + 15_000);
        }
        r.release(&mut out);
        assert_eq!(out, [line("old"), line("recent")].concat());
        // Something older than what was written can only follow it, and is counted.
        r.push(10, line("late"));
        r.flush(&mut out);
        assert_eq!(r.late, 1);
    }
}

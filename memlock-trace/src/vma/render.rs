//! VMA activity as text lines: the event lines under `--events` and the per-process
//! split/merge summary (their JSON is [`super::json`]).

use std::fmt::Write as _;

use super::{
    calls::{syscall_only, syscall_str},
    diff::{Change, ChangeCounts},
    hooks::VmaHooks,
    tracker::{Activity, VmaCall},
};
use crate::{
    event::{comm_of, comm_str, errno_name},
    procfs::PAGE_SIZE,
};
use memlock_trace_common::vma::{
    FuncEvent, STORE_FN_LEN, StoreEvent, VM_LOCKED, VM_LOCKONFAULT, VmaRange, WholeTotals, phase,
};

pub fn flags_str(flags: u64) -> String {
    const VM_READ: u64 = 0x1;
    const VM_WRITE: u64 = 0x2;
    const VM_EXEC: u64 = 0x4;
    const VM_SHARED: u64 = 0x8;
    let bit = |b: u64, c: char| if flags & b != 0 { c } else { '-' };
    let mut s: String = [
        bit(VM_READ, 'r'),
        bit(VM_WRITE, 'w'),
        bit(VM_EXEC, 'x'),
        if flags & VM_SHARED != 0 { 's' } else { 'p' },
    ]
    .into_iter()
    .collect();
    if flags & VM_LOCKED != 0 {
        s.push_str(" lo");
    }
    if flags & VM_LOCKONFAULT != 0 {
        s.push_str(" lf");
    }
    s
}

pub fn range_str(v: &VmaRange) -> String {
    format!("{:x}-{:x} {}", v.start, v.end, flags_str(v.flags))
}

fn lock_flags_str(flags: u64) -> String {
    let mut names = Vec::new();
    if flags & VM_LOCKED != 0 {
        names.push("VM_LOCKED");
    }
    if flags & VM_LOCKONFAULT != 0 {
        names.push("VM_LOCKONFAULT");
    }
    let other = flags & !(VM_LOCKED | VM_LOCKONFAULT);
    if other != 0 {
        names.push("other");
    }
    let mut s = names.join("|");
    if other != 0 {
        let _ = write!(s, "({other:#x})");
    }
    s
}

impl Change {
    pub fn describe(&self) -> String {
        match *self {
            Change::Split { start, end, at } => format!("split {start:x}-{end:x} at {at:x}"),
            Change::Merge { start, end, at } => format!("merge at {at:x} into {start:x}-{end:x}"),
            Change::Flags { set, cleared, .. } => {
                let (start, end) = self.span();
                let mut s = format!("{start:x}-{end:x} ({} pages)", (end - start) / PAGE_SIZE);
                if set != 0 {
                    let _ = write!(s, " +{}", lock_flags_str(set));
                }
                if cleared != 0 {
                    let _ = write!(s, " -{}", lock_flags_str(cleared));
                }
                s
            }
        }
    }
}

pub fn store_func(s: &StoreEvent) -> String {
    comm_str(&s.func[..STORE_FN_LEN])
}

fn store_str(s: &StoreEvent) -> String {
    if s.vma == 0 {
        // The range is inclusive; an erase can reach the top of the address space.
        match s.last.checked_add(1) {
            Some(end) => format!("erase {:x}-{end:x}", s.index),
            None => format!("erase {:x}-(top)", s.index),
        }
    } else {
        format!("store {}", range_str(&s.range))
    }
}

/// `__split_vma(vma=7f..-7f.. rw-p, addr=0x7f.., new_below=0x1)`, with the slot VMAs.
pub fn function_str(f: &FuncEvent, hooks: Option<&VmaHooks>) -> String {
    let Some(hooked) = hooks.and_then(|h| h.functions.get(f.hook as usize)) else {
        return format!("hook {} {:?}", f.hook, f.args);
    };
    let mut s = format!(
        "{}{}(",
        if f.phase == phase::BEFORE {
            "-> "
        } else {
            "<- "
        },
        hooked.name
    );
    let mut parts = Vec::new();
    for (i, label) in hooked.slots.iter().enumerate() {
        let v = &f.vmas[i];
        if f.values[i] == 0 || (label == "ret" && f.phase == phase::BEFORE) {
            continue;
        }
        parts.push(format!("{label}={}", range_str(v)));
    }
    for (i, name) in hooked.params.iter().enumerate().take(f.args.len()) {
        if !hooked.slots.iter().any(|l| l == name) && !name.is_empty() {
            parts.push(format!("{name}={:#x}", f.args[i]));
        }
    }
    s.push_str(&parts.join(", "));
    s.push(')');
    if f.phase == phase::AFTER {
        let _ = write!(s, " = {:#x}", f.ret);
    }
    s
}

impl VmaCall {
    /// `VMAs around range 1 -> 3 (map_count 10 -> 12): split .. at ..; 7f..-7f.. (8 pages)
    /// +VM_LOCKED`: the snapshots' VMAs (the range and its adjacent neighbours), then the
    /// whole process's `map_count`.
    pub fn summary(&self) -> String {
        if self.unmeasured {
            return format!(
                "whole process (map_count {} -> {}): VMAs not measured (no tree walk on this \
                 kernel, or the tree changed under it)",
                self.syscall.raw.map_count_before, self.syscall.raw.map_count_after
            );
        }
        if let Some([b, a]) = &self.whole {
            return whole_summary(b, a);
        }
        let count = |s: &[VmaRange]| s.len();
        let mut out = format!(
            "VMAs around range {} -> {} (map_count {} -> {})",
            count(&self.before),
            count(&self.after),
            self.syscall.raw.map_count_before,
            self.syscall.raw.map_count_after
        );
        if self.changes.is_empty() {
            out.push_str(": no change");
        } else {
            out.push_str(": ");
            out.push_str(
                &self
                    .changes
                    .iter()
                    .map(Change::describe)
                    .collect::<Vec<_>>()
                    .join("; "),
            );
        }
        if self.incomplete {
            out.push_str(" (snapshot incomplete)");
        }
        out
    }
}

/// `whole process: VMAs 40 -> 39, VM_LOCKED on 0 KiB in 0 VMAs -> 16880 KiB in 37 VMAs:
/// VM_LOCKED set on 16880 KiB`: an `mlockall`/`munlockall`, from its entry and exit totals.
fn whole_summary(b: &WholeTotals, a: &WholeTotals) -> String {
    let mut out = format!(
        "whole process: VMAs {} -> {}, VM_LOCKED on {} KiB in {} VMAs -> {} KiB in {} VMAs: ",
        b.vmas,
        a.vmas,
        b.locked_bytes / 1024,
        b.locked_vmas,
        a.locked_bytes / 1024,
        a.locked_vmas
    );
    let (set, cleared) = (
        a.locked_bytes.saturating_sub(b.locked_bytes),
        b.locked_bytes.saturating_sub(a.locked_bytes),
    );
    out.push_str(&match (set, cleared) {
        (0, 0) => "no change".to_string(),
        (s, 0) => format!("VM_LOCKED set on {} KiB", s / 1024),
        (_, c) => format!("VM_LOCKED cleared on {} KiB", c / 1024),
    });
    out
}

/// Lines for `--events`.
pub fn activity_lines(a: &Activity, hooks: Option<&VmaHooks>) -> Vec<String> {
    match a {
        Activity::Call(c) => {
            let r = &c.syscall.raw;
            let result = errno_name(r.ret).map_or_else(|| r.ret.to_string(), |e| format!("-1 {e}"));
            let mut lines = vec![format!(
                "{:>7}/{:<7} {:<16} {} = {}  {}",
                r.tgid,
                r.tid,
                c.syscall.name(),
                c.syscall.syscall.describe(r.args),
                result,
                c.summary()
            )];
            for s in &c.stores {
                lines.push(format!(
                    "{:>16} ma_write {} ({})",
                    "",
                    store_str(s),
                    store_func(s)
                ));
            }
            for f in &c.functions {
                lines.push(format!("{:>16} {}", "", function_str(f, hooks)));
            }
            lines
        }
        Activity::Store(s) => vec![format!(
            "{:>7}/{:<7} {:<16} {}: ma_write {} ({})",
            s.tgid,
            s.tid,
            comm_of(&s.comm),
            syscall_str(s.nr, s.args),
            store_str(s),
            store_func(s)
        )],
        Activity::Func(f) => vec![format!(
            "{:>7}/{:<7} {:<16} {}: {}",
            f.tgid,
            f.tid,
            "",
            // `args` are the kernel function's, not the call's.
            syscall_only(f.nr),
            function_str(f, hooks)
        )],
    }
}

/// The text summary's line for one process.
pub fn summary_line(pid: u32, c: &ChangeCounts) -> String {
    let mut out = format!(
        "pid {pid} VMA changes by mlock-family calls: {} splits, {} merges, VM_LOCKED set on {} KiB, cleared on {} KiB",
        c.splits,
        c.merges,
        c.locked_bytes / 1024,
        c.unlocked_bytes / 1024
    );
    if c.unmeasured_calls > 0 {
        let _ = write!(
            out,
            " ({} mlockall/munlockall calls not measured, not included)",
            c.unmeasured_calls
        );
    }
    // Why this can be less than the syscall table's locked pages (`locked_vm`).
    if c.incomplete_calls > 0 {
        let _ = write!(
            out,
            " ({} {} spanned more VMAs than a snapshot holds: the VMAs past it are not in \
             these figures, the syscall table's locked pages (locked_vm) count them)",
            c.incomplete_calls,
            if c.incomplete_calls == 1 {
                "call's range"
            } else {
                "calls' ranges"
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use memlock_trace_common::{EventKind, SyscallEvent, vma::SnapshotEvent};

    use super::*;
    use crate::vma::test_vmas::{LO, P, RW, v};
    use crate::{
        event::{DecodeError, Event, Syscall, SyscallRecord, VmaRecord, bytes_of, decode},
        vma::Tracker,
    };

    fn snapshot(phase: u32, vmas: &[VmaRange]) -> SnapshotEvent {
        let mut s = SnapshotEvent {
            kind: EventKind::Snapshot as u32,
            phase,
            tgid: 5,
            tid: 6,
            count: vmas.len() as u32,
            ..Default::default()
        };
        s.vmas[..vmas.len()].copy_from_slice(vmas);
        s
    }

    fn syscall_record() -> SyscallRecord {
        SyscallRecord {
            syscall: Syscall::Mlock,
            raw: SyscallEvent {
                kind: EventKind::Syscall as u32,
                nr: Syscall::Mlock.nr(),
                tgid: 5,
                tid: 6,
                map_count_before: 10,
                map_count_after: 12,
                ..Default::default()
            },
        }
    }

    #[test]
    fn records_round_trip_and_pair_with_their_call() {
        let before = snapshot(phase::BEFORE, &[v(100, 116, RW)]);
        let after = snapshot(
            phase::AFTER,
            &[v(100, 104, RW), v(104, 112, RW | LO), v(112, 116, RW)],
        );
        let mut store = StoreEvent {
            kind: EventKind::Store as u32,
            tgid: 5,
            tid: 6,
            index: 100 * P,
            last: 104 * P - 1,
            vma: 0xffff_8880_0000_1000,
            range: v(100, 104, RW),
            ..Default::default()
        };
        store.func[..18].copy_from_slice(b"mas_store_prealloc");

        let mut tracker = Tracker::default();
        let decode_one = |bytes: Vec<u8>| match decode(&bytes) {
            Ok(Event::Vma(record)) => record,
            other => panic!("not a VMA record: {other:?}"),
        };
        assert!(tracker.record(decode_one(bytes_of(&before))).is_none());
        assert!(tracker.record(decode_one(bytes_of(&store))).is_none());
        // The same store again (the inner node writer): dropped.
        assert!(tracker.record(decode_one(bytes_of(&store))).is_none());
        assert!(tracker.syscall(&syscall_record()).is_none());
        let Some(Activity::Call(call)) = tracker.record(decode_one(bytes_of(&after))) else {
            panic!("the exit snapshot completes the call");
        };
        assert_eq!(call.stores.len(), 1);
        assert_eq!(store_func(&call.stores[0]), "mas_store_prealloc");
        assert_eq!(ChangeCounts::of(&call.changes).splits, 2);
        assert_eq!(call.before.len(), 1);
        assert_eq!(call.after.len(), 3);
        assert!(
            call.summary()
                .starts_with("VMAs around range 1 -> 3 (map_count 10 -> 12): split"),
            "{}",
            call.summary()
        );

        // A store with no call around it stands alone.
        let Some(Activity::Store(s)) =
            tracker.record(VmaRecord::Store(StoreEvent { tid: 9, ..store }))
        else {
            panic!("a store outside a call is its own activity");
        };
        assert_eq!(s.tid, 9);
        let mut short = bytes_of(&before);
        short.truncate(40);
        assert!(matches!(decode(&short), Err(DecodeError::Short { .. })));
    }

    #[test]
    fn mlockall_counts_the_whole_process_or_says_it_could_not() {
        let whole = |measured, locked_vmas, locked_bytes| WholeTotals {
            measured,
            vmas: 40,
            locked_vmas,
            locked_bytes,
            ..WholeTotals::default()
        };
        let mut tracker = Tracker::default();
        let mut call = |nr: Syscall, b: WholeTotals, a: WholeTotals| {
            let mut before = snapshot(phase::BEFORE, &[]);
            before.whole = b;
            let mut after = snapshot(phase::AFTER, &[]);
            after.whole = a;
            let mut rec = syscall_record();
            rec.syscall = nr;
            tracker.record(VmaRecord::Snapshot(Box::new(before)));
            tracker.syscall(&rec);
            match tracker.record(VmaRecord::Snapshot(Box::new(after))) {
                Some(Activity::Call(c)) => c,
                other => panic!("{other:?}"),
            }
        };
        let lock = call(Syscall::Mlockall, whole(1, 0, 0), whole(1, 37, 400 * P));
        let c = lock.counts();
        assert_eq!(
            (c.locked_bytes, c.unlocked_bytes, c.unmeasured_calls),
            (400 * P, 0, 0)
        );
        assert!(
            lock.summary().ends_with(
                "VM_LOCKED on 0 KiB in 0 VMAs -> 1600 KiB in 37 VMAs: VM_LOCKED set on 1600 KiB"
            ),
            "{}",
            lock.summary()
        );
        let unlock = call(Syscall::Munlockall, whole(1, 37, 400 * P), whole(1, 0, 0));
        assert_eq!(unlock.counts().unlocked_bytes, 400 * P);
        assert!(unlock.summary().ends_with("VM_LOCKED cleared on 1600 KiB"));
        // One side unread (5.10, or a tree changing under the walk): not measured, not 0.
        let unread = call(Syscall::Mlockall, whole(0, 0, 0), whole(1, 37, 400 * P));
        let c = unread.counts();
        assert_eq!((c.locked_bytes, c.unmeasured_calls), (0, 1));
        assert!(
            unread.summary().contains("not measured"),
            "{}",
            unread.summary()
        );
        assert!(
            summary_line(1, &c)
                .ends_with("(1 mlockall/munlockall calls not measured, not included)")
        );
    }

    #[test]
    fn a_store_erasing_up_to_the_top_renders() {
        // munmap of the stack region at exec: the tree range ends at ULONG_MAX.
        let erase = StoreEvent {
            kind: EventKind::Store as u32,
            index: 0x7ffc_0000_0000,
            last: u64::MAX,
            ..Default::default()
        };
        assert_eq!(store_str(&erase), "erase 7ffc00000000-(top)");
        let lines = activity_lines(&Activity::Store(erase), None);
        assert!(
            lines[0].ends_with("erase 7ffc00000000-(top) ()"),
            "{lines:?}"
        );
    }

    #[test]
    fn flags_render_like_proc() {
        assert_eq!(flags_str(RW), "rw-p");
        assert_eq!(flags_str(RW | LO | VM_LOCKONFAULT), "rw-p lo lf");
        assert_eq!(flags_str(0x75 | LO), "r-xp lo");
        assert_eq!(
            lock_flags_str(LO | VM_LOCKONFAULT),
            "VM_LOCKED|VM_LOCKONFAULT"
        );
    }
}

//! VMA events in user space: decoding, pairing each with the mlock-family call that caused
//! it, and what the call did to the address space (splits, merges, flag changes).
//!
//! The semantics come from diffing the two snapshots the kernel side takes around each call
//! (the VMAs covering the call's range and its neighbours, at `sys_enter` and `sys_exit`), so
//! they are the same on every kernel. The `ma_write` stores and fentry/fexit function events
//! are the mechanism, shown alongside.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt::Write as _,
};

use memlock_trace_common::EventKind;
use memlock_trace_common::vma::{
    FuncEvent, NR_UNKNOWN, STORE_FN_LEN, SnapshotEvent, StoreEvent, VM_LOCKED, VM_LOCKONFAULT,
    VmaRange, phase,
};
use serde::Serialize;
use serde_json::json;

use crate::{
    decode::{DecodeError, SyscallRecord, comm_str, read_struct},
    syscall::{Syscall, errno_name},
    tracer::VmaHooks,
};

pub const PAGE_SIZE: u64 = 4096;

/// A decoded VMA record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmaRecord {
    Snapshot(Box<SnapshotEvent>),
    Store(StoreEvent),
    Func(Box<FuncEvent>),
}

pub fn decode(k: u32, record: &[u8]) -> Result<VmaRecord, DecodeError> {
    Ok(match EventKind::from_u32(k) {
        Some(EventKind::Snapshot) => {
            let s: SnapshotEvent = read_struct(k, record)?;
            if s.count as usize > s.vmas.len() {
                return Err(DecodeError::Short {
                    kind: k,
                    len: s.count as usize,
                    need: s.vmas.len(),
                });
            }
            VmaRecord::Snapshot(Box::new(s))
        }
        Some(EventKind::Store) => VmaRecord::Store(read_struct(k, record)?),
        Some(EventKind::Func) => VmaRecord::Func(Box::new(read_struct(k, record)?)),
        _ => return Err(DecodeError::UnknownKind(k)),
    })
}

/// What a call did to the VMAs it touched.
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
    let mut changes = Vec::new();
    for &at in new.difference(&old) {
        if let Some(v) = containing(before, at).filter(|v| v.start < at) {
            changes.push(Change::Split {
                start: v.start,
                end: v.end,
                at,
            });
        }
    }
    for &at in old.difference(&new) {
        if let Some(v) = containing(after, at).filter(|v| v.start < at) {
            changes.push(Change::Merge {
                start: v.start,
                end: v.end,
                at,
            });
        }
    }
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
            Change::Flags {
                start,
                end,
                set,
                cleared,
            } => {
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
    }
}

/// One mlock-family call with its VMA view.
#[derive(Clone, Debug)]
pub struct VmaCall {
    pub syscall: SyscallRecord,
    pub before: Vec<VmaRange>,
    pub after: Vec<VmaRange>,
    /// A snapshot could not cover the whole range (too many VMAs, a hole, a busy lock).
    pub incomplete: bool,
    pub changes: Vec<Change>,
    /// `ma_write` stores into the task's VMA tree during the call.
    pub stores: Vec<StoreEvent>,
    /// fentry/fexit events of hooked kernel functions during the call.
    pub functions: Vec<FuncEvent>,
}

/// What the tracker hands out: a completed call, or a VMA event outside mlock-family calls
/// (e.g. `mmap` storing a VMA that is born VM_LOCKED under `mlockall(MCL_FUTURE)`).
#[derive(Clone, Debug)]
pub enum Activity {
    Call(Box<VmaCall>),
    Store(StoreEvent),
    Func(Box<FuncEvent>),
}

impl Activity {
    pub fn tgid(&self) -> u32 {
        match self {
            Activity::Call(c) => c.syscall.raw.tgid,
            Activity::Store(s) => s.tgid,
            Activity::Func(f) => f.tgid,
        }
    }
}

#[derive(Default)]
struct Pending {
    before: Option<Box<SnapshotEvent>>,
    after: Option<Box<SnapshotEvent>>,
    syscall: Option<SyscallRecord>,
    stores: Vec<StoreEvent>,
    functions: Vec<FuncEvent>,
}

/// Pairs snapshots, stores and function events with their syscall event, per thread.
/// A call's records arrive in order from its thread: the entry snapshot, the stores and
/// function events, then the syscall event and the exit snapshot (in either order).
#[derive(Default)]
pub struct Tracker {
    pending: HashMap<u32, Pending>,
    /// `ma_write` fires twice per store on some kernels (the store function and the node
    /// writer it calls): the last store seen per thread, to drop the repeat.
    last_store: HashMap<u32, (u64, u64, u64)>,
}

impl Tracker {
    pub fn syscall(&mut self, rec: &SyscallRecord) -> Option<Activity> {
        let pending = self.pending.get_mut(&rec.raw.tid)?;
        pending.syscall = Some(rec.clone());
        self.complete(rec.raw.tid)
    }

    pub fn record(&mut self, rec: VmaRecord) -> Option<Activity> {
        match rec {
            VmaRecord::Snapshot(s) if s.phase == phase::BEFORE => {
                self.last_store.remove(&s.tid);
                // A call whose exit was lost is replaced rather than kept forever.
                self.pending.insert(
                    s.tid,
                    Pending {
                        before: Some(s),
                        ..Pending::default()
                    },
                );
                None
            }
            VmaRecord::Snapshot(s) => {
                let tid = s.tid;
                self.pending.get_mut(&tid)?.after = Some(s);
                self.complete(tid)
            }
            VmaRecord::Store(s) => {
                let key = (s.index, s.last, s.vma);
                if self.last_store.insert(s.tid, key) == Some(key) {
                    return None;
                }
                match self.pending.get_mut(&s.tid) {
                    Some(p) if p.syscall.is_none() && p.after.is_none() => {
                        p.stores.push(s);
                        None
                    }
                    _ => Some(Activity::Store(s)),
                }
            }
            VmaRecord::Func(f) => match self.pending.get_mut(&f.tid) {
                Some(p) if p.syscall.is_none() && p.after.is_none() => {
                    p.functions.push(*f);
                    None
                }
                _ => Some(Activity::Func(f)),
            },
        }
    }

    fn complete(&mut self, tid: u32) -> Option<Activity> {
        let p = self.pending.get(&tid)?;
        if p.syscall.is_none() || p.after.is_none() {
            return None;
        }
        let p = self.pending.remove(&tid)?;
        let (before, after) = (p.before?, p.after?);
        let list = |s: &SnapshotEvent| s.vmas[..s.count as usize].to_vec();
        let (b, a) = (list(&before), list(&after));
        Some(Activity::Call(Box::new(VmaCall {
            changes: diff(&b, &a),
            syscall: p.syscall?,
            before: b,
            after: a,
            incomplete: before.incomplete != 0 || after.incomplete != 0,
            stores: p.stores,
            functions: p.functions,
        })))
    }
}

/// `rw-p`-style permissions plus the lock flags, like /proc/PID/maps and smaps `VmFlags`.
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
            Change::Flags {
                start,
                end,
                set,
                cleared,
            } => {
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

/// `mmap(0x7f.., 65536, 0x3)`: a syscall number with its first arguments, for VMA events
/// outside the mlock family.
pub fn syscall_str(nr: u32, args: [u64; 3]) -> String {
    if nr == NR_UNKNOWN {
        return "(no syscall: page fault or kernel)".into();
    }
    if let Some(s) = Syscall::from_nr(nr) {
        return s.describe(args);
    }
    let name = syscall_name(nr).map_or_else(|| format!("syscall {nr}"), str::to_string);
    format!("{name}({:#x}, {}, {:#x})", args[0], args[1], args[2])
}

/// Names of the other calls that change VMAs (x86-64 numbers via libc).
fn syscall_name(nr: u32) -> Option<&'static str> {
    let nr = i64::from(nr);
    Some(match nr {
        n if n == libc::SYS_mmap => "mmap",
        n if n == libc::SYS_munmap => "munmap",
        n if n == libc::SYS_mprotect => "mprotect",
        n if n == libc::SYS_madvise => "madvise",
        n if n == libc::SYS_mremap => "mremap",
        n if n == libc::SYS_brk => "brk",
        n if n == libc::SYS_clone => "clone",
        n if n == libc::SYS_clone3 => "clone3",
        n if n == libc::SYS_execve => "execve",
        n if n == libc::SYS_exit_group => "exit_group",
        _ => return None,
    })
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
    /// `1 -> 3 VMAs: split .. at ..; 7f..-7f.. (8 pages) +VM_LOCKED`
    pub fn summary(&self) -> String {
        let count = |s: &[VmaRange]| s.len();
        let mut out = format!(
            "VMAs {} -> {} (map_count {} -> {})",
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
                c.syscall.comm(),
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
            "",
            syscall_str(s.nr, s.args),
            store_str(s),
            store_func(s)
        )],
        Activity::Func(f) => vec![format!(
            "{:>7}/{:<7} {:<16} {}: {}",
            f.tgid,
            f.tid,
            "",
            syscall_str(f.nr, [f.args[0], f.args[1], f.args[2]]),
            function_str(f, hooks)
        )],
    }
}

fn range_json(v: &VmaRange) -> serde_json::Value {
    json!({"start": v.start, "end": v.end, "flags": v.flags, "perms": flags_str(v.flags)})
}

/// One JSON line for `--events --json`.
pub fn activity_json(a: &Activity, hooks: Option<&VmaHooks>) -> serde_json::Value {
    match a {
        Activity::Call(c) => {
            let r = &c.syscall.raw;
            json!({
                "type": "vma_call",
                "schema": crate::render::JSON_SCHEMA,
                "pid": r.tgid,
                "tid": r.tid,
                "comm": c.syscall.comm(),
                "syscall": c.syscall.syscall.name(),
                "args": c.syscall.syscall.describe(r.args),
                "ret": r.ret,
                "errno": errno_name(r.ret),
                "map_count_before": r.map_count_before,
                "map_count_after": r.map_count_after,
                "before": c.before.iter().map(range_json).collect::<Vec<_>>(),
                "after": c.after.iter().map(range_json).collect::<Vec<_>>(),
                "incomplete": c.incomplete,
                "changes": c.changes,
                "counts": ChangeCounts::of(&c.changes),
                "stores": c.stores.iter().map(store_json).collect::<Vec<_>>(),
                "functions": c.functions.iter().map(|f| function_str(f, hooks)).collect::<Vec<_>>(),
            })
        }
        Activity::Store(s) => store_json(s),
        Activity::Func(f) => json!({
            "type": "vma_function",
            "schema": crate::render::JSON_SCHEMA,
            "pid": f.tgid,
            "tid": f.tid,
            "syscall": syscall_str(f.nr, [f.args[0], f.args[1], f.args[2]]),
            "call": function_str(f, hooks),
        }),
    }
}

fn store_json(s: &StoreEvent) -> serde_json::Value {
    json!({
        "type": "vma_store",
        "schema": crate::render::JSON_SCHEMA,
        "pid": s.tgid,
        "tid": s.tid,
        "syscall": syscall_str(s.nr, s.args),
        "start": s.index,
        "end": s.last.wrapping_add(1),
        "vma": if s.vma == 0 { serde_json::Value::Null } else { range_json(&s.range) },
        "function": store_func(s),
    })
}

/// The text summary's line for one process.
pub fn summary_line(pid: u32, c: &ChangeCounts) -> String {
    format!(
        "pid {pid} VMA changes by mlock-family calls: {} splits, {} merges, VM_LOCKED set on {} KiB, cleared on {} KiB",
        c.splits,
        c.merges,
        c.locked_bytes / 1024,
        c.unlocked_bytes / 1024
    )
}

/// `{"type":"vma_summary","processes":[{"pid":..,"changes":{..}}]}`, printed before the summary.
pub fn summary_json(counts: &BTreeMap<u32, ChangeCounts>) -> serde_json::Value {
    let processes: Vec<_> = counts
        .iter()
        .map(|(pid, c)| json!({"pid": pid, "changes": c}))
        .collect();
    json!({"type": "vma_summary", "schema": crate::render::JSON_SCHEMA, "processes": processes})
}

#[cfg(test)]
mod tests {
    use memlock_trace_common::SyscallEvent;

    use super::*;

    const P: u64 = PAGE_SIZE;
    const RW: u64 = 0x73; // VM_READ|VM_WRITE|VM_MAYREAD|VM_MAYWRITE|VM_MAYEXEC
    const LO: u64 = VM_LOCKED;

    fn v(start: u64, end: u64, flags: u64) -> VmaRange {
        VmaRange {
            start: start * P,
            end: end * P,
            flags,
        }
    }

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

    fn bytes_of<T: Copy>(value: &T) -> Vec<u8> {
        // SAFETY: reading the bytes of a plain #[repr(C)] struct without padding holes.
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
            .to_vec()
    }

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
        let decode_one = |bytes: Vec<u8>| {
            let k = u32::from_ne_bytes(bytes[..4].try_into().unwrap());
            decode(k, &bytes).unwrap()
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
                .starts_with("VMAs 1 -> 3 (map_count 10 -> 12): split"),
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
        assert!(matches!(
            decode(EventKind::Snapshot as u32, &short),
            Err(DecodeError::Short { .. })
        ));
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

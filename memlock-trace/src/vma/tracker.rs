//! Pairs each mlock-family call with its VMA records (the snapshots around it, the tree
//! stores and hooked functions during it), per thread.

use std::collections::HashMap;

use memlock_trace_common::vma::{
    FuncEvent, SnapshotEvent, StoreEvent, VmaRange, WholeTotals, phase,
};

use super::diff::{Change, ChangeCounts, diff};
use crate::event::{Syscall, SyscallRecord, VmaRecord};

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
    /// `mlockall`/`munlockall` only: every VMA's totals at entry and exit, `None` when the
    /// kernel side could not read them (5.10, or a tree changing under the walk).
    pub whole: Option<[WholeTotals; 2]>,
    /// `mlockall`/`munlockall` whose totals could not be read.
    pub unmeasured: bool,
}

impl VmaCall {
    /// What the call did: the diff of its range's snapshots, plus for `mlockall` and
    /// `munlockall` the change of the whole process's VM_LOCKED bytes (each of them only
    /// sets, or only clears, VM_LOCKED, so the difference of the totals is what it set or
    /// cleared).
    pub fn counts(&self) -> ChangeCounts {
        let mut c = ChangeCounts::of(&self.changes);
        if let Some([b, a]) = &self.whole {
            c.locked_bytes += a.locked_bytes.saturating_sub(b.locked_bytes);
            c.unlocked_bytes += b.locked_bytes.saturating_sub(a.locked_bytes);
            c.onfault_bytes += a.onfault_bytes.saturating_sub(b.onfault_bytes);
            c.unonfault_bytes += b.onfault_bytes.saturating_sub(a.onfault_bytes);
        }
        c.unmeasured_calls += u32::from(self.unmeasured);
        // mlockall/munlockall's figures are the whole process's totals, complete whatever
        // the snapshot of their range held; a call that changed no locked_vm (one refused on
        // the limit) left nothing out.
        c.incomplete_calls +=
            u32::from(self.incomplete && self.whole.is_none() && self.syscall.pages_locked() != 0);
        c
    }
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

/// Threads whose last store is kept for [`Tracker`]'s repeat check.
const LAST_STORES: usize = 8192;

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
                // Threads come and go (system-wide, a new one each time a process starts and
                // locks memory): bounded by starting over, at the cost of at most one
                // repeated store line per thread.
                if self.last_store.len() >= LAST_STORES && !self.last_store.contains_key(&s.tid) {
                    self.last_store.clear();
                }
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
        let syscall = p.syscall?;
        let is_whole = matches!(syscall.syscall, Syscall::Mlockall | Syscall::Munlockall);
        let measured = before.whole.measured != 0 && after.whole.measured != 0;
        Some(Activity::Call(Box::new(VmaCall {
            whole: (is_whole && measured).then_some([before.whole, after.whole]),
            unmeasured: is_whole && !measured,
            changes: diff(&b, &a),
            syscall,
            before: b,
            after: a,
            incomplete: before.incomplete != 0 || after.incomplete != 0,
            stores: p.stores,
            functions: p.functions,
        })))
    }
}

//! Checking a step: the expected layout and calls against what the tracer saw (the probe
//! call's VMA snapshot, the calls since the last checkpoint) and what /proc says
//! (`proc_view`).

use std::fmt::Write as _;

use memlock_trace_common::vma::{VM_LOCKED, phase};

use super::{
    Checkpoint, ExpectCalls, PROBE_FLAG, Piece, StepResult,
    proc_view::{ProcView, bounds, compare_proc, proc_words},
    table::{calls_str, layout_str, run_lengths},
};
use crate::{
    event::Syscall,
    procfs::PAGE_SIZE,
    vma::{Activity, ChangeCounts, VmaCall, VmaHooks},
};

/// Checks one checkpoint against the tracer's `activity` for its process since the last one,
/// and against /proc; `shows_lf`: whether this kernel's smaps shows VM_LOCKONFAULT.
pub(super) fn check(
    cp: &Checkpoint,
    activity: &[Activity],
    shows_lf: bool,
    hooks: Option<&VmaHooks>,
) -> StepResult {
    let traced = Traced::of(cp, activity);
    let stores: usize = traced.calls.iter().map(|c| c.stores.len()).sum();
    let functions: Vec<String> = traced
        .calls
        .iter()
        .flat_map(|c| &c.functions)
        .filter(|f| f.phase == phase::BEFORE)
        .map(|f| {
            hooks
                .and_then(|h| h.functions.get(f.hook as usize))
                .map_or_else(|| format!("hook {}", f.hook), |h| h.name.clone())
        })
        .collect();
    let proc = ProcView::read(cp, shows_lf);
    let totals = call_totals(&traced.calls);

    let mut bad = Vec::new();
    // Before 6.1 there is no maple_tree:ma_write: an mmap born locked is not seen as a store
    // (the snapshots still are, and are checked).
    let stores_traced = hooks.is_none_or(|h| !h.rb_walk);
    compare_traced(cp, &traced, &totals, stores_traced, &mut bad);
    match &proc {
        Ok(view) => compare_proc(cp, view, shows_lf, &mut bad),
        Err(e) => bad.push(format!("reading /proc: {e:#}")),
    }

    StepResult {
        step: cp.step.clone(),
        action: cp.action.clone(),
        pid: cp.pid,
        tid: cp.tid,
        expected: expected_words(cp),
        traced: traced_words(
            cp,
            &traced,
            &totals,
            stores_traced.then_some(stores),
            &functions,
        ),
        proc: proc_words(cp, &proc, shows_lf),
        ok: bad.is_empty(),
        mismatches: bad,
        stores,
        functions,
        expected_layout: cp.layout.clone(),
        traced_layout: traced.layout.unwrap_or_default(),
        proc_layout: proc.map(|view| view.layout).unwrap_or_default(),
    }
}

/// What the tracer saw for a checkpoint.
#[derive(Default)]
struct Traced {
    layout: Option<Vec<Piece>>,
    probe_tid: u32,
    probe_locked_vm: u64,
    incomplete: bool,
    calls: Vec<VmaCall>,
    born_locked: bool,
}

impl Traced {
    fn of(cp: &Checkpoint, activity: &[Activity]) -> Self {
        let mut t = Self::default();
        for a in activity {
            match a {
                Activity::Call(call) if is_probe(call) => {
                    t.layout = Some(in_window(
                        cp.window,
                        call.before.iter().map(Piece::from_range),
                    ));
                    t.probe_tid = call.syscall.raw.tid;
                    t.probe_locked_vm = call.syscall.raw.locked_vm_before;
                    t.incomplete = call.incomplete;
                }
                Activity::Call(call) => t.calls.push((**call).clone()),
                Activity::Store(s) => {
                    let covers =
                        s.vma != 0 && s.range.start <= cp.window.0 && s.range.end >= cp.window.1;
                    if covers && s.range.flags & VM_LOCKED != 0 && i64::from(s.nr) == libc::SYS_mmap
                    {
                        t.born_locked = true;
                    }
                }
                Activity::Func(_) => {}
            }
        }
        t
    }
}

fn is_probe(call: &VmaCall) -> bool {
    let r = &call.syscall.raw;
    call.syscall.syscall == Syscall::Mlock2
        && r.args[2] == PROBE_FLAG
        && r.ret == -i64::from(libc::EINVAL)
}

fn in_window(window: (u64, u64), pieces: impl Iterator<Item = Piece>) -> Vec<Piece> {
    pieces
        .filter(|p| p.start < window.1 && p.end > window.0)
        .collect()
}

/// The calls' totals, as compared with [`ExpectCalls`].
fn call_totals(calls: &[VmaCall]) -> ExpectCalls {
    let mut counts = ChangeCounts::default();
    let (mut map_count, mut locked_vm, mut populated) = (0i64, 0i64, 0u64);
    for c in calls {
        counts.merge(&c.counts());
        map_count +=
            i64::from(c.syscall.raw.map_count_after) - i64::from(c.syscall.raw.map_count_before);
        locked_vm += c.syscall.pages_locked();
        populated += c.syscall.pages_populated();
    }
    let pages = |bytes: u64| (bytes / PAGE_SIZE) as i64;
    ExpectCalls {
        count: Some(calls.len() as u32),
        splits: Some(counts.splits),
        merges: Some(counts.merges),
        locked_pages: Some(pages(counts.locked_bytes) - pages(counts.unlocked_bytes)),
        onfault_pages: Some(pages(counts.onfault_bytes) - pages(counts.unonfault_bytes)),
        map_count: Some(map_count),
        locked_vm: Some(locked_vm),
        locked_vm_after: calls.last().map(|c| c.syscall.raw.locked_vm_after),
        populated: Some(populated),
    }
}

/// The tracer's view of the region against the checkpoint.
fn compare_traced(
    cp: &Checkpoint,
    traced: &Traced,
    totals: &ExpectCalls,
    stores_traced: bool,
    bad: &mut Vec<String>,
) {
    match &traced.layout {
        None => {
            bad.push("the tracer saw no probe call, so no VMA snapshot of the region".to_string())
        }
        Some(layout) => {
            if layout != &cp.layout {
                bad.push(format!(
                    "traced VMAs {} != expected {}",
                    layout_str(cp.window, layout),
                    layout_str(cp.window, &cp.layout)
                ));
            }
            if traced.probe_tid != cp.tid {
                bad.push(format!(
                    "the probe was traced in tid {}, made by tid {}",
                    traced.probe_tid, cp.tid
                ));
            }
        }
    }
    if traced.incomplete {
        bad.push("a VMA snapshot was incomplete".into());
    }
    if let Some(want) = cp.locked_vm
        && traced.layout.is_some()
        && traced.probe_locked_vm != want
    {
        bad.push(format!(
            "traced locked_vm {} pages != expected {want}",
            traced.probe_locked_vm
        ));
    }
    if let Some(want) = &cp.calls {
        compare_calls(want, totals, bad);
    }
    if let Some(want) = cp.born_locked
        && stores_traced
        && traced.born_locked != want
    {
        bad.push(if want {
            "the tracer saw no mmap storing the region already VM_LOCKED".to_string()
        } else {
            "the tracer saw an mmap storing the region VM_LOCKED".to_string()
        });
    }
}

fn compare_calls(want: &ExpectCalls, got: &ExpectCalls, bad: &mut Vec<String>) {
    macro_rules! field {
        ($name:ident, $label:literal) => {
            if let Some(w) = want.$name {
                if got.$name != Some(w) {
                    let got = got
                        .$name
                        .map_or_else(|| "none".to_string(), |g| g.to_string());
                    bad.push(format!("traced {} {got} != expected {w}", $label));
                }
            }
        };
    }
    field!(count, "calls");
    field!(splits, "splits");
    field!(merges, "merges");
    field!(locked_pages, "VM_LOCKED pages");
    field!(onfault_pages, "VM_LOCKONFAULT pages");
    field!(map_count, "map_count change");
    field!(locked_vm, "locked_vm change");
    field!(locked_vm_after, "locked_vm after");
    field!(populated, "pages populated");
}

/// The checkpoint in words: layout, `Locked`, `Rss` and what is expected of the calls.
fn expected_words(cp: &Checkpoint) -> String {
    let mut s = format!(
        "{} Locked {}k",
        layout_str(cp.window, &cp.layout),
        cp.locked_kb
    );
    if let Some(rss) = cp.rss_kb {
        let _ = write!(s, " Rss {rss}k");
    }
    if let Some(thp) = cp.thp_kb {
        let _ = write!(s, " AnonHugePages {thp}k");
    }
    if let Some(p) = &cp.pressure {
        let _ = write!(
            s,
            " Swap {}; cgroup unevictable {}",
            bounds(p.swap_kb),
            bounds(p.unevictable_kb)
        );
    }
    if let Some(c) = &cp.calls {
        let _ = write!(s, "; {}", calls_str(c));
    }
    if let Some(v) = cp.locked_vm {
        let _ = write!(s, "; locked_vm {v}");
    }
    if cp.born_locked == Some(true) {
        s.push_str("; born locked");
    }
    s
}

/// What the tracer saw, in words.
fn traced_words(
    cp: &Checkpoint,
    traced: &Traced,
    totals: &ExpectCalls,
    // None where the kernel has no store tracepoint.
    stores: Option<usize>,
    functions: &[String],
) -> String {
    let mut s = match &traced.layout {
        Some(l) => layout_str(cp.window, l),
        None => "(no snapshot)".into(),
    };
    if cp.calls.is_some() || !traced.calls.is_empty() {
        let names: Vec<&str> = traced
            .calls
            .iter()
            .map(|c| c.syscall.syscall.name())
            .collect();
        let _ = write!(
            s,
            "; {}: {}",
            if names.is_empty() {
                "no calls".to_string()
            } else {
                names.join("+")
            },
            calls_str(totals)
        );
        match stores {
            Some(stores) => {
                let _ = write!(s, " [ma_write x{stores}");
            }
            None => s.push_str(" [no ma_write"),
        }
        if !functions.is_empty() {
            let _ = write!(s, "; fentry {}", run_lengths(functions));
        }
        s.push(']');
    }
    if cp.locked_vm.is_some() && traced.layout.is_some() {
        let _ = write!(
            s,
            "; locked_vm {} (tid {})",
            traced.probe_locked_vm, traced.probe_tid
        );
    }
    if cp.born_locked.is_some() && stores.is_none() {
        s.push_str("; mmap stores not traced on this kernel");
    } else if cp.born_locked.is_some() {
        s.push_str(if traced.born_locked {
            "; mmap stored it locked"
        } else {
            "; no locked mmap store"
        });
    }
    s
}

#[cfg(test)]
mod tests {
    use memlock_trace_common::vma::VmaRange;

    use super::*;
    use crate::lab::{
        verify::scenarios::{N, RW, Y, calls},
        workload::Region,
    };

    /// A probe call as the tracker would hand it over, whose entry snapshot is `before`.
    fn probe_activity(before: &[VmaRange]) -> Activity {
        use memlock_trace_common::{EventKind, SyscallEvent};
        let raw = SyscallEvent {
            kind: EventKind::Syscall as u32,
            nr: Syscall::Mlock2.nr(),
            tgid: std::process::id(),
            tid: nix::unistd::gettid().as_raw() as u32,
            args: [0, 0, PROBE_FLAG],
            ret: -i64::from(libc::EINVAL),
            ..SyscallEvent::default()
        };
        Activity::Call(Box::new(VmaCall {
            syscall: crate::event::SyscallRecord {
                syscall: Syscall::Mlock2,
                raw,
            },
            before: before.to_vec(),
            after: before.to_vec(),
            incomplete: false,
            changes: Vec::new(),
            whole: None,
            unmeasured: false,
            stores: Vec::new(),
            functions: Vec::new(),
        }))
    }

    #[test]
    fn verdicts_compare_expected_traced_and_this_processs_proc() {
        let r = Region::guarded(16, RW).unwrap();
        let rw = 0x73; // VM_READ|VM_WRITE|VM_MAYREAD|VM_MAYWRITE|VM_MAYEXEC
        let truth = [VmaRange {
            start: r.start(),
            end: r.at(16),
            flags: rw,
        }];
        let agree = r.checkpoint("t", "", &[(16, "rw-p", N, N)], 0);
        let result = check(&agree, &[probe_activity(&truth)], true, None);
        assert!(result.ok, "{:?}", result.mismatches);
        assert_eq!(result.proc, "[16 rw] Locked 0k Rss 0k");

        // Expecting a lock that is not there: both the tracer and /proc disagree.
        let wrong = r.checkpoint("t", "", &[(16, "rw-p", Y, N)], 64);
        let result = check(&wrong, &[probe_activity(&truth)], true, None);
        assert_eq!(result.mismatches.len(), 3, "{:?}", result.mismatches);
        assert!(result.mismatches[0].starts_with("traced VMAs [16 rw] != expected [16 rw lo]"));
        assert!(result.mismatches[1].starts_with("/proc VMAs [16 rw] != expected [16 rw lo]"));
        assert_eq!(result.mismatches[2], "smaps Locked 0 kB != expected 64 kB");

        // A tracer that saw a split /proc does not show; and one that saw nothing.
        let split = [
            VmaRange {
                start: r.start(),
                end: r.at(8),
                flags: rw,
            },
            VmaRange {
                start: r.at(8),
                end: r.at(16),
                flags: rw,
            },
        ];
        let result = check(&agree, &[probe_activity(&split)], true, None);
        assert_eq!(
            result.mismatches,
            ["traced VMAs [8 rw][8 rw] != expected [16 rw]"]
        );
        let result = check(&agree, &[], true, None);
        assert_eq!(
            result.mismatches,
            ["the tracer saw no probe call, so no VMA snapshot of the region"]
        );
    }

    #[test]
    fn call_expectations_compare_only_what_is_set() {
        let want = ExpectCalls {
            splits: Some(2),
            map_count: Some(2),
            ..calls(1)
        };
        let got = ExpectCalls {
            count: Some(1),
            splits: Some(2),
            merges: Some(5),
            map_count: Some(1),
            ..ExpectCalls::default()
        };
        let mut bad = Vec::new();
        compare_calls(&want, &got, &mut bad);
        assert_eq!(bad, ["traced map_count change 1 != expected 2"]);
    }
}

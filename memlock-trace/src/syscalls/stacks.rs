//! `--stacks` for mlock-family calls: the calls, pages populated and pages locked per user
//! call site. Every call's stack is kept by the kernel at its exit
//! (`memlock-trace-ebpf/src/stacks.rs`), unwound and summed by [`crate::unwind`], and
//! symbolized here like the fault stacks ([`crate::symbolize`]): "which code path locks
//! 2 GiB at start-up".

use std::collections::BTreeMap;

use memlock_trace_common::stacks::{SyscallStackKey, SyscallStackValue, names};
use serde::Serialize;

use crate::{
    event::Syscall,
    symbolize::{Frame, StackSymbolizer},
    unwind::ProcessModules,
};

/// The calls per call site.
#[derive(Clone, Debug, Default)]
pub struct CallSiteReport {
    pub counts: BTreeMap<SyscallStackKey, SyscallStackValue>,
    /// Calls whose stack was lost to a full ring buffer.
    pub dropped: u64,
    /// Always 0 since the call sites are summed in user space (kept for the JSON schema).
    pub evicted: u64,
}

/// Before load: turns call-site stacks on (`--stacks`).
pub fn prepare_loader(loader: &mut aya::EbpfLoader<'_>, stacks: bool) {
    // The loader keeps a reference until it loads.
    const ON: &u32 = &1;
    const OFF: &u32 = &0;
    loader.override_global(names::SYSCALL_STACKS, if stacks { ON } else { OFF }, true);
}

/// One call site of a process: the `"call_sites"` entries of a process in the JSON summary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CallSite {
    pub syscall: &'static str,
    pub calls: u64,
    pub errors: u64,
    /// Pages the kernel faulted in inside these calls.
    pub pages_populated: u64,
    /// Growth / shrinkage of `locked_vm` across these calls, in pages.
    pub pages_locked: u64,
    pub pages_unlocked: u64,
    /// Time inside these calls.
    pub total_ns: u64,
    /// Innermost first: the instruction after the `syscall`, then its callers.
    pub frames: Vec<Frame>,
}

/// The top `top` call sites of `tgid`: most pages locked, unlocked or populated first, then
/// most calls.
pub fn top_call_sites(
    report: &CallSiteReport,
    tgid: u32,
    modules: Option<&ProcessModules>,
    top: usize,
    symbolizer: &StackSymbolizer,
) -> Vec<CallSite> {
    let first = SyscallStackKey {
        tgid,
        ..SyscallStackKey::default()
    };
    let mut list: Vec<(&SyscallStackKey, &SyscallStackValue)> = report
        .counts
        .range(first..)
        .take_while(|(key, _)| key.tgid == tgid)
        .collect();
    let weight = |v: &SyscallStackValue| v.locked + v.unlocked + v.populated;
    list.sort_by(|a, b| {
        weight(b.1)
            .cmp(&weight(a.1))
            .then(b.1.calls.cmp(&a.1.calls))
            .then(a.0.cmp(b.0))
    });
    list.truncate(top);
    list.into_iter()
        .map(|(key, v)| {
            let depth = key
                .ips
                .iter()
                .position(|&ip| ip == 0)
                .unwrap_or(key.ips.len());
            CallSite {
                syscall: Syscall::from_nr(key.nr).map_or("unknown", Syscall::name),
                calls: v.calls,
                errors: v.errors,
                pages_populated: v.populated,
                pages_locked: v.locked,
                pages_unlocked: v.unlocked,
                total_ns: v.duration_ns,
                frames: symbolizer.stack(&key.ips[..depth], modules),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_sites_of_one_process_by_pages_then_calls() {
        let key = |tgid, syscall: Syscall, frames: &[u64]| {
            let mut key = SyscallStackKey {
                tgid,
                nr: syscall.nr(),
                ..SyscallStackKey::default()
            };
            key.ips[..frames.len()].copy_from_slice(frames);
            key
        };
        let value = |calls, locked| SyscallStackValue {
            calls,
            locked,
            ..SyscallStackValue::default()
        };
        let report = CallSiteReport {
            counts: BTreeMap::from([
                (key(1, Syscall::Mlock, &[0x10]), value(9, 0)),
                (key(2, Syscall::Mlock, &[0x10, 0x20]), value(1, 512)),
                (key(2, Syscall::Munlock, &[0x30]), value(7, 0)),
                (key(2, Syscall::Mlock, &[0x40]), value(2, 0)),
                (key(3, Syscall::Mlockall, &[0x50]), value(1, 100_000)),
            ]),
            ..CallSiteReport::default()
        };
        let s = StackSymbolizer::default();
        let sites = top_call_sites(&report, 2, None, 10, &s);
        let shown: Vec<(&str, u64, u64, usize)> = sites
            .iter()
            .map(|c| (c.syscall, c.calls, c.pages_locked, c.frames.len()))
            .collect();
        assert_eq!(
            shown,
            [
                ("mlock", 1, 512, 2),
                ("munlock", 7, 0, 1),
                ("mlock", 2, 0, 1)
            ]
        );
        assert_eq!(sites[0].frames[1].symbol, "0x20");
        assert_eq!(top_call_sites(&report, 2, None, 1, &s).len(), 1);
    }
}

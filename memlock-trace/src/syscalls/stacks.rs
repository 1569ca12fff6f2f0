//! `--stacks` for mlock-family calls: the calls, pages populated and pages locked per user
//! call site, counted in the kernel at each call's exit (`memlock-trace-ebpf/src/stacks.rs`),
//! read back here and symbolized like the fault stacks ([`crate::symbolize`]): "which code
//! path locks 2 GiB at start-up".

use std::collections::BTreeMap;

use anyhow::{Result, anyhow};
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray, PerCpuHashMap},
};
use memlock_trace_common::stacks::{SyscallStackKey, SyscallStackValue, counter, names};
use serde::Serialize;

use crate::{
    event::Syscall,
    procfs::Mapping,
    symbolize::{Frame, StackSymbolizer},
};

/// What the kernel counted per call site, summed over CPUs.
#[derive(Clone, Debug, Default)]
pub struct CallSiteReport {
    pub counts: BTreeMap<SyscallStackKey, SyscallStackValue>,
    /// Calls whose stack could not be recorded.
    pub dropped: u64,
    /// (process, call, stack) entries the bounded LRU map evicted.
    pub evicted: u64,
}

/// Before load: turns call-site counting on (`--stacks`), or shrinks its map to one entry.
pub fn prepare_loader(loader: &mut aya::EbpfLoader<'_>, stacks: bool) {
    // The loader keeps a reference until it loads.
    const ON: &u32 = &1;
    const OFF: &u32 = &0;
    loader.override_global(names::SYSCALL_STACKS, if stacks { ON } else { OFF }, true);
    if !stacks {
        loader.map_max_entries(names::SYSCALL_STACK_COUNTS, 1);
    }
}

/// Reads the call-site maps.
pub fn read(ebpf: &Ebpf) -> Result<CallSiteReport> {
    let map = |name: &str| ebpf.map(name).ok_or_else(|| anyhow!("map {name} missing"));
    let mut report = CallSiteReport::default();
    let counts: PerCpuHashMap<&MapData, SyscallStackKey, SyscallStackValue> =
        PerCpuHashMap::try_from(map(names::SYSCALL_STACK_COUNTS)?)?;
    let mut present = 0u64;
    for item in counts.iter() {
        let Ok((key, values)) = item else { continue };
        present += 1;
        let sum = report.counts.entry(key).or_default();
        for v in values.iter() {
            add(sum, v);
        }
    }
    let counters: PerCpuArray<&MapData, u64> =
        PerCpuArray::try_from(map(names::SYSCALL_STACK_COUNTERS)?)?;
    let sum = |index: u32| -> u64 { counters.get(&index, 0).map(|v| v.iter().sum()).unwrap_or(0) };
    report.dropped = sum(counter::DROPPED);
    report.evicted = sum(counter::INSERTS).saturating_sub(present);
    Ok(report)
}

fn add(into: &mut SyscallStackValue, v: &SyscallStackValue) {
    into.calls += v.calls;
    into.errors += v.errors;
    into.populated += v.populated;
    into.locked += v.locked;
    into.unlocked += v.unlocked;
    into.duration_ns += v.duration_ns;
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
    maps: Option<&[Mapping]>,
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
                frames: symbolizer.stack(&key.ips[..depth], maps),
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

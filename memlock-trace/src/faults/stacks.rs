//! `--stacks`, faults: the faults per user call stack (one fault in N keeps its stack,
//! unwound by [`crate::unwind`], and counts as the N faults it stands for, as in the folded
//! file), and each process's top stacks symbolized through its kept modules
//! ([`crate::symbolize`]).

use std::collections::BTreeMap;

use memlock_trace_common::{faults::StackKey, process::ProcessKey};
use serde::Serialize;

use super::FaultSummary;
pub use crate::symbolize::{Frame, StackSymbolizer};
use crate::unwind::{ModuleRegistry, ProcessModules, SitesByRegion, Stack};

/// The faults per stack, as the kept stacks stand for them.
#[derive(Clone, Debug, Default)]
pub struct StackReport {
    /// Faults per (process or thread, stack), each kept stack counted as the faults it
    /// stands for (one in `sample_every` kept).
    pub counts: BTreeMap<StackKey, u64>,
    /// The same per region they were counted in: each mapping row's top stacks.
    pub sites: SitesByRegion,
    /// Faults whose stack would have been kept but was lost to a full ring buffer.
    pub dropped: u64,
    /// Always 0 since the stacks are summed in user space (kept for the JSON schema).
    pub evicted: u64,
    /// One fault in this many keeps its stack.
    pub sample_every: u32,
}

/// One of a process's top stacks: the `"stacks"` entries of the JSON `"faults"` object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StackFaults {
    pub faults: u64,
    /// Innermost first: the faulting instruction, or the system call's call site.
    pub frames: Vec<Frame>,
}

/// The top `top` stacks of `tgid` by faults (threads folded into their process).
pub fn top_stacks(
    report: &StackReport,
    tgid: u32,
    modules: Option<&ProcessModules>,
    top: usize,
    symbolizer: &StackSymbolizer,
) -> Vec<StackFaults> {
    let mut per_stack: BTreeMap<&[u64], u64> = BTreeMap::new();
    for (key, n) in report.counts.range(
        StackKey {
            tgid,
            ..StackKey::default()
        }..,
    ) {
        if key.tgid != tgid {
            break;
        }
        let depth = key
            .ips
            .iter()
            .position(|&ip| ip == 0)
            .unwrap_or(key.ips.len());
        *per_stack.entry(&key.ips[..depth]).or_default() += n;
    }
    symbolized_top(per_stack, modules, top, symbolizer)
}

/// The `top` stacks of `per_stack` by faults, symbolized.
fn symbolized_top(
    per_stack: BTreeMap<&[u64], u64>,
    modules: Option<&ProcessModules>,
    top: usize,
    symbolizer: &StackSymbolizer,
) -> Vec<StackFaults> {
    let mut list: Vec<(&[u64], u64)> = per_stack.into_iter().collect();
    // Most faults first; ties in address order, so the output is stable.
    list.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    list.truncate(top);
    list.into_iter()
        .map(|(ips, faults)| StackFaults {
            faults,
            frames: symbolizer.stack(ips, modules),
        })
        .collect()
}

/// Stacks listed under each mapping row: the few that say which code faulted there (the
/// process's own list and the profile files have them all).
pub const MAPPING_STACKS: usize = 3;

/// A mapping row's stacks symbolized to find its top ones: its most faulting, so that the
/// work stays bounded in a row of thousands of rare stacks.
const MAPPING_STACKS_SYMBOLIZED: usize = 64;

/// A mapping row's top `top` call paths: its stacks symbolized and merged by the functions
/// they name, since two stacks that differ only in the addresses inside the same functions
/// are one site to the reader (as a flame graph merges them).
fn top_sites(
    sampled: &BTreeMap<Stack, u64>,
    modules: Option<&ProcessModules>,
    top: usize,
    symbolizer: &StackSymbolizer,
) -> Vec<StackFaults> {
    let per_stack = sampled.iter().map(|(s, &n)| (&s[..], n)).collect();
    let mut merged: Vec<(Vec<String>, StackFaults)> = Vec::new();
    for stack in symbolized_top(per_stack, modules, MAPPING_STACKS_SYMBOLIZED, symbolizer) {
        let names: Vec<String> = stack.frames.iter().map(|f| f.symbol.to_string()).collect();
        match merged.iter_mut().find(|(n, _)| *n == names) {
            Some((_, site)) => site.faults += stack.faults,
            None => merged.push((names, stack)),
        }
    }
    merged.sort_by(|a, b| b.1.faults.cmp(&a.1.faults).then_with(|| a.0.cmp(&b.0)));
    merged.into_iter().take(top).map(|(_, site)| site).collect()
}

/// Adds each process's top stacks to its summary, and each mapping row's, symbolized with
/// its kept modules.
pub fn add_to(
    per_process: &mut BTreeMap<ProcessKey, (crate::output::Outside, FaultSummary)>,
    report: &StackReport,
    modules: &ModuleRegistry,
    top: usize,
    symbolizer: &StackSymbolizer,
) {
    for (key, (_, summary)) in per_process.iter_mut() {
        let modules = modules.get(key.tgid);
        summary.stacks = Some(top_stacks(report, key.tgid, modules, top, symbolizer));
        for row in &mut summary.by_mapping {
            let top = top.min(MAPPING_STACKS);
            row.stacks = Some(top_sites(&row.sampled, modules, top, symbolizer));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_stacks_fold_threads_and_sort_by_faults() {
        let key = |tgid, tid, frames: &[u64]| {
            let mut key = StackKey {
                tgid,
                tid,
                ..StackKey::default()
            };
            key.ips[..frames.len()].copy_from_slice(frames);
            key
        };
        let (five, six, seven) = (&[0x10, 0x20][..], &[0x30][..], &[0x40][..]);
        let report = StackReport {
            counts: BTreeMap::from([
                (key(1, 0, five), 3),
                (key(2, 10, five), 4),
                (key(2, 11, five), 4),
                (key(2, 10, six), 9),
                (key(2, 10, seven), 1),
                (key(3, 0, five), 100),
            ]),
            ..StackReport::default()
        };
        let s = StackSymbolizer::default();
        let top = top_stacks(&report, 2, None, 2, &s);
        assert_eq!(top.len(), 2);
        assert_eq!((top[0].faults, top[1].faults), (9, 8));
        assert_eq!(top[1].frames.len(), 2);
        assert_eq!(top[1].frames[1].symbol, "0x20");
    }
}

//! `--stacks`, loader side: read the faults counted per user call stack in the kernel
//! (`memlock-trace-ebpf/src/stacks.rs`), and symbolize each process's top stacks through
//! the process's last mapping snapshot ([`crate::symbolize`]).

use std::collections::BTreeMap;

use anyhow::{Result, anyhow};
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray, PerCpuHashMap},
};
use memlock_trace_common::{
    faults::{StackKey, names, stack_counter},
    process::ProcessKey,
};
use serde::Serialize;

use super::FaultSummary;
use crate::procfs::{Mapping, MappingCache};
pub use crate::symbolize::{Frame, StackSymbolizer};

/// What the kernel counted per stack, summed over CPUs.
#[derive(Clone, Debug, Default)]
pub struct StackReport {
    /// Faults per (process or thread, stack).
    pub counts: BTreeMap<StackKey, u64>,
    /// Faults whose stack could not be recorded (see `stack_counter::DROPPED`).
    pub dropped: u64,
    /// Keys the LRU evicted.
    pub evicted: u64,
}

/// Reads the stack maps.
pub fn read(ebpf: &Ebpf) -> Result<StackReport> {
    let map = |name: &str| ebpf.map(name).ok_or_else(|| anyhow!("map {name} missing"));
    let mut report = StackReport::default();
    let counts: PerCpuHashMap<&MapData, StackKey, u64> =
        PerCpuHashMap::try_from(map(names::FAULT_STACK_COUNTS)?)?;
    for item in counts.iter() {
        let Ok((key, values)) = item else { continue };
        let sum: u64 = values.iter().sum();
        if sum > 0 {
            *report.counts.entry(key).or_default() += sum;
        }
    }
    let counters: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map(names::STACK_COUNTERS)?)?;
    let sum = |index: u32| -> u64 { counters.get(&index, 0).map(|v| v.iter().sum()).unwrap_or(0) };
    report.dropped = sum(stack_counter::DROPPED);
    let present = counts.keys().filter(Result::is_ok).count() as u64;
    report.evicted = sum(stack_counter::INSERTS).saturating_sub(present);
    Ok(report)
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
    maps: Option<&[Mapping]>,
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
    let mut list: Vec<(&[u64], u64)> = per_stack.into_iter().collect();
    // Most faults first; ties in address order, so the output is stable.
    list.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    list.truncate(top);
    list.into_iter()
        .map(|(ips, faults)| StackFaults {
            faults,
            frames: symbolizer.stack(ips, maps),
        })
        .collect()
}

/// Adds each process's top stacks to its summary, symbolized with its mappings (re-read now
/// if it still lives, else its last snapshot).
pub fn add_to(
    per_process: &mut BTreeMap<ProcessKey, (crate::output::Outside, FaultSummary)>,
    report: &StackReport,
    mappings: &mut MappingCache,
    top: usize,
    symbolizer: &StackSymbolizer,
) {
    for (key, (_, summary)) in per_process.iter_mut() {
        let tgid = key.tgid;
        mappings.refresh(tgid, std::time::Duration::ZERO);
        summary.stacks = Some(top_stacks(
            report,
            tgid,
            mappings.get(tgid),
            top,
            symbolizer,
        ));
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

//! `--stacks`, loader side: read the faults counted per user call stack in the kernel
//! (`memlock-trace-ebpf/src/stacks.rs`), and symbolize each process's top stacks.
//!
//! An address is symbolized through the mapping that held it in the process's last
//! `/proc/PID/smaps` snapshot ([`MappingCache`]): the mapped file and the address's offset in
//! it, resolved by [blazesym](https://docs.rs/blazesym) from the file's ELF symbols (and
//! DWARF, when present, for file:line). Working from the snapshot rather than the live
//! process means the stacks of a command that has already exited are still symbolized.
//! A frame that cannot be resolved is shown as `module+0xoffset` (or the bare address when
//! no mapping held it), never dropped.

use std::{collections::BTreeMap, path::Path};

use anyhow::{Result, anyhow};
use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray, PerCpuHashMap},
};
use blazesym::symbolize::{
    CodeInfo, Input, Symbolized, Symbolizer,
    source::{Elf, Source},
};
use memlock_trace_common::faults::{StackKey, names, stack_counter};
use serde::Serialize;

use super::FaultSummary;
use crate::procfs::{Mapping, MappingCache};

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

/// One frame of a stack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Frame {
    /// The instruction pointer (a return address for every frame but the first).
    pub addr: String,
    /// The function (demangled); when it could not be resolved, `module+0xoffset`, or the
    /// address when no mapping held it.
    pub symbol: String,
    /// Whether `symbol` names a function.
    pub resolved: bool,
    /// A function the compiler inlined into the next frame (same `addr`; DWARF only).
    pub inlined: bool,
    /// The mapped file (or `[vdso]`, `anonymous`, ...); null when no mapping held the address.
    pub module: Option<String>,
    /// Offset of the address in `module`'s file.
    pub offset: Option<String>,
    /// Source file and line, when the module has DWARF.
    pub file: Option<String>,
    pub line: Option<u32>,
}

/// Symbolizes frames through a mapping snapshot; keeps parsed files between summaries.
pub struct StackSymbolizer {
    symbolizer: Symbolizer,
}

impl Default for StackSymbolizer {
    fn default() -> Self {
        Self {
            symbolizer: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .enable_demangling(true)
                .build(),
        }
    }
}

impl StackSymbolizer {
    /// The frames at `ip` of a process whose mappings were `maps`: the function, preceded by
    /// the functions inlined into it there (innermost first). `return_address`: every frame
    /// but the innermost holds the address after a call, looked up one byte back so that a
    /// call at a function's very end resolves to that function and its line.
    pub fn frames(&self, ip: u64, return_address: bool, maps: Option<&[Mapping]>) -> Vec<Frame> {
        let (mut frame, offset) = Self::unresolved(ip, maps);
        // Only files can be symbolized: not [vdso], [heap], anonymous (JIT code), nor a
        // file deleted since it was mapped.
        let (Some(path), Some(offset)) = (frame.module.clone(), offset) else {
            return vec![frame];
        };
        if !path.starts_with('/') || !Path::new(&path).is_file() {
            return vec![frame];
        }
        let lookup = if return_address && offset > 0 {
            offset - 1
        } else {
            offset
        };
        let source = Source::Elf(Elf::new(&path));
        let Ok(Symbolized::Sym(sym)) = self
            .symbolizer
            .symbolize_single(&source, Input::FileOffset(lookup))
        else {
            return vec![frame];
        };
        let place = |code: Option<&CodeInfo>| match code {
            Some(code) => (Some(code.to_path().display().to_string()), code.line),
            None => (None, None),
        };
        let mut out = Vec::with_capacity(sym.inlined.len() + 1);
        for inlined in sym.inlined.iter().rev() {
            let (file, line) = place(inlined.code_info.as_ref());
            out.push(Frame {
                symbol: inlined.name.to_string(),
                resolved: true,
                inlined: true,
                file,
                line,
                ..frame.clone()
            });
        }
        (frame.file, frame.line) = place(sym.code_info.as_deref());
        frame.symbol = sym.name.to_string();
        frame.resolved = true;
        out.push(frame);
        out
    }

    /// The unresolved frame at `ip` (module and offset, or the bare address) and the offset.
    fn unresolved(ip: u64, maps: Option<&[Mapping]>) -> (Frame, Option<u64>) {
        let addr = format!("{ip:#x}");
        let Some(m) = maps.and_then(|maps| maps.iter().find(|m| m.start <= ip && ip < m.end))
        else {
            let frame = Frame {
                symbol: addr.clone(),
                addr,
                resolved: false,
                inlined: false,
                module: None,
                offset: None,
                file: None,
                line: None,
            };
            return (frame, None);
        };
        let offset = ip - m.start + m.offset;
        let frame = Frame {
            addr,
            symbol: format!("{}+{offset:#x}", m.name),
            resolved: false,
            inlined: false,
            module: Some(m.name.clone()),
            offset: Some(format!("{offset:#x}")),
            file: None,
            line: None,
        };
        (frame, Some(offset))
    }
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
            frames: ips
                .iter()
                .enumerate()
                .flat_map(|(i, &ip)| symbolizer.frames(ip, i > 0, maps))
                .collect(),
        })
        .collect()
}

/// Adds each process's top stacks to its summary, symbolized with its mappings (re-read now
/// if it still lives, else its last snapshot).
pub fn add_to(
    per_process: &mut BTreeMap<u32, (String, FaultSummary)>,
    report: &StackReport,
    mappings: &mut MappingCache,
    top: usize,
    symbolizer: &StackSymbolizer,
) {
    for (&tgid, (_, summary)) in per_process.iter_mut() {
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
    fn unresolvable_frames_keep_their_module_and_offset() {
        let maps = [
            Mapping {
                start: 0x1000,
                end: 0x3000,
                offset: 0x5000,
                name: "[vdso]".into(),
                locked: false,
                lockonfault: None,
            },
            Mapping {
                start: 0x8000,
                end: 0x9000,
                offset: 0,
                name: "/nonexistent/lib.so".into(),
                locked: false,
                lockonfault: None,
            },
        ];
        let s = StackSymbolizer::default();
        let one = |ip, ret, maps| {
            let mut frames = s.frames(ip, ret, maps);
            assert_eq!(frames.len(), 1, "{frames:?}");
            frames.remove(0)
        };
        let f = one(0x1234, false, Some(&maps));
        assert_eq!(
            (f.symbol.as_str(), f.resolved, f.offset.as_deref()),
            ("[vdso]+0x5234", false, Some("0x5234"))
        );
        let f = one(0x8010, true, Some(&maps));
        assert_eq!(f.symbol, "/nonexistent/lib.so+0x10");
        let f = one(0x20000, false, Some(&maps));
        assert_eq!((f.symbol.as_str(), f.module), ("0x20000", None));
        assert_eq!(one(0x1234, false, None).symbol, "0x1234");
    }

    #[inline(never)]
    fn a_function_to_find() -> u64 {
        std::hint::black_box(7)
    }

    /// This test binary's own function, found through its own smaps and ELF symbols.
    #[test]
    fn symbolizes_through_the_mapping_snapshot() {
        let ip = a_function_to_find as *const () as u64;
        assert_eq!(a_function_to_find(), 7);
        let pid = std::process::id();
        let mut cache = MappingCache::default();
        cache.refresh(pid, std::time::Duration::ZERO);
        let frames = StackSymbolizer::default().frames(ip, false, cache.get(pid));
        let f = frames.last().unwrap();
        assert!(f.resolved && !f.inlined, "{f:?}");
        assert!(f.symbol.ends_with("a_function_to_find"), "{f:?}");
    }

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

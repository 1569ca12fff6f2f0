//! `--stacks`, user side of the kept stacks: each sample the kernel wrote (user registers
//! and the top of the user stack, `memlock-trace-ebpf/src/stacks.rs`) is unwound here with
//! the modules' own unwind tables by [framehop](https://docs.rs/framehop), as perf's
//! `--call-graph dwarf` and samply do, and summed per (process, stack): the call sites of
//! mlock-family calls and the stacks of sampled faults. Where a module has no unwind
//! table for an address, framehop follows the frame pointer.
//!
//! A frame is kept only if it falls in an executable mapping of the process: the first
//! that does not (a data word taken for a return address) ends the stack there and is
//! counted in [`StackHealth::frames_dropped`], never printed.

pub mod modules;

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
};

use anyhow::Result;
use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, RingBuf},
};
use framehop::Unwinder as _;
use memlock_trace_common::{
    faults::{RegionKey, STACK_DEPTH, StackKey},
    stacks::{
        ModulesChanged, SAMPLE_FRAME_POINTERS, STACK_COPY_BYTES, STACK_SAMPLES_BYTE_SIZE,
        StackConfig, StackSample, SyscallStackKey, SyscallStackValue, counter, names, sample_kind,
    },
    syscall_hooks::hook,
};
use serde::Serialize;

pub use self::modules::{ModuleRegistry, ProcessModules};
use crate::{
    btf::KernelBtf,
    object::{AttachContext, SyscallEdge},
    procfs::PAGE_SIZE,
};

/// What the kept stacks lost, and how they were unwound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StackHealth {
    /// Stacks unwound from registers and stack bytes.
    pub unwound: u64,
    /// Stacks that are the kernel's frame-pointer walk: the registers were not found.
    pub frame_pointer_walks: u64,
    /// Stacks cut at a frame outside every executable mapping (that frame not shown).
    pub frames_dropped: u64,
    /// Stacks whose first address is in no known executable mapping: not kept.
    pub no_module: u64,
    /// Stacks cut where the caller's frame lies above the copied 8 KiB.
    pub stack_exhausted: u64,
    /// Samples too short to decode.
    pub undecodable: u64,
    /// Time spent unwinding the kept stacks from registers (module reads not included).
    pub unwind_ns: u64,
}

/// A stack's return addresses, innermost first (one allocation per distinct stack, shared
/// by every region it faulted in).
pub type Stack = Arc<[u64]>;

/// Faults per region they were counted in (as the kernel keys `FAULT_REGIONS`) and stack,
/// threads folded, as the samples stand for them ([`StackCollector::fault_every`]): which
/// code faulted in each mapping.
pub type SitesByRegion = BTreeMap<RegionKey, BTreeMap<Stack, u64>>;

/// The kept stacks, unwound and summed.
#[derive(Default)]
pub struct StackCollector {
    pub modules: ModuleRegistry,
    /// Mlock-family calls per (process, call, call site).
    pub calls: BTreeMap<SyscallStackKey, SyscallStackValue>,
    /// Faults per (process or thread, stack), each sample counted as the faults it stands
    /// for ([`Self::fault_every`]).
    pub faults: BTreeMap<StackKey, u64>,
    /// The same faults per region and stack. Its size is bounded by the samples (a region
    /// keyed by page, no VMA found at the fault, is one per sample at worst), as the
    /// kernel's own region map is by its faults.
    pub fault_sites: SitesByRegion,
    /// The distinct stacks of `fault_sites`.
    stacks: HashSet<Stack>,
    pub health: StackHealth,
    /// One fault in this many keeps its stack (`--stack-sample`): a sample of fewer faults
    /// than that (one user fault) stands for this many, the chance of keeping it being one
    /// in this many; a sample of more (the pages one mlock populated, always kept) for its
    /// own. So every figure built from the stacks (the stack table, the mapping rows'
    /// stacks, the profile files) counts faults, not samples.
    fault_every: u64,
}

impl StackCollector {
    /// A collector that already knows the files the tracer itself maps (see
    /// [`ModuleRegistry::know_own_files`]), for faults of which one in `fault_every` keeps
    /// its stack.
    pub fn new(fault_every: u32) -> Self {
        let mut collector = Self {
            fault_every: u64::from(fault_every.max(1)),
            ..Self::default()
        };
        collector.modules.know_own_files();
        collector
    }

    /// Unwinds every sample waiting in the ring buffer.
    ///
    /// A process that maps code does so dozens of times in a row (python3 at start-up: about
    /// 70 `mmap`s with `PROT_EXEC`): the notices of a batch are applied once per process,
    /// before its next stack or at the end of the batch, so that the maps are read while it
    /// still runs rather than one re-read per notice falling behind it.
    pub fn drain(&mut self, ring: &mut RingBuf<MapData>) {
        let mut notices: Vec<ModulesChanged> = Vec::new();
        while let Some(item) = ring.next() {
            if let Some(notice) = modules_changed(&item) {
                notices.push(notice);
                continue;
            }
            if item.len() < size_of::<StackSample>() {
                self.health.undecodable += 1;
                continue;
            }
            // SAFETY: the record is a `StackSample` (checked length; plain integers, any bit
            // pattern valid), read unaligned from the ring's bytes.
            let sample: StackSample =
                unsafe { item.as_ptr().cast::<StackSample>().read_unaligned() };
            if notices.iter().any(|n| n.tgid == sample.tgid) {
                let (now, later): (Vec<_>, Vec<_>) =
                    notices.into_iter().partition(|n| n.tgid == sample.tgid);
                self.modules.mapped(&now);
                notices = later;
            }
            self.add(&sample);
        }
        let mut tgids: Vec<u32> = notices.iter().map(|n| n.tgid).collect();
        tgids.sort_unstable();
        tgids.dedup();
        for tgid in tgids {
            let of: Vec<ModulesChanged> =
                notices.iter().filter(|n| n.tgid == tgid).copied().collect();
            self.modules.mapped(&of);
        }
    }

    fn add(&mut self, s: &StackSample) {
        let ips = self.unwind(s);
        if ips.is_empty() {
            self.health.no_module += 1;
            return;
        }
        let mut frames = [0u64; STACK_DEPTH];
        frames[..ips.len()].copy_from_slice(&ips);
        match s.kind {
            sample_kind::SYSCALL => {
                let key = SyscallStackKey {
                    tgid: s.tgid,
                    nr: s.nr,
                    ips: frames,
                };
                self.calls.entry(key).or_default().add(&s.call);
            }
            sample_kind::FAULT => {
                let key = StackKey {
                    tgid: s.tgid,
                    tid: s.tid,
                    ips: frames,
                };
                let faults = s.faults.max(self.fault_every);
                *self.faults.entry(key).or_default() += faults;
                let stack = match self.stacks.get(ips.as_slice()) {
                    Some(stack) => Arc::clone(stack),
                    None => {
                        let stack: Stack = ips.into();
                        self.stacks.insert(Arc::clone(&stack));
                        stack
                    }
                };
                let sites = self.fault_sites.entry(s.region).or_default();
                *sites.entry(stack).or_default() += faults;
            }
            _ => self.health.undecodable += 1,
        }
    }

    /// The return addresses of a sample, innermost first, cut at the first one outside
    /// every executable mapping of the process.
    fn unwind(&mut self, s: &StackSample) -> Vec<u64> {
        let len = (s.stack_len as usize).min(STACK_COPY_BYTES);
        let mut ips = Vec::new();
        if s.flags & SAMPLE_FRAME_POINTERS != 0 {
            self.health.frame_pointer_walks += 1;
            ips.extend(
                s.stack[..len]
                    .chunks_exact(8)
                    .map(|w| u64::from_ne_bytes(w.try_into().unwrap_or_default()))
                    .take_while(|&ip| ip != 0),
            );
            self.modules
                .ensure(s.tgid, ips.first().copied().unwrap_or(0));
        } else {
            self.health.unwound += 1;
            self.modules.ensure(s.tgid, s.ip);
            let Some(p) = self.modules.get_mut(s.tgid) else {
                return ips;
            };
            let (base, bytes) = (s.stack_base, &s.stack[..len]);
            let mut read_stack = |addr: u64| -> Result<u64, ()> {
                let at = usize::try_from(addr.checked_sub(base).ok_or(())?).map_err(|_| ())?;
                let word = bytes.get(at..at + 8).ok_or(())?;
                Ok(u64::from_ne_bytes(word.try_into().map_err(|_| ())?))
            };
            let began = std::time::Instant::now();
            if walk(p, s, &mut read_stack, &mut ips) {
                self.health.stack_exhausted += 1;
            }
            self.health.unwind_ns += began.elapsed().as_nanos() as u64;
        }
        ips.truncate(STACK_DEPTH);
        let mut cut = self.first_unknown(s.tgid, &ips);
        // Code made executable by mprotect (a JIT's) comes with no mmap notice: a frame
        // outside the known mappings has the maps read again, at most every 10 ms.
        if let Some(i) = cut.filter(|&i| i > 0)
            && self
                .modules
                .ensure_within(s.tgid, ips[i] - 1, std::time::Duration::from_millis(10))
        {
            cut = self.first_unknown(s.tgid, &ips);
        }
        if self.modules.get(s.tgid).is_none() {
            ips.clear();
            return ips;
        }
        if let Some(cut) = cut {
            if cut > 0 {
                self.health.frames_dropped += 1;
            }
            ips.truncate(cut);
        }
        ips
    }
}

impl StackCollector {
    /// The first frame of `ips` in no executable mapping of `tgid` (a return address is
    /// looked up one byte back, since it points after its call).
    fn first_unknown(&self, tgid: u32, ips: &[u64]) -> Option<usize> {
        let p = self.modules.get(tgid)?;
        ips.iter()
            .enumerate()
            .position(|(i, &ip)| p.at(if i > 0 { ip - 1 } else { ip }).is_none())
    }
}

/// Unwinds `s` into `ips` (innermost first, at most [`STACK_DEPTH`]) with `p`'s unwind
/// tables; true if the stack was cut at the end of the copied bytes. Where a step gives an
/// address in no executable mapping of the process, or fails, the frame pointer is followed
/// instead when that gives one (as perf's walk does): a leaf V8 builtin, code with no FDE
/// that framehop takes for a frameless leaf (its return address at the stack pointer),
/// pushed a frame pointer, and the walk through node's JIT frames goes on from there.
fn walk(
    p: &mut ProcessModules,
    s: &StackSample,
    read_stack: &mut impl FnMut(u64) -> Result<u64, ()>,
    ips: &mut Vec<u64>,
) -> bool {
    use framehop::FrameAddress;
    let base = s.stack_base;
    let known = |code: &[modules::CodeMapping], ret: u64| {
        let addr = ret.wrapping_sub(1);
        let i = code.partition_point(|m| m.end <= addr);
        code.get(i).is_some_and(|m| m.start <= addr)
    };
    let mut regs = crate::arch::unwind_regs(s);
    let mut address = FrameAddress::from_instruction_pointer(s.ip);
    loop {
        ips.push(address.address());
        if ips.len() == STACK_DEPTH {
            return false;
        }
        let before = regs;
        let step = p
            .unwinder
            .unwind_frame(address, &mut regs, &mut p.cache, read_stack);
        let next = match step {
            Ok(Some(ret)) if known(&p.code, ret) => Some(ret),
            Ok(None) => return false,
            // The caller's frame is above the copied bytes: the stack is cut there.
            Err(framehop::Error::CouldNotReadStack(addr)) if addr >= base => return true,
            _ => None,
        };
        let next = next.or_else(|| {
            let (fp, sp) = crate::arch::frame_pointer_and_sp(&before);
            if fp < sp {
                return None;
            }
            // The frame record both architectures keep: the caller's frame pointer at the
            // frame pointer, the return address above it.
            let ret = crate::arch::return_address(read_stack(fp.checked_add(8)?).ok()?);
            let caller_fp = read_stack(fp).ok()?;
            known(&p.code, ret).then(|| {
                regs = crate::arch::caller_regs(ret, fp + 16, caller_fp);
                ret
            })
        });
        // No caller found either way: the address framehop gave (if any) is kept, to be
        // cut as outside every mapping (or found in a mapping read since).
        let Some(ret) = next.or(step.ok().flatten()) else {
            return false;
        };
        match FrameAddress::from_return_address(ret) {
            Some(a) => address = a,
            None => return false,
        }
    }
}

/// The record, if it is a [`ModulesChanged`] notice.
fn modules_changed(item: &[u8]) -> Option<ModulesChanged> {
    let head = item.get(..size_of::<ModulesChanged>())?;
    // SAFETY: as many bytes as a `ModulesChanged` (plain integers), read unaligned.
    let notice: ModulesChanged = unsafe { head.as_ptr().cast::<ModulesChanged>().read_unaligned() };
    (notice.kind == sample_kind::MODULES).then_some(notice)
}

/// Attaches the `mmap` hooks that tell when a traced process maps code (`--stacks`).
pub fn attach(cx: &mut AttachContext<'_>) -> Result<()> {
    let mmap = [libc::SYS_mmap as u32];
    cx.syscall_hook(SyscallEdge::Enter, hook::STACKS_MMAP_ENTER, &mmap)?;
    cx.syscall_hook(SyscallEdge::Exit, hook::STACKS_MMAP_EXIT, &mmap)?;
    Ok(())
}

/// Kept stacks the kernel lost: (calls, faults) not kept because the ring buffer was full.
pub fn kernel_dropped(ebpf: &Ebpf) -> Result<(u64, u64)> {
    Ok((
        counter_sum(ebpf, names::SYSCALL_STACK_COUNTERS, counter::DROPPED)?,
        counter_sum(ebpf, names::STACK_COUNTERS, counter::DROPPED)?,
    ))
}

/// The kernel side's stack settings: where the user registers are, and the fault sampling.
/// `fault_every`: one fault in this many keeps its stack.
pub fn config(btf: &KernelBtf, stacks: bool, fault_every: u32) -> Result<StackConfig> {
    if !stacks {
        return Ok(StackConfig::default());
    }
    // THREAD_SIZE is 16 KiB on x86_64 (PAGE_SIZE << THREAD_SIZE_ORDER, order 2) and on
    // arm64 with 4 KiB pages (THREAD_SHIFT 14), doubled with KASAN (x86 KASAN_STACK_ORDER,
    // arm64 KASAN_THREAD_SHIFT). The kernel side checks the registers it finds there (x86's
    // segment registers, arm64's pstate), so a wrong guess falls back to the frame-pointer
    // walk, counted.
    let thread_size = if btf.has_function("kasan_report") {
        32 << 10
    } else {
        16 << 10
    };
    let mut config = StackConfig {
        task_stack: btf.field_offset("task_struct", "stack")?,
        thread_size,
        pt_regs_bytes: btf.struct_size("pt_regs")?,
        fault_every: fault_every.max(1),
        ..StackConfig::default()
    };
    // The identity of mapped files is a help, not a need: without one of these fields the
    // modules are known from /proc only.
    let field = |s: &str, f: &str| btf.field_offset(s, f).ok();
    if let (Some(a), Some(b), Some(c), Some(d), Some(e), Some(f), Some(g), Some(h)) = (
        field("task_struct", "files"),
        field("files_struct", "fdt"),
        field("fdtable", "fd"),
        field("fdtable", "max_fds"),
        field("file", "f_inode"),
        field("inode", "i_ino"),
        field("inode", "i_sb"),
        field("super_block", "s_dev"),
    ) {
        // 0 is "not read" for `task_files`: no kernel has `files` first in task_struct.
        (
            config.task_files,
            config.files_fdt,
            config.fdt_fd,
            config.fdt_max_fds,
        ) = (a, b, c, d);
        (
            config.file_inode,
            config.inode_ino,
            config.inode_sb,
            config.sb_dev,
        ) = (e, f, g, h);
    }
    Ok(config)
}

/// Before load: the stack settings, and the ring buffer shrunk to a page without
/// `--stacks`.
pub fn prepare_loader<'a>(loader: &mut EbpfLoader<'a>, config: &'a StackConfig, stacks: bool) {
    loader.override_global(names::STACK_CONFIG, config, true);
    // A burst of faults that each keep their stack (--stack-sample below 32) outruns a busy
    // reader: the ring grows as the rate does, up to 32 MiB (about 3,900 stacks) at 1-4.
    let size = if stacks {
        let scale = (32 / config.fault_every.max(1))
            .clamp(1, 8)
            .next_power_of_two();
        STACK_SAMPLES_BYTE_SIZE * scale
    } else {
        PAGE_SIZE as u32
    };
    loader.map_max_entries(names::STACK_SAMPLES, size);
}

fn counter_sum(ebpf: &Ebpf, map: &str, index: u32) -> Result<u64> {
    Ok(crate::per_cpu::CpuCounters::open(ebpf, map)?
        .sum(index)
        .unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use memlock_trace_common::stacks::STACK_CHUNK;

    use super::*;
    use crate::symbolize::StackSymbolizer;

    /// What the kernel copies, taken from this very thread: its registers here (a frame
    /// kept small, so that its callers' frames are within the copy) and the top of its
    /// stack.
    #[inline(never)]
    fn sample_here() -> Box<StackSample> {
        let (ip, sp, bp, lr) = crate::registers_here!();
        copy_stack(ip, sp, bp, lr)
    }

    /// The stack above `sp` as the kernel copies it: whole chunks, as far as it goes. Runs
    /// below `sp`, so it changes nothing it copies.
    #[inline(never)]
    fn copy_stack(ip: u64, sp: u64, bp: u64, lr: u64) -> Box<StackSample> {
        use std::os::unix::fs::FileExt as _;
        // SAFETY: every field of a `StackSample` is a plain integer: all zeroes is valid.
        let mut s = unsafe { Box::<StackSample>::new_zeroed().assume_init() };
        s.kind = sample_kind::SYSCALL;
        s.tgid = std::process::id();
        s.nr = libc::SYS_mlock as u32;
        (s.ip, s.sp, s.bp, s.lr) = (ip, sp, bp, lr);
        s.stack_base = sp & !(STACK_CHUNK as u64 - 1);
        s.call.calls = 1;
        let mem = std::fs::File::open("/proc/self/mem").unwrap();
        let mut len = 0;
        while len < STACK_COPY_BYTES {
            let chunk = &mut s.stack[len..len + STACK_CHUNK];
            if mem.read_exact_at(chunk, s.stack_base + len as u64).is_err() {
                break;
            }
            len += STACK_CHUNK;
        }
        s.stack_len = len as u32;
        s
    }

    #[inline(never)]
    fn caller_two() -> Box<StackSample> {
        std::hint::black_box(sample_here())
    }

    #[inline(never)]
    fn caller_one() -> Box<StackSample> {
        std::hint::black_box(caller_two())
    }

    /// This thread's own stack, unwound from its registers and stack bytes with the test
    /// binary's unwind tables: the callers in order, each in an executable mapping.
    #[test]
    fn unwinds_own_stack_through_its_callers() {
        let sample = caller_one();
        let mut collector = StackCollector::default();
        collector.add(&sample);
        assert_eq!(collector.health.unwound, 1);
        let (key, _) = collector.calls.iter().next().expect("one call site");
        let depth = key.ips.iter().position(|&ip| ip == 0).unwrap();
        let frames = StackSymbolizer::default()
            .stack(&key.ips[..depth], collector.modules.get(std::process::id()));
        let names: Vec<String> = frames
            .iter()
            .map(|f| f.symbol.to_str_lossy().into_owned())
            .collect();
        let at = |name: &str| {
            names
                .iter()
                .position(|n| n.ends_with(name))
                .unwrap_or_else(|| panic!("{name} not in {names:#?}"))
        };
        assert_eq!(at("sample_here") + 1, at("caller_two"), "{names:#?}");
        assert_eq!(at("caller_two") + 1, at("caller_one"), "{names:#?}");
        assert!(at("unwinds_own_stack_through_its_callers") > at("caller_one"));
        eprintln!("{names:#?} {:?}", collector.health);
    }
}

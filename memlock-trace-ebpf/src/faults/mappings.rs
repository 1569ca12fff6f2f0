//! The mapping of a fault, resolved at the fault: the faulting VMA's start and flags key
//! the fault's region, and the VMA's identity (range, offset, file, name) goes into
//! `FAULT_MAPPINGS` the first time a CPU meets it, so user space names the region even when
//! it was unmapped long before anyone read `/proc/PID/smaps`.
//!
//! Why a cache: `bpf_find_vma` takes the mmap lock (trylock) and walks the maple tree, and
//! recording the identity is a hash update; a fault usually lands in one of the few VMAs the
//! CPU's last faults landed in. The cache is dropped whenever a traced process changes its
//! mappings (a generation bumped at the enter and exit of the calls that map, unmap, move,
//! re-protect or lock them), so a VMA unmapped and replaced is looked up again.

use aya_ebpf::{
    bindings::BPF_ANY,
    macros::{map, tracepoint},
    maps::{Array, LruHashMap, PerCpuArray},
    programs::TracePointContext,
};
use memlock_trace_common::faults::{MAX_FAULT_MAPPINGS, RegionKey, VM_HELD_SP, region_kind};

use crate::{
    mapping,
    shared::{current_ids, is_target},
};

/// The identity of each VMA faults were counted in, keyed like its region.
#[map]
static FAULT_MAPPINGS: LruHashMap<RegionKey, memlock_trace_common::mapping::MappingInfo> =
    LruHashMap::with_max_entries(MAX_FAULT_MAPPINGS, 0);

/// Bumped when a traced process may have changed its mappings.
#[map]
static FAULT_VMA_GEN: Array<u64> = Array::with_max_entries(1, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct CachedVma {
    tgid: u32,
    _pad: u32,
    generation: u64,
    start: u64,
    end: u64,
    flags: u64,
    /// The VMA's address, for the hooks handed one (fentry/kprobe).
    vma: u64,
}

const CACHE_WAYS: usize = 4;

#[repr(C)]
#[derive(Clone, Copy)]
struct VmaCache {
    next: u32,
    _pad: u32,
    ways: [CachedVma; CACHE_WAYS],
}

#[map]
static FAULT_VMA_CACHE: PerCpuArray<VmaCache> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn generation() -> u64 {
    FAULT_VMA_GEN.get(0).copied().unwrap_or(0)
}

/// The mappings of a traced process may have changed: drop every CPU's cache.
#[inline(always)]
pub(super) fn changed() {
    if let Some(generation) = FAULT_VMA_GEN.get_ptr_mut(0) {
        // SAFETY: a valid pointer to the map's one value. Two CPUs bumping at once may lose
        // an increment; either way the value differs from every cached one.
        unsafe { *generation += 1 };
    }
}

/// `sys_enter_munmap`, `sys_exit_munmap`, `sys_exit_munlock`, `sys_exit_munlockall`: calls
/// that change mappings without populating anything (the populating calls bump it from
/// their own programs).
#[tracepoint]
pub fn fault_mappings_changed(_ctx: TracePointContext) -> u32 {
    let (tgid, _) = current_ids();
    if is_target(tgid) {
        changed();
    }
    0
}

/// The start and flags of the VMA of `tgid` (the current task's process) holding
/// `address`, recording its identity on a cache miss; `None` when none holds it (or the
/// mmap lock was busy). The flags carry [`VM_HELD_SP`] when the VMA also holds `sp`, the
/// faulting thread's user stack pointer (0: not known).
#[inline(always)]
pub(super) fn resolve<const RB: bool>(tgid: u32, address: u64, sp: u64) -> Option<(u64, u64)> {
    let cache = FAULT_VMA_CACHE.get_ptr_mut(0)?;
    // SAFETY: this CPU's value of a per-CPU map, valid while the program runs; a program
    // runs to completion on its CPU, so nothing else uses it meanwhile.
    let cache = unsafe { &mut *cache };
    let generation = generation();
    for way in &cache.ways {
        if way.tgid == tgid
            && way.generation == generation
            && way.start <= address
            && address < way.end
        {
            return Some((way.start, with_sp(way.flags, way.start, way.end, sp)));
        }
    }
    let found = mapping::find::<RB>(address, true)?;
    remember(
        cache,
        tgid,
        generation,
        found.start,
        found.end,
        found.flags,
        0,
    );
    Some((
        found.start,
        with_sp(found.flags, found.start, found.end, sp),
    ))
}

/// A VMA's flags as the fault hooks count them: the kernel's, with [`VM_HELD_SP`] set when
/// the VMA holds `sp`.
#[inline(always)]
pub(super) fn with_sp(flags: u64, start: u64, end: u64, sp: u64) -> u64 {
    let flags = flags & !VM_HELD_SP;
    if start <= sp && sp < end {
        flags | VM_HELD_SP
    } else {
        flags
    }
}

/// fentry/kprobe: the hook was handed the VMA; records its identity the first time this CPU
/// meets it. Its end, when known.
#[inline(always)]
pub(super) fn note_vma(tgid: u32, vma: u64, start: u64, flags: u64) -> Option<u64> {
    let cache = FAULT_VMA_CACHE.get_ptr_mut(0)?;
    // SAFETY: as in `resolve`.
    let cache = unsafe { &mut *cache };
    let generation = generation();
    for way in &cache.ways {
        if way.tgid == tgid
            && way.generation == generation
            && way.vma == vma
            && way.start == start
            && way.flags == flags
        {
            return Some(way.end);
        }
    }
    let info = mapping::identify_vma(vma)?;
    let end = info.end;
    remember(cache, tgid, generation, start, end, flags, vma);
    Some(end)
}

/// Caches a VMA and records the identity the lookup left in the scratch.
#[inline(always)]
fn remember(
    cache: &mut VmaCache,
    tgid: u32,
    generation: u64,
    start: u64,
    end: u64,
    flags: u64,
    vma: u64,
) {
    let way = cache.next as usize & (CACHE_WAYS - 1);
    cache.next = cache.next.wrapping_add(1);
    cache.ways[way] = CachedVma {
        tgid,
        _pad: 0,
        generation,
        start,
        end,
        flags,
        vma,
    };
    let Some(info) = mapping::scratch() else {
        return;
    };
    let key = RegionKey {
        tgid,
        exact: region_kind::VMA,
        start,
    };
    if FAULT_MAPPINGS
        .insert(key, info, u64::from(BPF_ANY))
        .is_err()
    {
        super::update_failed("FAULT_MAPPINGS");
    }
}

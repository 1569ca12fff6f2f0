//! The mapping of a fault, resolved at the fault: the faulting VMA's start and flags key
//! the fault's region, and the VMA's identity (range, offset, file, name) goes into
//! `FAULT_MAPPINGS` the first time a CPU meets it, so user space names the region even when
//! it was unmapped long before anyone read `/proc/PID/smaps`.
//!
//! Why a cache: a lookup walks the VMA tree (a probe read per level and per VMA field), and
//! recording the identity is a hash update; a fault usually lands in one of the few VMAs the
//! CPU's last faults landed in. A process's cached VMAs are dropped whenever it changes its
//! mappings (its generation bumped at the enter and exit of the calls that map, unmap,
//! move, re-protect or lock them), so a VMA unmapped and replaced is looked up again.
//!
//! The fault programs walk the VMA tree without its lock (`mapping::TREE_WALK`). Where
//! `bpf_find_vma` looks up the VMA a populating call filled, it only tries the mmap lock:
//! while another thread of the process maps, a lookup fails and the pages are keyed by page.
//! Such pages wait in `FAULT_VMA_PENDING` and are looked up again when the lock is likely
//! free: as the process enters its next call that maps or unmaps, or exits. Once the VMA is
//! identified, user space puts the pages keyed by page inside it in its row, even after the
//! process has exited.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_ANY,
    helpers::generated::bpf_loop,
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use memlock_trace_common::faults::{
    MAX_FAULT_MAPPINGS, RegionKey, VM_BACKING, VM_HELD_SP, VM_OURS, region_kind,
};

pub(super) use self::generation::changed;
use self::generation::generation;
use crate::{
    mapping::{self, Identified, Lookup},
    shared::{current_ids, is_target},
};

mod generation;

/// The identity of each VMA faults were counted in, keyed like its region.
#[map]
static FAULT_MAPPINGS: LruHashMap<RegionKey, memlock_trace_common::mapping::MappingInfo> =
    LruHashMap::with_max_entries(MAX_FAULT_MAPPINGS, 0);

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
    /// Where `FAULT_MAPPINGS` keys are built: a map value, not the stack, whose 512 bytes
    /// the fault programs share with their `bpf_loop` callbacks (6.1 counts them together).
    key: RegionKey,
}

#[map]
static FAULT_VMA_CACHE: PerCpuArray<VmaCache> = PerCpuArray::with_max_entries(1, 0);

/// At the exit of `munmap`, `munlock`, `munlockall` (`hook::MAPPINGS_CHANGED`): calls that
/// change mappings without populating anything (the populating calls bump it from their
/// own handlers).
#[inline(never)]
pub fn on_changed() {
    let (tgid, _) = current_ids();
    if is_target(tgid) {
        changed(tgid);
    }
}

/// At the entry of `munmap` (`hook::MAPPINGS_GOING`): the mappings are about to change.
/// `RETRY` (`hook::MAPPINGS_GOING_RETRY`, where the tracepoint set has `bpf_find_vma`), at
/// the entry of `munmap` and `exit_group`: also the last chance to look up the process's
/// waiting pages before their VMAs go (a thread's stack freed by the thread that joined it,
/// a glibc arena at exit) after a burst of faults whose lookups all met a busy lock.
#[inline(never)]
pub fn on_going<const RETRY: bool>() {
    let (tgid, _) = current_ids();
    if is_target(tgid) {
        changed(tgid);
        if RETRY {
            retry_pending(tgid);
        }
    }
}

/// The start and flags of the VMA of `tgid` (the current task's process) holding
/// `address`, recording its identity on a cache miss; `None` when none holds it (or the
/// mmap lock was busy). The flags carry [`VM_HELD_SP`] when the VMA also holds `sp`, the
/// faulting thread's user stack pointer (0: not known). `HOW`: see [`mapping::FIND_VMA`];
/// a lookup by the helper that met a busy lock leaves the page waiting (see the module).
#[inline(always)]
pub(super) fn resolve<const HOW: u8>(tgid: u32, address: u64, sp: u64) -> Option<(u64, u64)> {
    let cache = FAULT_VMA_CACHE.get_ptr_mut(0)?;
    // SAFETY: this CPU's value of a per-CPU map, valid while the program runs; a program
    // runs to completion on its CPU, so nothing else uses it meanwhile.
    let cache = unsafe { &mut *cache };
    let generation = generation(tgid);
    for way in cache.ways.iter_mut() {
        if way.tgid == tgid
            && way.generation == generation
            && way.start <= address
            && address < way.end
        {
            let flags = with_sp(way.flags, way.start, way.end, sp);
            // The first lookup may have had another thread's sp (a new thread's stack is
            // first written by its creator): the first fault of the stack's own thread tells.
            if flags & VM_HELD_SP != 0 && way.flags & VM_HELD_SP == 0 {
                way.flags |= VM_HELD_SP;
                hold_sp(&mut cache.key, tgid, way.start);
            }
            return Some((way.start, flags));
        }
    }
    let found = match mapping::lookup::<HOW>(address, true) {
        Lookup::Found(found) => found,
        Lookup::Unmapped => return None,
        Lookup::Unknown => {
            // Only the helper fails on a busy lock; a walk that cannot answer will not
            // answer later either.
            if HOW == mapping::FIND_VMA {
                wait_for_lookup(tgid, address, sp);
            }
            return None;
        }
    };
    let flags = with_sp(found.flags, found.start, found.end, sp);
    let backing = remember(
        cache,
        tgid,
        generation,
        found.start,
        found.end,
        found.flags,
        0,
        flags & VM_HELD_SP != 0,
    );
    Some((found.start, flags & !VM_BACKING | backing))
}

/// Pages of one process whose lookup failed, by [`PENDING_SHIFT`] block, with the faulting
/// thread's stack pointer (0: not known) so a stack is still told as one.
#[repr(C)]
#[derive(Clone, Copy)]
struct Pending {
    next: u32,
    _pad: u32,
    pages: [u64; PENDING_SLOTS],
    sps: [u64; PENDING_SLOTS],
}

/// Pages pending per process: one is enough to name a VMA, so a block of
/// `1 << PENDING_SHIFT` bytes (a thread stack's used top, say) takes one slot however many
/// of its faults failed; a slot is overwritten when more blocks wait. 256: each thread
/// created in a burst can leave 4 blocks waiting (its stack's used top across two, its
/// signal stack, its malloc arena); with 64 slots, 32 threads on a loaded machine lost
/// whole stacks with `--latency-sample` (1 run in 12), with 256 none in 20 runs, nor 64
/// threads. 256 processes at once: a program waits only while it maps and faults at once.
const PENDING_SLOTS: usize = 256;
const PENDING_SHIFT: u32 = 18;

/// Processes with pages waiting for a lookup.
#[map]
static FAULT_VMA_PENDING: LruHashMap<u32, Pending> = LruHashMap::with_max_entries(256, 0);

/// An empty [`Pending`] to insert from (it does not fit the stack beside its callers).
#[map]
static FAULT_VMA_PENDING_EMPTY: PerCpuArray<Pending> = PerCpuArray::with_max_entries(1, 0);

/// A lookup at `address` failed (the mmap lock was busy): keep its page for a later one.
#[inline(always)]
fn wait_for_lookup(tgid: u32, address: u64, sp: u64) {
    let page = address & memlock_trace_common::PAGE_MASK;
    if FAULT_VMA_PENDING.get_ptr_mut(tgid).is_none() {
        let Some(empty) = FAULT_VMA_PENDING_EMPTY.get_ptr(0) else {
            return;
        };
        // SAFETY: this CPU's value of a per-CPU map nothing writes: all zeros.
        let empty = unsafe { &*empty };
        let _ = FAULT_VMA_PENDING.insert(tgid, empty, u64::from(BPF_ANY));
    }
    let Some(pending) = FAULT_VMA_PENDING.get_ptr_mut(tgid) else {
        super::update_failed("FAULT_VMA_PENDING");
        return;
    };
    let mut search = SlotSearch {
        pending,
        page,
        sp,
        free: PENDING_SLOTS as u64,
        same: 0,
    };
    // SAFETY: the callback reads the entry `search` points to and writes only `search`.
    // bpf_loop: the callback is verified once, where a loop of 64 inlined would be 64 times.
    unsafe {
        bpf_loop(
            PENDING_SLOTS as u32,
            find_slot as *mut c_void,
            (&raw mut search).cast(),
            0,
        )
    };
    if search.same != 0 {
        return;
    }
    // SAFETY: a valid pointer to the process's entry; two CPUs writing it at once can at
    // worst lose or duplicate a pending page, which only costs a later lookup.
    let pending = unsafe { &mut *pending };
    let i = if search.free < PENDING_SLOTS as u64 {
        search.free as usize
    } else {
        pending.next = pending.next.wrapping_add(1);
        pending.next as usize & (PENDING_SLOTS - 1)
    };
    if i < PENDING_SLOTS {
        pending.pages[i] = page;
        pending.sps[i] = sp;
    }
}

#[repr(C)]
struct SlotSearch {
    pending: *mut Pending,
    page: u64,
    sp: u64,
    /// A free slot, or `PENDING_SLOTS`.
    free: u64,
    /// A slot already holds a page of the block.
    same: u64,
}

extern "C" fn find_slot(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `SlotSearch` on the caller's stack passed to bpf_loop, whose
    // `pending` points to a map value valid for the program's run.
    let search = unsafe { &mut *ctx.cast::<SlotSearch>() };
    let i = index as usize;
    if i >= PENDING_SLOTS {
        return 1;
    }
    // SAFETY: as above.
    let pending = unsafe { &mut *search.pending };
    let page = pending.pages[i];
    if page != 0 && page >> PENDING_SHIFT == search.page >> PENDING_SHIFT {
        // The stack pointer nearest the page is kept: a thread touching its own stack has
        // it there, the thread that created it (writing its descriptor) elsewhere.
        if search.sp.abs_diff(search.page) < pending.sps[i].abs_diff(page) {
            pending.pages[i] = search.page;
            pending.sps[i] = search.sp;
        }
        search.same = 1;
        return 1;
    }
    if page == 0 {
        search.free = index;
    }
    0
}

/// Looks the process's pending pages up again (by the current task, one of its threads):
/// each VMA found is recorded like a fault's, a page in none is dropped; the first lookup
/// that finds the lock busy again ends the round.
#[inline(always)]
pub(super) fn retry_pending(tgid: u32) {
    let Some(pending) = FAULT_VMA_PENDING.get_ptr_mut(tgid) else {
        return;
    };
    let Some(cache) = FAULT_VMA_CACHE.get_ptr_mut(0) else {
        return;
    };
    let mut retry = Retry {
        pending,
        cache,
        tgid: u64::from(tgid),
        generation: generation(tgid),
        busy: 0,
    };
    // SAFETY: the callback uses the entry and cache `retry` points to, and `retry`.
    unsafe {
        bpf_loop(
            PENDING_SLOTS as u32,
            retry_slot as *mut c_void,
            (&raw mut retry).cast(),
            0,
        )
    };
    if retry.busy == 0 {
        let _ = FAULT_VMA_PENDING.remove(tgid);
    }
}

#[repr(C)]
struct Retry {
    pending: *mut Pending,
    cache: *mut VmaCache,
    tgid: u64,
    generation: u64,
    busy: u64,
}

extern "C" fn retry_slot(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `Retry` on the caller's stack passed to bpf_loop; its pointers
    // are to map values valid for the program's run, used by nothing else meanwhile.
    let retry = unsafe { &mut *ctx.cast::<Retry>() };
    let i = index as usize;
    if i >= PENDING_SLOTS {
        return 1;
    }
    // SAFETY: as above.
    let pending = unsafe { &mut *retry.pending };
    let (page, sp) = (pending.pages[i], pending.sps[i]);
    if page == 0 {
        return 0;
    }
    // Into the scratch, not onto this frame: see `mapping::identify`.
    match mapping::identify(page) {
        Identified::Found => {
            pending.pages[i] = 0;
            let Some(info) = mapping::scratch() else {
                return 1;
            };
            let (start, end, flags) = (info.start, info.end, info.flags);
            // SAFETY: as above.
            let cache = unsafe { &mut *retry.cache };
            remember(
                cache,
                retry.tgid as u32,
                retry.generation,
                start,
                end,
                flags,
                0,
                start <= sp && sp < end,
            );
            0
        }
        Identified::Unmapped => {
            pending.pages[i] = 0;
            0
        }
        // Still busy: the next chance will do.
        Identified::Unknown => {
            retry.busy = 1;
            1
        }
    }
}

/// Marks the identity of `tgid`'s VMA at `start` as having held a faulting thread's sp.
// The key by reference: where it lies, in a map value; by value it would be copied onto
// the stack (see `VmaCache::key`).
#[allow(clippy::needless_borrows_for_generic_args)]
#[inline(always)]
fn hold_sp(key: &mut RegionKey, tgid: u32, start: u64) {
    *key = RegionKey {
        tgid,
        exact: region_kind::VMA,
        start,
    };
    if let Some(info) = FAULT_MAPPINGS.get_ptr_mut(&*key) {
        // SAFETY: a valid pointer to the map's value; a racing writer sets the same bit.
        unsafe { (*info).flags |= VM_HELD_SP };
    }
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
/// meets it. Its end and [`VM_BACKING`] bits, when known.
#[inline(always)]
pub(super) fn note_vma(tgid: u32, vma: u64, start: u64, flags: u64) -> Option<(u64, u64)> {
    let cache = FAULT_VMA_CACHE.get_ptr_mut(0)?;
    // SAFETY: as in `resolve`.
    let cache = unsafe { &mut *cache };
    let generation = generation(tgid);
    for way in &cache.ways {
        if way.tgid == tgid
            && way.generation == generation
            && way.vma == vma
            && way.start == start
            && way.flags & !VM_OURS == flags
        {
            return Some((way.end, way.flags & VM_BACKING));
        }
    }
    let end = mapping::identify_vma(vma)?.end;
    let backing = remember(cache, tgid, generation, start, end, flags, vma, false);
    Some((end, backing))
}

/// Caches a VMA and records the identity the lookup left in the scratch; returns its
/// [`VM_BACKING`] bits. `held_sp`: a faulting thread's stack pointer was in it, which its
/// identity then keeps for good (for the pages keyed by page inside it).
#[allow(clippy::too_many_arguments, clippy::needless_borrows_for_generic_args)]
#[inline(always)]
fn remember(
    cache: &mut VmaCache,
    tgid: u32,
    generation: u64,
    start: u64,
    end: u64,
    flags: u64,
    vma: u64,
    held_sp: bool,
) -> u64 {
    let way = cache.next as usize & (CACHE_WAYS - 1);
    cache.next = cache.next.wrapping_add(1);
    let Some(info) = mapping::scratch() else {
        return 0;
    };
    let backing = info.flags & VM_BACKING;
    cache.key = RegionKey {
        tgid,
        exact: region_kind::VMA,
        start,
    };
    // SAFETY: a valid pointer to the map's value, read at once.
    let old = unsafe { FAULT_MAPPINGS.get(&cache.key) }.copied();
    let held_before = old.is_some_and(|old| old.end == end && old.flags & VM_HELD_SP != 0);
    let held = if held_sp || held_before {
        VM_HELD_SP
    } else {
        0
    };
    // The cached flags carry the bit once the identity has it (see `resolve`).
    cache.ways[way] = CachedVma {
        tgid,
        _pad: 0,
        generation,
        start,
        end,
        flags: flags & !VM_OURS | held | backing,
        vma,
    };
    info.flags = info.flags & !VM_HELD_SP | held;
    // Already recorded as it is (the cache is dropped at every mapping call of every traced
    // process, so most misses meet a VMA already known): an LRU update saved.
    if old.is_some_and(|old| {
        old.end == info.end
            && old.flags == info.flags
            && old.pgoff == info.pgoff
            && old.ino == info.ino
            && old.dev == info.dev
            && old.kind == info.kind
    }) {
        return backing;
    }
    if FAULT_MAPPINGS
        .insert(&cache.key, info, u64::from(BPF_ANY))
        .is_err()
    {
        super::update_failed("FAULT_MAPPINGS");
    }
    backing
}

//! Totals over every VMA of the process, for `mlockall`/`munlockall` (which have no range
//! for [`super::walk`] to snapshot): a walk of the mm's maple tree (6.1+), one node slot per
//! `bpf_loop` step, so the verifier checks one step rather than every path of a long loop.
//!
//! The encoding (lib/maple_tree.c, 6.1 to 6.18): a node entry is the node's address with its
//! type in bits 3..7 (`maple_leaf_64` = 1, `maple_range_64` = 2, `maple_arange_64` = 3; below
//! `maple_range_64` is a leaf) and flags in the low bits; the mm tree's root is a node
//! (`(entry & 3) == 2`). Slot `i` covers `[min_i, pivot[i]]`, `min_i` being one past the
//! previous pivot; the last used slot (`ma_data_end()`) reaches the node's max. Leaves hold
//! VMAs, or NULL for holes.
//!
//! The mmap lock is not held at `sys_enter`/`sys_exit`: a tree another thread changes
//! meanwhile can read inconsistently, which the walk detects (a VMA whose bounds are not its
//! slot's) and reports as not measured, never as a wrong figure it knows of.

use core::ffi::c_void;

use aya_ebpf::{helpers::generated::bpf_loop, macros::map, maps::PerCpuArray};
use memlock_trace_common::vma::{VM_LOCKED, VM_LOCKONFAULT, VmaOffsets, WholeTotals};

use super::{VMA_CONFIG, read_vma};
use crate::{
    kernel_walk::{MAPLE_ARANGE64_SLOTS, MAPLE_NODE_MASK, MAPLE_RANGE64_SLOTS, peek},
    shared::current_task,
};

/// `bpf_loop` steps at most: a few per tree level per leaf, 16 slots per leaf; far more than
/// a process with thousands of VMAs needs.
const MAX_STEPS: u32 = 1 << 16;
/// `enum maple_type`'s values for the node types an mm's tree holds.
const LEAF_64: u64 = 1;
const RANGE_64: u64 = 2;
const ARANGE_64: u64 = 3;

/// The walk's state, in a map rather than on the stack: values read back from a map are
/// unknown to the verifier, so it checks [`step`] once instead of once per slot and count it
/// could tell apart (which ran past its instruction limit).
#[map]
static WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
struct Walk {
    root: u64,
    /// The node entry being read, its range, the slot and the slot's first address.
    node: u64,
    min: u64,
    max: u64,
    slot: u64,
    slot_min: u64,
    /// The lowest address not yet counted: a finished leaf restarts the descent here.
    addr: u64,
    /// 1: the whole tree was read; 2: an inconsistency stopped the walk.
    state: u32,
    _pad: u32,
    totals: WholeTotals,
}

const RUNNING: u32 = 0;
const DONE: u32 = 1;
const FAILED: u32 = 2;

/// Fills `out` with the totals over every VMA; `out.measured` says whether it could.
#[inline(always)]
pub(super) fn totals(out: &mut WholeTotals) {
    let off = VMA_CONFIG.load().offsets;
    *out = WholeTotals::default();
    if off.mt_walk == 0 {
        return;
    }
    let mm: u64 = peek(current_task(), off.task_mm);
    let root: u64 = peek(mm, off.mm_mt + off.mt_root);
    if mm == 0 || root & 3 != 2 {
        return;
    }
    let Some(walk) = WALK.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's own entry; a BPF program is not preempted by another on its CPU.
    let walk = unsafe { &mut *walk };
    *walk = Walk {
        root,
        node: root,
        min: 0,
        max: u64::MAX,
        slot: 0,
        slot_min: 0,
        addr: 0,
        state: RUNNING,
        _pad: 0,
        totals: WholeTotals::default(),
    };
    // SAFETY: the callback only reads and writes this CPU's `WALK` entry.
    unsafe { bpf_loop(MAX_STEPS, step as *mut c_void, core::ptr::null_mut(), 0) };
    if walk.state == DONE {
        *out = walk.totals;
        out.measured = 1;
    }
}

/// One slot of one node: count a VMA, descend into a child, or restart at the root after a
/// leaf. Returns 1 to stop the loop.
#[inline(never)]
extern "C" fn step(_index: u64, _ctx: *mut c_void) -> i64 {
    let Some(w) = WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's own entry, as in [`totals`].
    let w = unsafe { &mut *w };
    let off = VMA_CONFIG.load().offsets;
    let next = advance(w, &off);
    w.state = next;
    i64::from(next != RUNNING)
}

#[inline(always)]
fn advance(w: &mut Walk, off: &VmaOffsets) -> u32 {
    let node = w.node & !MAPLE_NODE_MASK;
    let kind = (w.node >> 3) & 0xf;
    let (pivots, slots, count) = match kind {
        LEAF_64 | RANGE_64 => (off.mr64_pivot, off.mr64_slot, MAPLE_RANGE64_SLOTS),
        ARANGE_64 => (off.ma64_pivot, off.ma64_slot, MAPLE_ARANGE64_SLOTS),
        _ => return FAILED,
    };
    if node == 0 || w.slot >= count {
        return FAILED;
    }
    let end = data_end(node, kind, w.max, off);
    let i = w.slot;
    if i > end {
        return FAILED;
    }
    let slot_max = if i == end {
        w.max
    } else {
        peek(node, pivots + 8 * i as u32)
    };
    if slot_max < w.slot_min {
        return FAILED;
    }
    let entry: u64 = peek(node, slots + 8 * i as u32);
    if kind == LEAF_64 {
        if entry != 0 && slot_max >= w.addr {
            let vma = read_vma(entry, off);
            // The VMA stored for [min, max] is [vm_start, vm_end): a stale read otherwise.
            if vma.start != w.slot_min || vma.end != slot_max.wrapping_add(1) {
                return FAILED;
            }
            let t = &mut w.totals;
            t.vmas += 1;
            if vma.flags & VM_LOCKED != 0 {
                t.locked_vmas += 1;
                t.locked_bytes += vma.end - vma.start;
            }
            if vma.flags & VM_LOCKONFAULT != 0 {
                t.onfault_bytes += vma.end - vma.start;
            }
        }
        if i < end {
            w.slot = i + 1;
            w.slot_min = slot_max.wrapping_add(1);
            return RUNNING;
        }
        if w.max == u64::MAX {
            return DONE;
        }
        // Next leaf: descend again from the root to the first address above this one.
        w.addr = w.max + 1;
        w.node = w.root;
        w.min = 0;
        w.max = u64::MAX;
        w.slot = 0;
        w.slot_min = 0;
        return RUNNING;
    }
    if slot_max >= w.addr {
        w.node = entry;
        w.min = w.slot_min;
        w.max = slot_max;
        w.slot = 0;
        return RUNNING;
    }
    if i >= end {
        return FAILED;
    }
    w.slot = i + 1;
    w.slot_min = slot_max.wrapping_add(1);
    RUNNING
}

/// The last used slot, as `ma_data_end()` finds it: the metadata's `end` for `arange_64`
/// nodes and partly filled `range_64` ones (whose last pivot is 0); a full `range_64` node's
/// last pivot is its max (then the slot before the last is the end) or below it (all used).
#[inline(always)]
fn data_end(node: u64, kind: u64, max: u64, off: &VmaOffsets) -> u64 {
    if kind == ARANGE_64 {
        // `meta.end` is the metadata's first byte (x86-64 is little-endian).
        let meta: u32 = peek(node, off.ma64_slot + 8 * MAPLE_ARANGE64_SLOTS as u32 * 2);
        return u64::from(meta & 0xff);
    }
    let last: u64 = peek(node, off.mr64_pivot + 8 * (MAPLE_RANGE64_SLOTS as u32 - 2));
    if last == 0 {
        // The metadata sits in place of the last slot.
        let meta: u32 = peek(node, off.mr64_slot + 8 * (MAPLE_RANGE64_SLOTS as u32 - 1));
        return u64::from(meta & 0xff);
    }
    if last == max {
        return MAPLE_RANGE64_SLOTS - 2;
    }
    MAPLE_RANGE64_SLOTS - 1
}

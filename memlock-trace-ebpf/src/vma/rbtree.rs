//! Snapshots on kernels without the maple tree and `bpf_find_vma` (5.10: Debian 11, Amazon
//! Linux 2): the VMAs around a range, found the way 5.10's `find_vma()` does (a descent of
//! `mm->mm_rb` to the first VMA ending above the address), then followed along the
//! `vm_next` list. The same records as [`super::walk`], so user space diffs them alike.
//!
//! The mmap lock is not held at `sys_enter`/`sys_exit`: another thread of the process
//! changing its mappings meanwhile can make a snapshot stale, never unsafe (every read is a
//! `bpf_probe_read_kernel`, and the loops are bounded).

use memlock_trace_common::vma::{
    MAX_SNAPSHOT_VMAS, SnapshotEvent, VM_LOCKED, VM_LOCKONFAULT, VmaOffsets, WholeTotals,
};

use super::{CallRange, VMA_CONFIG, peek, read_vma};
use crate::shared::current_task;

/// Levels of the rbtree descended at most: a red-black tree of n nodes is at most
/// 2 log2(n + 1) deep, 32 for the 65530 VMAs `vm.max_map_count` allows by default.
const RB_DEPTH: usize = 40;

/// Walks the VMAs from the one below `start` to the one holding `end`, like
/// [`super::walk`]: a hole ends the walk.
#[inline(always)]
pub(super) fn walk(call: &CallRange, event: &mut SnapshotEvent) {
    let off = VMA_CONFIG.load().offsets;
    let mm: u64 = peek(current_task(), off.task_mm);
    let probe = call.start.saturating_sub(1);
    let mut vma = first_ending_above(mm, probe, &off);
    let mut count = 0usize;
    let mut addr = call.start;
    // The VMA just below the range: a merge candidate (it may also hold `start`).
    if call.start > 0 && vma != 0 {
        let below = read_vma(vma, &off);
        if below.start <= probe {
            event.vmas[0] = below;
            count = 1;
            addr = below.end;
            vma = peek(vma, off.vma_next);
        }
    }
    let mut complete = false;
    for _ in 0..MAX_SNAPSHOT_VMAS {
        // The last VMA held `end`: it was the upper neighbour.
        if addr > call.end {
            complete = true;
            break;
        }
        let found = read_vma(vma, &off);
        // No VMA (the list's end reads as zeroes) or a hole before the next one: nothing
        // holds `addr`. Done if that is above the range, else a hole inside it.
        if vma == 0 || found.start > addr || found.end <= addr {
            complete = addr >= call.end;
            break;
        }
        let Some(entry) = event.vmas.get_mut(count) else {
            break;
        };
        *entry = found;
        count += 1;
        addr = found.end;
        vma = peek(vma, off.vma_next);
    }
    event.count = count as u32;
    event.incomplete = u32::from(!(complete || addr > call.end));
}

/// VMAs the `mlockall`/`munlockall` totals follow along the list at most: a process with
/// more is reported as not measured.
const MAX_LIST_VMAS: usize = 1024;

/// Totals over every VMA, for `mlockall`/`munlockall`: the `mm->mmap` list in address order.
/// The sums are branch-free so the verifier walks one path through the loop, not one per
/// locked/unlocked combination.
#[inline(always)]
pub(super) fn totals(out: &mut WholeTotals) {
    let off = VMA_CONFIG.load().offsets;
    *out = WholeTotals::default();
    if off.list_walk == 0 {
        return;
    }
    let mm: u64 = peek(current_task(), off.task_mm);
    if mm == 0 {
        return;
    }
    let mut vma: u64 = peek(mm, off.mm_mmap);
    let mut t = WholeTotals::default();
    let mut last_end = 0u64;
    for _ in 0..MAX_LIST_VMAS {
        if vma == 0 {
            t.measured = 1;
            *out = t;
            return;
        }
        let v = read_vma(vma, &off);
        // Out of order or empty: the list changed under the walk.
        if v.start < last_end || v.end <= v.start {
            return;
        }
        let len = v.end - v.start;
        let locked = (v.flags / VM_LOCKED) & 1;
        let onfault = (v.flags / VM_LOCKONFAULT) & 1;
        t.vmas += 1;
        t.locked_vmas += locked as u32;
        t.locked_bytes += len * locked;
        t.onfault_bytes += len * onfault;
        last_end = v.end;
        vma = peek(vma, off.vma_next);
    }
}

/// The first VMA whose end is above `addr` (5.10's `find_vma()`), or 0.
#[inline(always)]
fn first_ending_above(mm: u64, addr: u64, off: &VmaOffsets) -> u64 {
    if mm == 0 {
        return 0;
    }
    let mut node: u64 = peek(mm, off.mm_rb);
    let mut best = 0u64;
    for _ in 0..RB_DEPTH {
        if node == 0 {
            break;
        }
        let vma = node.wrapping_sub(u64::from(off.vma_rb));
        let end: u64 = peek(vma, off.vma_end);
        if end > addr {
            best = vma;
            let start: u64 = peek(vma, off.vma_start);
            if start <= addr {
                break;
            }
            node = peek(node, off.rb_left);
        } else {
            node = peek(node, off.rb_right);
        }
    }
    best
}

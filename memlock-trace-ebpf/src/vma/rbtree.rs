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

use super::{CallRange, VMA_CONFIG, read_vma};
use crate::{
    kernel_walk::{RbOffsets, first_ending_above, peek},
    shared::current_task,
};

/// Where the rbtree walk reads, from the VMA family's offsets.
#[inline(always)]
fn rb_offsets(off: &VmaOffsets) -> RbOffsets {
    RbOffsets {
        mm_rb: off.mm_rb,
        vma_rb: off.vma_rb,
        vma_start: off.vma_start,
        vma_end: off.vma_end,
        rb_left: off.rb_left,
        rb_right: off.rb_right,
    }
}

/// Walks the VMAs from the one below `start` to the one holding `end`, like
/// [`super::walk`]: a hole ends the walk.
#[inline(always)]
pub(super) fn walk(call: &CallRange, event: &mut SnapshotEvent) {
    let off = VMA_CONFIG.load().offsets;
    let mm: u64 = peek(current_task(), off.task_mm);
    let probe = call.start.saturating_sub(1);
    let mut vma = first_ending_above(mm, probe, &rb_offsets(&off));
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

//! Whether the range of an `mlock`, `mlock2` or `munlock` was mapped at entry, VMA by VMA:
//! `apply_vma_lock_flags()` (mm/mlock.c) fails with ENOMEM at the first hole, after the
//! limit check, and both look alike in the return value. The exit program puts the answer
//! in the call's event ([`take`]).
//!
//! Its own handler at the calls' entry, in two kinds (`bpf_find_vma`, or the rbtree walk
//! before 5.17: see [`crate::mapping`]), so the call's entry handler runs on every kernel
//! whatever this one needs.

use aya_ebpf::{macros::map, maps::HashMap};
use memlock_trace_common::{MAX_INFLIGHT, PAGE_MASK, PAGE_SIZE, lock_context};

use crate::{
    mapping::{self, Lookup},
    shared::{current_ids, is_target},
    syscall_hooks::{SyscallContext, syscall_arg},
};

/// What the walk found: [`lock_context`] bits and the first unmapped address.
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub struct RangeCheck {
    pub flags: u32,
    pub _pad: u32,
    pub first_unmapped: u64,
}

#[map]
static RANGE_CHECKS: HashMap<u32, RangeCheck> = HashMap::with_max_entries(MAX_INFLIGHT, 0);

/// VMAs walked at most; a range over more is left unchecked.
const MAX_VMAS: usize = 16;

/// At the entry of `mlock`, `mlock2` and `munlock`, beside the call's entry handler
/// (`hook::RANGE_CHECK`; `HOW` the rbtree walk: `hook::RANGE_CHECK_RB`, on kernels
/// without `bpf_find_vma`, before 5.17).
#[inline(never)]
pub fn on_enter<const HOW: u8>(ctx: &impl SyscallContext) {
    let (tgid, tid) = current_ids();
    if !is_target(tgid) {
        return;
    }
    // mm/mlock.c: len = PAGE_ALIGN(len + offset_in_page(start)), start &= PAGE_MASK; a
    // range that wraps is EINVAL before anything is looked up.
    let start = syscall_arg(ctx, 0);
    let len = syscall_arg(ctx, 1);
    let offset = start & !PAGE_MASK;
    let len = len.wrapping_add(offset).wrapping_add(PAGE_SIZE - 1) & PAGE_MASK;
    let start = start - offset;
    let end = start.wrapping_add(len);
    let mut result = RangeCheck::default();
    if end > start {
        let mut addr = start;
        for _ in 0..MAX_VMAS {
            match mapping::lookup::<HOW>(addr, false) {
                Lookup::Found(found) => {
                    addr = found.end;
                    if addr >= end {
                        result.flags = lock_context::RANGE_CHECKED;
                        break;
                    }
                }
                Lookup::Unmapped => {
                    result.flags = lock_context::RANGE_CHECKED | lock_context::RANGE_UNMAPPED;
                    result.first_unmapped = addr;
                    break;
                }
                Lookup::Unknown => break,
            }
        }
    }
    // A failed insert (table full) leaves the call unchecked, which the event says.
    let _ = RANGE_CHECKS.insert(tid, result, 0);
}

/// The entry check of the calling thread's call, removed; unchecked when there is none.
#[inline(always)]
pub fn take(tid: u32) -> RangeCheck {
    let Some(check) = RANGE_CHECKS.get_ptr(tid) else {
        return RangeCheck::default();
    };
    // SAFETY: a valid pointer to this thread's own entry, copied out before it is removed.
    let check = unsafe { *check };
    let _ = RANGE_CHECKS.remove(tid);
    check
}

//! Kernel structures every family reads the same way, in one copy: [`peek`], the descent of
//! the VMA rbtree of kernels before 6.1, and the maple tree's node layout (6.1+). The
//! mapping lookups (faults, populating calls, an mlock's range) and the VMA snapshots both
//! walk them.

use core::ffi::c_void;

use aya_ebpf::helpers::generated::bpf_probe_read_kernel;

use crate::shared::Plain;

/// Reads a `T` at `base + offset` of kernel memory without a branch: on failure the helper
/// zeroes the destination, so the field reads as 0 (a NULL pointer, no name). Unlike
/// `shared::read_kernel` a failure is not counted: each counted failure is one more path
/// for the verifier to walk, per read, in the walks' loops.
#[inline(always)]
pub fn peek<T: Plain + Default>(base: u64, offset: u32) -> T {
    let mut value = T::default();
    // SAFETY: bpf_probe_read_kernel checks the source address itself, and writes at most
    // `size_of::<T>()` bytes into `value`, any of which make a valid `T` (`Plain`).
    unsafe {
        bpf_probe_read_kernel(
            (&mut value as *mut T).cast(),
            size_of::<T>() as u32,
            base.wrapping_add(u64::from(offset)) as *const c_void,
        )
    };
    value
}

/// Where the rbtree walk reads: `mm_struct.mm_rb`, `vm_area_struct.vm_rb/vm_start/vm_end`,
/// `rb_node.rb_left/rb_right` (each family has them in its own config).
pub struct RbOffsets {
    pub mm_rb: u32,
    pub vma_rb: u32,
    pub vma_start: u32,
    pub vma_end: u32,
    pub rb_left: u32,
    pub rb_right: u32,
}

/// Levels of the rbtree descended at most: a red-black tree of n nodes is at most
/// 2 log2(n + 1) deep, 32 for the 65530 VMAs `vm.max_map_count` allows by default.
const RB_DEPTH: usize = 40;

/// The first VMA whose end is above `addr` (5.10's `find_vma()`), or 0.
#[inline(always)]
pub fn first_ending_above(mm: u64, addr: u64, off: &RbOffsets) -> u64 {
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

/// include/linux/maple_tree.h and lib/maple_tree.c (unchanged from 6.1 to 6.18): a node is
/// 256 bytes, aligned to them; an encoded node pointer keeps the node type in bits 3-6, and
/// the root pointer has bit 1 set when it is a node.
/// <https://git.kernel.org/pub/scm/linux/kernel/git/torvalds/linux.git/tree/lib/maple_tree.c?h=v6.1#n314>
pub const MAPLE_NODE_WORDS: usize = 32;
pub const MAPLE_NODE_MASK: u64 = 255;
pub const MAPLE_ROOT_NODE: u64 = 0x02;
pub const MAPLE_TYPE_SHIFT: u64 = 3;
pub const MAPLE_TYPE_MASK: u64 = 0x0f;
/// `MAPLE_RANGE64_SLOTS` (leaves and range nodes), `MAPLE_ARANGE64_SLOTS`.
pub const MAPLE_RANGE64_SLOTS: u64 = 16;
pub const MAPLE_ARANGE64_SLOTS: u64 = 10;

//! Which mapping an address is in, read in the kernel at the moment it matters (a fault, a
//! populating call, an mlock's range): the VMA's range, flags, offset and the identity of
//! its file, so a region mapped and unmapped between two reads of `/proc/PID/smaps` is
//! still named.
//!
//! Two ways to find the VMA: `bpf_find_vma` (5.17+), or a bounded lockless descent of the
//! VMA tree: the rbtree before 6.1 (`mm->mm_rb`, what 5.10's `find_vma()` does), the maple
//! tree after (`mm->mm_mt`, what `mas_walk()` does). A program calling a helper the
//! kernel lacks does not load, so each program that looks VMAs up comes in both kinds and
//! the loader picks one.

use bytemuck::Zeroable;

/// Name of the [`MappingConfig`] global the loader sets before load.
pub const MAPPING_CONFIG: &str = "MAPPING_CONFIG";

/// Bytes of a file's name kept (`dentry.d_name`, the last path component).
pub const NAME_LEN: usize = 64;

/// Byte offsets of the fields a VMA lookup reads, from the running kernel's BTF. Zero where
/// this kernel lacks the field; `valid` says whether the lookup can run at all.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappingConfig {
    /// 1 when the offsets below were resolved (else every lookup finds nothing).
    pub valid: u32,
    /// 1 when the rbtree fields are valid (kernels before 6.1).
    pub rb_valid: u32,
    /// `task_struct.mm`
    pub task_mm: u32,
    /// `vm_area_struct.vm_start`, `.vm_end`, `.vm_flags`, `.vm_pgoff`, `.vm_file`, `.vm_mm`,
    /// `.vm_ops`, `.vm_private_data`
    pub vma_start: u32,
    pub vma_end: u32,
    pub vma_flags: u32,
    pub vma_pgoff: u32,
    pub vma_file: u32,
    pub vma_mm: u32,
    pub vma_ops: u32,
    pub vma_private_data: u32,
    /// `file.f_path` + `path.dentry`
    pub file_dentry: u32,
    /// `file.f_inode`
    pub file_inode: u32,
    /// `dentry.d_name` + `qstr.name`
    pub dentry_name: u32,
    /// `inode.i_ino`, `inode.i_sb`, `super_block.s_dev`
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    /// `mm_struct.start_brk`, `.brk`, `.start_stack`: what names `[heap]` and `[stack]`.
    pub mm_start_brk: u32,
    pub mm_brk: u32,
    pub mm_start_stack: u32,
    /// `mm_struct.mm_rb`, `vm_area_struct.vm_rb`, `rb_node.rb_left`, `.rb_right`.
    pub mm_rb: u32,
    pub vma_rb: u32,
    pub rb_left: u32,
    pub rb_right: u32,
    /// 1 when the maple tree fields are valid (6.1 and later).
    pub maple_valid: u32,
    /// `mm_struct.mm_mt` + `maple_tree.ma_root`.
    pub mm_mt_root: u32,
    /// `maple_range_64.pivot`, `.slot` and `maple_arange_64.pivot`, `.slot`, in words from
    /// the node's start.
    pub range_pivot: u32,
    pub range_slot: u32,
    pub arange_pivot: u32,
    pub arange_slot: u32,
    /// `enum maple_type` values of `maple_leaf_64`, `maple_range_64`, `maple_arange_64`.
    pub maple_leaf_64: u32,
    pub maple_range_64: u32,
    pub maple_arange_64: u32,
    /// `super_block.s_magic`: whether a file is shmem's (tmpfs, memfd, SysV shm, a shared
    /// anonymous mapping's `/dev/zero`), whose pages swap like anonymous memory.
    pub sb_magic: u32,
}

impl MappingConfig {
    /// All zero: what the programs see if the loader sets nothing.
    // SAFETY: every field is an integer (or a struct of integers), for which all-zero
    // bytes are a value (the crate's tests check it equals the derived `Default`).
    pub const ZERO: Self = unsafe { core::mem::zeroed() };
}

/// `TMPFS_MAGIC`, shmem's `super_block.s_magic` (include/uapi/linux/magic.h).
pub const TMPFS_MAGIC: u64 = 0x0102_1994;

/// [`MappingInfo::kind`]: what the kernel's `/proc/PID/maps` would call the mapping.
pub mod kind {
    /// Anonymous memory (no file, not the heap or the initial stack).
    pub const ANONYMOUS: u32 = 0;
    /// A file: [`super::MappingInfo::name`] is its last path component.
    pub const FILE: u32 = 1;
    /// The initial heap (`brk`).
    pub const HEAP: u32 = 2;
    /// The initial stack.
    pub const STACK: u32 = 3;
    /// A special mapping (`[vdso]`, `[vvar]`, ...): the name is its own.
    pub const SPECIAL: u32 = 4;
}

/// One VMA as a lookup read it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Zeroable, PartialEq, Eq)]
pub struct MappingInfo {
    pub start: u64,
    pub end: u64,
    pub flags: u64,
    /// `vm_pgoff`: the offset in the file, in pages.
    pub pgoff: u64,
    /// The file's inode number and device (`super_block.s_dev`, the kernel's
    /// `major << 20 | minor`); 0 without a file.
    pub ino: u64,
    pub dev: u32,
    /// One of [`kind`].
    pub kind: u32,
    /// NUL-terminated: the file's name, or a special mapping's (`[vdso]`).
    pub name: [u8; NAME_LEN],
}

zeroed_default!(MappingInfo);

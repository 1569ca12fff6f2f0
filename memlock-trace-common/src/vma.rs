//! The VMA part of the kernel/user contract: how mlock splits, merges and re-flags VMAs.
//!
//! Three records, each tagged with its [`EventKind`](crate::EventKind) in its first four bytes:
//! - [`SnapshotEvent`]: the VMAs around an mlock-family call's range, read with
//!   `bpf_find_vma` at `sys_enter` and again at `sys_exit`. Diffing the two gives the
//!   splits, merges and flag changes on every kernel, whatever its internal functions.
//! - [`StoreEvent`]: one `maple_tree:ma_write` store into the task's own VMA tree (the
//!   mechanism; fires on every kernel with BTF, fentry or not).
//! - [`FuncEvent`]: entry or exit of one of the kernel's split/merge/modify functions
//!   (fentry/fexit, where the kernel allows trampolines).

/// Name of the [`VmaConfig`] global the loader sets before load.
pub const VMA_CONFIG: &str = "VMA_CONFIG";
/// Name of the array map of [`HookSpec`]s, filled by the loader before attaching (a map, not
/// a global, so a program reads its own entry instead of copying all of them).
pub const VMA_HOOKS: &str = "VMA_HOOKS";
/// Most VMAs one snapshot carries: the range's VMAs plus one neighbour on each side.
pub const MAX_SNAPSHOT_VMAS: usize = 8;
/// Most kernel functions hooked with fentry/fexit at once (one program pair each).
pub const MAX_FN_HOOKS: usize = 10;
/// Value slots read per function event.
pub const FN_SLOTS: usize = 4;
/// Arguments recorded per function event.
pub const FN_ARGS: usize = 6;
/// Bytes of the `ma_write` caller name kept (`mas_store_prealloc` and the like).
pub const STORE_FN_LEN: usize = 24;
/// `nr` of a VMA event whose system call could not be read.
pub const NR_UNKNOWN: u32 = u32::MAX;

/// `vm_flags` bits, from include/linux/mm.h (unchanged since VM_LOCKONFAULT was added in 4.4):
/// `#define VM_LOCKED 0x00002000`, `#define VM_LOCKONFAULT 0x00080000`,
/// `#define VM_MAYSHARE 0x00000080`.
pub const VM_LOCKED: u64 = 0x0000_2000;
pub const VM_LOCKONFAULT: u64 = 0x0008_0000;
/// `MAP_SHARED` (set even where the mapping cannot be written, unlike `VM_SHARED`).
pub const VM_MAYSHARE: u64 = 0x0000_0080;

/// [`SnapshotEvent::phase`] and [`FuncEvent::phase`].
pub mod phase {
    pub const BEFORE: u32 = 0;
    pub const AFTER: u32 = 1;
}

/// Byte offsets of the fields the VMA programs read, from the running kernel's BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmaOffsets {
    /// `task_struct.mm`
    pub task_mm: u32,
    /// `mm_struct.mm_mt`: the maple tree of the mm's VMAs.
    pub mm_mt: u32,
    /// `vm_area_struct.vm_start`, `.vm_end`, `.vm_flags`
    pub vma_start: u32,
    pub vma_end: u32,
    pub vma_flags: u32,
    /// `ma_state.tree`, `.index`, `.last`
    pub mas_tree: u32,
    pub mas_index: u32,
    pub mas_last: u32,
    /// 1 when snapshots walk the VMA rbtree and list instead of calling `bpf_find_vma`
    /// (kernels before 6.1 keep VMAs in `mm->mm_rb` and the `vm_next` list; 5.10 has no
    /// `bpf_find_vma` either).
    pub rb_walk: u32,
    /// `mm_struct.mm_rb` (a `struct rb_root`: the root node's address is its first field).
    pub mm_rb: u32,
    /// `vm_area_struct.vm_rb`, `.vm_next`.
    pub vma_rb: u32,
    pub vma_next: u32,
    /// `rb_node.rb_left`, `.rb_right`.
    pub rb_left: u32,
    pub rb_right: u32,
    /// `maple_tree.ma_root`; `maple_range_64.pivot`, `.slot` (leaves);
    /// `maple_arange_64.pivot`, `.slot` (the mm tree's inner nodes): for the whole-tree walk
    /// of `mlockall`/`munlockall`. `mt_walk` is 1 when they are valid.
    pub mt_root: u32,
    pub mr64_pivot: u32,
    pub mr64_slot: u32,
    pub ma64_pivot: u32,
    pub ma64_slot: u32,
    pub mt_walk: u32,
    /// `mm_struct.mmap` (the head of the `vm_next` list before 6.1); `list_walk` is 1 when
    /// it is valid (the offset itself is 0 on 5.10).
    pub mm_mmap: u32,
    pub list_walk: u32,
}

/// Where one [`FuncEvent`] slot value comes from.
pub mod slot {
    /// Unused slot.
    pub const NONE: u8 = 0;
    /// Argument number `arg`.
    pub const ARG: u8 = 1;
    /// The return value (fexit only).
    pub const RET: u8 = 2;
    /// A pointer to a `vm_area_struct`: snapshot it.
    pub const AS_VMA: u8 = 1;
    /// A plain value.
    pub const AS_VALUE: u8 = 2;
}

/// One value a function hook reads: `source` ([`slot::ARG`] number `arg`, or [`slot::RET`]),
/// optionally dereferenced (`deref != 0`: read the 8 bytes at `value + offset`), then
/// recorded as-is or snapshotted as a VMA (`read_as`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotSpec {
    pub source: u8,
    pub arg: u8,
    pub deref: u8,
    pub read_as: u8,
    pub offset: u32,
}

/// What the loader found out about one hooked function's parameters from BTF
/// (entry `N` of `VMA_HOOKS` describes the `vma_fn{N}_entry`/`vma_fn{N}_exit` programs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HookSpec {
    pub slots: [SlotSpec; FN_SLOTS],
}

/// Load-time configuration of the VMA programs (the `VMA_CONFIG` global).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmaConfig {
    pub offsets: VmaOffsets,
    /// 1: report every VMA store of traced processes (mmap, mprotect, munmap, brk, ...);
    /// 0: only stores during mlock-family calls or of VMAs with VM_LOCKED/VM_LOCKONFAULT.
    pub all_stores: u32,
    pub _pad: u32,
}

impl VmaConfig {
    /// All zero: what the programs see if the loader sets nothing.
    // SAFETY: every field is an integer (or a struct of integers), for which all-zero
    // bytes are a value (the crate's tests check it equals the derived `Default`).
    pub const ZERO: Self = unsafe { core::mem::zeroed() };
}

/// One VMA as the kernel had it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmaRange {
    pub start: u64,
    pub end: u64,
    pub flags: u64,
}

/// The VMAs covering `[start - 1, end]` of an mlock-family call (so the neighbours a merge
/// may absorb are included), in address order. Empty for `mlockall`/`munlockall`, which
/// have no range: for those the `whole` totals over every VMA of the process instead.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotEvent {
    /// An [`EventKind`](crate::EventKind): always
    /// [`EventKind::Snapshot`](crate::EventKind::Snapshot).
    pub kind: u32,
    /// [`phase::BEFORE`] (at `sys_enter`) or [`phase::AFTER`] (at `sys_exit`).
    pub phase: u32,
    pub tgid: u32,
    pub tid: u32,
    /// The system call number.
    pub nr: u32,
    /// Valid entries of `vmas`.
    pub count: u32,
    /// 1 when the range holds more VMAs than fit, or a hole stopped the walk early.
    pub incomplete: u32,
    pub _pad: u32,
    /// The call's range, page-aligned like the kernel does (`end` exclusive).
    pub start: u64,
    pub end: u64,
    pub vmas: [VmaRange; MAX_SNAPSHOT_VMAS],
    pub whole: WholeTotals,
}

/// Totals over every VMA of the process, taken for `mlockall`/`munlockall`: the difference
/// between the entry and exit totals is what the call set or cleared (each call only sets,
/// or only clears, VM_LOCKED).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WholeTotals {
    /// 1 when the walk read the whole tree; 0 when it could not (no walk on this kernel, a
    /// tree changing under it, more VMAs than the walk's bound).
    pub measured: u32,
    /// VMAs seen, and those with VM_LOCKED.
    pub vmas: u32,
    pub locked_vmas: u32,
    pub _pad: u32,
    /// Bytes of VMAs with VM_LOCKED, and with VM_LOCKONFAULT.
    pub locked_bytes: u64,
    pub onfault_bytes: u64,
}

/// One store into the task's VMA tree (`trace_ma_write(fn, mas, piv, val)`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreEvent {
    /// An [`EventKind`](crate::EventKind): always
    /// [`EventKind::Store`](crate::EventKind::Store).
    pub kind: u32,
    pub tgid: u32,
    pub tid: u32,
    /// The system call the task is in (`pt_regs.orig_ax`), or [`NR_UNKNOWN`].
    pub nr: u32,
    /// Its first three arguments.
    pub args: [u64; 3],
    /// The tree range written, inclusive (`mas->index`, `mas->last`).
    pub index: u64,
    pub last: u64,
    /// The stored entry: a `vm_area_struct *`, or 0 when the range is erased.
    pub vma: u64,
    /// The stored VMA's fields at the time of the store (0 when erased).
    pub range: VmaRange,
    /// The maple tree function that stored it, NUL-terminated.
    pub func: [u8; STORE_FN_LEN],
    /// The storing task's name (`task_struct.comm`), as every other event line shows it.
    pub comm: [u8; crate::TASK_COMM_LEN],
}

/// One entry to or exit from a hooked kernel function.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FuncEvent {
    /// An [`EventKind`](crate::EventKind): always
    /// [`EventKind::Func`](crate::EventKind::Func).
    pub kind: u32,
    /// Index into the [`VMA_HOOKS`] map of [`HookSpec`]s; the loader knows which function it is.
    pub hook: u32,
    /// [`phase::BEFORE`] (fentry) or [`phase::AFTER`] (fexit).
    pub phase: u32,
    pub tgid: u32,
    pub tid: u32,
    /// The system call the task is in, or [`NR_UNKNOWN`].
    pub nr: u32,
    /// Raw arguments (those past the function's arity are 0) and the return value (fexit).
    pub args: [u64; FN_ARGS],
    pub ret: u64,
    /// Per [`HookSpec`] slot: the value read, and the VMA it points to for VMA slots.
    pub values: [u64; FN_SLOTS],
    pub vmas: [VmaRange; FN_SLOTS],
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` integers with explicit padding: every bit pattern is valid.
    unsafe impl aya::Pod for super::VmaConfig {}
    unsafe impl aya::Pod for super::HookSpec {}
    unsafe impl aya::Pod for super::SnapshotEvent {}
    unsafe impl aya::Pod for super::WholeTotals {}
    unsafe impl aya::Pod for super::StoreEvent {}
    unsafe impl aya::Pod for super::FuncEvent {}
}

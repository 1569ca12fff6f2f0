//! The VMA holding an address, found in the kernel where it matters (a fault, a populating
//! call, an mlock's range), and what it maps: a layer below the families (faults and
//! syscalls use it).
//!
//! Three kinds of lookup (see `memlock_trace_common::mapping`), a `const` parameter so that
//! a program holds the code of its kind only: [`FIND_VMA`], [`RB_WALK`], [`TREE_WALK`]. A
//! program holding a call to a helper the kernel lacks does not load, so the loader
//! attaches the right kind.

use core::ffi::c_void;

use aya_ebpf::{
    Global,
    helpers::{
        bpf_get_current_task_btf, bpf_probe_read_kernel_str_bytes,
        generated::{bpf_find_vma, bpf_probe_read_kernel},
    },
    macros::map,
    maps::PerCpuArray,
};
use memlock_trace_common::{
    faults::{VM_BACKING, VM_BACKING_KNOWN, VM_FILE_BACKED, VM_SHMEM_BACKED},
    mapping::{MappingConfig, MappingInfo, TMPFS_MAGIC, kind},
};

use crate::{
    kernel_walk::{
        MAPLE_ARANGE64_SLOTS, MAPLE_NODE_MASK, MAPLE_NODE_WORDS, MAPLE_RANGE64_SLOTS,
        MAPLE_ROOT_NODE, MAPLE_TYPE_MASK, MAPLE_TYPE_SHIFT, RbOffsets, first_ending_above, peek,
    },
    shared::current_task,
};

/// Offsets, set by the loader (`EbpfLoader::override_global`).
#[unsafe(no_mangle)]
static MAPPING_CONFIG: Global<MappingConfig> = Global::new(MappingConfig::ZERO);

/// Where a lookup that identifies the VMA writes what it read (a [`MappingInfo`] does not
/// fit the callback's context, which must be on the stack, next to the caller's).
#[map]
static MAPPING_SCRATCH: PerCpuArray<MappingInfo> = PerCpuArray::with_max_entries(1, 0);

/// A VMA's range and flags.
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub struct Found {
    pub start: u64,
    pub end: u64,
    pub flags: u64,
}

/// What a lookup found.
#[derive(Clone, Copy)]
pub enum Lookup {
    Found(Found),
    /// No VMA holds the address.
    Unmapped,
    /// Not known: the mmap lock was busy, or the offsets or a read failed.
    Unknown,
}

impl Lookup {
    #[inline(always)]
    pub fn found(self) -> Option<Found> {
        match self {
            Self::Found(found) => Some(found),
            _ => None,
        }
    }
}

/// The callback's context: what to read, and what was read.
#[repr(C)]
struct Context {
    identify: u64,
    found: Found,
}

/// `-ENOENT`: `bpf_find_vma` found no VMA holding the address.
const ENOENT: i64 = -2;

/// `bpf_find_vma` (5.17+): it takes the mmap lock with a trylock and answers `-EBUSY` when
/// that fails, which counts as not known.
pub const FIND_VMA: u8 = 0;
/// A bounded descent of `mm->mm_rb`, what 5.10's `find_vma()` does (before 6.1, which has
/// no `bpf_find_vma` before 5.17).
pub const RB_WALK: u8 = 1;
/// A lockless descent of the tree the kernel has: the rbtree before 6.1, the maple tree
/// (what `mas_walk()` does) after. For the programs that run with interrupts off (perf
/// events), where `bpf_find_vma` defers its unlock to an irq_work: a self-IPI per lookup,
/// 5 us in a virtual machine. Only they carry it: the maple descent inlined in the syscall
/// dispatchers' loops took one past 690,000 verified instructions.
pub const TREE_WALK: u8 = 2;

/// The VMA of the current task holding `addr`, found as `HOW` says. `identify`: also read
/// its file's identity and name into this CPU's [`scratch`].
#[inline(always)]
pub fn find<const HOW: u8>(addr: u64, identify: bool) -> Option<Found> {
    lookup::<HOW>(addr, identify).found()
}

/// [`find`], telling an unmapped address from a lookup that could not answer.
#[inline(always)]
pub fn lookup<const HOW: u8>(addr: u64, identify: bool) -> Lookup {
    let config = MAPPING_CONFIG.load();
    if config.valid == 0 {
        return Lookup::Unknown;
    }
    if HOW != FIND_VMA {
        let mm: u64 = peek(current_task(), config.task_mm);
        if mm == 0 {
            return Lookup::Unknown;
        }
        let vma = if config.rb_valid != 0 {
            first_ending_above(
                mm,
                addr,
                &RbOffsets {
                    mm_rb: config.mm_rb,
                    vma_rb: config.vma_rb,
                    vma_start: config.vma_start,
                    vma_end: config.vma_end,
                    rb_left: config.rb_left,
                    rb_right: config.rb_right,
                },
            )
        } else if HOW == TREE_WALK && config.maple_valid != 0 {
            match maple_walk(mm, addr, &config) {
                Some(vma) => vma,
                None => return Lookup::Unknown,
            }
        } else {
            return Lookup::Unknown;
        };
        if vma == 0 {
            return Lookup::Unmapped;
        }
        let found = read_range(vma, &config);
        if found.start > addr || found.end <= addr {
            return Lookup::Unmapped;
        }
        if identify {
            read_identity(vma, &found, &config);
        }
        return Lookup::Found(found);
    }
    let mut context = Context {
        identify: u64::from(identify),
        found: Found::default(),
    };
    // SAFETY: the helper takes the trusted current-task pointer; the callback writes only
    // the `Context` on this stack that we pass it, and this CPU's scratch value.
    let ret = unsafe {
        bpf_find_vma(
            bpf_get_current_task_btf().cast(),
            addr,
            lookup_callback as *mut c_void,
            (&raw mut context).cast(),
            0,
        )
    };
    match ret {
        0 => Lookup::Found(context.found),
        ENOENT => Lookup::Unmapped,
        _ => Lookup::Unknown,
    }
}

/// What the last identifying [`find`] on this CPU read.
#[inline(always)]
pub fn scratch() -> Option<&'static mut MappingInfo> {
    let info = MAPPING_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's value of a per-CPU map, valid while the program runs; a program
    // runs to completion on its CPU, so nothing else uses it meanwhile.
    Some(unsafe { &mut *info })
}

/// Identifies a VMA the hook was handed (fentry/kprobe on `handle_mm_fault`) into this
/// CPU's [`scratch`].
#[inline(always)]
pub fn identify_vma(vma: u64) -> Option<&'static MappingInfo> {
    let config = MAPPING_CONFIG.load();
    if config.valid == 0 || vma == 0 {
        return None;
    }
    let found = read_range(vma, &config);
    read_identity(vma, &found, &config);
    scratch().map(|info| &*info)
}

/// `mm_struct.start_stack` of the current task: an address in its initial stack, where
/// `execve` copies the arguments (0 when unknown).
#[inline(always)]
pub fn current_mm_start_stack() -> u64 {
    let config = MAPPING_CONFIG.load();
    if config.valid == 0 {
        return 0;
    }
    let mm: u64 = peek(current_task(), config.task_mm);
    if mm == 0 {
        return 0;
    }
    peek(mm, config.mm_start_stack)
}

/// What [`identify`] found, the VMA itself being in this CPU's [`scratch`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Identified {
    Found,
    Unmapped,
    Unknown,
}

/// The VMA of the current task holding `addr`, range, flags and identity read into this
/// CPU's [`scratch`] and nothing onto the stack: for callers deep in callbacks (`bpf_loop`),
/// where kernels before 6.12 count every frame's stack against the program's 512 bytes.
#[inline(always)]
pub fn identify(addr: u64) -> Identified {
    if MAPPING_CONFIG.load().valid == 0 {
        return Identified::Unknown;
    }
    // SAFETY: the helper takes the trusted current-task pointer; the callback writes only
    // this CPU's scratch value.
    let ret = unsafe {
        bpf_find_vma(
            bpf_get_current_task_btf().cast(),
            addr,
            identify_callback as *mut c_void,
            core::ptr::null_mut(),
            0,
        )
    };
    match ret {
        0 => Identified::Found,
        ENOENT => Identified::Unmapped,
        _ => Identified::Unknown,
    }
}

/// `bpf_find_vma` callback of [`identify`].
#[inline(never)]
extern "C" fn identify_callback(_task: *mut c_void, vma: *mut c_void, _ctx: *mut c_void) -> i64 {
    let config = MAPPING_CONFIG.load();
    let found = read_range(vma as u64, &config);
    read_identity(vma as u64, &found, &config);
    0
}

/// `bpf_find_vma` callback: copies the VMA's range and flags out, and its identity when
/// asked.
#[inline(never)]
extern "C" fn lookup_callback(_task: *mut c_void, vma: *mut c_void, ctx: *mut c_void) -> i64 {
    let config = MAPPING_CONFIG.load();
    let context = ctx.cast::<Context>();
    let found = read_range(vma as u64, &config);
    // SAFETY: `ctx` is the `Context` on the caller's stack passed to bpf_find_vma.
    unsafe {
        (*context).found = found;
        if (*context).identify != 0 {
            read_identity(vma as u64, &found, &config);
        }
    }
    0
}

#[inline(always)]
fn read_range(vma: u64, c: &MappingConfig) -> Found {
    Found {
        start: peek(vma, c.vma_start),
        end: peek(vma, c.vma_end),
        flags: peek(vma, c.vma_flags),
    }
}

/// The file's device, inode and name; or, without a file, `[heap]`, `[stack]` or a special
/// mapping's own name (`[vdso]`), as `/proc/PID/maps` names them.
#[inline(always)]
fn read_identity(vma: u64, found: &Found, c: &MappingConfig) {
    let Some(info) = MAPPING_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's value of a per-CPU map, valid while the program runs and used by
    // nothing else meanwhile.
    let info = unsafe { &mut *info };
    info.start = found.start;
    info.end = found.end;
    info.flags = found.flags & !VM_BACKING | VM_BACKING_KNOWN;
    info.pgoff = peek(vma, c.vma_pgoff);
    info.ino = 0;
    info.dev = 0;
    info.name[0] = 0;
    let file: u64 = peek(vma, c.vma_file);
    if file != 0 {
        info.kind = kind::FILE;
        let dentry: u64 = peek(file, c.file_dentry);
        let name: u64 = peek(dentry, c.dentry_name);
        read_str(name, &mut info.name);
        let inode: u64 = peek(file, c.file_inode);
        info.ino = peek(inode, c.inode_ino);
        let sb: u64 = peek(inode, c.inode_sb);
        info.dev = peek(sb, c.sb_dev);
        let shmem = peek::<u64>(sb, c.sb_magic) == TMPFS_MAGIC;
        info.flags |= VM_FILE_BACKED | if shmem { VM_SHMEM_BACKED } else { 0 };
        return;
    }
    // include/linux/mm.h `vma_is_initial_heap()` and `vma_is_initial_stack()`.
    let mm: u64 = peek(vma, c.vma_mm);
    let start_brk: u64 = peek(mm, c.mm_start_brk);
    let brk: u64 = peek(mm, c.mm_brk);
    let start_stack: u64 = peek(mm, c.mm_start_stack);
    info.kind = if found.start < brk && found.end > start_brk {
        kind::HEAP
    } else if found.start <= start_stack && found.end >= start_stack {
        kind::STACK
    } else {
        kind::ANONYMOUS
    };
    if info.kind != kind::ANONYMOUS {
        return;
    }
    // A special mapping (`_install_special_mapping`): `vm_private_data` points to its
    // `struct vm_special_mapping`, whose first field is the name (`"[vdso]"`).
    let ops: u64 = peek(vma, c.vma_ops);
    let private: u64 = peek(vma, c.vma_private_data);
    if ops == 0 || private == 0 {
        return;
    }
    let name: u64 = peek(private, 0);
    read_str(name, &mut info.name);
    if info.name[0] == b'[' {
        info.kind = kind::SPECIAL;
    } else {
        info.name[0] = 0;
    }
}

#[inline(always)]
fn read_str(ptr: u64, out: &mut [u8]) {
    if ptr == 0 {
        return;
    }
    // SAFETY: the helper fails rather than faults on a bad address and writes at most
    // `out.len()` bytes.
    if unsafe { bpf_probe_read_kernel_str_bytes(ptr as *const u8, out) }.is_err() {
        out[0] = 0;
    }
}

/// Levels of the maple tree descended at most: a leaf holds up to 16 VMAs and an inner
/// node 10 children, so 6 levels already hold the 65530 VMAs `vm.max_map_count` allows.
const MAPLE_DEPTH: usize = 8;
/// A copy of the maple node being descended (one read per level; too big for the stack).
#[map]
static MAPLE_NODE: PerCpuArray<[u64; MAPLE_NODE_WORDS]> = PerCpuArray::with_max_entries(1, 0);

/// The VMA `mas_walk()` would find for `addr` (0: a gap), by a descent of `mm->mm_mt`
/// without its lock: nodes are freed by RCU, under which programs run, and every read is
/// a probe read; a node changed meanwhile can only lead to a VMA that does not hold
/// `addr`, which the caller checks. `None`: not known (a read failed, an unknown node).
#[inline(always)]
fn maple_walk(mm: u64, addr: u64, c: &MappingConfig) -> Option<u64> {
    let mut entry: u64 = peek(mm, c.mm_mt_root);
    if entry & 3 != MAPLE_ROOT_NODE || entry < 4096 {
        return None;
    }
    let node = MAPLE_NODE.get_ptr_mut(0)?;
    for _ in 0..MAPLE_DEPTH {
        let kind = ((entry >> MAPLE_TYPE_SHIFT) & MAPLE_TYPE_MASK) as u32;
        let (pivots, slots, count) = if kind == c.maple_arange_64 {
            (c.arange_pivot, c.arange_slot, MAPLE_ARANGE64_SLOTS as usize)
        } else if kind == c.maple_range_64 || kind == c.maple_leaf_64 {
            (c.range_pivot, c.range_slot, MAPLE_RANGE64_SLOTS as usize)
        } else {
            return None;
        };
        // SAFETY: the helper checks the source itself and writes at most the node's 256
        // bytes into this CPU's value of MAPLE_NODE, which nothing else uses meanwhile.
        let copied = unsafe {
            bpf_probe_read_kernel(
                node.cast(),
                (MAPLE_NODE_WORDS * 8) as u32,
                (entry & !MAPLE_NODE_MASK) as *const c_void,
            )
        };
        if copied != 0 {
            return None;
        }
        // SAFETY: as above: this CPU's copy, just written.
        let words = unsafe { &*node };
        // mtree_range_walk(): the first slot whose pivot reaches `addr`; past the data the
        // pivots are 0 and the last slot's upper bound is the node's own (no pivot).
        let mut offset = count - 1;
        for i in 0..MAPLE_RANGE64_SLOTS as usize - 1 {
            if i + 1 >= count {
                break;
            }
            let pivot = words[(pivots as usize + i) & (MAPLE_NODE_WORDS - 1)];
            if pivot >= addr || (i > 0 && pivot == 0) {
                offset = i;
                break;
            }
        }
        let next = words[(slots as usize + offset) & (MAPLE_NODE_WORDS - 1)];
        if kind == c.maple_leaf_64 {
            return Some(next);
        }
        entry = next;
    }
    None
}

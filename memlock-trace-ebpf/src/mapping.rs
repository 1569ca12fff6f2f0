//! The VMA holding an address, found in the kernel where it matters (a fault, a populating
//! call, an mlock's range), and what it maps: a layer below the families (faults and
//! syscalls use it).
//!
//! Two lookups, one per kernel generation (see `memlock_trace_common::mapping`):
//! `bpf_find_vma` (5.17+; it takes the mmap lock with a trylock and answers `-EBUSY` when
//! that fails, which counts as not found), or a bounded descent of `mm->mm_rb`, what 5.10's
//! `find_vma()` does (before 6.1). `RB` picks the second; a program holding a call to a
//! helper the kernel lacks does not load, so the loader attaches the right kind.

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
use memlock_trace_common::mapping::{MappingConfig, MappingInfo, kind};

use crate::shared::{Plain, current_task};

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

/// Levels of the rbtree descended at most: a red-black tree of n nodes is at most
/// 2 log2(n + 1) deep, 32 for the 65530 VMAs `vm.max_map_count` allows by default.
const RB_DEPTH: usize = 40;

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

/// The VMA of the current task holding `addr`. `identify`: also read its file's identity
/// and name into this CPU's [`scratch`].
#[inline(always)]
pub fn find<const RB: bool>(addr: u64, identify: bool) -> Option<Found> {
    lookup::<RB>(addr, identify).found()
}

/// [`find`], telling an unmapped address from a lookup that could not answer.
#[inline(always)]
pub fn lookup<const RB: bool>(addr: u64, identify: bool) -> Lookup {
    let config = MAPPING_CONFIG.load();
    if config.valid == 0 {
        return Lookup::Unknown;
    }
    if RB {
        if config.rb_valid == 0 {
            return Lookup::Unknown;
        }
        let mm: u64 = peek(current_task(), config.task_mm);
        if mm == 0 {
            return Lookup::Unknown;
        }
        let vma = first_ending_above(mm, addr, &config);
        if vma == 0 {
            return Lookup::Unmapped;
        }
        let found = read_range(vma, &config);
        if found.start > addr {
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
    info.flags = found.flags;
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

/// The first VMA whose end is above `addr` (5.10's `find_vma()`), or 0.
#[inline(always)]
fn first_ending_above(mm: u64, addr: u64, c: &MappingConfig) -> u64 {
    if mm == 0 {
        return 0;
    }
    let mut node: u64 = peek(mm, c.mm_rb);
    let mut best = 0u64;
    for _ in 0..RB_DEPTH {
        if node == 0 {
            break;
        }
        let vma = node.wrapping_sub(u64::from(c.vma_rb));
        let end: u64 = peek(vma, c.vma_end);
        if end > addr {
            best = vma;
            let start: u64 = peek(vma, c.vma_start);
            if start <= addr {
                break;
            }
            node = peek(node, c.rb_left);
        } else {
            node = peek(node, c.rb_right);
        }
    }
    best
}

/// Reads a `T` at `base + offset` of kernel memory; on failure the helper zeroes the
/// destination, so the field reads as 0 (a NULL pointer, no name).
#[inline(always)]
fn peek<T: Plain + Default>(base: u64, offset: u32) -> T {
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

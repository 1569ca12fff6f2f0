//! `--stacks`: the kept stacks (every mlock-family call at its `sys_exit`, one fault in N)
//! as the kernel copies them (see `memlock-trace-ebpf/src/stacks.rs`), and the call sites
//! user space sums them into. Faults per stack are keyed by [`crate::faults::StackKey`].

use crate::faults::{RegionKey, STACK_DEPTH};
use bytemuck::Zeroable;

/// Bytes of the user stack copied per kept stack, from the stack pointer up (perf's
/// `--call-graph dwarf` default is 8 KiB too). Copied in [`STACK_CHUNK`]-byte pieces aligned
/// to the chunk size, so that the copy stops exactly at the top of the stack mapping (page
/// aligned) instead of failing whole when the stack holds less than 8 KiB above the
/// pointer.
pub const STACK_COPY_BYTES: usize = 8192;
pub const STACK_CHUNK: usize = 512;

/// Size of the `STACK_SAMPLES` ring buffer with `--stacks` (about 480 samples); the loader
/// shrinks it to one page without.
pub const STACK_SAMPLES_BYTE_SIZE: u32 = 4 << 20;
/// Fault samples wake the reader once this much waits (mlock-family calls always wake it,
/// so that the process's modules are read while it lives).
pub const STACK_SAMPLES_WAKEUP_BYTES: u64 = (STACK_SAMPLES_BYTE_SIZE / 8) as u64;

/// Names of the maps and globals the loader looks up by name.
pub mod names {
    pub const STACK_SAMPLES: &str = "STACK_SAMPLES";
    pub const SYSCALL_STACK_COUNTERS: &str = "SYSCALL_STACK_COUNTERS";
    pub const STACK_COUNTERS: &str = "STACK_COUNTERS";
    /// `u32` global: non-zero with `--stacks`. Read-only once loaded, so without it the
    /// verifier removes the stack code from the exit program altogether.
    pub const SYSCALL_STACKS: &str = "SYSCALL_STACKS";
    /// [`super::StackConfig`] global.
    pub const STACK_CONFIG: &str = "STACK_CONFIG";
}

/// How the kernel finds the user registers and how often a fault's stack is kept; set by
/// the loader from the running kernel's BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackConfig {
    /// `task_struct.stack`: the base of the task's kernel stack; the user registers
    /// (`struct pt_regs`) sit at its top (`task_pt_regs()`, arch/x86/include/asm/
    /// processor.h), which is how 5.10 reads them without `bpf_task_pt_regs` (5.15).
    pub task_stack: u32,
    /// `THREAD_SIZE`: 16 KiB on x86_64, 32 KiB with KASAN.
    pub thread_size: u32,
    /// Keep the stack of one fault in this many (1: every fault).
    pub fault_every: u32,
    /// `sizeof(struct pt_regs)`: arm64's sit exactly that far below the top of the kernel
    /// stack (x86's are found by their segment registers).
    pub pt_regs_bytes: u32,
    /// The file an `mmap` maps, from its descriptor: `task_struct.files`,
    /// `files_struct.fdt`, `fdtable.fd`, `fdtable.max_fds`, `file.f_inode`, `inode.i_ino`,
    /// `inode.i_sb`, `super_block.s_dev`. 0 for `files`: not read (the notice then has no
    /// identity, and user space reads the maps only).
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdt_fd: u32,
    pub fdt_max_fds: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
}

/// What a [`StackSample`] is the stack of.
pub mod sample_kind {
    /// An mlock-family call at its exit: `nr` and `call` are set.
    pub const SYSCALL: u32 = 1;
    /// Faults (`faults` of them) of a traced task.
    pub const FAULT: u32 = 2;
    /// A [`super::ModulesChanged`] notice, not a stack.
    pub const MODULES: u32 = 3;
}

/// A traced process has just mapped a file executable (`mmap` with `PROT_EXEC` returned):
/// user space reads its modules now, while the process lives, so that its stacks unwind
/// and symbolize even if it exits before they are read.
///
/// With the mapping itself, as perf's `PERF_RECORD_MMAP2`: where, and which file (device
/// and inode), so that a process that exits before user space reads its maps is still known
/// from files user space has seen elsewhere.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ModulesChanged {
    /// [`sample_kind::MODULES`].
    pub kind: u32,
    pub tgid: u32,
    pub start: u64,
    pub len: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// The file's `super_block.s_dev` (kernel encoding: major << 20 | minor) and inode; 0
    /// when not read.
    pub dev: u64,
    pub inode: u64,
}

/// An `mmap` with `PROT_EXEC` in progress: its arguments, from entry to exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecMmap {
    pub len: u64,
    pub offset: u64,
    pub fd: i64,
}

/// Registers of a [`StackSample`] were not found (the stack walk is the kernel's
/// frame-pointer walk, in `stack` as `u64` addresses).
pub const SAMPLE_FRAME_POINTERS: u32 = 1;

/// One kept stack, written to the `STACK_SAMPLES` ring buffer: the user registers and the
/// top of the user stack, unwound in user space with each module's unwind tables.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StackSample {
    /// [`sample_kind`].
    pub kind: u32,
    pub tgid: u32,
    /// 0 unless statistics are per thread (faults); the thread for calls.
    pub tid: u32,
    /// The system call's number (calls only).
    pub nr: u32,
    /// User `ip`, `sp`, `bp` (from the `pt_regs` saved at entry to the kernel; `bp` is the
    /// frame pointer: x86 `rbp`, arm64 `x29`).
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// The link register (arm64 `x30`: a leaf function's return address); 0 on x86.
    pub lr: u64,
    /// The user address `stack[0]` was copied from: `sp` rounded down to [`STACK_CHUNK`].
    pub stack_base: u64,
    /// Bytes of `stack` copied (or, with [`SAMPLE_FRAME_POINTERS`], bytes of addresses).
    pub stack_len: u32,
    /// 0 or [`SAMPLE_FRAME_POINTERS`].
    pub flags: u32,
    /// Faults this sample stands for (faults only).
    pub faults: u64,
    /// Where those faults were counted, as `FAULT_REGIONS` keys them (faults only): user
    /// space attributes the stack to the same mapping row as the faults themselves.
    pub region: RegionKey,
    /// The call's figures (calls only).
    pub call: SyscallStackValue,
    pub stack: [u8; STACK_COPY_BYTES],
}

/// One call site of one process (calls unwound in user space are summed per key).
#[repr(C)]
#[derive(Clone, Copy, Debug, Zeroable, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SyscallStackKey {
    pub tgid: u32,
    /// The system call's number (`__syscall_nr`).
    pub nr: u32,
    /// Instruction pointers, innermost first (the instruction after the `syscall`), zero
    /// after the last frame.
    pub ips: [u64; STACK_DEPTH],
}

zeroed_default!(SyscallStackKey);

/// The figures of a call, or of the calls of one call site.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallStackValue {
    pub calls: u64,
    /// Calls that returned an error.
    pub errors: u64,
    /// Growth of the thread's `min_flt + maj_flt` across the calls.
    pub populated: u64,
    /// Growth / shrinkage of `mm->locked_vm` across the calls, in pages.
    pub locked: u64,
    pub unlocked: u64,
    /// Time inside the calls.
    pub duration_ns: u64,
}

impl SyscallStackValue {
    /// Adds the figures of `other` (more calls of the same call site).
    pub fn add(&mut self, other: &Self) {
        self.calls += other.calls;
        self.errors += other.errors;
        self.populated += other.populated;
        self.locked += other.locked;
        self.unlocked += other.unlocked;
        self.duration_ns += other.duration_ns;
    }
}

indices! {
    /// Indices of the per-CPU `SYSCALL_STACK_COUNTERS` (calls) and `STACK_COUNTERS` (faults).
    pub mod counter: u32, COUNT: u32 {
        /// Calls (faults) whose stack could not be recorded: the ring buffer was full.
        DROPPED,
        /// Kept stacks whose user registers were not found: frame-pointer walk instead.
        FRAME_POINTERS,
        /// Faults seen, for the 1-in-N sampling (faults only).
        SEEN,
        /// Samples written (faults: one per `fault_every` faults).
        SAMPLES,
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: `#[repr(C)]` plain integers, no padding, every bit pattern valid.
    unsafe impl aya::Pod for super::SyscallStackKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SyscallStackValue {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::StackConfig {}
}

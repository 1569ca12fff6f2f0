//! `--stacks`: the user stacks of mlock-family calls (every call) and of page faults (one
//! fault in `StackConfig::fault_every`). The one place that captures stacks; the fault
//! hooks call [`record`] for a traced task's counted faults only when the loader set
//! `FaultConfig::stacks`, so without `--stacks` a fault pays one predictable branch; the
//! syscall exit calls [`record_call`] only when the loader set [`SYSCALL_STACKS`], a
//! read-only global the verifier folds, so without `--stacks` the code is not even in the
//! loaded program.
//!
//! What is kept is what perf's `--call-graph dwarf` keeps: the user registers saved at
//! entry to the kernel (`ip`, `sp`, `bp`) and the top [`STACK_COPY_BYTES`] of the user
//! stack; user space unwinds them with each module's `.eh_frame`/`.debug_frame`. The
//! kernel's own frame-pointer walk (`bpf_get_stack`) reads data as return addresses in code
//! built without frame pointers (every distribution's), so it is only the fallback when the
//! registers cannot be found. For a user fault the registers are the faulting
//! instruction's; for pages populated inside a system call (mlock, `MAP_POPULATE`) and at a
//! call's exit they are the `syscall`'s, i.e. the call site.

use aya_ebpf::{
    EbpfContext, Global,
    bindings::{BPF_F_USER_STACK, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_task, bpf_get_stack, bpf_probe_read_kernel,
        generated::{bpf_probe_read_kernel as bpf_probe_read_kernel_raw, bpf_probe_read_user},
    },
    macros::map,
    maps::{HashMap, PerCpuArray, RingBuf},
};
use memlock_trace_common::{
    faults::RegionKey,
    stacks::{
        ExecMmap, ModulesChanged, SAMPLE_FRAME_POINTERS, STACK_CHUNK, STACK_COPY_BYTES,
        STACK_SAMPLES_BYTE_SIZE, STACK_SAMPLES_WAKEUP_BYTES, StackConfig, StackSample,
        SyscallStackValue, counter, sample_kind,
    },
};

use crate::arch::{self, USER_REGS_READ_WORDS, UserRegs};
use crate::shared::{add, current_ids, is_target};
use crate::syscall_hooks::{SyscallContext, syscall_arg, syscall_ret};

/// Set by the loader (see `StackConfig`).
#[unsafe(no_mangle)]
static STACK_CONFIG: Global<StackConfig> = Global::new(StackConfig {
    task_stack: 0,
    thread_size: 0,
    fault_every: 1,
    pt_regs_bytes: 0,
    task_files: 0,
    files_fdt: 0,
    fdt_fd: 0,
    fdt_max_fds: 0,
    file_inode: 0,
    inode_ino: 0,
    inode_sb: 0,
    sb_dev: 0,
});

/// Non-zero with `--stacks` (set by the loader, see `stacks::names::SYSCALL_STACKS`).
#[unsafe(no_mangle)]
static SYSCALL_STACKS: Global<u32> = Global::new(0);

/// The [`Head`] of the sample being written, this CPU's. Not on the BPF stack: the syscall
/// exit programs' combined stack (frames rounded to 32 bytes) was within 32 bytes of the
/// verifier's 512 on 5.10 and 6.1, and 16 more bytes of head took it to 544.
#[map]
static SAMPLE_HEAD: PerCpuArray<Head> = PerCpuArray::with_max_entries(1, 0);

/// Every kept stack, for user space to unwind.
#[map]
static STACK_SAMPLES: RingBuf = RingBuf::with_byte_size(STACK_SAMPLES_BYTE_SIZE, 0);

/// Fault stacks: see [`counter`].
#[map]
static STACK_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Call stacks: see [`counter`].
#[map]
static SYSCALL_STACK_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Threads inside an `mmap` with `PROT_EXEC`, from its entry to its exit.
#[map]
static EXEC_MMAPS: HashMap<u32, ExecMmap> = HashMap::with_max_entries(1024, 0);

/// At the entry of `mmap` (`hook::STACKS_MMAP_ENTER`, `--stacks` only): a traced thread
/// mapping code.
#[inline(never)]
pub fn on_mmap_enter(ctx: &impl SyscallContext) {
    const PROT_EXEC: u64 = 4;
    let (tgid, tid) = current_ids();
    // mmap(addr, len, prot, flags, fd, off)
    if syscall_arg(ctx, 2) & PROT_EXEC != 0 && is_target(tgid) {
        let call = ExecMmap {
            len: syscall_arg(ctx, 1),
            fd: syscall_arg(ctx, 4) as i64,
            offset: syscall_arg(ctx, 5),
        };
        let _ = EXEC_MMAPS.insert(tid, call, 0);
    }
}

/// At the exit of `mmap` (`hook::STACKS_MMAP_EXIT`, `--stacks` only): tells user space
/// where the code was mapped and from which file, and to read the process's modules now
/// (see `ModulesChanged`).
#[inline(never)]
pub fn on_mmap_exit(ctx: &impl SyscallContext) {
    let (tgid, tid) = current_ids();
    let Some(call) = EXEC_MMAPS.get_ptr(tid) else {
        return;
    };
    // SAFETY: this thread's own entry, copied before it is removed.
    let call = unsafe { *call };
    let _ = EXEC_MMAPS.remove(tid);
    let start = syscall_ret(ctx);
    if start < 0 {
        return;
    }
    let (dev, inode) = file_identity(call.fd);
    if let Some(mut entry) = STACK_SAMPLES.reserve::<ModulesChanged>(0) {
        entry.write(ModulesChanged {
            kind: sample_kind::MODULES,
            tgid,
            start: start as u64,
            len: call.len,
            offset: call.offset,
            dev,
            inode,
        });
        entry.submit(u64::from(BPF_RB_FORCE_WAKEUP));
    }
}

/// The device and inode of the current task's descriptor `fd` (0, 0 if unknown):
/// `current->files->fdt->fd[fd]->f_inode`.
#[inline(always)]
fn file_identity(fd: i64) -> (u64, u64) {
    let c = STACK_CONFIG.load();
    if fd < 0 || c.task_files == 0 {
        return (0, 0);
    }
    let read = |base: u64, offset: u32| -> u64 {
        // SAFETY: a read of kernel memory through the helper, which fails rather than faults.
        unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const u64) }.unwrap_or(0)
    };
    // SAFETY: the current task's address.
    let task = unsafe { bpf_get_current_task() };
    let fdt = read(read(task, c.task_files), c.files_fdt);
    if fdt == 0 || fd as u64 >= read(fdt, c.fdt_max_fds) & 0xffff_ffff {
        return (0, 0);
    }
    let file = read(read(fdt, c.fdt_fd) + fd as u64 * 8, 0);
    let inode = read(file, c.file_inode);
    if file == 0 || inode == 0 {
        return (0, 0);
    }
    let dev = read(read(inode, c.inode_sb), c.sb_dev) & 0xffff_ffff;
    (dev, read(inode, c.inode_ino))
}

/// Whether mlock-family calls are counted per call site (`--stacks`).
#[inline(always)]
pub fn syscalls_enabled() -> bool {
    SYSCALL_STACKS.load() != 0
}

/// Keeps the current user stack for `count` faults of `tgid` (thread `tid`, 0 unless per
/// thread) if they hold the next sampled fault: one in `fault_every`, counted in faults so
/// that the pages one call populated (hundreds at once) are sampled as often as hundreds
/// of separate faults. A sample lost to a full ring buffer is counted in
/// [`counter::DROPPED`], in faults. `region`: where they were counted (a
/// [`RegionKey::exact`] kind and start, as the fault hooks key `FAULT_REGIONS`).
#[inline(always)]
pub fn record<C: EbpfContext>(ctx: &C, tgid: u32, tid: u32, count: u64, region: (u32, u64)) {
    let every = u64::from(STACK_CONFIG.load().fault_every.max(1));
    let before = add(&STACK_COUNTERS, counter::SEEN, count);
    if before / every == (before + count) / every {
        return;
    }
    let wake = STACK_SAMPLES.query(u64::from(BPF_RB_AVAIL_DATA)) >= STACK_SAMPLES_WAKEUP_BYTES;
    let Some(head) = SAMPLE_HEAD.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's value of a per-CPU map; the program runs to completion on its CPU.
    unsafe {
        *head = Head {
            kind: sample_kind::FAULT,
            tgid,
            tid,
            nr: 0,
            faults: count,
            region_kind: region.0,
            region: region.1,
        };
    }
    match write_sample(ctx, None, wake) {
        Some(fp) => {
            add(&STACK_COUNTERS, counter::SAMPLES, 1);
            if fp {
                add(&STACK_COUNTERS, counter::FRAME_POINTERS, 1);
            }
        }
        None => stack_dropped(&STACK_COUNTERS, count, "fault"),
    }
}

/// Keeps the call site of one mlock-family call (`nr`) of `tgid` with its figures: at
/// `sys_exit` the user registers are still those saved at the `syscall`. Always wakes the
/// reader, so that it reads the process's modules while the process lives.
#[inline(always)]
pub fn record_call<C: EbpfContext>(ctx: &C, tgid: u32, nr: u32, call: &SyscallStackValue) {
    let Some(head) = SAMPLE_HEAD.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: as in `record`.
    unsafe {
        *head = Head {
            kind: sample_kind::SYSCALL,
            tgid,
            tid: current_ids().1,
            nr,
            faults: 0,
            region_kind: 0,
            region: 0,
        };
    }
    match write_sample(ctx, Some(call), true) {
        Some(fp) => {
            add(&SYSCALL_STACK_COUNTERS, counter::SAMPLES, 1);
            if fp {
                add(&SYSCALL_STACK_COUNTERS, counter::FRAME_POINTERS, 1);
            }
        }
        None => stack_dropped(&SYSCALL_STACK_COUNTERS, 1, "call"),
    }
}

/// What [`write_sample`] writes besides the registers and the stack: filled by the caller in
/// [`SAMPLE_HEAD`].
#[derive(Clone, Copy)]
struct Head {
    kind: u32,
    tgid: u32,
    tid: u32,
    nr: u32,
    faults: u64,
    region_kind: u32,
    region: u64,
}

/// Writes one sample: registers and stack, or the frame-pointer walk when the registers
/// cannot be found. `Some(true)` when it fell back to frame pointers; `None` when the ring
/// buffer was full. Not inlined: a BPF function of its own, so that the fault programs'
/// stack frames do not grow with it. `call`: the call's figures (calls), None for faults.
#[inline(never)]
fn write_sample<C: EbpfContext>(
    ctx: &C,
    call: Option<&SyscallStackValue>,
    wake: bool,
) -> Option<bool> {
    let head = SAMPLE_HEAD.get(0)?;
    let mut entry = STACK_SAMPLES.reserve::<StackSample>(0)?;
    let s = entry.as_mut_ptr();
    let fell_back;
    // SAFETY: `s` is the reserved record, exclusively ours until submitted; every field is
    // written before submission (the stack bytes past `stack_len` are not read).
    unsafe {
        (*s).kind = head.kind;
        (*s).tgid = head.tgid;
        (*s).tid = head.tid;
        (*s).nr = head.nr;
        (*s).faults = head.faults;
        (*s).region = RegionKey {
            tgid: head.tgid,
            exact: head.region_kind,
            start: head.region,
        };
        // A fault's zeroes are written here, not built on its program's stack.
        (*s).call = match call {
            Some(call) => *call,
            None => SyscallStackValue::default(),
        };
        if let Some(UserRegs { ip, sp, fp, lr }) = user_regs(&mut (*s).stack) {
            (*s).ip = ip;
            (*s).sp = sp;
            (*s).bp = fp;
            (*s).lr = lr;
            let base = sp & !(STACK_CHUNK as u64 - 1);
            (*s).stack_base = base;
            (*s).flags = 0;
            // Chunks aligned to their size end exactly at the top of the stack mapping (page
            // aligned): the copy stops there, where one 8 KiB read would fail whole.
            let mut len = 0u32;
            for i in 0..STACK_COPY_BYTES / STACK_CHUNK {
                let off = i * STACK_CHUNK;
                let dst = (*s).stack.as_mut_ptr().add(off);
                let src = (base + off as u64) as *const core::ffi::c_void;
                if bpf_probe_read_user(dst.cast(), STACK_CHUNK as u32, src) != 0 {
                    break;
                }
                len += STACK_CHUNK as u32;
            }
            (*s).stack_len = len;
            fell_back = false;
        } else {
            let copied = bpf_get_stack(
                ctx.as_ptr(),
                (*s).stack.as_mut_ptr().cast(),
                (STACK_COPY_BYTES / 8 * 8) as u32,
                u64::from(BPF_F_USER_STACK),
            );
            (*s).ip = 0;
            (*s).sp = 0;
            (*s).bp = 0;
            (*s).lr = 0;
            (*s).stack_base = 0;
            (*s).stack_len = if copied > 0 { copied as u32 } else { 0 };
            (*s).flags = SAMPLE_FRAME_POINTERS;
            fell_back = true;
        }
    }
    entry.submit(u64::from(if wake {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }));
    Some(fell_back)
}

/// The user registers of the current task, from the `pt_regs` at the top of its kernel
/// stack (`task_pt_regs()`); the helper for it, `bpf_task_pt_regs`, is 5.15+. Where exactly
/// they are and whether they are a 64-bit task's user registers is the architecture's
/// ([`arch::user_regs_at_stack_top`]); otherwise None. `scratch` holds the words read (the
/// BPF stack has no room for them).
#[inline(always)]
fn user_regs(scratch: &mut [u8; STACK_COPY_BYTES]) -> Option<UserRegs> {
    let config = STACK_CONFIG.load();
    if config.task_stack == 0 {
        return None;
    }
    // SAFETY: the current task's address, and reads of kernel memory through the helper,
    // which fails rather than faults.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        let stack: u64 =
            bpf_probe_read_kernel(task.add(config.task_stack as usize).cast::<u64>()).ok()?;
        let top = stack + u64::from(config.thread_size);
        let words = scratch.as_mut_ptr().cast::<u64>();
        let src = (top - (USER_REGS_READ_WORDS * 8) as u64) as *const core::ffi::c_void;
        if bpf_probe_read_kernel_raw(words.cast(), (USER_REGS_READ_WORDS * 8) as u32, src) != 0 {
            return None;
        }
        let word = |at: usize| words.add(at).read_unaligned();
        arch::user_regs_at_stack_top(word, config.pt_regs_bytes)
    }
}

/// A stack that could not be kept (`n` calls or faults); with `-v`, why. Not inlined: a
/// call on the failure path only, so its log code cannot change the per-fault path's code.
#[inline(never)]
fn stack_dropped(counters: &PerCpuArray<u64>, n: u64, what: &'static str) {
    let before = add(counters, counter::DROPPED, n);
    if crate::diag::wanted(before) {
        aya_log_ebpf::warn!(
            &(),
            target: "stacks",
            "ring buffer STACK_SAMPLES full: a {}'s stack lost ({} on this CPU)",
            what,
            before + n
        );
    }
}

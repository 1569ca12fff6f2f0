//! Populating system calls: the pages the kernel faulted in without an exception, counted
//! from the task's `min_flt`/`maj_flt` growth across the call (tracepoint hook set) or
//! named by the call in flight (fentry/kprobe sets); and failed faults, seen as the signal
//! they end in (every hook set).

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_ANY,
    macros::{btf_tracepoint, map},
    maps::LruHashMap,
    programs::BtfTracePointContext,
};
use memlock_trace_common::{
    PAGE_MASK,
    causes::cause,
    faults::{
        MAX_POPULATE_CALLS, PopulateCall, SLOTS, VM_HELD_SP, fault_flags, populate, region_kind,
        stat,
    },
    vma::VM_LOCKED,
};

use super::{
    FAULT_CONFIG, NO_SYSCALL,
    events::{NO_LATENCY, emit},
    record_stack,
    regions::flush_region,
    stats_for,
};
use crate::shared::{
    current_ids, current_task, is_target, now_ns, offsets, read_kernel, task_faults,
};
use crate::syscall_hooks::{SyscallContext, syscall_arg, syscall_ret};
use crate::{arch, mapping};

#[map]
pub(super) static POPULATE_INFLIGHT: LruHashMap<u32, PopulateCall> =
    LruHashMap::with_max_entries(MAX_POPULATE_CALLS, 0);

/// `signal:signal_generate(int sig, struct kernel_siginfo *info, struct task_struct *task,
/// int group, int result)` (include/trace/events/signal.h), tp_btf.
///
/// A page fault the kernel cannot resolve for user mode ends in `force_sig_fault()` on the
/// faulting task: SIGSEGV with `SEGV_MAPERR`/`SEGV_ACCERR`/`SEGV_PKUERR`, or SIGBUS with
/// `BUS_ADRERR`/`BUS_MCEERR_AR`. That is the one place every hook set sees a failed fault,
/// including those refused before `handle_mm_fault` (no VMA, access error). Signals are rare,
/// so this costs nothing per fault.
#[btf_tracepoint(function = "signal_generate")]
pub fn fault_signal(ctx: BtfTracePointContext) -> i32 {
    const SIGBUS: i32 = 7;
    const SIGSEGV: i32 = 11;
    /// `kernel_siginfo.si_code`, after `si_signo` and `si_errno`.
    const SI_CODE_OFFSET: u32 = 8;
    let sig: i32 = ctx.arg(0);
    let info: u64 = ctx.arg(1);
    let task: u64 = ctx.arg(2);
    // `SEND_SIG_NOINFO` (0) and `SEND_SIG_PRIV` (1) are no siginfo: a signal sent by a
    // process, not a fault. A probe read (signals are rare): some kernels' BTF leaves the
    // verifier no type to check a direct load against.
    let code = if info < 4096 {
        0
    } else {
        read_kernel::<i32>(info, SI_CODE_OFFSET)
    };
    let from_fault = match sig {
        // SEGV_MAPERR 1, SEGV_ACCERR 2, SEGV_PKUERR 4
        SIGSEGV => matches!(code, 1 | 2 | 4),
        // BUS_ADRERR 2, BUS_MCEERR_AR 4
        SIGBUS => matches!(code, 2 | 4),
        _ => false,
    };
    // Self-inflicted: the faulting task signals itself.
    if !from_fault || task != crate::shared::current_task() {
        return 0;
    }
    let (tgid, tid) = current_ids();
    if let Some((stats, _)) = stats_for(tgid, tid, false) {
        // SAFETY: `stats_for` returns a valid pointer to the task's stats (see `account`),
        // whose counters are only added to atomically.
        super::add_shared(unsafe { &raw mut (*stats).counts[stat::FAILED] }, 1);
    }
    if config!(events) != 0 && is_target(tgid) {
        emit(
            ctx.as_ptr(),
            tgid,
            tid,
            fault_flags::FAILED,
            0,
            NO_LATENCY,
            0,
            1,
            NO_SYSCALL,
            [0; cause::COUNT],
        );
    }
    0
}

/// At the entry of every [`populate`] call `nr` (`hook::POPULATE_ENTER`). `RETRY`
/// (`hook::POPULATE_ENTER_RETRY`, the tracepoint set on kernels with `bpf_find_vma`): also
/// looks up again the process's pages whose lookup met a busy mmap lock, as the thread is
/// about to take it (a good moment: no other mapping call of this thread holds it). Here
/// rather than at the exit, which has no stack to spare for the lookups' frames.
#[inline(never)]
pub fn on_enter<const RETRY: bool>(ctx: &impl SyscallContext, nr: u32) {
    if let Some(tgid) = enter(ctx, nr)
        && RETRY
    {
        super::mappings::retry_pending(tgid);
    }
}

/// The traced process's tgid, when it is one.
#[inline(always)]
fn enter(ctx: &impl SyscallContext, nr: u32) -> Option<u32> {
    let (tgid, tid) = current_ids();
    if !is_target(tgid) {
        return None;
    }
    let mut index = populate::OTHER as u32;
    for i in 0..populate::COUNT {
        // Volatile, element by element: a plain read of the static would be folded to its
        // compile-time value, not the one the loader wrote.
        // SAFETY: an in-bounds read of a static, which outlives the program.
        let candidate =
            unsafe { core::ptr::read_volatile(&raw const FAULT_CONFIG.populate_nrs[i]) };
        if candidate == nr {
            index = i as u32;
            break;
        }
    }
    // The call may map, unmap or split VMAs: the fault hooks look them up afresh.
    super::mappings::changed(tgid);
    if !may_populate(ctx, index as usize) {
        return Some(tgid);
    }
    let (min_flt, maj_flt) = task_faults();
    let call = PopulateCall {
        index,
        _pad: 0,
        start_ns: now_ns(),
        min_flt,
        maj_flt,
        exception_min: 0,
        exception_maj: 0,
        address: syscall_arg(ctx, 0),
        len: syscall_arg(ctx, 1),
    };
    if POPULATE_INFLIGHT
        .insert(tid, call, u64::from(BPF_ANY))
        .is_err()
    {
        super::update_failed("POPULATE_INFLIGHT");
    }
    Some(tgid)
}

/// Whether call `index` can fault pages in, by the kernel's own tests; one that cannot is
/// left out of `POPULATE_INFLIGHT`, which saves its entry's insert and removal on the
/// commonest mapping calls (ld.so's `mmap`s and `mprotect`s, an allocator's `madvise`):
/// - `mmap`: `do_mmap()` populates with `MAP_POPULATE` or a `VM_LOCKED` mapping
///   (`MAP_LOCKED`, or `mlockall(MCL_FUTURE)`'s `def_flags`); `brk` only with the latter;
/// - `mprotect`, `pkey_mprotect` (`mprotect_fixup()`) and `mremap` only in `VM_LOCKED`
///   VMAs, so never while `locked_vm` is 0;
/// - `madvise` not for the advice values below, which drop, mark or hint (not
///   `MADV_UNMERGEABLE`: breaking KSM sharing faults);
/// - the mlock family, `execve` (its arguments) and `remap_file_pages` always may.
#[inline(always)]
fn may_populate(ctx: &impl SyscallContext, index: usize) -> bool {
    let off = offsets();
    // Read only for the calls whose answer depends on them (not on every `execve`).
    let mm = || read_kernel::<u64>(current_task(), off.task_mm);
    // An unknown offset counts as locked: the call is counted, as before.
    let locked_by_default = |mm: u64| {
        off.mm_def_flags == 0 || read_kernel::<u64>(mm, off.mm_def_flags) & VM_LOCKED != 0
    };
    match index {
        populate::MMAP => {
            syscall_arg(ctx, 3) & (arch::MAP_POPULATE | arch::MAP_LOCKED) != 0
                || locked_by_default(mm())
        }
        populate::BRK => locked_by_default(mm()),
        populate::MPROTECT | populate::PKEY_MPROTECT | populate::MREMAP => {
            let mm = mm();
            read_kernel::<u64>(mm, off.mm_locked_vm) != 0 || locked_by_default(mm)
        }
        // MADV_NORMAL, RANDOM, SEQUENTIAL, DONTNEED, FREE, HUGEPAGE, NOHUGEPAGE, DONTDUMP,
        // DODUMP (include/uapi/asm-generic/mman-common.h, every architecture's).
        populate::MADVISE => !matches!(syscall_arg(ctx, 2), 0 | 1 | 2 | 4 | 8 | 14..=17),
        _ => true,
    }
}

/// At the exit of every [`populate`] call, with the tracepoint hook set
/// (`hook::POPULATE_EXIT_COUNTED`): the task's fault-counter growth during the call, less
/// the faults the perf events already counted, is what the call populated; charged to the
/// VMA the call populated, found as `HOW` says: `bpf_find_vma`, or a walk of the VMA rbtree
/// (`hook::POPULATE_EXIT_COUNTED_RB`, on kernels without the helper, before 5.17).
#[inline(never)]
pub fn on_exit_counted<const HOW: u8>(ctx: &impl SyscallContext) {
    let (tgid, tid) = current_ids();
    let Some(call) = POPULATE_INFLIGHT.get_ptr(tid) else {
        // A call that could not populate (`may_populate`) may still have changed mappings.
        // Bumped whoever called: cheaper than asking whether it is traced (a hash lookup
        // with `-p`), and an untraced process's slot drops no cached VMA of its own.
        super::mappings::changed(tgid);
        return;
    };
    let (min_flt, maj_flt) = task_faults();
    // SAFETY: a valid pointer to this thread's own entry, read before it is removed. The
    // fields, not a copy of the whole entry: 64 bytes more of this function's frame took
    // the raw `sys_exit` program's combined stack past 512 on 5.10.
    let (index, minor, major, range) = unsafe {
        (
            (*call).index,
            min_flt
                .wrapping_sub((*call).min_flt)
                .saturating_sub((*call).exception_min),
            maj_flt
                .wrapping_sub((*call).maj_flt)
                .saturating_sub((*call).exception_maj),
            ((*call).address, (*call).len),
        )
    };
    let _ = POPULATE_INFLIGHT.remove(tid);
    super::mappings::changed(tgid);
    if minor == 0 && major == 0 {
        return;
    }
    let Some((stats, _)) = stats_for(tgid, tid, true) else {
        return;
    };
    // SAFETY: as in `fault_signal`.
    let s = unsafe { &mut *stats };
    super::add_shared(&raw mut s.counts[stat::POPULATED_MINOR], minor);
    super::add_shared(&raw mut s.counts[stat::POPULATED_MAJOR], major);
    super::add_shared(
        &raw mut s.populated_by[index as usize & (SLOTS - 1)],
        minor + major,
    );
    let ret = syscall_ret(ctx);
    let address = charge::<HOW>(ctx, (tgid, tid), index, range, ret, (minor + major, major));
    if config!(events) != 0 {
        let flags = fault_flags::POPULATED | if minor == 0 { fault_flags::MAJOR } else { 0 };
        emit(
            ctx.as_ptr(),
            tgid,
            tid,
            flags,
            address,
            NO_LATENCY,
            0,
            minor + major,
            index,
            [0; cause::COUNT],
        );
    }
}

/// Charges a call's populated pages to the VMA they went into: mmap and mremap return the
/// mapping, brk the heap's new end, execve copied its arguments into the new stack, the
/// others take the range as their first two arguments. Pages of a call that spans VMAs
/// (`mlockall`, an `mlock` over several) go to the call itself: without a hook per fault
/// nothing tells them apart. With `--stacks`, the call site's stack is kept under the same
/// region. Returns the address charged (0 for the call).
#[inline(always)]
fn charge<const HOW: u8>(
    ctx: &impl SyscallContext,
    (tgid, tid): (u32, u32),
    index: u32,
    range: (u64, u64),
    ret: i64,
    (pages, majors): (u64, u64),
) -> u64 {
    let index = index as usize;
    let (address, len) = match index {
        populate::MMAP | populate::MREMAP if ret > 0 => (ret as u64, 1),
        populate::BRK if ret > 0 => (ret as u64 - 1, 1),
        populate::EXECVE | populate::EXECVEAT => (mapping::current_mm_start_stack(), 1),
        populate::MLOCKALL => (0, 0),
        _ => range,
    };
    let address = address & PAGE_MASK;
    if address != 0
        && let Some(found) = mapping::find::<HOW>(address, false)
        && found.end >= address.saturating_add(len)
    {
        flush_region(
            tgid,
            region_kind::VMA,
            found.start,
            (pages, majors),
            found.flags & !VM_HELD_SP,
        );
        // The stack, kept where the region is at hand: a region held across the lookup
        // below cost the caller's frame the 8 bytes that took the raw `sys_exit` program's
        // stack past 512 on 5.10.
        if config!(stacks) != 0 {
            record_stack(ctx, tgid, tid, pages, (region_kind::VMA, found.start));
        }
        // Named like the faults' VMAs (those were likely met already; if not, this records it).
        super::mappings::resolve::<HOW>(tgid, address, 0);
        return address;
    }
    flush_region(tgid, region_kind::CALL, index as u64, (pages, majors), 0);
    if config!(stacks) != 0 {
        record_stack(ctx, tgid, tid, pages, (region_kind::CALL, index as u64));
    }
    0
}

/// At the exit of every [`populate`] call, with the fentry/kprobe hook sets
/// (`hook::POPULATE_EXIT`), which count populated faults one by one and only use the
/// in-flight entry to name the call.
#[inline(never)]
pub fn on_exit() {
    let (tgid, tid) = current_ids();
    let _ = POPULATE_INFLIGHT.remove(tid);
    // With an entry or not (`may_populate`), as in `on_exit_counted`.
    super::mappings::changed(tgid);
}

//! VMA splits, merges and flag changes, three ways:
//!
//! 1. **Snapshots**: at `sys_enter` and `sys_exit` of each mlock-family call, the VMAs
//!    around its range, read with `bpf_find_vma` (5.17+), or before 6.1 by a bounded walk of
//!    the VMA rbtree and list ([`rbtree`]). The loader diffs the two, so the semantics never
//!    depend on which internal functions a kernel version has.
//! 2. **`maple_tree:ma_write`** (tp_btf): each store into the current task's own VMA tree,
//!    with the stored VMA's range and flags, and the system call the task is in.
//! 3. **fentry/fexit** on the kernel's split/merge/modify functions, where the kernel allows
//!    trampolines; the loader picks the functions from BTF and says which argument is what.
//!
//! The `sys_enter_*` records (`start`, `len` are the first two arguments of `mlock`, `mlock2`
//! and `munlock`): see [`crate::shared::syscall_tp`].
//!
//! `ma_write` (include/trace/events/maple_tree.h, 6.1 to 6.18):
//! `TP_PROTO(const char *fn, struct ma_state *mas, unsigned long piv, void *val)`.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext as _, Global,
    helpers::{
        bpf_get_current_comm, bpf_get_current_task_btf, bpf_probe_read_kernel_str_bytes,
        generated::{bpf_find_vma, bpf_get_func_arg, bpf_get_func_ret, bpf_task_pt_regs},
    },
    macros::{btf_tracepoint, fentry, fexit, map},
    maps::{Array, HashMap},
    programs::{BtfTracePointContext, FEntryContext, FExitContext},
};
use memlock_trace_common::{
    EventKind, MAX_INFLIGHT, PAGE_MASK, PAGE_SIZE, counter,
    syscalls::nr as syscall_nr,
    vma::{
        FN_SLOTS, FuncEvent, HookSpec, MAX_FN_HOOKS, MAX_SNAPSHOT_VMAS, NR_UNKNOWN, SnapshotEvent,
        StoreEvent, VM_LOCKED, VM_LOCKONFAULT, VmaConfig, VmaOffsets, VmaRange, WholeTotals, phase,
        slot,
    },
};

mod maple;
mod rbtree;

use crate::shared::{EVENTS, add_shared, count, current_ids, current_task, is_target};
use crate::syscall_hooks::{SyscallContext, syscall_arg};
use crate::{arch, kernel_walk::peek};

/// Offsets and options, set by the loader (`EbpfLoader::override_global`).
#[unsafe(no_mangle)]
static VMA_CONFIG: Global<VmaConfig> = Global::new(VmaConfig::ZERO);

/// Per hooked function, which arguments are VMAs: filled by the loader before attaching.
#[map]
static VMA_HOOKS: Array<HookSpec> = Array::with_max_entries(MAX_FN_HOOKS as u32, 0);

/// The range of the mlock-family call a thread is in, kept from entry to exit.
#[derive(Clone, Copy)]
#[repr(C)]
struct CallRange {
    nr: u32,
    /// 0 for `mlockall`/`munlockall`: no range, no snapshot.
    ranged: u32,
    start: u64,
    end: u64,
}

#[map]
static VMA_CALLS: HashMap<u32, CallRange> = HashMap::with_max_entries(MAX_INFLIGHT, 0);

/// How many entries `VMA_CALLS` holds: nearly always 0, when the programs that run at every
/// VMA change on the machine (`ma_write`, the split/merge functions) need no lookup to
/// tell that the thread is in no mlock-family call.
#[map]
static VMA_CALLS_LIVE: Array<u64> = Array::with_max_entries(1, 0);

/// Adds `n` (wrapping: `u64::MAX` takes one away) to [`VMA_CALLS_LIVE`].
#[inline(always)]
fn count_live_calls(n: u64) {
    if let Some(live) = VMA_CALLS_LIVE.get_ptr_mut(0) {
        add_shared(live, n);
    }
}

/// Whether thread `tid` is inside an mlock-family call.
#[inline(always)]
fn in_mlock_call(tid: u32) -> bool {
    VMA_CALLS_LIVE.get(0).is_some_and(|&live| live != 0) && VMA_CALLS.get_ptr(tid).is_some()
}

/// At the exit of the five calls (`hook::VMA_EXIT`; `RB`: `hook::VMA_EXIT_RB`, on kernels
/// whose VMAs are an rbtree, before 6.1).
#[inline(never)]
pub fn on_exit<const RB: bool>() {
    let (tgid, tid) = current_ids();
    let Some(call) = VMA_CALLS.get_ptr(tid) else {
        return;
    };
    // SAFETY: a valid pointer to this thread's own entry (keyed by tid), copied out before
    // it is removed.
    let call = unsafe { *call };
    if VMA_CALLS.remove(tid).is_ok() {
        count_live_calls(u64::MAX);
    }
    snapshot::<RB>(tgid, tid, phase::AFTER, &call);
}

/// At the entry of the five calls (`hook::VMA_ENTER`, `RB`: `hook::VMA_ENTER_RB`).
#[inline(never)]
pub fn on_enter<const RB: bool>(ctx: &impl SyscallContext, nr: u32) {
    let (tgid, tid) = current_ids();
    if !is_target(tgid) {
        return;
    }
    // `mlockall` and `munlockall` have no range, so no snapshot.
    let ranged = !matches!(nr, syscall_nr::MLOCKALL | syscall_nr::MUNLOCKALL);
    let (start, end) = if ranged {
        let start = syscall_arg(ctx, 0);
        let len = syscall_arg(ctx, 1);
        // What mm/mlock.c does first: len = PAGE_ALIGN(len + offset_in_page(start)),
        // start &= PAGE_MASK.
        let offset = start & !PAGE_MASK;
        let len = len.wrapping_add(offset).wrapping_add(PAGE_SIZE - 1) & PAGE_MASK;
        let start = start - offset;
        (start, start.wrapping_add(len))
    } else {
        (0, 0)
    };
    let call = CallRange {
        nr,
        ranged: u32::from(ranged),
        start,
        end,
    };
    if VMA_CALLS.insert(tid, call, 0).is_err() {
        count(counter::INFLIGHT_FULL);
        return;
    }
    count_live_calls(1);
    snapshot::<RB>(tgid, tid, phase::BEFORE, &call);
}

/// Emits the VMAs covering `[start - 1, end]` (the range and its two neighbours), written
/// straight into the ring buffer.
#[inline(always)]
fn snapshot<const RB: bool>(tgid: u32, tid: u32, phase: u32, call: &CallRange) {
    let Some(mut slot) = EVENTS.reserve::<SnapshotEvent>(0) else {
        count(counter::VMA_DROPPED);
        return;
    };
    let event = slot.as_mut_ptr();
    // SAFETY: `event` is the reserved, exclusively ours, ring buffer record.
    unsafe {
        (*event).kind = EventKind::Snapshot as u32;
        (*event).phase = phase;
        (*event).tgid = tgid;
        (*event).tid = tid;
        (*event).nr = call.nr;
        (*event).count = 0;
        (*event).incomplete = 0;
        (*event)._pad = 0;
        (*event).start = call.start;
        (*event).end = call.end;
        (*event).vmas = [VmaRange::default(); MAX_SNAPSHOT_VMAS];
        (*event).whole = WholeTotals::default();
        if call.ranged != 0 && call.end > call.start {
            if RB {
                rbtree::walk(call, &mut *event);
            } else {
                walk(call, &mut *event);
            }
        } else if call.ranged == 0 {
            if RB {
                rbtree::totals(&mut (*event).whole);
            } else {
                maple::totals(&mut (*event).whole);
            }
        }
    }
    slot.submit(0);
}

/// Walks the VMAs from the one below `start` to the one holding `end`.
///
/// Few branches on purpose: the verifier walks every path through this loop and the
/// callback, and 6.1's gave up at its 1M-instruction limit when each read could fail its own
/// way (see [`peek`]).
#[inline(always)]
fn walk(call: &CallRange, event: &mut SnapshotEvent) {
    // SAFETY: the helper has no preconditions; the verifier tracks the pointer it returns.
    let task = unsafe { bpf_get_current_task_btf() };
    let mut count = 0usize;
    let mut addr = call.start;
    // The VMA just below the range: a merge candidate (it may also hold `start`).
    if call.start > 0 {
        let mut below = VmaRange::default();
        if find_vma(task, call.start - 1, &mut below) == 0 {
            event.vmas[0] = below;
            count = 1;
            addr = below.end;
        }
    }
    let mut complete = false;
    for _ in 0..MAX_SNAPSHOT_VMAS {
        // The last VMA held `end`: it was the upper neighbour.
        if addr > call.end {
            complete = true;
            break;
        }
        let mut found = VmaRange::default();
        if find_vma(task, addr, &mut found) != 0 {
            // Nothing mapped right above the range: no upper neighbour, done. Otherwise a
            // hole inside the range (mlock fails with ENOMEM) or a busy mmap lock.
            complete = addr >= call.end;
            break;
        }
        let Some(entry) = event.vmas.get_mut(count) else {
            break;
        };
        *entry = found;
        count += 1;
        addr = found.end;
    }
    event.count = count as u32;
    event.incomplete = u32::from(!(complete || addr > call.end));
}

/// `bpf_find_vma` on the current task: 0 and `out` filled when a VMA holds `addr`.
#[inline(always)]
fn find_vma(task: *mut aya_ebpf::bindings::task_struct, addr: u64, out: &mut VmaRange) -> i64 {
    // SAFETY: the callback only writes a VmaRange through the context pointer we pass.
    unsafe {
        bpf_find_vma(
            task.cast(),
            addr,
            read_vma_callback as *mut c_void,
            (out as *mut VmaRange).cast(),
            0,
        )
    }
}

/// `bpf_find_vma` callback: copies the VMA's range and flags out.
#[inline(never)]
extern "C" fn read_vma_callback(_task: *mut c_void, vma: *mut c_void, out: *mut c_void) -> i64 {
    let off = VMA_CONFIG.load().offsets;
    let range = read_vma(vma as u64, &off);
    // SAFETY: `out` is the VmaRange on the caller's stack passed to bpf_find_vma.
    unsafe { *out.cast::<VmaRange>() = range };
    0
}

#[inline(always)]
fn read_vma(vma: u64, off: &VmaOffsets) -> VmaRange {
    VmaRange {
        start: peek(vma, off.vma_start),
        end: peek(vma, off.vma_end),
        flags: peek(vma, off.vma_flags),
    }
}

/// The system call the current task is in and its first three arguments, from its saved
/// user registers; [`NR_UNKNOWN`] outside a system call.
#[inline(always)]
fn current_syscall() -> (u32, [u64; 3]) {
    // SAFETY: `bpf_task_pt_regs` takes the trusted current-task pointer and returns an
    // address, read only with `peek`.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as u64;
    let word = |offset: usize| peek::<u64>(regs, offset as u32);
    if !arch::in_syscall(word) {
        return (NR_UNKNOWN, [0; 3]);
    }
    let nr: arch::SyscallNr = peek(regs, arch::SYSCALL_NR as u32);
    let [a0, a1, a2, ..] = arch::SYSCALL_ARGS;
    (nr as u32, [word(a0), word(a1), word(a2)])
}

#[btf_tracepoint(function = "ma_write")]
pub fn vma_ma_write(ctx: BtfTracePointContext) -> i32 {
    let (tgid, tid) = current_ids();
    if !is_target(tgid) {
        return 0;
    }
    let config = VMA_CONFIG.load();
    let off = config.offsets;
    let func: u64 = ctx.arg(0);
    let mas: u64 = ctx.arg(1);
    let val: u64 = ctx.arg(3);
    // Nearly every store (a fork copying a tree, an exec building one, ld.so mapping) is of
    // an unlocked VMA outside an mlock-family call: told by one read (and a lookup while
    // such a call runs somewhere), before the tree and the range are read.
    let flags: u64 = if val != 0 {
        peek(val, off.vma_flags)
    } else {
        0
    };
    if config.all_stores == 0 && flags & (VM_LOCKED | VM_LOCKONFAULT) == 0 && !in_mlock_call(tid) {
        return 0;
    }
    // Only the task's own VMA tree: other maple trees (and other mms, e.g. a fork child's
    // being copied) are not what this task's call did to its address space.
    let mm: u64 = peek(current_task(), off.task_mm);
    let tree: u64 = peek(mas, off.mas_tree);
    if mm == 0 || tree != mm + u64::from(off.mm_mt) {
        return 0;
    }
    let range = if val != 0 {
        read_vma(val, &off)
    } else {
        VmaRange::default()
    };
    let (nr, args) = current_syscall();
    let Some(mut slot) = EVENTS.reserve::<StoreEvent>(0) else {
        count(counter::VMA_DROPPED);
        return 0;
    };
    let mut event = StoreEvent {
        kind: EventKind::Store as u32,
        tgid,
        tid,
        nr,
        args,
        index: peek(mas, off.mas_index),
        last: peek(mas, off.mas_last),
        vma: val,
        range,
        func: [0; _],
        comm: bpf_get_current_comm().unwrap_or([0; _]),
    };
    // SAFETY: the helper fails rather than faults on a bad `func` (the tracepoint's
    // `const char *fn`), and writes at most `event.func.len()` bytes.
    let _ = unsafe { bpf_probe_read_kernel_str_bytes(func as *const u8, &mut event.func) };
    slot.write(event);
    slot.submit(0);
    0
}

/// One fentry/fexit pair per hookable function; the loader attaches pair `N` to the function
/// described by `VMA_HOOKS[N]`.
macro_rules! function_hooks {
    ($($index:literal => $entry:ident, $exit:ident;)*) => {$(
        #[fentry]
        pub fn $entry(ctx: FEntryContext) -> i32 {
            function_event(ctx.as_ptr(), $index, phase::BEFORE);
            0
        }

        #[fexit]
        pub fn $exit(ctx: FExitContext) -> i32 {
            function_event(ctx.as_ptr(), $index, phase::AFTER);
            0
        }
    )*};
}

function_hooks! {
    0 => vma_fn0_entry, vma_fn0_exit;
    1 => vma_fn1_entry, vma_fn1_exit;
    2 => vma_fn2_entry, vma_fn2_exit;
    3 => vma_fn3_entry, vma_fn3_exit;
    4 => vma_fn4_entry, vma_fn4_exit;
    5 => vma_fn5_entry, vma_fn5_exit;
    6 => vma_fn6_entry, vma_fn6_exit;
    7 => vma_fn7_entry, vma_fn7_exit;
    8 => vma_fn8_entry, vma_fn8_exit;
    9 => vma_fn9_entry, vma_fn9_exit;
}

#[inline(always)]
fn function_event(ctx: *mut c_void, hook: u32, phase: u32) {
    let (tgid, tid) = current_ids();
    if !is_target(tgid) {
        return;
    }
    let config = VMA_CONFIG.load();
    // These functions run for every mmap/mprotect/munmap too: keep the mlock-family ones
    // unless the user asked for all.
    if config.all_stores == 0 && !in_mlock_call(tid) {
        return;
    }
    let Some(spec) = VMA_HOOKS.get_ptr(hook) else {
        return;
    };
    // SAFETY: a valid pointer into an array map that user space fills before attaching and
    // programs never write.
    let spec = unsafe { &*spec };
    let Some(mut slot) = EVENTS.reserve::<FuncEvent>(0) else {
        count(counter::VMA_DROPPED);
        return;
    };
    let (nr, _) = current_syscall();
    let mut event = FuncEvent {
        kind: EventKind::Func as u32,
        hook,
        phase,
        tgid,
        tid,
        nr,
        ..FuncEvent::default()
    };
    for (i, arg) in event.args.iter_mut().enumerate() {
        // Fails (leaving 0) past the function's arity.
        // SAFETY: `ctx` is this fentry/fexit program's context, and the helper checks `i`
        // against the function's arity.
        let _ = unsafe { bpf_get_func_arg(ctx, i as u32, arg) };
    }
    if phase == phase::AFTER {
        // SAFETY: `ctx` is this fexit program's context.
        let _ = unsafe { bpf_get_func_ret(ctx, &mut event.ret) };
    }
    // Every slot writes its value and VMA whatever its spec (0, and a failed read's zeroes,
    // for an unused one): a slot that was skipped leaves its part of the event in a
    // different verifier state than one that was written, and 6.12's verifier then walks
    // each combination of the four slots apart (~280k instructions instead of a few
    // thousand).
    for i in 0..FN_SLOTS {
        let spec = spec.slots[i];
        let arg = event.args.get(spec.arg as usize).copied().unwrap_or(0);
        let mut value = match spec.source {
            slot::ARG => arg,
            slot::RET => event.ret,
            _ => 0,
        };
        if spec.deref != 0 {
            value = peek(value, spec.offset);
        }
        event.values[i] = value;
        let vma = if spec.read_as == slot::AS_VMA {
            value
        } else {
            0
        };
        // Address 0 fails to read, which zero-fills the range.
        event.vmas[i] = read_vma(vma, &config.offsets);
    }
    slot.write(event);
    slot.submit(0);
}

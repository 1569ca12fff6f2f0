//! `--stacks`: page faults, and mlock-family calls, counted per user call stack. The one
//! place that captures stacks; the fault hooks call [`record`] for a traced task's counted
//! faults only when the loader set `FaultConfig::stacks`, so without `--stacks` a fault pays
//! one predictable branch; the syscall exit calls [`record_call`] only when the loader set
//! [`SYSCALL_STACKS`], a read-only global the verifier folds, so without `--stacks` the
//! code is not even in the loaded program.
//!
//! The stack is the task's user stack as the kernel unwinds it (frame pointers, from the
//! user registers saved at the exception or system call entry): for a user fault the
//! faulting instruction first, for pages populated inside a system call (mlock,
//! `MAP_POPULATE`) the instruction after the `syscall`, i.e. the call site. Why the frames
//! themselves are the key (no stack trace map): see [`StackKey`].

use aya_ebpf::{
    EbpfContext, Global,
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::bpf_get_stack,
    macros::map,
    maps::{LruPerCpuHashMap, PerCpuArray},
};
use memlock_trace_common::{
    faults::{MAX_FAULT_STACK_COUNTS, StackKey, stack_counter},
    stacks::{MAX_SYSCALL_STACKS, SyscallStackKey, SyscallStackValue, counter},
};

/// Faults per (process or thread, user stack), per CPU.
#[map]
static FAULT_STACK_COUNTS: LruPerCpuHashMap<StackKey, u64> =
    LruPerCpuHashMap::with_max_entries(MAX_FAULT_STACK_COUNTS, 0);

/// Where the key is built: 520 bytes do not fit the 512-byte BPF stack.
#[map]
static STACK_SCRATCH: PerCpuArray<StackKey> = PerCpuArray::with_max_entries(1, 0);

#[map]
static STACK_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stack_counter::COUNT, 0);

#[inline(always)]
fn add(index: u32, n: u64) {
    crate::shared::add(&STACK_COUNTERS, index, n);
}

/// Adds `count` faults of `tgid` (thread `tid`, 0 unless per thread) to the current user
/// stack. Nothing is lost silently: a fault whose stack or count cannot be stored is
/// counted in [`stack_counter::DROPPED`].
#[inline(always)]
pub fn record<C: EbpfContext>(ctx: &C, tgid: u32, tid: u32, count: u64) {
    let Some(key) = STACK_SCRATCH.get_ptr_mut(0) else {
        stack_dropped(count, "map STACK_SCRATCH lookup failed");
        return;
    };
    // SAFETY: this CPU's scratch value of a per-CPU map, valid while the program runs; a
    // program runs to completion on its CPU, so nothing else uses it meanwhile.
    let key = unsafe { &mut *key };
    key.tgid = tgid;
    key.tid = tid;
    // Zero-fills the frames after the last, so equal stacks are equal keys.
    // SAFETY: `ctx.as_ptr()` is this program's context, and the buffer is `key.ips`, of
    // exactly the size passed.
    let copied = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            key.ips.as_mut_ptr().cast(),
            size_of_val(&key.ips) as u32,
            u64::from(BPF_F_USER_STACK),
        )
    };
    if copied <= 0 {
        stack_dropped(count, "no user stack (bpf_get_stack failed)");
        return;
    }
    let key = &*key;
    for _ in 0..2 {
        if let Some(value) = FAULT_STACK_COUNTS.get_ptr_mut(key) {
            // SAFETY: this CPU's share of the entry, kept valid (RCU) while the program runs.
            unsafe { *value += count };
            return;
        }
        if FAULT_STACK_COUNTS
            .insert(key, count, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            add(stack_counter::INSERTS, 1);
            return;
        }
        // Lost a race with another CPU's insert: add to this CPU's share of it.
    }
    stack_dropped(count, "map FAULT_STACK_COUNTS update failed");
}

/// `count` faults whose stack could not be kept; with `-v`, why. Not inlined: a call on the
/// failure path only, so its log code cannot change the per-fault path's code.
#[inline(never)]
fn stack_dropped(count: u64, why: &'static str) {
    let before = crate::shared::add(&STACK_COUNTERS, stack_counter::DROPPED, count);
    if crate::diag::wanted(before) {
        aya_log_ebpf::warn!(
            &(),
            target: "page-fault hooks",
            "{}: {} faults counted without a stack ({} on this CPU)",
            why,
            count,
            before + count
        );
    }
}

/// Non-zero with `--stacks` (set by the loader, see `stacks::names::SYSCALL_STACKS`).
#[unsafe(no_mangle)]
static SYSCALL_STACKS: Global<u32> = Global::new(0);

/// mlock-family calls per (process, call, user stack), per CPU.
#[map]
static SYSCALL_STACK_COUNTS: LruPerCpuHashMap<SyscallStackKey, SyscallStackValue> =
    LruPerCpuHashMap::with_max_entries(MAX_SYSCALL_STACKS, 0);

#[map]
static SYSCALL_STACK_SCRATCH: PerCpuArray<SyscallStackKey> = PerCpuArray::with_max_entries(1, 0);

#[map]
static SYSCALL_STACK_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Whether mlock-family calls are counted per call site (`--stacks`).
#[inline(always)]
pub fn syscalls_enabled() -> bool {
    SYSCALL_STACKS.load() != 0
}

/// Adds one mlock-family call (`nr`) of `tgid`, with its figures, to the current user stack:
/// at `sys_exit` the user registers are still those saved at the `syscall`, so the stack is
/// the call site. A call whose stack or figures cannot be stored is counted in
/// [`counter::DROPPED`].
#[inline(always)]
pub fn record_call<C: EbpfContext>(ctx: &C, tgid: u32, nr: u32, call: &SyscallStackValue) {
    let Some(key) = SYSCALL_STACK_SCRATCH.get_ptr_mut(0) else {
        call_dropped("map SYSCALL_STACK_SCRATCH lookup failed");
        return;
    };
    // SAFETY: this CPU's scratch value of a per-CPU map, valid while the program runs; a
    // program runs to completion on its CPU, so nothing else uses it meanwhile.
    let key = unsafe { &mut *key };
    key.tgid = tgid;
    key.nr = nr;
    // SAFETY: `ctx.as_ptr()` is this program's context, and the buffer is `key.ips`, of
    // exactly the size passed; the frames after the last are zero-filled.
    let copied = unsafe {
        bpf_get_stack(
            ctx.as_ptr(),
            key.ips.as_mut_ptr().cast(),
            size_of_val(&key.ips) as u32,
            u64::from(BPF_F_USER_STACK),
        )
    };
    if copied <= 0 {
        call_dropped("no user stack (bpf_get_stack failed)");
        return;
    }
    let key = &*key;
    for _ in 0..2 {
        if let Some(value) = SYSCALL_STACK_COUNTS.get_ptr_mut(key) {
            // SAFETY: this CPU's share of the entry, kept valid (RCU) while the program runs.
            let value = unsafe { &mut *value };
            value.calls += call.calls;
            value.errors += call.errors;
            value.populated += call.populated;
            value.locked += call.locked;
            value.unlocked += call.unlocked;
            value.duration_ns += call.duration_ns;
            return;
        }
        if SYSCALL_STACK_COUNTS
            .insert(key, call, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            crate::shared::add(&SYSCALL_STACK_COUNTERS, counter::INSERTS, 1);
            return;
        }
        // Lost a race with another CPU's insert: add to this CPU's share of it.
    }
    call_dropped("map SYSCALL_STACK_COUNTS update failed");
}

/// A call whose call site could not be kept; with `-v`, why.
#[inline(always)]
fn call_dropped(why: &'static str) {
    let before = crate::shared::add(&SYSCALL_STACK_COUNTERS, counter::DROPPED, 1);
    if crate::diag::wanted(before) {
        aya_log_ebpf::warn!(
            &(),
            target: "sys_exit_mlock_family",
            "{}: call counted without its call site ({} on this CPU)",
            why,
            before + 1
        );
    }
}

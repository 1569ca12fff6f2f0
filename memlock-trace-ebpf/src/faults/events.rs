//! `--events`: the sampled fault records, one in `sample_every` of the faults the
//! accounting body counts (and of the pages a populating call faulted in), written to their
//! own ring buffer.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_comm, bpf_get_stack},
    macros::map,
    maps::RingBuf,
};
use memlock_trace_common::{
    EventKind, TASK_COMM_LEN,
    causes::cause,
    faults::{FAULT_EVENTS_BYTE_SIZE, FaultEvent, fault_counter, fault_flags},
    vma::{VM_LOCKED, VM_LOCKONFAULT},
};

use super::{bump, event_dropped};
use crate::shared::{now_ns, this_cpu};

/// Sampled fault events (`--events`): their own ring, so faults never crowd out the
/// syscall events in `EVENTS`.
#[map]
static FAULT_EVENTS: RingBuf = RingBuf::with_byte_size(FAULT_EVENTS_BYTE_SIZE, 0);

/// A fault event's `latency_ns` when the fault has none.
pub(super) const NO_LATENCY: u64 = u64::MAX;

/// The current task's user instruction pointer: the first frame of its user stack, which
/// `bpf_get_stack` takes from the task's user registers (the fault's, or those of the call
/// being made). 0 without a program context (`ctx` null) or when it cannot be read.
#[inline(always)]
fn user_ip(ctx: *mut c_void) -> u64 {
    if ctx.is_null() {
        return 0;
    }
    let mut ip = 0u64;
    // SAFETY: `ctx` is the running program's context; the helper writes at most 8 bytes to
    // `ip`, a local that outlives the call.
    let copied =
        unsafe { bpf_get_stack(ctx, (&raw mut ip).cast(), 8, u64::from(BPF_F_USER_STACK)) };
    if copied == 8 { ip } else { 0 }
}

/// One sampled fault event. `ctx`: the program's context, for the user instruction pointer
/// (null where the fault is accounted away from its own program: see [`user_ip`]).
#[expect(clippy::too_many_arguments, reason = "the fields of one event")]
#[inline(always)]
pub(super) fn emit(
    ctx: *mut c_void,
    tgid: u32,
    tid: u32,
    mut flags: u32,
    address: u64,
    latency: u64,
    vm_flags: u64,
    count: u64,
    syscall: u32,
    cause_ns: [u64; cause::COUNT],
) {
    let every = u64::from(config!(sample_every));
    if every > 1 && !bump(fault_counter::SAMPLE_SEQ).is_multiple_of(every) {
        return;
    }
    let ip = user_ip(ctx);
    if latency != NO_LATENCY {
        flags |= fault_flags::HAS_LATENCY;
    }
    if vm_flags != 0 {
        flags |= fault_flags::HAS_VMA;
        if vm_flags & VM_LOCKED != 0 {
            flags |= fault_flags::VM_LOCKED;
        }
        if vm_flags & VM_LOCKONFAULT != 0 {
            flags |= fault_flags::VM_LOCKONFAULT;
        }
    }
    let Some(mut slot) = FAULT_EVENTS.reserve::<FaultEvent>(0) else {
        event_dropped(tid);
        return;
    };
    // Field by field into the ring buffer: a whole event built first would take its 136
    // bytes of the program's 512-byte stack (the perf completions run near the limit).
    let e = slot.as_mut_ptr();
    // SAFETY: `e` points to the reserved slot, a whole `FaultEvent` this program owns until
    // it submits it; every field is written (the struct has no padding), none read.
    unsafe {
        (&raw mut (*e).kind).write(EventKind::Fault as u32);
        (&raw mut (*e).flags).write(flags);
        (&raw mut (*e).tgid).write(tgid);
        (&raw mut (*e).tid).write(tid);
        (&raw mut (*e).address).write(address);
        (&raw mut (*e).ip).write(ip);
        (&raw mut (*e).latency_ns).write(if latency == NO_LATENCY { 0 } else { latency });
        (&raw mut (*e).time_ns).write(now_ns());
        (&raw mut (*e).count).write(count);
        (&raw mut (*e).syscall).write(syscall);
        (&raw mut (*e).cpu).write(this_cpu());
        (&raw mut (*e).cause_ns).write(cause_ns);
        (&raw mut (*e).comm).write(bpf_get_current_comm().unwrap_or([0; TASK_COMM_LEN]));
    }
    slot.submit(0);
}

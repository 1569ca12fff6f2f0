//! mlock-family system calls: `sys_enter_*` records the arguments and the task's counters,
//! `sys_exit_*` counts the call in `SYSCALL_STATS` (exact, whatever the ring buffer drops)
//! and emits one [`SyscallEvent`] with the deltas, for `--events` and per-call detail.
//!
//! The tracepoint records, and how many arguments each call has: see
//! [`crate::shared::syscall_tp`].

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_get_current_comm,
    macros::map,
    maps::{HashMap, LruHashMap, PerCpuArray},
};
use memlock_trace_common::{
    EventKind, MAX_INFLIGHT, SyscallEvent, counter,
    diag::{field, program},
    lock_context,
    stacks::SyscallStackValue,
    syscalls::{
        LATENCY_SLOTS, MAX_SYSCALL_KEYS, SyscallKey, SyscallStats, latency_slot, nr as syscall_nr,
        syscall_counter,
    },
};

use aya_log_ebpf::warn;

pub mod range;

use crate::rss::UNKNOWN_PAGES;
use crate::shared::{
    COUNTERS, EVENTS, Prog, TaskCounters, add, current_ids, current_task, is_target, now_ns,
    offsets, read_field, read_optional, task_counters,
};
use crate::syscall_hooks::{SyscallContext, syscall_arg, syscall_ret};

/// A call between its entry and exit, keyed by tid.
#[derive(Clone, Copy)]
#[repr(C)]
struct InFlight {
    nr: u32,
    _pad: u32,
    enter_ns: u64,
    args: [u64; 3],
    before: TaskCountersRepr,
    limits: LockLimits,
    /// [`crate::rss::mapped_pages_or_unknown`] at entry.
    mapped_before: i64,
}

/// What the kernel checks a lock against, at entry: see [`lock_context`].
#[derive(Clone, Copy)]
#[repr(C)]
struct LockLimits {
    rlimit_memlock: u64,
    total_vm: u64,
    flags: u32,
    _pad: u32,
}

/// Reads the limits of the current task: a few probe reads, only for target processes. A
/// field this kernel lacks (offset 0) is not read at all, so its figure stays unknown.
#[inline(always)]
fn lock_limits(prog: Prog) -> LockLimits {
    let off = offsets();
    let task = current_task();
    let mut flags = 0;
    let signal = read_optional::<u64>(task, off.task_signal, prog, field::TASK_SIGNAL);
    let rlimit = signal.and_then(|signal| {
        read_optional::<u64>(
            signal,
            off.signal_rlim_memlock,
            prog,
            field::SIGNAL_RLIM_MEMLOCK,
        )
    });
    if rlimit.is_some() {
        flags |= lock_context::RLIMIT_KNOWN;
    }
    let cred = read_optional::<u64>(task, off.task_cred, prog, field::TASK_CRED);
    let caps = cred.and_then(|cred| {
        read_optional::<u64>(
            cred,
            off.cred_cap_effective,
            prog,
            field::CRED_CAP_EFFECTIVE,
        )
    });
    if let Some(caps) = caps {
        flags |= lock_context::CAP_KNOWN;
        if caps & (1 << lock_context::CAP_IPC_LOCK_BIT) != 0 {
            flags |= lock_context::CAP_IPC_LOCK;
        }
    }
    let mm: u64 = read_field(task, off.task_mm, prog, field::TASK_MM);
    let total_vm = read_optional::<u64>(mm, off.mm_total_vm, prog, field::MM_TOTAL_VM);
    if total_vm.is_some() {
        flags |= lock_context::TOTAL_VM_KNOWN;
    }
    let (rlimit_memlock, total_vm) = (rlimit.unwrap_or(0), total_vm.unwrap_or(0));
    LockLimits {
        rlimit_memlock,
        total_vm,
        flags,
        _pad: 0,
    }
}

/// [`TaskCounters`] with a fixed layout, for storage in a map.
#[derive(Clone, Copy)]
#[repr(C)]
struct TaskCountersRepr {
    min_flt: u64,
    maj_flt: u64,
    locked_vm: u64,
    map_count: i32,
    _pad: u32,
}

impl From<TaskCounters> for TaskCountersRepr {
    fn from(c: TaskCounters) -> Self {
        Self {
            min_flt: c.min_flt,
            maj_flt: c.maj_flt,
            locked_vm: c.locked_vm,
            map_count: c.map_count,
            _pad: 0,
        }
    }
}

#[map]
static INFLIGHT: HashMap<u32, InFlight> = HashMap::with_max_entries(MAX_INFLIGHT, 0);

/// Calls per process, call and outcome, one value the CPUs share, added to atomically (per
/// CPU, its memory grew with the CPUs: 16 MiB held 16384 keys on 2 CPUs, 1560 on 64); LRU,
/// so a machine with more callers than slots keeps the recent ones, and the loader counts
/// the evicted (`INSERTS`).
#[map]
static SYSCALL_STATS: LruHashMap<SyscallKey, SyscallStats> =
    LruHashMap::with_max_entries(MAX_SYSCALL_KEYS, 0);

/// See [`syscall_counter`].
#[map]
static SYSCALL_COUNTERS: PerCpuArray<u64> =
    PerCpuArray::with_max_entries(syscall_counter::COUNT, 0);

/// Zeroed value to insert from: kept off the exit program's stack, which the event needs.
#[map]
static SYSCALL_STATS_ZERO: PerCpuArray<SyscallStats> = PerCpuArray::with_max_entries(1, 0);

/// What one call adds to its key's figures.
struct CallFigures {
    populated: u64,
    faults: u64,
    locked: u64,
    unlocked: u64,
    duration_ns: u64,
}

/// Counts one completed call under `key` (a new key also records who the process is). A
/// function of its own: inlined, its registers spill into the exit's frame, which shares
/// 512 bytes with the dispatcher's and the `-v` helpers' (5.10 refused 544).
#[inline(never)]
fn count_call(key: &SyscallKey, call: &CallFigures) {
    let stats = match SYSCALL_STATS.get_ptr_mut(key) {
        Some(stats) => stats,
        None => {
            let Some(zero) = SYSCALL_STATS_ZERO.get_ptr(0) else {
                return;
            };
            // SAFETY: this CPU's value of SYSCALL_STATS_ZERO, which nothing writes.
            let zero = unsafe { &*zero };
            // By reference: by value, the stats would be copied onto the exit program's stack.
            if SYSCALL_STATS
                .insert(key, zero, u64::from(BPF_NOEXIST))
                .is_ok()
            {
                add(&SYSCALL_COUNTERS, syscall_counter::INSERTS, 1);
                crate::process::note_process(key.tgid, key.start_ns);
            }
            match SYSCALL_STATS.get_ptr_mut(key) {
                Some(stats) => stats,
                None => {
                    add(&SYSCALL_COUNTERS, syscall_counter::UPDATE_FAILED, 1);
                    return;
                }
            }
        }
    };
    // SAFETY: the shared entry, valid (RCU) while the program runs; its counters are only
    // added to atomically (the max not: no atomic max before 5.12, so two calls ending at
    // once on two CPUs may keep the smaller).
    let s = unsafe { &mut *stats };
    crate::shared::add_shared(&raw mut s.calls, 1);
    crate::shared::add_shared(&raw mut s.pages_populated, call.populated);
    crate::shared::add_shared(&raw mut s.faults_populated, call.faults);
    crate::shared::add_shared(&raw mut s.pages_locked, call.locked);
    crate::shared::add_shared(&raw mut s.pages_unlocked, call.unlocked);
    if call.duration_ns > s.max_ns {
        s.max_ns = call.duration_ns;
    }
    // A mask every verifier can follow (`LATENCY_SLOTS` is a power of two); `latency_slot`
    // never returns more than `LATENCY_SLOTS - 1` anyway.
    crate::shared::add_shared_u32(
        &raw mut s.latency[latency_slot(call.duration_ns) & (LATENCY_SLOTS - 1)],
        1,
    );
}

/// The entry of the five calls (`hook::SYSCALLS_ENTER`): the `-v` diagnostics name each
/// call's handler as when each had its own program (`sys_enter_mlock`, ...).
#[inline(never)]
pub fn on_enter(ctx: &impl SyscallContext, nr: u32, mapped_now: i64) {
    let (slot, name) = match nr {
        syscall_nr::MLOCK => (program::SYS_ENTER_MLOCK, "sys_enter_mlock"),
        syscall_nr::MLOCK2 => (program::SYS_ENTER_MLOCK2, "sys_enter_mlock2"),
        syscall_nr::MUNLOCK => (program::SYS_ENTER_MUNLOCK, "sys_enter_munlock"),
        syscall_nr::MLOCKALL => (program::SYS_ENTER_MLOCKALL, "sys_enter_mlockall"),
        syscall_nr::MUNLOCKALL => (program::SYS_ENTER_MUNLOCKALL, "sys_enter_munlockall"),
        _ => return,
    };
    enter(ctx, nr, Prog { slot, name }, mapped_now);
}

const EXIT_PROG: Prog = Prog {
    slot: program::SYS_EXIT_MLOCK_FAMILY,
    name: "sys_exit_mlock_family",
};

/// The exit of the five calls (`hook::SYSCALLS_EXIT`).
#[inline(never)]
pub fn on_exit(ctx: &impl SyscallContext, mapped_now: i64) {
    // Only a traced call read anything worth a record.
    if exit(ctx, mapped_now) {
        crate::diag::report_reads(EXIT_PROG);
    }
}

/// Records entry state of call `nr`; `prog` names the program in `-v` diagnostics.
#[inline(always)]
fn enter(ctx: &impl SyscallContext, nr: u32, prog: Prog, mapped_now: i64) {
    let (tgid, tid) = current_ids();
    if !is_target(tgid) {
        return;
    }
    // All three read for every call: the registers are there whatever the call's arguments.
    let args = [
        syscall_arg(ctx, 0),
        syscall_arg(ctx, 1),
        syscall_arg(ctx, 2),
    ];
    let entry = InFlight {
        nr,
        _pad: 0,
        enter_ns: now_ns(),
        args,
        before: task_counters(prog).into(),
        limits: lock_limits(prog),
        mapped_before: mapped_now,
    };
    if INFLIGHT.insert(tid, entry, 0).is_err() {
        let before = add(&COUNTERS, counter::INFLIGHT_FULL, 1);
        if crate::diag::wanted(before) {
            warn!(
                ctx,
                target: prog.name,
                "map INFLIGHT full ({} calls in flight): call of tid {} not traced ({} on this CPU)",
                MAX_INFLIGHT,
                tid,
                before + 1
            );
        }
    }
    crate::diag::report_reads(prog);
}

/// Emits the call's event; false if the call was not traced (no entry), so nothing was read.
#[inline(always)]
fn exit(ctx: &impl SyscallContext, mapped_now: i64) -> bool {
    let (tgid, tid) = current_ids();
    let Some(entry) = INFLIGHT.get_ptr(tid) else {
        return false;
    };
    // SAFETY: a valid pointer to this thread's own entry (keyed by tid): only this thread
    // writes or removes it, and it is removed once read (`finish`). Read in place, not
    // copied: a copy's 104 bytes took the exit's chain past the verifier's 512.
    let entry = unsafe { &*entry };
    finish(ctx, tid, tgid, entry, mapped_now);
    let _ = INFLIGHT.remove(tid);
    true
}

/// Counts and reports the call whose entry `entry` is, before the entry is removed.
#[inline(always)]
fn finish(ctx: &impl SyscallContext, tid: u32, tgid: u32, entry: &InFlight, mapped_now: i64) {
    let now = now_ns();
    let range = range::take(tid);
    let after = task_counters(EXIT_PROG);
    let ret = syscall_ret(ctx);
    let min_flt = after.min_flt.wrapping_sub(entry.before.min_flt);
    let maj_flt = after.maj_flt.wrapping_sub(entry.before.maj_flt);
    let locked = after.locked_vm as i64 - entry.before.locked_vm as i64;
    let faults = min_flt + maj_flt;
    // Base pages, where both ends were read; else the faults stand in.
    let mapped = (mapped_now != UNKNOWN_PAGES && entry.mapped_before != UNKNOWN_PAGES)
        .then(|| mapped_now - entry.mapped_before);
    let populated = match mapped {
        Some(pages) if pages > 0 => pages as u64,
        Some(_) => 0,
        None => faults,
    };
    let start_ns = crate::shared::current_process_start_ns();
    // Counted before the event is written: a full ring buffer loses no call.
    count_call(
        &SyscallKey {
            tgid,
            nr: entry.nr,
            start_ns,
            errno: if ret < 0 {
                ret.unsigned_abs() as u32
            } else {
                0
            },
            _pad: 0,
        },
        &CallFigures {
            populated,
            faults,
            locked: if locked > 0 { locked as u64 } else { 0 },
            unlocked: if locked < 0 { locked.unsigned_abs() } else { 0 },
            duration_ns: now - entry.enter_ns,
        },
    );
    if crate::stacks::syscalls_enabled() {
        let call = SyscallStackValue {
            calls: 1,
            errors: u64::from(ret < 0),
            populated,
            locked: if locked > 0 { locked as u64 } else { 0 },
            unlocked: if locked < 0 { locked.unsigned_abs() } else { 0 },
            duration_ns: now - entry.enter_ns,
        };
        crate::stacks::record_call(ctx, tgid, entry.nr, &call);
    }

    let Some(mut slot) = EVENTS.reserve::<SyscallEvent>(0) else {
        let before = add(&COUNTERS, counter::RINGBUF_DROPPED, 1);
        if crate::diag::wanted(before) {
            warn!(
                ctx,
                target: EXIT_PROG.name,
                "ring buffer EVENTS full: record of syscall nr {} by tid {} dropped ({} on this CPU)",
                entry.nr,
                tid,
                before + 1
            );
        }
        return;
    };
    // Written field by field into the reserved record: built on the stack first, the
    // record would add its 184 bytes to a frame the dispatcher's and the `-v` helpers'
    // frames already share 512 bytes with (5.10 refused the exit at 544).
    let event = slot.as_mut_ptr();
    // SAFETY: the record this program reserved, its own until submitted; every field is a
    // plain integer written once, so no uninitialised value is read or dropped.
    unsafe {
        (*event).kind = EventKind::Syscall as u32;
        (*event).nr = entry.nr;
        (*event).tgid = tgid;
        (*event).tid = tid;
        (*event).enter_ns = entry.enter_ns;
        (*event).duration_ns = now - entry.enter_ns;
        (*event).args = entry.args;
        (*event).ret = ret;
        (*event).min_flt = min_flt;
        (*event).maj_flt = maj_flt;
        (*event).locked_vm_before = entry.before.locked_vm;
        (*event).locked_vm_after = after.locked_vm;
        (*event).map_count_before = entry.before.map_count;
        (*event).map_count_after = after.map_count;
        (*event).comm = bpf_get_current_comm().unwrap_or_default();
        (*event).process_start_ns = start_ns;
        (*event).rlimit_memlock = entry.limits.rlimit_memlock;
        (*event).total_vm_before = entry.limits.total_vm;
        (*event).lock_context = entry.limits.flags
            | range.flags
            | if mapped.is_some() {
                lock_context::PAGES_MAPPED_KNOWN
            } else {
                0
            };
        (*event).pages_mapped = mapped.unwrap_or(0);
        (*event)._pad = 0;
        (*event).first_unmapped = range.first_unmapped;
    }
    slot.submit(crate::shared::submit_flags());
}

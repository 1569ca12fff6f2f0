//! Maps, configuration and helpers shared by every hook family: the one place for the
//! current task's ids, per-CPU counters and kernel reads.

use aya_ebpf::{
    Global,
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_ancestor_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_current_task_btf, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        bpf_probe_read_kernel,
    },
    macros::map,
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use core::intrinsics::{AtomicOrdering, atomic_xadd};
use memlock_trace_common::{
    Config, EVENTS_BYTE_SIZE, KernelOffsets, MAX_TARGETS, TASK_COMM_LEN, counter,
    diag::field,
    filter,
    process::{CgroupOffsets, ProcessConfig, ProcessOffsets},
};

pub use crate::diag::Prog;

/// Set by the loader before load (`EbpfLoader::override_global`): filter mode and the
/// running kernel's struct offsets.
#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(Config {
    filter: filter::ALL,
    leave_out_tgid: 0,
    offsets: KernelOffsets {
        task_mm: 0,
        task_min_flt: 0,
        task_maj_flt: 0,
        mm_locked_vm: 0,
        mm_map_count: 0,
        mm_def_flags: 0,
        task_signal: 0,
        signal_rlim_memlock: 0,
        task_cred: 0,
        cred_cap_effective: 0,
        mm_total_vm: 0,
        task_thread_status: 0,
    },
});

/// Every record the loader decodes: syscall events, VMA events, sampled faults.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTE_SIZE, 0);

/// Thread groups to trace when `CONFIG.filter == filter::TGIDS`.
#[map]
pub static TARGET_TGIDS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_TARGETS, 0);

/// The tracer's own health: see [`counter`].
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

#[inline(always)]
pub fn offsets() -> KernelOffsets {
    CONFIG.load().offsets
}

/// Whether the thread group `tgid` is one the user asked to trace (and passes `--comm`
/// and `--cgroup`, see `process.rs`).
#[inline(always)]
pub fn is_target(tgid: u32) -> bool {
    let config = CONFIG.load();
    let wanted = if config.filter == filter::ALL {
        tgid != config.leave_out_tgid
    } else {
        TARGET_TGIDS.get_ptr(tgid).is_some()
    };
    wanted && matches_filters()
}

/// Flags for `submit`: wake the reader only once a batch is waiting (see
/// [`memlock_trace_common::EVENTS_WAKEUP_BYTES`]).
#[inline(always)]
pub fn submit_flags() -> u64 {
    if EVENTS.query(u64::from(BPF_RB_AVAIL_DATA)) >= memlock_trace_common::EVENTS_WAKEUP_BYTES {
        u64::from(BPF_RB_FORCE_WAKEUP)
    } else {
        u64::from(BPF_RB_NO_WAKEUP)
    }
}

/// Counts one event in the health counter `index` (see [`counter`]).
#[inline(always)]
pub fn count(index: u32) {
    add(&COUNTERS, index, 1);
}

/// Adds `n` to a counter of a map value the CPUs share. The result is unused, so this is
/// the plain BPF atomic add every kernel verifies (the fetching forms need 5.12).
#[inline(always)]
pub fn add_shared(counter: *mut u64, n: u64) {
    // SAFETY: the callers pass an aligned u64 inside a map value, valid while the program
    // runs (RCU keeps an evicted LRU entry alive meanwhile).
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(counter, n) };
}

/// [`add_shared`] for a u32 counter.
#[inline(always)]
pub fn add_shared_u32(counter: *mut u32, n: u32) {
    // SAFETY: as in `add_shared`: an aligned u32 inside a map value.
    unsafe { atomic_xadd::<u32, u32, { AtomicOrdering::Relaxed }>(counter, n) };
}

/// Adds `n` to this CPU's slot `index` of a per-CPU counter array and returns what the slot
/// held before (0 for an index past the array).
#[inline(always)]
pub fn add(counters: &PerCpuArray<u64>, index: u32, n: u64) -> u64 {
    match counters.get_ptr_mut(index) {
        // SAFETY: the map returned a valid pointer to this CPU's own slot, and a program runs
        // to completion on one CPU, so a plain read-modify-write is race-free.
        Some(slot) => unsafe {
            let old = *slot;
            *slot = old + n;
            old
        },
        None => 0,
    }
}

/// The current task's thread group id (the process, `getpid()`) and thread id (`gettid()`),
/// from one `bpf_get_current_pid_tgid` call: tgid in the upper 32 bits, pid in the lower.
#[inline(always)]
pub fn current_ids() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

/// Types for which any bytes are a valid value, so they can be copied out of kernel memory
/// or a tracepoint record whatever it holds.
///
/// # Safety
///
/// Every bit pattern of `size_of::<Self>()` bytes must be a valid `Self`.
pub unsafe trait Plain: Copy {}

// SAFETY: integers, and arrays of them, have no invalid bit patterns.
unsafe impl Plain for u8 {}
// SAFETY: as above.
unsafe impl Plain for i32 {}
// SAFETY: as above.
unsafe impl Plain for u32 {}
// SAFETY: as above.
unsafe impl Plain for i64 {}
// SAFETY: as above.
unsafe impl Plain for u64 {}
// SAFETY: as above.
unsafe impl<T: Plain, const N: usize> Plain for [T; N] {}

/// The field at `offset` of the current tracepoint's record, `None` if it cannot be read.
#[inline(always)]
pub fn tp_field<T: Plain>(ctx: &TracePointContext, offset: usize) -> Option<T> {
    // SAFETY: `read_at` copies with `bpf_probe_read`, which fails rather than faults on a
    // bad address, into a `T` that any bytes make valid (`Plain`).
    unsafe { ctx.read_at::<T>(offset) }.ok()
}

/// Reads a `T` at `base + offset` in kernel memory; a failed read is counted and yields 0,
/// so one unreadable field never costs the whole event.
#[inline(always)]
pub fn read_kernel<T: Plain + Default>(base: u64, offset: u32) -> T {
    if base == 0 {
        count(counter::READ_FAILED);
        return T::default();
    }
    // SAFETY: `bpf_probe_read_kernel` checks the source address itself and fails rather
    // than faults, and any bytes are a valid `T` (`Plain`).
    match unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const T) } {
        Ok(value) => value,
        Err(_) => {
            count(counter::READ_FAILED);
            T::default()
        }
    }
}

/// [`read_kernel`] of a named field (one of `diag::field`), for the diagnostics: with `-v`,
/// a failed read is noted for `prog`'s record ([`crate::diag::report_reads`]).
#[inline(always)]
pub fn read_field<T: Plain + Default>(base: u64, offset: u32, prog: Prog, field: u32) -> T {
    read_reported(base, offset, prog, field).unwrap_or_default()
}

/// [`read_field`] of a field this kernel may not have (`offset` 0, see
/// [`KernelOffsets`]): `None` when it is missing or unreadable, so the figure is shown as
/// unknown rather than 0. Only a failed read is counted.
#[inline(always)]
pub fn read_optional<T: Plain>(base: u64, offset: u32, prog: Prog, field: u32) -> Option<T> {
    if offset == 0 {
        return None;
    }
    read_reported(base, offset, prog, field)
}

/// The read behind [`read_field`]: a failure is counted (and, with `-v`, noted by field;
/// nothing is logged here, see `diag.rs`).
#[inline(always)]
fn read_reported<T: Plain>(base: u64, offset: u32, prog: Prog, field: u32) -> Option<T> {
    if base != 0 {
        // SAFETY: as in `read_kernel`: the helper checks the address and fails rather than
        // faults; any bytes are a valid `T`.
        if let Ok(value) = unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const T) }
        {
            return Some(value);
        }
    }
    count(counter::READ_FAILED);
    crate::diag::read_failed(prog, field, base == 0);
    None
}

/// The fields of the current task and its mm that the syscall and fault hooks compare
/// before and after a call.
#[derive(Clone, Copy, Default)]
pub struct TaskCounters {
    pub min_flt: u64,
    pub maj_flt: u64,
    pub locked_vm: u64,
    pub map_count: i32,
}

/// `prog`: the program reading them, named in `-v` diagnostics.
#[inline(always)]
pub fn task_counters(prog: Prog) -> TaskCounters {
    let off = offsets();
    let task = current_task();
    let mm: u64 = read_field(task, off.task_mm, prog, field::TASK_MM);
    TaskCounters {
        min_flt: read_field(task, off.task_min_flt, prog, field::TASK_MIN_FLT),
        maj_flt: read_field(task, off.task_maj_flt, prog, field::TASK_MAJ_FLT),
        locked_vm: read_field(mm, off.mm_locked_vm, prog, field::MM_LOCKED_VM),
        map_count: read_field(mm, off.mm_map_count, prog, field::MM_MAP_COUNT),
    }
}

/// The current task's `min_flt` and `maj_flt`: the faults it has taken, including those the
/// kernel took on its behalf (pages populated inside a system call).
#[inline(always)]
pub fn task_faults() -> (u64, u64) {
    faults_of(current_task(), &offsets())
}

#[inline(always)]
fn faults_of(task: u64, off: &KernelOffsets) -> (u64, u64) {
    (
        read_kernel(task, off.task_min_flt),
        read_kernel(task, off.task_maj_flt),
    )
}

/// The current `task_struct`'s address, for [`read_kernel`].
#[inline(always)]
pub fn current_task() -> u64 {
    // SAFETY: the helper has no preconditions; it returns an address, not a reference.
    unsafe { bpf_get_current_task() }
}

/// `bpf_ktime_get_ns()`: the monotonic clock, in ns.
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: the helper has no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// The CPU this program runs on (it does not migrate while it runs).
#[inline(always)]
pub fn this_cpu() -> u32 {
    // SAFETY: the helper has no preconditions.
    unsafe { bpf_get_smp_processor_id() }
}

// The per-process filters (`--comm`, `--cgroup`) and the process start time, shared by
// every family's target check; `process.rs` keeps the set of targets in step with forks
// and exits.

/// Set by the loader before load: which filters are on, and this kernel's offsets.
#[unsafe(no_mangle)]
pub static PROCESS_CONFIG: Global<ProcessConfig> = Global::new(ProcessConfig {
    follow_children: 0,
    match_comm: 0,
    comm: [0; TASK_COMM_LEN],
    comm_mask: [0; TASK_COMM_LEN],
    match_cgroup: 0,
    cgroup_level: 0,
    cgroup_id: 0,
    offsets: ProcessOffsets {
        task_tgid: 0,
        task_group_leader: 0,
        task_start_boottime: 0,
        task_comm: 0,
        task_signal: 0,
        signal_live: 0,
        signal_min_flt: 0,
        signal_maj_flt: 0,
        task_min_flt: 0,
        task_maj_flt: 0,
        task_btf: 0,
    },
    cgroup_offsets: CgroupOffsets {
        task_cgroups: 0,
        css_set_dfl_cgrp: 0,
        cgroup_level: 0,
        cgroup_ancestor_ids: 0,
    },
});

/// One field of [`PROCESS_CONFIG`], read alone: a whole-struct `load` would copy it onto the
/// stack of every program that checks a target, which the VMA programs cannot spare.
macro_rules! process_config {
    ($($field:ident).+) => {
        // SAFETY: `Global` is a transparent wrapper of an initialised value in a static,
        // which outlives the program.
        unsafe {
            core::ptr::read_volatile(
                &raw const (*(&raw const PROCESS_CONFIG).cast::<ProcessConfig>()).$($field).+,
            )
        }
    };
}

/// The current task's group leader (the process, as `/proc/PID` sees it).
#[inline(always)]
pub fn current_leader(off: &ProcessOffsets) -> u64 {
    read_kernel(current_task(), off.task_group_leader)
}

/// Whether the current task passes `--comm` and `--cgroup` (true when they are off).
#[inline(always)]
pub fn matches_filters() -> bool {
    if process_config!(match_cgroup) != 0 {
        let level = process_config!(cgroup_level);
        // The ancestor at the filter cgroup's depth is the filter cgroup itself exactly when
        // the task is in it or below it.
        let ancestor = if process_config!(cgroup_offsets.cgroup_ancestor_ids) == 0 {
            // SAFETY: the helper has no preconditions; a level deeper than the task's cgroup
            // yields 0, which matches no filter.
            unsafe { bpf_get_current_ancestor_cgroup_id(level as i32) }
        } else {
            ancestor_cgroup_id(&process_config!(cgroup_offsets), level)
        };
        if ancestor != process_config!(cgroup_id) {
            return false;
        }
    }
    if process_config!(match_comm) != 0 {
        // The group leader's comm, so renamed threads of a matching process still match.
        let leader = read_kernel(current_task(), process_config!(offsets.task_group_leader));
        // Compared as two u64 words: BPF has no memcmp.
        let comm: [u64; 2] = read_kernel(leader, process_config!(offsets.task_comm));
        let (want, mask) = (process_config!(comm), process_config!(comm_mask));
        // SAFETY: `[u8; 16]` and `[u64; 2]` have the same size, and any bytes are valid u64s.
        let (want, mask) = unsafe {
            (
                core::mem::transmute::<[u8; TASK_COMM_LEN], [u64; 2]>(want),
                core::mem::transmute::<[u8; TASK_COMM_LEN], [u64; 2]>(mask),
            )
        };
        // Bytes after the NUL may hold an older name (see `ProcessConfig::comm_mask`).
        if comm[0] & mask[0] != want[0] || comm[1] & mask[1] != want[1] {
            return false;
        }
    }
    true
}

/// `bpf_get_current_ancestor_cgroup_id(level)` from the task's cgroup's own list of its
/// ancestors' ids, for kernels whose tracing programs may not call the helper.
#[inline(always)]
fn ancestor_cgroup_id(off: &CgroupOffsets, level: u32) -> u64 {
    let css_set: u64 = read_kernel(current_task(), off.task_cgroups);
    let cgroup: u64 = read_kernel(css_set, off.css_set_dfl_cgrp);
    let own_level: i32 = read_kernel(cgroup, off.cgroup_level);
    if own_level < level as i32 {
        return 0;
    }
    read_kernel(cgroup, off.cgroup_ancestor_ids + level * 8)
}

/// The current process's start time (its group leader's `start_boottime`), which with the
/// tgid identifies it for its whole life. It runs on every fault that is not on the
/// single-process fast path (once: the fault's histogram reuses its stats key's). Where the
/// kernel has `bpf_get_current_task_btf`, two loads the verifier checks against the task's BTF (the
/// offsets are constants of the frozen `.rodata`) and makes fault-safe; else two
/// `bpf_probe_read_kernel` calls (a system-wide `--count-only` first touch: 112-133 ns a
/// fault's completion with them, 102-105 without; bpf_stats).
#[inline(always)]
pub fn current_process_start_ns() -> u64 {
    let (leader_at, start_at) = (
        process_config!(offsets.task_group_leader),
        process_config!(offsets.task_start_boottime),
    );
    if process_config!(offsets.task_btf) == 0 {
        let leader: u64 = read_kernel(current_task(), leader_at);
        return read_kernel(leader, start_at);
    }
    // SAFETY: the helper has no preconditions and returns the current task, never NULL.
    let task = unsafe { bpf_get_current_task_btf() }.cast::<u8>();
    // SAFETY: in-bounds fields of `struct task_struct` (offsets from the kernel's BTF); the
    // verifier checks each load against that BTF and turns it into one that cannot fault.
    unsafe {
        let leader = core::ptr::read_volatile(task.add(leader_at as usize).cast::<*const u8>());
        core::ptr::read_volatile(leader.add(start_at as usize).cast::<u64>())
    }
}

/// The current process's group leader's comm: its name after its last exec (a thread's own
/// comm may have been renamed).
#[inline(always)]
pub fn current_process_comm() -> [u8; TASK_COMM_LEN] {
    let leader: u64 = read_kernel(current_task(), process_config!(offsets.task_group_leader));
    read_kernel(leader, process_config!(offsets.task_comm))
}

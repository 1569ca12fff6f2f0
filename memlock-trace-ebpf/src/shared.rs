//! Maps, configuration and helpers shared by every hook family.

use aya_ebpf::{
    Global,
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_current_task, bpf_probe_read_kernel},
    macros::map,
    maps::{HashMap, PerCpuArray, RingBuf},
};
use memlock_trace_common::{Config, EVENTS_BYTE_SIZE, KernelOffsets, MAX_TARGETS, counter, filter};

/// Set by the loader before load (`EbpfLoader::override_global`): filter mode and the
/// running kernel's struct offsets.
#[unsafe(no_mangle)]
static CONFIG: Global<Config> = Global::new(Config {
    filter: filter::ALL,
    _pad: 0,
    offsets: KernelOffsets {
        task_mm: 0,
        task_min_flt: 0,
        task_maj_flt: 0,
        mm_locked_vm: 0,
        mm_map_count: 0,
        _pad: 0,
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
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

#[inline(always)]
pub fn offsets() -> KernelOffsets {
    CONFIG.load().offsets
}

/// Whether the thread group `tgid` is one the user asked to trace (and passes `--comm`
/// and `--cgroup`, see `process.rs`).
#[inline(always)]
pub fn is_target(tgid: u32) -> bool {
    (CONFIG.load().filter == filter::ALL || TARGET_TGIDS.get_ptr(tgid).is_some())
        && crate::process::matches_filters()
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

#[inline(always)]
pub fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // Per-CPU slot, so a plain increment is race-free.
        unsafe { *slot += 1 };
    }
}

/// Reads a `T` at `base + offset` in kernel memory; a failed read is counted and yields 0,
/// so one unreadable field never costs the whole event.
#[inline(always)]
pub fn read_kernel<T: Default>(base: u64, offset: u32) -> T {
    if base == 0 {
        count(counter::READ_FAILED);
        return T::default();
    }
    match unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const T) } {
        Ok(value) => value,
        Err(_) => {
            count(counter::READ_FAILED);
            T::default()
        }
    }
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

#[inline(always)]
pub fn task_counters() -> TaskCounters {
    let off = offsets();
    let task = unsafe { bpf_get_current_task() };
    let mm: u64 = read_kernel(task, off.task_mm);
    TaskCounters {
        min_flt: read_kernel(task, off.task_min_flt),
        maj_flt: read_kernel(task, off.task_maj_flt),
        locked_vm: read_kernel(mm, off.mm_locked_vm),
        map_count: read_kernel(mm, off.mm_map_count),
    }
}

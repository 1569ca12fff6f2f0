//! Faults per region: the run of faults this CPU is counting, the per-CPU region table
//! finished runs go to, and the LRU hash map the table spills into.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use memlock_trace_common::{
    PAGE_SHIFT,
    faults::{
        MAX_FAULT_REGIONS, REGION_SLOTS, RegionKey, RegionSlot, RegionValue, fault_counter,
        region_kind,
    },
};

use super::bump;

/// Faults per region, moved here from `FAULT_REGION_SLOTS` when a slot is needed for another
/// region; shared by the CPUs and added to atomically, like `FAULT_STATS`.
#[map]
static FAULT_REGIONS: LruHashMap<RegionKey, RegionValue> =
    LruHashMap::with_max_entries(MAX_FAULT_REGIONS, 0);

/// The run of faults this CPU is counting: consecutive faults of one process in one region
/// (its VMA, or the `1 << region_shift` block of the run's first fault), keyed by the VMA
/// start or the run's first page. That page is where the run began, so the mapping holding
/// it is exact, where a rounded-down address could fall in the neighbouring mapping.
#[map]
static FAULT_REGION_RUN: PerCpuArray<RegionSlot> = PerCpuArray::with_max_entries(1, 0);

/// Where finished runs go first: a per-CPU table indexed by the region, so storing a run
/// costs an inlined array lookup. Why not straight into the hash map `FAULT_REGIONS`: a first
/// touch finishes a run every 16 pages, and each run is a new key, an LRU insert; measured
/// (bpf_stats, 256 MiB first touch) that was ~35 ns per fault, a third of the programs' cost.
/// Consecutive regions take consecutive slots, so up to `REGION_SLOTS` runs of a sequential
/// touch (256 MiB) stay in the table; a slot's occupant moves to the hash map only when
/// another run needs the slot.
#[map]
static FAULT_REGION_SLOTS: PerCpuArray<RegionSlot> = PerCpuArray::with_max_entries(REGION_SLOTS, 0);

/// What a fault's region start is: its VMA's when the hook read the VMA's flags, else its
/// page's.
#[inline(always)]
pub(super) fn region_kind_of(vm_flags: u64) -> u32 {
    if vm_flags != 0 {
        region_kind::VMA
    } else {
        region_kind::PAGE
    }
}

/// Counts one fault in `region` (a VMA start when `vm_flags` is set, else a page address);
/// `major`: 1 for a major fault, 0 for a minor one or one not known yet.
#[inline(always)]
pub(super) fn count_region(tgid: u32, region: u64, vm_flags: u64, major: u64) {
    let exact = region_kind_of(vm_flags);
    let Some(run) = FAULT_REGION_RUN.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's value of a per-CPU map, valid while the program runs; a program runs
    // to completion on its CPU, so nothing else uses it meanwhile.
    let run = unsafe { &mut *run };
    let same = run.value.faults != 0
        && run.key.tgid == tgid
        && run.key.exact == exact
        && if exact != 0 {
            run.key.start == region
        } else {
            run.key.start >> config!(region_shift) == region >> config!(region_shift)
        };
    if same {
        run.value.faults += 1;
        run.value.majors += major;
        run.value.vm_flags |= vm_flags;
        return;
    }
    if run.value.faults != 0 {
        stash_run(run.key, run.value);
    }
    run.key = RegionKey {
        tgid,
        exact,
        start: region,
    };
    run.value = RegionValue {
        faults: 1,
        majors: major,
        vm_flags,
    };
}

/// A finished run into the region table: added to its slot if the slot holds the same key,
/// else it takes the slot and the previous occupant moves to `FAULT_REGIONS`.
#[inline(always)]
fn stash_run(key: RegionKey, value: RegionValue) {
    let block = if key.exact != 0 {
        key.start >> PAGE_SHIFT
    } else {
        key.start >> config!(region_shift)
    };
    let index = (block as u32 ^ key.tgid) & config!(region_slots_mask) & (REGION_SLOTS - 1);
    let Some(slot) = FAULT_REGION_SLOTS.get_ptr_mut(index) else {
        return;
    };
    // SAFETY: as in `count_region`: this CPU's slot of a per-CPU map.
    let slot = unsafe { &mut *slot };
    if slot.value.faults != 0
        && slot.key.tgid == key.tgid
        && slot.key.exact == key.exact
        && slot.key.start == key.start
    {
        slot.value.faults += value.faults;
        slot.value.majors += value.majors;
        slot.value.vm_flags |= value.vm_flags;
        return;
    }
    if slot.value.faults != 0 {
        flush_region(
            slot.key.tgid,
            slot.key.exact,
            slot.key.start,
            (slot.value.faults, slot.value.majors),
            slot.value.vm_flags,
        );
    }
    slot.key = key;
    slot.value = value;
}

/// Adds `(faults, majors)` to a region (`kind`: one of
/// [`memlock_trace_common::faults::region_kind`]) in `FAULT_REGIONS`.
#[inline(always)]
pub(super) fn flush_region(
    tgid: u32,
    kind: u32,
    start: u64,
    (faults, majors): (u64, u64),
    vm_flags: u64,
) {
    let key = RegionKey {
        tgid,
        exact: kind,
        start,
    };
    for _ in 0..2 {
        if let Some(value) = FAULT_REGIONS.get_ptr_mut(key) {
            // SAFETY: the shared entry; the map keeps it valid (RCU) while the program runs,
            // even if the LRU evicts the key meanwhile. The flags are or'ed without an atomic
            // (atomic or needs 5.12), and only when a bit is missing: a race can lose a bit
            // the region's next fault sets again.
            unsafe {
                super::add_shared(&raw mut (*value).faults, faults);
                if majors != 0 {
                    super::add_shared(&raw mut (*value).majors, majors);
                }
                if (*value).vm_flags & vm_flags != vm_flags {
                    (*value).vm_flags |= vm_flags;
                }
            }
            return;
        }
        let value = RegionValue {
            faults,
            majors,
            vm_flags,
        };
        if FAULT_REGIONS
            .insert(key, value, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            bump(fault_counter::REGION_INSERTS);
            return;
        }
        // Lost a race with another CPU's insert: add to the entry it made.
    }
    super::update_failed("FAULT_REGIONS");
}

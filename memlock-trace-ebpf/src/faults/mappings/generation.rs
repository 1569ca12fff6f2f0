//! Each traced process's mappings generation: its cached VMAs are those cached at the
//! current one, and a call that may change its mappings bumps it.

use aya_ebpf::{macros::map, maps::Array};

use crate::shared::add_shared;

/// Per process (a slot per tgid, by its low bits), bumped when it may have changed its
/// mappings: only its own cached VMAs are dropped. One generation for all dropped every
/// CPU's cache at every mapping call on the machine (system-wide, ld.so's `mmap`s in each
/// new process walked the tree again for every other process's faults).
#[map]
static FAULT_VMA_GEN: Array<u64> = Array::with_max_entries(GEN_SLOTS, 0);

const GEN_SLOTS: u32 = 4096;

#[inline(always)]
pub(super) fn generation(tgid: u32) -> u64 {
    FAULT_VMA_GEN
        .get(tgid & (GEN_SLOTS - 1))
        .copied()
        .unwrap_or(0)
}

/// The mappings of traced process `tgid` may have changed: drop its VMAs from every CPU's
/// cache (and those of the processes sharing its slot).
#[inline(always)]
pub(in crate::faults) fn changed(tgid: u32) {
    if let Some(generation) = FAULT_VMA_GEN.get_ptr_mut(tgid & (GEN_SLOTS - 1)) {
        // Atomic, so that the value only grows: a lost increment could bring back a value
        // a CPU cached a VMA at.
        add_shared(generation, 1);
    }
}

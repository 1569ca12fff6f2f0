//! Before load: the fault family's globals from this kernel's BTF, and its maps sized: the
//! shared ones by how many processes they must hold, the per-CPU region table for the CPUs.

use anyhow::{Result, anyhow};
use aya::EbpfLoader;
use memlock_trace_common::faults::{
    FAULT_EVENTS_BYTE_SIZE, FaultConfig, MAX_FAULT_HISTS, MAX_FAULT_KEYS, MAX_FAULT_REGIONS,
    REGION_SLOTS, RegionSlot, names, populate,
};

use super::FaultOptions;
use crate::btf::KernelBtf;

/// Without a VMA, faults within 64 KiB are counted together (one region-table slot each).
pub(crate) const REGION_SHIFT: u32 = 16;

/// Slots of the per-CPU region table: [`REGION_SLOTS`], fewer where that would take more
/// than 1 MiB over all CPUs (256 slots at 96 possible CPUs, 1,024 at 32). The slots only
/// batch a CPU's faults before `FAULT_REGIONS`, whose counts are exact either way; 2 MiB
/// (512 slots at 96) left no room in a system-wide session's 32 MiB for the fifth cause of
/// fault time (test:fork_storm on the 96-CPU 5.10 guest: 33,640,448 bytes).
fn region_slots(cpus: usize) -> u32 {
    let fit = entries_within(1 << 20, cpus, size_of::<RegionSlot>(), REGION_SLOTS);
    // A power of two: the programs index with a mask.
    1 << (31 - fit.leading_zeros())
}

/// Entries of a per-CPU map with `value`-byte values that fit `budget` bytes over `cpus`
/// CPUs, between 256 and `most`.
fn entries_within(budget: usize, cpus: usize, value: usize, most: u32) -> u32 {
    u32::try_from(budget / (cpus.max(1) * value))
        .unwrap_or(u32::MAX)
        .clamp(256, most)
}

/// This architecture's numbers for the [`populate`] calls.
pub(super) fn populate_nrs() -> [u32; populate::COUNT] {
    let mut nrs = [u32::MAX; populate::COUNT];
    let known: [(usize, libc::c_long); 12] = [
        (populate::MLOCK, libc::SYS_mlock),
        (populate::MLOCK2, libc::SYS_mlock2),
        (populate::MLOCKALL, libc::SYS_mlockall),
        (populate::MMAP, libc::SYS_mmap),
        (populate::MREMAP, libc::SYS_mremap),
        (populate::BRK, libc::SYS_brk),
        (populate::MADVISE, libc::SYS_madvise),
        (populate::MPROTECT, libc::SYS_mprotect),
        (populate::PKEY_MPROTECT, libc::SYS_pkey_mprotect),
        (populate::REMAP_FILE_PAGES, libc::SYS_remap_file_pages),
        (populate::EXECVE, libc::SYS_execve),
        (populate::EXECVEAT, libc::SYS_execveat),
    ];
    for (index, nr) in known {
        nrs[index] = nr as u32;
    }
    nrs
}

/// Possible CPUs: how many values each per-CPU map holds.
fn possible_cpus() -> Result<usize> {
    Ok(aya::util::nr_cpus()
        .map_err(|(what, e)| anyhow!("{what}: {e}"))?
        .max(1))
}

/// `FAULT_FLAG_*` values of kernels where they are `#define`s, which BTF does not carry:
/// include/linux/mm.h of 5.10 (`#define FAULT_FLAG_TRIED 0x20`, `#define FAULT_FLAG_USER
/// 0x40`, unchanged from 5.7 until `enum fault_flag` replaced the defines with the same
/// values).
const FAULT_FLAG_DEFINES: [(&str, u32); 2] =
    [("FAULT_FLAG_TRIED", 0x20), ("FAULT_FLAG_USER", 0x40)];

/// A fault flag's value: from the kernel's `enum fault_flag` where it has one, else the
/// `#define` of older kernels ([`FAULT_FLAG_DEFINES`]).
fn fault_flag(btf: &KernelBtf, name: &str) -> Result<u32> {
    if btf.has_enum("fault_flag") {
        return Ok(btf.enum_value("fault_flag", name)? as u32);
    }
    FAULT_FLAG_DEFINES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, value)| value)
        .ok_or_else(|| anyhow!("no known value of {name} for a kernel without enum fault_flag"))
}

/// The `FAULT_CONFIG` global for this kernel: result and flag bits from its BTF.
pub fn config(btf: &KernelBtf, options: &FaultOptions) -> Result<FaultConfig> {
    let cpus = possible_cpus()?;
    let reason = |member: &str| btf.enum_value("vm_fault_reason", member);
    let error = [
        "VM_FAULT_OOM",
        "VM_FAULT_SIGBUS",
        "VM_FAULT_SIGSEGV",
        "VM_FAULT_HWPOISON",
        "VM_FAULT_HWPOISON_LARGE",
        "VM_FAULT_FALLBACK",
    ]
    .iter()
    .try_fold(0u64, |acc, m| reason(m).map(|v| acc | v))?;
    Ok(FaultConfig {
        per_thread: u32::from(options.per_thread),
        latency: u32::from(options.latency),
        events: u32::from(options.events),
        sample_every: options.sample_every.max(1),
        vm_fault_major: reason("VM_FAULT_MAJOR")? as u32,
        vm_fault_retry: reason("VM_FAULT_RETRY")? as u32,
        vm_fault_error: error as u32,
        fault_flag_tried: fault_flag(btf, "FAULT_FLAG_TRIED")?,
        fault_flag_user: fault_flag(btf, "FAULT_FLAG_USER")?,
        vm_fault_oom: reason("VM_FAULT_OOM")? as u32,
        nr_cpus: u32::try_from(cpus).unwrap_or(u32::MAX),
        stacks: u32::from(options.stacks),
        vma_vm_flags: btf.field_offset("vm_area_struct", "vm_flags")?,
        vma_vm_start: btf.field_offset("vm_area_struct", "vm_start")?,
        region_shift: REGION_SHIFT,
        region_slots_mask: region_slots(cpus) - 1,
        populate_nrs: populate_nrs(),
        // Read by the tracepoint set's programs only: the others count every fault.
        counted_by_perf: u32::from(options.samples_latency()),
        latency_period: options.latency_period(),
        task_pid: btf.field_offset("task_struct", "pid")?,
    })
}

/// Per-process entries when a handful of processes is traced (a command or `-p`, without
/// their children or per-thread keys): LRU, so a long `-p` list evicts and counts.
const FEW_PROCESS_KEYS: u32 = 1024;
/// Regions then: 1 GiB of distinct 64 KiB regions before the least recently faulted is
/// evicted (and counted); the fault counts themselves never depend on it.
const FEW_PROCESS_REGIONS: u32 = 16384;

/// Sets the fault globals and sizes the maps before load. The per-process maps are shared
/// by the CPUs, so their memory does not grow with them; with `few_processes` they are
/// smaller still (a command or `-p` needs a few entries). The fault event ring is a page
/// unless `--events` streams into it.
pub fn prepare_loader<'a>(
    loader: &mut EbpfLoader<'a>,
    config: &'a FaultConfig,
    few_processes: bool,
) -> Result<()> {
    let cpus = possible_cpus()?;
    let (keys, hists, regions) = if few_processes {
        (FEW_PROCESS_KEYS, FEW_PROCESS_KEYS, FEW_PROCESS_REGIONS)
    } else {
        (MAX_FAULT_KEYS, MAX_FAULT_HISTS, MAX_FAULT_REGIONS)
    };
    let events_ring = if config.events != 0 {
        FAULT_EVENTS_BYTE_SIZE
    } else {
        // SAFETY: sysconf has no preconditions.
        u32::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
    };
    loader
        .override_global(names::FAULT_CONFIG, config, true)
        // Every process alive or exited since its entry was last used needs one: a fork
        // storm of 10,000 processes (`stress-ng --fork 2 --fork-ops 10000`) lost 177,000 of
        // 614,000 faults to 7,046 evictions with 3,066 entries.
        .map_max_entries(names::FAULT_STATS, keys)
        .map_max_entries(names::FAULT_HIST, hists)
        .map_max_entries(names::FAULT_REGION_SLOTS, region_slots(cpus))
        .map_max_entries(names::FAULT_REGIONS, regions)
        .map_max_entries(names::FAULT_EVENTS, events_ring);
    Ok(())
}

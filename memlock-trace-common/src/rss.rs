//! The base pages a process has mapped, from the kernel's own per-mm RSS counters, read at
//! an mlock-family call's entry and exit: what the call populated in base pages, whatever
//! the page size (a THP fault maps 512 pages, a hugetlb fault 512 or 262,144), where the
//! task's fault counters count one per fault.
//!
//! Two layouts (include/linux/mm_types.h): up to 6.1 `mm->rss_stat.count[]` are atomics
//! and, with `SPLIT_RSS_COUNTING`, each task caches its own changes in
//! `task->rss_stat.count[]` (flushed every 64 faults), so the calling thread's sum of the
//! two is exact; from 6.2 `mm->rss_stat[]` are `percpu_counter`s, exact only as `count`
//! plus every CPU's share. hugetlb pages are counted apart, in `mm->hugetlb_usage`.

/// Names of the map and global the loader looks up.
pub mod names {
    pub const RSS_CONFIG: &str = "RSS_CONFIG";
    pub const RSS_CPU_OFFSETS: &str = "RSS_CPU_OFFSETS";
}

/// How this kernel keeps `mm->rss_stat`.
pub mod layout {
    /// Unknown: the figure is not read (the fault count stands in).
    pub const NONE: u32 = 0;
    /// `atomic_long_t count[]` (to 6.1), plus the task's cache when `task_rss_count` is set.
    pub const ATOMIC: u32 = 1;
    /// `struct percpu_counter rss_stat[]` (6.2 on).
    pub const PERCPU: u32 = 2;
}

/// Most CPUs whose per-CPU shares are summed; a kernel with more possible CPUs gets
/// [`layout::NONE`].
pub const MAX_CPUS: u32 = 1024;

/// The `RSS_CPU_OFFSETS` value of a possible CPU that was not online when the tracer
/// started (its offset cannot be learnt, and it holds no share): skipped.
pub const CPU_OFFLINE: u64 = u64::MAX;

/// The `mm_rss_stat` members that are pages mapped: `MM_FILEPAGES`, `MM_ANONPAGES`,
/// `MM_SHMEMPAGES` (`MM_SWAPENTS`, 2, counts swap entries, not pages). The same numbers
/// since 4.5.
pub const MAPPED_MEMBERS: [u32; 3] = [0, 1, 3];

/// The `RSS_CONFIG` global: offsets from the running kernel's BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RssConfig {
    /// One of [`layout`].
    pub layout: u32,
    /// Possible CPUs (`nr_cpu_ids`): how many per-CPU shares a sum reads.
    pub nr_cpus: u32,
    /// `task_struct.mm`
    pub task_mm: u32,
    /// `mm_struct.rss_stat`
    pub mm_rss_stat: u32,
    /// Bytes per counter: 8 (`atomic_long_t`) or `sizeof(struct percpu_counter)`.
    pub counter_size: u32,
    /// [`layout::PERCPU`]: `percpu_counter.count` and `.counters` (the per-CPU `s32`s).
    pub counter_count: u32,
    pub counter_counters: u32,
    /// [`layout::ATOMIC`] with `SPLIT_RSS_COUNTING`: `task_struct.rss_stat.count`, else 0.
    pub task_rss_count: u32,
    /// `mm_struct.hugetlb_usage` (base pages of hugetlb mappings), 0 without
    /// `CONFIG_HUGETLB_PAGE`.
    pub mm_hugetlb_usage: u32,
    /// `bpf_array.pptrs`: where a per-CPU array keeps its per-CPU pointers, to learn each
    /// CPU's per-CPU offset from one of the object's own maps.
    pub bpf_array_pptrs: u32,
}

impl RssConfig {
    /// All zero ([`layout::NONE`]): what the programs see if the loader sets nothing.
    // SAFETY: every field is an integer (or a struct of integers), for which all-zero
    // bytes are a value (the crate's tests check it equals the derived `Default`).
    pub const ZERO: Self = unsafe { core::mem::zeroed() };
}

#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers: every bit pattern is valid.
unsafe impl aya::Pod for RssConfig {}

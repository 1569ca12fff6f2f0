//! The base pages the current process has mapped, summed from the kernel's RSS counters
//! (see [`memlock_trace_common::rss`]). Read at an mlock-family call's entry and exit only.
//!
//! From 6.2 each counter is a `percpu_counter`: `count` plus one `s32` share per CPU,
//! at `counters + __per_cpu_offset[cpu]`. Kernels without `CONFIG_KALLSYMS_ALL` do not
//! name `__per_cpu_offset`, so each CPU's offset is learnt here from the object's own
//! per-CPU array: where the kernel says this CPU's value is, less the per-CPU pointer the
//! array keeps (`bpf_array.pptrs[0]`). The loader runs [`rss_learn_cpu`] once on every CPU
//! (`BPF_PROG_TEST_RUN` with `BPF_F_TEST_RUN_ON_CPU`) before the calls are traced.

use aya_ebpf::{
    Global,
    helpers::bpf_probe_read_kernel,
    macros::{map, raw_tracepoint},
    maps::{Array, PerCpuArray},
    programs::RawTracePointContext,
};
use memlock_trace_common::rss::{CPU_OFFLINE, MAPPED_MEMBERS, MAX_CPUS, RssConfig, layout};

use crate::shared::{current_task, read_kernel, this_cpu};

/// Set by the loader before load.
#[unsafe(no_mangle)]
static RSS_CONFIG: Global<RssConfig> = Global::new(RssConfig::ZERO);

/// Each CPU's per-CPU offset (`__per_cpu_offset[cpu]`), 0 until learnt.
#[map]
static RSS_CPU_OFFSETS: Array<u64> = Array::with_max_entries(MAX_CPUS, 0);

/// A per-CPU array whose addresses give this CPU's offset away; its value is unused.
#[map]
static RSS_CPU_PROBE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// One field of [`RSS_CONFIG`], read alone (a whole-struct load would take stack).
macro_rules! rss_config {
    ($field:ident) => {
        // SAFETY: `Global` is a transparent wrapper of an initialised value in a static,
        // which outlives the program.
        unsafe {
            core::ptr::read_volatile(
                &raw const (*(&raw const RSS_CONFIG).cast::<RssConfig>()).$field,
            )
        }
    };
}

/// A pointer's value as a plain number: copied through a helper, so the verifier sees a
/// scalar (the tracer is privileged: `allow_ptr_leaks`), not a map pointer it would keep
/// from arithmetic.
#[inline(always)]
fn address_of<T>(pointer: *const T) -> u64 {
    let value = pointer as u64;
    // SAFETY: reads the local `value` back, 8 bytes of this program's own stack.
    unsafe { bpf_probe_read_kernel(&raw const value) }.unwrap_or(0)
}

/// Never attached: the loader runs it on each CPU in turn (`BPF_PROG_TEST_RUN`), so that
/// it learns that CPU's per-CPU offset.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn rss_learn_cpu(_ctx: RawTracePointContext) -> i32 {
    learn_cpu_offset();
    0
}

/// Learns the per-CPU offset of the CPU this runs on.
#[inline(always)]
fn learn_cpu_offset() {
    if rss_config!(layout) != layout::PERCPU {
        return;
    }
    let cpu = this_cpu();
    let Some(slot) = RSS_CPU_OFFSETS.get_ptr_mut(cpu) else {
        return;
    };
    let Some(here) = RSS_CPU_PROBE.get_ptr(0) else {
        return;
    };
    let array = address_of(&raw const RSS_CPU_PROBE);
    let pptr: u64 = read_kernel(array, rss_config!(bpf_array_pptrs));
    let here = address_of(here);
    if pptr != 0 && here != 0 {
        // SAFETY: a valid pointer to an element of an array map; only this CPU's run writes it.
        unsafe { *slot = here.wrapping_sub(pptr) };
    }
}

/// [`mapped_pages`], or [`UNKNOWN_PAGES`]: a plain number, passed in a register.
#[inline(always)]
pub fn mapped_pages_or_unknown() -> i64 {
    mapped_pages().unwrap_or(UNKNOWN_PAGES)
}

/// The figure of [`mapped_pages_or_unknown`] when it could not be read.
pub const UNKNOWN_PAGES: i64 = i64::MIN;

/// The base pages the current process has mapped (file, anonymous, shmem and hugetlb);
/// `None` if this kernel's counters are unknown or a CPU's offset is not learnt yet.
#[inline(never)]
fn mapped_pages() -> Option<i64> {
    let task = current_task();
    let mm: u64 = read_kernel(task, rss_config!(task_mm));
    if mm == 0 {
        return None;
    }
    let stat = mm + u64::from(rss_config!(mm_rss_stat));
    let size = u64::from(rss_config!(counter_size));
    let mut pages: i64 = match rss_config!(mm_hugetlb_usage) {
        0 => 0,
        offset => read_kernel(mm, offset),
    };
    match rss_config!(layout) {
        layout::ATOMIC => {
            let task_count = rss_config!(task_rss_count);
            for member in MAPPED_MEMBERS {
                pages += read_kernel::<i64>(stat + u64::from(member) * size, 0);
                if task_count != 0 {
                    pages += i64::from(read_kernel::<i32>(task, task_count + 4 * member));
                }
            }
        }
        layout::PERCPU => {
            let mut shares = [0u64; MAPPED_MEMBERS.len()];
            for (i, member) in MAPPED_MEMBERS.iter().enumerate() {
                let counter = stat + u64::from(*member) * size;
                pages += read_kernel::<i64>(counter, rss_config!(counter_count));
                shares[i] = read_kernel(counter, rss_config!(counter_counters));
            }
            let nr_cpus = rss_config!(nr_cpus);
            for cpu in 0..MAX_CPUS {
                if cpu >= nr_cpus {
                    break;
                }
                let offset = *RSS_CPU_OFFSETS.get(cpu)?;
                match offset {
                    // Not learnt: the sum would be short of this CPU's share.
                    0 => return None,
                    // Not online when the tracer started: no share (a CPU's is folded
                    // into `count` when it goes offline).
                    CPU_OFFLINE => continue,
                    _ => {}
                }
                for share in shares {
                    pages += i64::from(read_kernel::<i32>(share.wrapping_add(offset), 0));
                }
            }
        }
        _ => return None,
    }
    Some(pages)
}

//! The contract's offset structs filled from the running kernel's BTF: the fields the
//! syscall programs read ([`KernelOffsets`]), the RSS counters ([`RssConfig`]) and the
//! in-kernel VMA lookups ([`MappingConfig`]).

use anyhow::Result;
use memlock_trace_common::{
    KernelOffsets, lock_context,
    mapping::MappingConfig,
    rss::{self, RssConfig},
};

use super::KernelBtf;

impl KernelBtf {
    /// The fields the mlock-family programs read ([`KernelOffsets`]); an error names the
    /// first required field this kernel lacks.
    pub fn offsets(&self) -> Result<KernelOffsets> {
        let f = |name: &str, field: &str| self.field_offset(name, field);
        // Why a lock failed is extra: a kernel without one of these fields still traces,
        // with that figure unknown (offset 0; a pointer and the field behind it go together).
        let optional = |name: &str, field: &str| f(name, field).unwrap_or(0);
        let both = |a: u32, b: u32| if a == 0 || b == 0 { (0, 0) } else { (a, b) };
        let rlim = f("signal_struct", "rlim").map_or(0, |rlim| {
            rlim + lock_context::RLIMIT_MEMLOCK * lock_context::RLIMIT_SIZE
        });
        let (task_signal, signal_rlim_memlock) = both(optional("task_struct", "signal"), rlim);
        let (task_cred, cred_cap_effective) = both(
            optional("task_struct", "cred"),
            optional("cred", "cap_effective"),
        );
        Ok(KernelOffsets {
            task_mm: f("task_struct", "mm")?,
            task_min_flt: f("task_struct", "min_flt")?,
            task_maj_flt: f("task_struct", "maj_flt")?,
            mm_locked_vm: f("mm_struct", "locked_vm")?,
            mm_map_count: f("mm_struct", "map_count")?,
            mm_def_flags: optional("mm_struct", "def_flags"),
            task_signal,
            signal_rlim_memlock,
            task_cred,
            cred_cap_effective,
            mm_total_vm: optional("mm_struct", "total_vm"),
            // x86 and arm64 keep `thread_info` in the task (first, offset 0); the compat
            // field (x86 `status`, arm64 `flags`) is read only when found.
            task_thread_status: match (
                f("task_struct", "thread_info"),
                f("thread_info", crate::arch::COMPAT_FIELD),
            ) {
                (Ok(info), Ok(status)) => info + status,
                _ => 0,
            },
        })
    }

    /// Where this kernel keeps a process's RSS counters (`memlock_trace_common::rss`), for
    /// `nr_cpus` possible CPUs; [`rss::layout::NONE`] if neither layout is there.
    pub fn rss_config(&self, nr_cpus: u32) -> RssConfig {
        self.rss_config_of(nr_cpus).unwrap_or(RssConfig::ZERO)
    }

    fn rss_config_of(&self, nr_cpus: u32) -> Result<RssConfig> {
        let f = |name: &str, field: &str| self.field_offset(name, field);
        let mut config = RssConfig {
            nr_cpus,
            task_mm: f("task_struct", "mm")?,
            mm_rss_stat: f("mm_struct", "rss_stat")?,
            mm_hugetlb_usage: f("mm_struct", "hugetlb_usage").unwrap_or(0),
            ..RssConfig::ZERO
        };
        if let Ok(count) = f("mm_rss_stat", "count") {
            // To 6.1: `struct mm_rss_stat { atomic_long_t count[NR_MM_COUNTERS]; }`.
            config.layout = rss::layout::ATOMIC;
            config.mm_rss_stat += count;
            config.counter_size = 8;
            // `struct task_rss_stat { int events; int count[NR_MM_COUNTERS]; }`, with
            // SPLIT_RSS_COUNTING only.
            if let (Ok(task), Ok(count)) =
                (f("task_struct", "rss_stat"), f("task_rss_stat", "count"))
            {
                config.task_rss_count = task + count;
            }
        } else if nr_cpus <= rss::MAX_CPUS {
            config.layout = rss::layout::PERCPU;
            config.counter_size = self.struct_size("percpu_counter")?;
            config.counter_count = f("percpu_counter", "count")?;
            config.counter_counters = f("percpu_counter", "counters")?;
            config.bpf_array_pptrs = f("bpf_array", "pptrs")?;
        }
        Ok(config)
    }

    /// The offsets the in-kernel VMA lookups read (`memlock_trace_common::mapping`); an
    /// error names the first field this kernel lacks.
    pub fn mapping_config(&self) -> Result<MappingConfig> {
        let f = |name: &str, field: &str| self.field_offset(name, field);
        let vma = |field: &str| f("vm_area_struct", field);
        let mm = |field: &str| f("mm_struct", field);
        let mut config = MappingConfig {
            valid: 1,
            task_mm: f("task_struct", "mm")?,
            vma_start: vma("vm_start")?,
            vma_end: vma("vm_end")?,
            vma_flags: vma("vm_flags")?,
            vma_pgoff: vma("vm_pgoff")?,
            vma_file: vma("vm_file")?,
            vma_mm: vma("vm_mm")?,
            vma_ops: vma("vm_ops")?,
            vma_private_data: vma("vm_private_data")?,
            file_dentry: f("file", "f_path")? + f("path", "dentry")?,
            file_inode: f("file", "f_inode")?,
            dentry_name: f("dentry", "d_name")? + f("qstr", "name")?,
            inode_ino: f("inode", "i_ino")?,
            inode_sb: f("inode", "i_sb")?,
            sb_dev: f("super_block", "s_dev")?,
            sb_magic: f("super_block", "s_magic")?,
            mm_start_brk: mm("start_brk")?,
            mm_brk: mm("brk")?,
            mm_start_stack: mm("start_stack")?,
            ..MappingConfig::ZERO
        };
        // Before 6.1 the VMAs are an rbtree: what the lookups walk without `bpf_find_vma`.
        if let (Ok(mm_rb), Ok(vma_rb), Ok(rb_left), Ok(rb_right)) = (
            mm("mm_rb"),
            vma("vm_rb"),
            f("rb_node", "rb_left"),
            f("rb_node", "rb_right"),
        ) {
            config.rb_valid = 1;
            config.mm_rb = mm_rb;
            config.vma_rb = vma_rb;
            config.rb_left = rb_left;
            config.rb_right = rb_right;
        }
        // From 6.1 a maple tree: walked where `bpf_find_vma` cannot run (interrupts off).
        if let Ok(maple) = self.maple_offsets() {
            config = maple(config);
        }
        Ok(config)
    }

    /// The maple tree fields the lockless VMA walk reads (6.1+): offsets in words from a
    /// node's start, and the node types.
    fn maple_offsets(&self) -> Result<impl Fn(MappingConfig) -> MappingConfig> {
        let f = |name: &str, field: &str| self.field_offset(name, field);
        let word = |name: &str, field: &str| f(name, field).map(|o| o / 8);
        let kind = |member: &str| self.enum_value("maple_type", member).map(|v| v as u32);
        let (mm_mt_root, range_pivot, range_slot, arange_pivot, arange_slot) = (
            f("mm_struct", "mm_mt")? + f("maple_tree", "ma_root")?,
            word("maple_range_64", "pivot")?,
            word("maple_range_64", "slot")?,
            word("maple_arange_64", "pivot")?,
            word("maple_arange_64", "slot")?,
        );
        let (leaf, range, arange) = (
            kind("maple_leaf_64")?,
            kind("maple_range_64")?,
            kind("maple_arange_64")?,
        );
        Ok(move |config| MappingConfig {
            maple_valid: 1,
            mm_mt_root,
            range_pivot,
            range_slot,
            arange_pivot,
            arange_slot,
            maple_leaf_64: leaf,
            maple_range_64: range,
            maple_arange_64: arange,
            ..config
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_resolve_from_running_kernel() {
        let btf = KernelBtf::load().expect("kernel BTF");
        let off = btf.offsets().expect("offsets");
        // min_flt and maj_flt are adjacent `unsigned long`s in task_struct.
        assert_eq!(off.task_maj_flt, off.task_min_flt + 8, "{off:?}");
        assert!(off.mm_locked_vm > 0 && off.mm_map_count > 0, "{off:?}");
        // Every kernel this runs on has them, none first in its struct.
        assert!(
            off.task_signal > 0 && off.task_cred > 0 && off.mm_total_vm > 0,
            "{off:?}"
        );
        assert!(off.cred_cap_effective > 0, "{off:?}");
        assert_eq!(
            off.signal_rlim_memlock,
            btf.field_offset("signal_struct", "rlim").unwrap() + 8 * 16,
            "rlim[RLIMIT_MEMLOCK].rlim_cur"
        );
        assert!(btf.field_offset("task_struct", "no_such_field").is_err());
    }

    #[test]
    fn mapping_offsets_resolve_from_running_kernel() {
        let btf = KernelBtf::load().expect("kernel BTF");
        let c = btf.mapping_config().expect("mapping offsets");
        // vm_start and vm_end are adjacent `unsigned long`s in every kernel.
        assert_eq!(c.vma_end, c.vma_start + 8, "{c:?}");
        assert_eq!(c.mm_brk, c.mm_start_brk + 8, "{c:?}");
        // Before 6.1 the rbtree, from 5.17 bpf_find_vma: every kernel has one of the two.
        assert!(c.rb_valid == 1 || btf.has_find_vma(), "{c:?}");
    }
}

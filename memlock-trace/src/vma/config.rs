//! The VMA family's offsets for this kernel (`VMA_CONFIG`), from its BTF: the maple tree
//! (6.1+) with `bpf_find_vma`, or the rbtree and list the snapshots walk before it; and
//! where neither is there, what the kernel lacks, named before any program is loaded.

use anyhow::{Context as _, Result, bail};
use memlock_trace_common::vma::{VmaConfig, VmaOffsets};

use crate::btf::KernelBtf;

/// Whether this kernel keeps VMAs in an rbtree and list (before 6.1) rather than a maple tree.
pub(super) fn walks_rbtree(btf: &KernelBtf) -> bool {
    !btf.has_maple_tree()
}

/// The `VMA_CONFIG` global for this kernel.
pub fn config(btf: &KernelBtf, all_stores: bool) -> Result<VmaConfig> {
    // The snapshots read VMAs with bpf_find_vma and stores come from maple_tree:ma_write;
    // 5.10 (Debian 11, Amazon Linux 2) has neither. Name what is missing rather than let a
    // program fail verification.
    // Without a maple tree (before 6.1), the snapshots walk the VMA rbtree and list instead.
    if walks_rbtree(btf) {
        let rb = (|| -> Result<VmaOffsets> {
            Ok(VmaOffsets {
                task_mm: btf.field_offset("task_struct", "mm")?,
                vma_start: btf.field_offset("vm_area_struct", "vm_start")?,
                vma_end: btf.field_offset("vm_area_struct", "vm_end")?,
                vma_flags: btf.field_offset("vm_area_struct", "vm_flags")?,
                rb_walk: 1,
                mm_rb: btf.field_offset("mm_struct", "mm_rb")?,
                vma_rb: btf.field_offset("vm_area_struct", "vm_rb")?,
                vma_next: btf.field_offset("vm_area_struct", "vm_next")?,
                rb_left: btf.field_offset("rb_node", "rb_left")?,
                rb_right: btf.field_offset("rb_node", "rb_right")?,
                // mlockall/munlockall totals follow the list; without it: not measured.
                mm_mmap: btf.field_offset("mm_struct", "mmap").unwrap_or(0),
                list_walk: u32::from(btf.field_offset("mm_struct", "mmap").is_ok()),
                ..VmaConfig::ZERO.offsets
            })
        })();
        let offsets = rb.context(
            "this kernel lacks the maple tree and maple_tree:ma_write (6.1), the \
             bpf_find_vma helper (5.17), and the rbtree fields the fallback walks",
        )?;
        return Ok(VmaConfig {
            offsets,
            all_stores: u32::from(all_stores),
            _pad: 0,
        });
    }
    if !btf.has_enum_member("bpf_func_id", "BPF_FUNC_find_vma") {
        bail!("this kernel lacks the bpf_find_vma helper (5.17) the snapshots read VMAs with");
    }
    let mut offsets = VmaOffsets {
        task_mm: btf.field_offset("task_struct", "mm")?,
        mm_mt: btf.field_offset("mm_struct", "mm_mt").context(
            "this kernel keeps VMAs in no maple tree (before 6.1): VMA tracing needs 6.1 or later",
        )?,
        vma_start: btf.field_offset("vm_area_struct", "vm_start")?,
        vma_end: btf.field_offset("vm_area_struct", "vm_end")?,
        vma_flags: btf.field_offset("vm_area_struct", "vm_flags")?,
        mas_tree: btf.field_offset("ma_state", "tree")?,
        mas_index: btf.field_offset("ma_state", "index")?,
        mas_last: btf.field_offset("ma_state", "last")?,
        ..VmaConfig::ZERO.offsets
    };
    maple_offsets(btf, &mut offsets);
    Ok(VmaConfig {
        offsets,
        all_stores: u32::from(all_stores),
        _pad: 0,
    })
}

/// The maple tree fields the `mlockall`/`munlockall` walk reads; without them (or with a
/// layout other than the one the walk knows: `gap[10]` then `meta` after an `arange_64`'s
/// slots, `meta` in place of a `range_64`'s last slot) those calls' VMA totals are reported as
/// not measured.
fn maple_offsets(btf: &KernelBtf, offsets: &mut VmaOffsets) {
    let f = |s, m| btf.field_offset(s, m);
    let (Ok(root), Ok(rp), Ok(rs), Ok(rm), Ok(ap), Ok(asl), Ok(am)) = (
        f("maple_tree", "ma_root"),
        f("maple_range_64", "pivot"),
        f("maple_range_64", "slot"),
        f("maple_range_64", "meta"),
        f("maple_arange_64", "pivot"),
        f("maple_arange_64", "slot"),
        f("maple_arange_64", "meta"),
    ) else {
        return;
    };
    if rm != rs + 15 * 8 || am != asl + 20 * 8 {
        return;
    }
    offsets.mt_root = root;
    offsets.mr64_pivot = rp;
    offsets.mr64_slot = rs;
    offsets.ma64_pivot = ap;
    offsets.ma64_slot = asl;
    offsets.mt_walk = 1;
}

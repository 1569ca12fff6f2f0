//! fentry/fexit on the kernel's own VMA functions: which of the split/merge/modify
//! functions this kernel has, which event slots each one's signature fills, and attaching
//! a program pair to each until the kernel refuses trampolines.

use anyhow::{Result, anyhow};
use aya::{
    Btf, Ebpf,
    maps::Array,
    programs::{FEntry, FExit, Program, ProgramError},
};
use memlock_trace_common::vma::{FN_SLOTS, HookSpec, MAX_FN_HOOKS, SlotSpec, VMA_HOOKS, slot};

use super::hooks::{HookedFunction, VmaHooks};
use crate::{
    btf::{KernelBtf, Signature, TypeShape},
    object::{Refused, is_permission_error},
};

/// The kernel functions that split, merge or re-flag VMAs, across versions: 6.1 has
/// `__split_vma`/`split_vma`/`vma_merge`/`mlock_fixup`; 6.12+ replaced `vma_merge` with
/// `vma_merge_new_range`/`vma_merge_existing_range`/`commit_merge` and added
/// `vma_modify_flags`. Whatever this kernel's BTF lists is hooked, in this order.
pub const CANDIDATES: [&str; 9] = [
    "mlock_fixup",
    "vma_modify_flags",
    "__split_vma",
    "split_vma",
    "vma_merge",
    "vma_merge_new_range",
    "vma_merge_existing_range",
    "commit_merge",
    "vma_expand",
];

/// Which event slots to fill for a function with this signature: its VMA arguments, the VMA
/// behind a `struct vm_area_struct **`, the three VMAs of a `struct vma_merge_struct *`, and a
/// returned VMA.
pub fn hook_spec(btf: &KernelBtf, sig: &Signature) -> (HookSpec, Vec<String>) {
    let mut wanted: Vec<(SlotSpec, String)> = Vec::new();
    let vma_slot = |source, arg: usize, deref, offset| SlotSpec {
        source,
        arg: arg as u8,
        deref,
        read_as: slot::AS_VMA,
        offset,
    };
    for (i, (name, shape)) in sig
        .params
        .iter()
        .enumerate()
        .take(memlock_trace_common::vma::FN_ARGS)
    {
        match shape {
            TypeShape::PtrTo(s) if s == "vm_area_struct" => {
                wanted.push((vma_slot(slot::ARG, i, 0, 0), name.clone()));
            }
            TypeShape::PtrPtrTo(s) if s == "vm_area_struct" => {
                wanted.push((vma_slot(slot::ARG, i, 1, 0), format!("*{name}")));
            }
            TypeShape::PtrTo(s) if s == "vma_merge_struct" => {
                // `middle` was `vma` before 6.14.
                for field in ["prev", "middle", "vma", "next"] {
                    if let Ok(offset) = btf.field_offset("vma_merge_struct", field) {
                        wanted.push((
                            vma_slot(slot::ARG, i, 1, offset),
                            format!("{name}->{field}"),
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    if matches!(&sig.ret, TypeShape::PtrTo(s) if s == "vm_area_struct") {
        wanted.push((vma_slot(slot::RET, 0, 0, 0), "ret".into()));
    }
    let mut spec = HookSpec::default();
    let mut labels = Vec::new();
    for (i, (slot_spec, label)) in wanted.into_iter().take(FN_SLOTS).enumerate() {
        spec.slots[i] = slot_spec;
        labels.push(label);
    }
    (spec, labels)
}

/// fentry/fexit on each candidate this kernel has, until the kernel says no to
/// trampolines altogether (then `ma_write` and the snapshots carry on alone).
pub(super) fn attach_functions(
    ebpf: &mut Ebpf,
    btf: &KernelBtf,
    aya_btf: &Btf,
    hooks: &mut VmaHooks,
) -> Result<()> {
    // Taken out of the object so the programs can be loaded while we hold it; the
    // programs referenced its fd when the object was loaded.
    let mut specs: Array<_, HookSpec> = Array::try_from(
        ebpf.take_map(VMA_HOOKS)
            .ok_or_else(|| anyhow!("map {VMA_HOOKS} missing from the eBPF object"))?,
    )?;
    let mut found = Vec::new();
    for name in CANDIDATES {
        match btf.function_signature(name)? {
            Some(sig) => found.push((name, sig)),
            None => hooks.missing.push(name),
        }
    }
    let mut index = 0usize;
    for (name, sig) in found {
        if index == MAX_FN_HOOKS {
            break;
        }
        let (spec, slots) = hook_spec(btf, &sig);
        specs.set(index as u32, spec, 0)?;
        let entry = format!("vma_fn{index}_entry");
        let exit = format!("vma_fn{index}_exit");
        let result = attach_pair(ebpf, aya_btf, name, [&entry, &exit]);
        match result {
            Ok(()) => {
                hooks.functions.push(HookedFunction {
                    name: name.to_string(),
                    params: sig.params.iter().map(|(n, _)| n.clone()).collect(),
                    slots,
                });
                index += 1;
            }
            Err(error) => {
                let mut refused = Refused::of_program(&error);
                // Loaded but not attached: give the kernel its memory back.
                if let Some(Ok(program)) = ebpf.program_mut(&entry).map(<&mut FEntry>::try_from) {
                    let _ = program.unload();
                }
                if let Some(Ok(program)) = ebpf.program_mut(&exit).map(<&mut FExit>::try_from) {
                    let _ = program.unload();
                }
                if hooks.functions.is_empty() && is_permission_error(&error) {
                    // EPERM on the first: trampolines are forbidden here, not this function.
                    refused.reason = format!("{} (fentry on {name})", refused.reason);
                    hooks.fentry_refused = Some(refused);
                    return Ok(());
                }
                hooks.refused.push((name.to_string(), refused));
                // The programs of this index are spoiled (loaded or not): use the next pair.
                index += 1;
            }
        }
    }
    Ok(())
}

/// Loads the fentry program `entry` and the fexit program `exit` on `function`, and
/// attaches them.
fn attach_pair(
    ebpf: &mut Ebpf,
    aya_btf: &Btf,
    function: &str,
    [entry, exit]: [&str; 2],
) -> Result<(), ProgramError> {
    let fentry: &mut FEntry = program(ebpf, entry)?;
    fentry.load(function, aya_btf)?;
    fentry.attach()?;
    let fexit: &mut FExit = program(ebpf, exit)?;
    fexit.load(function, aya_btf)?;
    fexit.attach()?;
    Ok(())
}

/// The object's program `name`, as its kind.
fn program<'a, P>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut P, ProgramError>
where
    &'a mut P: TryFrom<&'a mut Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(ProgramError::NotLoaded)?
        .try_into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_specs_follow_the_running_kernels_signatures() {
        let btf = KernelBtf::load().expect("kernel BTF");
        let mut seen = 0;
        for name in CANDIDATES {
            let Some(sig) = btf.function_signature(name).expect("BTF") else {
                continue;
            };
            seen += 1;
            let (spec, labels) = hook_spec(&btf, &sig);
            let used = spec.slots.iter().filter(|s| s.source != slot::NONE).count();
            assert_eq!(used, labels.len(), "{name}: {labels:?}");
            // Every candidate takes or returns a VMA (directly or through vma_merge_struct).
            assert!(used > 0, "{name} {sig:?}");
            if name == "__split_vma" {
                // (vmi, vma, addr, new_below) since 6.3; (mm, vma, addr, new_below) before.
                let vma_arg = sig
                    .params
                    .iter()
                    .position(|(n, _)| n == "vma")
                    .expect("vma param");
                assert_eq!(labels, ["vma"]);
                assert_eq!(
                    spec.slots[0],
                    SlotSpec {
                        source: slot::ARG,
                        arg: vma_arg as u8,
                        deref: 0,
                        read_as: slot::AS_VMA,
                        offset: 0
                    }
                );
            }
        }
        assert!(seen > 0, "none of {CANDIDATES:?} in this kernel's BTF");
        assert!(
            btf.function_signature("no_such_function_xyz")
                .unwrap()
                .is_none()
        );
    }
}

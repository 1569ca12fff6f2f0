//! Loading the VMA family: snapshots at mlock-family entry and exit, the
//! `maple_tree:ma_write` tp_btf, and fentry/fexit on whichever of the kernel's
//! split/merge/modify functions this kernel has and allows.

use std::fmt::Write as _;

use anyhow::{Result, anyhow};
use aya::{
    Btf, Ebpf,
    maps::Array,
    programs::{BtfTracePoint, FEntry, FExit, ProgramError},
};
use memlock_trace_common::{
    syscall_hooks::hook,
    vma::{FN_SLOTS, HookSpec, MAX_FN_HOOKS, SlotSpec, VMA_HOOKS, slot},
};
use serde::Serialize;

use super::config::walks_rbtree;
use crate::{
    btf::{KernelBtf, Signature, TypeShape},
    event::Syscall,
    object::{
        AttachContext, HookFamily, HookLine, Refused, SyscallEdge, hook_refused,
        is_permission_error,
    },
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

/// The hook set the VMA family uses on this kernel, and why.
#[derive(Clone, Debug, Default, Serialize)]
pub struct VmaHooks {
    /// Functions hooked with fentry/fexit; the index is the event's `hook` number.
    pub functions: Vec<HookedFunction>,
    /// Why fentry/fexit is not used at all, when the kernel refused it.
    pub fentry_refused: Option<Refused>,
    /// Candidates this kernel's BTF does not have (renamed, removed or inlined).
    pub missing: Vec<&'static str>,
    /// Candidates the kernel refused one by one: (function, reason).
    pub refused: Vec<(String, Refused)>,
    /// Snapshots walk the VMA rbtree and list: a kernel before 6.1 (no maple tree, so no
    /// `maple_tree:ma_write` stores either).
    pub rb_walk: bool,
}

/// One hooked kernel function and what its event slots hold.
#[derive(Clone, Debug, Serialize)]
pub struct HookedFunction {
    pub name: String,
    /// Parameter names, in order (the event's `args`).
    pub params: Vec<String>,
    /// Label of each used event slot, e.g. `vma`, `*prev`, `vmg->middle`, `ret`.
    pub slots: Vec<String>,
}

impl HookFamily for VmaHooks {
    const NAME: &'static str = "vma";
    type Options = ();

    /// Attaches the VMA family; fails only if the snapshots or `ma_write` cannot be used.
    fn attach(cx: &mut AttachContext<'_>, (): &()) -> Result<Self> {
        let rb_walk = walks_rbtree(cx.btf);
        let (enter, exit) = if rb_walk {
            (hook::VMA_ENTER_RB, hook::VMA_EXIT_RB)
        } else {
            (hook::VMA_ENTER, hook::VMA_EXIT)
        };
        let nrs = Syscall::ALL.map(Syscall::nr);
        cx.syscall_hook(SyscallEdge::Enter, enter, &nrs)?;
        cx.syscall_hook(SyscallEdge::Exit, exit, &nrs)?;

        let btf = cx.btf;
        let (ebpf, aya_btf) = cx.ebpf_and_btf()?;
        let mut hooks = VmaHooks {
            rb_walk,
            ..VmaHooks::default()
        };
        if !btf.has_enum_member("bpf_func_id", "BPF_FUNC_get_func_arg") {
            // The function programs read their arguments with it (5.17).
            hooks.fentry_refused = Some(Refused::lacking(
                "this kernel has no bpf_get_func_arg helper",
            ));
        }
        if rb_walk {
            // No maple tree, so no ma_write; the function programs need 5.17 helpers.
            if hooks.fentry_refused.is_none() {
                attach_functions(ebpf, btf, aya_btf, &mut hooks)?;
            }
            return Ok(hooks);
        }
        let ma_write: &mut BtfTracePoint = ebpf
            .program_mut("vma_ma_write")
            .ok_or_else(|| anyhow!("program vma_ma_write missing from the eBPF object"))?
            .try_into()?;
        ma_write
            .load("ma_write", aya_btf)
            .map_err(|e| hook_refused("vma_ma_write", "tp_btf", e))?;
        ma_write
            .attach()
            .map_err(|e| hook_refused("vma_ma_write", "tp_btf", e))?;

        if hooks.fentry_refused.is_none() {
            attach_functions(ebpf, btf, aya_btf, &mut hooks)?;
        }
        Ok(hooks)
    }

    /// One line for the user: which hooks, and why not the others.
    fn hook_line(&self) -> HookLine {
        let mut out = String::new();
        if !self.functions.is_empty() {
            let names: Vec<&str> = self.functions.iter().map(|f| f.name.as_str()).collect();
            let _ = write!(out, "fentry+fexit {} + ", names.join(", "));
        }
        out.push_str(if self.rb_walk {
            "snapshots at mlock-family entry/exit by a bounded walk of mm->mm_rb and vm_next"
        } else {
            "tp_btf maple_tree:ma_write + bpf_find_vma snapshots at mlock-family entry/exit"
        });
        let brief = out.clone();
        if self.rb_walk {
            out.push_str(" (no maple tree: no maple_tree:ma_write, so VMA stores are not traced)");
        }
        if let Some(refused) = &self.fentry_refused {
            let _ = write!(out, " (fentry refused: {})", refused.reason);
        }
        // One reason per group of functions: a kernel without trampolines for any of them
        // (arm64 before 6.4) refuses each with the same words.
        let mut groups: Vec<(Vec<&str>, &str)> = Vec::new();
        for (name, refused) in &self.refused {
            let reason = refused.reason.as_str();
            match groups.iter_mut().find(|(_, r)| *r == reason) {
                Some((names, _)) => names.push(name),
                None => groups.push((vec![name], reason)),
            }
        }
        let every_one = self.functions.is_empty();
        for (names, reason) in groups {
            let names = names.join(", ");
            let _ = match every_one {
                true => write!(out, " (fentry refused on {names}: {reason})"),
                false => write!(out, " ({names} refused: {reason})"),
            };
        }
        let set = match (self.functions.is_empty(), self.rb_walk) {
            (false, _) => "fentry+fexit",
            (true, true) => "snapshots",
            (true, false) => "tp_btf",
        };
        HookLine::Traced {
            set,
            brief,
            full: out,
            refused: self
                .fentry_refused
                .iter()
                .chain(self.refused.iter().map(|(_, r)| r))
                .cloned()
                .collect(),
        }
    }
}

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
fn attach_functions(
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
        let result = (|| -> Result<(), ProgramError> {
            let program: &mut FEntry = ebpf
                .program_mut(&entry)
                .ok_or(ProgramError::NotLoaded)?
                .try_into()?;
            program.load(name, aya_btf)?;
            program.attach()?;
            let program: &mut FExit = ebpf
                .program_mut(&exit)
                .ok_or(ProgramError::NotLoaded)?
                .try_into()?;
            program.load(name, aya_btf)?;
            program.attach()?;
            Ok(())
        })();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vma::config::config;
    use crate::{
        process::Targets,
        tracer::{Options, Tracer},
    };

    /// Functions refused for one reason are named once with it; where none attached, the
    /// line says fentry was refused.
    #[test]
    fn refusals_are_grouped_by_reason() {
        let refused = |pairs: &[(&str, &str)]| VmaHooks {
            refused: pairs
                .iter()
                .map(|(n, r)| (n.to_string(), Refused::lacking(*r)))
                .collect(),
            ..VmaHooks::default()
        };
        let hooks = refused(&[("mlock_fixup", "ENOTSUPP"), ("split_vma", "ENOTSUPP")]);
        assert!(
            hooks
                .hook_line()
                .full()
                .ends_with(" (fentry refused on mlock_fixup, split_vma: ENOTSUPP)"),
            "{}",
            hooks.hook_line().full()
        );
        let mut hooks = refused(&[("vma_merge", "ENOTSUPP"), ("vma_expand", "EBUSY")]);
        hooks.functions.push(HookedFunction {
            name: "mlock_fixup".into(),
            params: Vec::new(),
            slots: Default::default(),
        });
        assert!(
            hooks
                .hook_line()
                .full()
                .ends_with(" (vma_merge refused: ENOTSUPP) (vma_expand refused: EBUSY)"),
            "{}",
            hooks.hook_line().full()
        );
    }

    /// 6.1's verifier gives up at 1M processed instructions and explores far more paths than
    /// this kernel's; a snapshot program near the limit here would fail there.
    /// Whatever the VMA family can do on this kernel, the tracer starts with the others; a
    /// kernel that cannot trace VMAs (5.10: no maple tree, no bpf_find_vma) says what it
    /// lacks where `probe` shows the hook sets.
    #[test]
    fn the_tracer_starts_whatever_the_vma_family_can_do() {
        let btf = KernelBtf::load().expect("kernel BTF");
        let tracer = Tracer::load(&Targets::Tgids(Vec::new()))
            .expect("the tracer starts on every kernel (needs root)");
        let described = &tracer.hooks[VmaHooks::NAME].full();
        match config(&btf, false) {
            Ok(config) => {
                let hooks = tracer.vma.as_ref().expect(described);
                // Before 6.1 (no maple tree) the snapshots walk the rbtree instead.
                assert_eq!(hooks.rb_walk, walks_rbtree(&btf), "{described}");
                assert_eq!(config.offsets.rb_walk, u32::from(hooks.rb_walk));
            }
            Err(error) => {
                assert!(tracer.vma.is_none(), "{described}");
                assert!(
                    described.starts_with("not traced: ") && described.contains("lacks"),
                    "{described}"
                );
                let error = format!("{error:#}");
                assert!(
                    error.contains("bpf_find_vma") || error.contains("maple tree"),
                    "{error}"
                );
            }
        }
        assert!(
            tracer.fault_hooks.is_some(),
            "faults: {:?}",
            tracer.hooks.get(crate::faults::FaultHooks::NAME)
        );
    }

    #[test]
    fn vma_programs_stay_far_below_the_verifier_limit() {
        let btf = KernelBtf::load().expect("kernel BTF");
        if let Err(lacks) = config(&btf, false) {
            // No VMA program can load here: requiring the family must say why, not load.
            let error = Tracer::load_with(
                &Targets::Tgids(Vec::new()),
                &Options {
                    require_vma: true,
                    ..Options::default()
                },
            )
            .err()
            .expect("requiring the VMA family fails on a kernel that cannot trace VMAs");
            assert!(
                format!("{error:#}").contains(&format!("{lacks:#}")),
                "{error:#}"
            );
            return;
        }
        let tracer = Tracer::load_with(
            &Targets::Tgids(Vec::new()),
            &Options {
                require_vma: true,
                ..Options::default()
            },
        )
        .expect("loading the tracer (needs root)");
        let mut counts = Vec::new();
        for (name, program) in tracer.ebpf.programs().filter(|(n, _)| {
            n.starts_with("vma_") || n.starts_with("syscall_") || n.starts_with("sys_")
        }) {
            if let Ok(info) = program.info() {
                counts.push((
                    name.to_string(),
                    info.verified_instruction_count().unwrap_or(0),
                ));
            }
        }
        eprintln!("verified instructions: {counts:?}");
        // The snapshots at the calls' entry run from mlock's fentry program, or from the
        // syscall dispatcher where fentry is refused.
        let enters = if btf.has_find_vma() {
            ["sys_mlock_enter_fv", "syscall_enter_find_vma"]
        } else {
            ["sys_mlock_enter", "syscall_enter"]
        };
        assert!(
            counts.iter().any(|(n, _)| enters.contains(&n.as_str())),
            "{counts:?}"
        );
        if btf.field_offset("bpf_prog_info", "verified_insns").is_err() {
            // Before 5.16 the kernel does not report the count: loading is all it tells
            // (5.10's verifier limit is the same 1M instructions).
            assert!(counts.iter().all(|(_, c)| *c == 0), "{counts:?}");
            return;
        }
        for (name, count) in &counts {
            // The dispatchers carry every family's syscall handlers (60,000 on 6.18), the
            // mlock family's fentry programs most of them.
            let most = if name.starts_with("syscall_") || name.starts_with("sys_") {
                200_000
            } else {
                20_000
            };
            assert!(
                (1..most).contains(count),
                "{name}: {count} instructions verified"
            );
        }
    }

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

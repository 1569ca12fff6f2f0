//! Loading the VMA family: snapshots at mlock-family entry and exit, the
//! `maple_tree:ma_write` tp_btf, and fentry/fexit on whichever of the kernel's
//! split/merge/modify functions this kernel has and allows.

use std::fmt::Write as _;

use anyhow::{Result, anyhow};
use aya::programs::BtfTracePoint;
use memlock_trace_common::syscall_hooks::hook;

use super::{config::walks_rbtree, functions::attach_functions, hooks::VmaHooks};
use crate::{
    event::Syscall,
    object::{AttachContext, HookFamily, HookLine, Refused, SyscallEdge, hook_refused},
};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vma::{config::config, hooks::HookedFunction};
    use crate::{
        btf::KernelBtf,
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
        // The snapshots at the calls' entry run from mlock's fentry program, or where fentry
        // is refused from the calls' events' program, or the syscall dispatcher.
        let enters: &[&str] = if btf.has_find_vma() {
            &[
                "sys_mlock_enter_fv",
                "syscall_enter_event",
                "syscall_enter_find_vma",
            ]
        } else {
            &["sys_mlock_enter", "syscall_enter"]
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
}

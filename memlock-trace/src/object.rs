//! The loaded eBPF object, and what every hook family attaches through: one signature
//! ([`HookFamily::attach`] with an [`AttachContext`]), and one way of turning the kernel's
//! refusal into a message that names the program, the kernel's reason and the fix.

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{Btf, Ebpf, EbpfLoader, programs::Program};
use memlock_trace_common::{Config, names};

use crate::btf::KernelBtf;

mod hook_line;
mod refusal;
#[cfg(test)]
mod stack_budget;
mod syscall_hooks;
pub use hook_line::HookLine;
pub use refusal::{
    Refused, hook_refused, is_permission_error, perf_paranoid_hint, refusal_reason, too_complex,
};
pub use syscall_hooks::{
    SyscallEdge, SyscallVia, attach_syscall_hook, call_names, fentry_refusal, possible_hooks,
};

/// The eBPF object built by `build.rs`, embedded so the binary is self-contained.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memlock-trace"));

/// aya's loader, being made on a thread of its own (see [`new_loader`]), which can go on
/// while the caller reads the offsets it needs.
pub struct NewLoader(std::thread::JoinHandle<EbpfLoader<'static>>);

impl NewLoader {
    pub fn start() -> Self {
        Self(std::thread::spawn(new_loader))
    }

    pub fn finish(self) -> EbpfLoader<'static> {
        self.0.join().expect("EbpfLoader::new does not panic")
    }
}

/// aya's loader without the kernel BTF it parses as it is made (17-20 ms, 9.4 MB here): it
/// keeps that parse for the object's CO-RE relocations, and ours has none (checked below),
/// while tp_btf and fentry programs load against a parse of their own. Dropped at once, it
/// no longer lies beside that one at start, the session's peak of memory.
pub fn new_loader() -> EbpfLoader<'static> {
    let mut loader = EbpfLoader::new();
    loader.btf(None);
    loader
}

/// Creates the object's maps with `config` baked into its read-only `CONFIG` global, after
/// `prepare` has set the families' globals and map sizes; no program is loaded yet.
pub fn load<'a>(
    mut loader: EbpfLoader<'a>,
    config: &'a Config,
    prepare: impl FnOnce(&mut EbpfLoader<'a>) -> Result<()>,
) -> Result<Ebpf> {
    loader.override_global(names::CONFIG, config, true);
    // aya-log's default is every level: off unless the caller asks (`-v`).
    crate::kernel_log::prepare_loader(&mut loader, 0);
    prepare(&mut loader)?;
    loader.load(EBPF_OBJECT).map_err(|e| maps_failed(&e))
}

/// One message for a failed map creation: aya's errors repeat their source's text
/// ("failed to create map `X`: failed to create map `X`: ..."), so each text is kept once;
/// RLIMIT_MEMLOCK is suspected only where the kernel still charges maps to it (before 5.11).
fn maps_failed(error: &aya::EbpfError) -> anyhow::Error {
    let mut reason = String::new();
    let mut next: Option<&dyn std::error::Error> = Some(error);
    while let Some(e) = next {
        let part = e.to_string();
        if !reason.contains(&part) {
            if !reason.is_empty() {
                reason.push_str(": ");
            }
            reason.push_str(&part);
        }
        next = e.source();
    }
    let release = crate::btf::kernel_release();
    let hint = match crate::btf::kernel_version(&release) {
        Some(version) if version < (5, 11) => {
            " (kernels before 5.11 charge maps to RLIMIT_MEMLOCK: is it too low?)"
        }
        _ => "",
    };
    anyhow!("creating the eBPF maps failed{hint}: {reason}")
}

/// A hook family (syscalls, faults, VMAs, processes): its programs, attached.
pub trait HookFamily: Sized {
    /// The family's name in `probe` and the summary's hook lines.
    const NAME: &'static str;
    /// What the user asked of this family.
    type Options;

    /// Loads and attaches the family's programs, with the best hook set the kernel allows.
    fn attach(cx: &mut AttachContext<'_>, options: &Self::Options) -> Result<Self>;

    /// The hooks in use, and those refused, for the user to see.
    fn hook_line(&self) -> HookLine;
}

/// What a family needs to attach: the object, the kernel's BTF, and whether specific
/// processes are traced (rather than the whole system).
pub struct AttachContext<'a> {
    pub ebpf: &'a mut Ebpf,
    pub btf: &'a KernelBtf,
    pub specific_targets: bool,
    /// The syscall handlers' bits the programs were loaded able to run ([`possible_hooks`]).
    syscall_hooks_possible: u32,
    /// aya's parse of the kernel BTF, for tp_btf and fentry programs: parsed once, when a
    /// family first needs it.
    aya_btf: Option<Btf>,
}

impl<'a> AttachContext<'a> {
    pub fn new(
        ebpf: &'a mut Ebpf,
        btf: &'a KernelBtf,
        specific_targets: bool,
        syscall_hooks_possible: u32,
    ) -> Self {
        Self {
            ebpf,
            btf,
            specific_targets,
            syscall_hooks_possible,
            aya_btf: None,
        }
    }

    /// With aya's parse of the kernel BTF made already (parsing 5 MB of vmlinux BTF is a
    /// good part of a session's start-up: once per session is enough).
    pub fn with_aya_btf(mut self, btf: Option<Btf>) -> Self {
        self.aya_btf = btf;
        self
    }

    /// aya's parse of the kernel BTF, if a family needed it, for the next context.
    pub fn into_aya_btf(self) -> Option<Btf> {
        self.aya_btf
    }

    /// The object and aya's BTF together (loading a tp_btf or fentry program needs both).
    pub fn ebpf_and_btf(&mut self) -> Result<(&mut Ebpf, &Btf)> {
        if self.aya_btf.is_none() {
            self.aya_btf =
                Some(Btf::from_sys_fs().context("reading the kernel's BTF for tp_btf/fentry")?);
        }
        Ok((self.ebpf, self.aya_btf.as_ref().expect("set above")))
    }

    /// See [`attach_syscall_hook`].
    pub fn syscall_hook(
        &mut self,
        edge: SyscallEdge,
        hook: u32,
        nrs: &[u32],
    ) -> Result<SyscallVia> {
        if hook & !self.syscall_hooks_possible != 0 {
            bail!("syscall handler {hook:#x} was not loaded for this kernel");
        }
        let find_vma = self.btf.has_find_vma();
        let (ebpf, btf) = self.ebpf_and_btf()?;
        attach_syscall_hook(ebpf, btf, find_vma, edge, hook, nrs)
    }
}

/// Runs `load` on each named program, one thread each. The kernel verifies programs side by
/// side (a privileged load takes no global lock), and verification is most of a session's
/// start: the largest programs take 40-100 ms each here.
pub fn load_side_by_side(
    ebpf: &mut Ebpf,
    names: &[&str],
    load: impl Fn(&str, &mut Program) -> Result<()> + Sync,
) -> Result<()> {
    let mut programs: Vec<(&str, &mut Program)> = ebpf
        .programs_mut()
        .filter(|(name, _)| names.contains(name))
        .collect();
    for name in names {
        if !programs.iter().any(|(n, _)| n == name) {
            bail!("program {name} missing from the eBPF object");
        }
    }
    let load = &load;
    std::thread::scope(|scope| {
        let loads: Vec<_> = programs
            .iter_mut()
            .map(|(name, program)| scope.spawn(move || load(name, program)))
            .collect();
        loads
            .into_iter()
            .try_for_each(|done| done.join().expect("loading a program does not panic"))
    })
}

/// The named map of `ebpf`.
pub fn map<'e>(ebpf: &'e Ebpf, name: &str) -> Result<&'e aya::maps::Map> {
    ebpf.map(name)
        .ok_or_else(|| anyhow!("map {name} missing from the eBPF object"))
}

/// The named program of `ebpf`.
pub fn program<'e>(ebpf: &'e mut Ebpf, name: &str) -> Result<&'e mut Program> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))
}

/// Loads program `name` for the raw BTF tracepoint `tracepoint` and attaches it; a refusal
/// names the program and the hook.
pub fn attach_tp_btf(ebpf: &mut Ebpf, name: &str, tracepoint: &str, btf: &Btf) -> Result<()> {
    let program: &mut aya::programs::BtfTracePoint = program(ebpf, name)?.try_into()?;
    program
        .load(tracepoint, btf)
        .map_err(|e| hook_refused(name, "tp_btf", e))?;
    program
        .attach()
        .map_err(|e| hook_refused(name, "tp_btf", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_object_has_no_core_relocations_for_the_loader_to_need_the_kernel_btf_for() {
        let object = aya_obj::Object::parse(super::EBPF_OBJECT).unwrap();
        assert!(!object.has_btf_relocations());
    }

    #[test]
    fn a_refused_map_is_named_once() {
        let error = aya::EbpfError::MapError(aya::maps::MapError::CreateError {
            name: "TARGET_TGIDS".into(),
            io_error: std::io::Error::from_raw_os_error(libc::E2BIG),
        });
        let message = format!("{:#}", super::maps_failed(&error));
        assert_eq!(
            message
                .matches("failed to create map `TARGET_TGIDS`")
                .count(),
            1,
            "{message}"
        );
        assert!(
            message.ends_with("Argument list too long (os error 7)"),
            "{message}"
        );
    }
}

//! The loaded eBPF object, and what every hook family attaches through: one signature
//! ([`HookFamily::attach`] with an [`AttachContext`]), and one way of turning the kernel's
//! refusal into a message that names the program, the kernel's reason and the fix.

use std::fmt::Write as _;

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Btf, Ebpf, EbpfLoader,
    programs::{Program, ProgramError},
};
use memlock_trace_common::{Config, names};

use crate::btf::KernelBtf;

#[cfg(test)]
mod stack_budget;
mod syscall_hooks;
pub use syscall_hooks::{SyscallEdge, SyscallVia, attach_syscall_hook, call_names, fentry_refusal};

/// The eBPF object built by `build.rs`, embedded so the binary is self-contained.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memlock-trace"));

/// aya's loader, being made on a thread of its own: `EbpfLoader::new` parses the kernel's
/// BTF (17-20 ms here, for its CO-RE relocations), which can go on while the caller reads
/// the offsets it needs.
pub struct NewLoader(std::thread::JoinHandle<EbpfLoader<'static>>);

impl NewLoader {
    pub fn start() -> Self {
        Self(std::thread::spawn(EbpfLoader::new))
    }

    pub fn finish(self) -> EbpfLoader<'static> {
        self.0.join().expect("EbpfLoader::new does not panic")
    }
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

    /// The hooks in use, for the user to see.
    fn describe(&self) -> String;
}

/// What a family needs to attach: the object, the kernel's BTF, and whether specific
/// processes are traced (rather than the whole system).
pub struct AttachContext<'a> {
    pub ebpf: &'a mut Ebpf,
    pub btf: &'a KernelBtf,
    pub specific_targets: bool,
    /// aya's parse of the kernel BTF, for tp_btf and fentry programs: parsed once, when a
    /// family first needs it.
    aya_btf: Option<Btf>,
}

impl<'a> AttachContext<'a> {
    pub fn new(ebpf: &'a mut Ebpf, btf: &'a KernelBtf, specific_targets: bool) -> Self {
        Self {
            ebpf,
            btf,
            specific_targets,
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

/// The named program of `ebpf`.
pub fn program<'e>(ebpf: &'e mut Ebpf, name: &str) -> Result<&'e mut Program> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))
}

/// Turns a refused load or attach into a message naming the program, the kernel's reason
/// (the last lines of the verifier log) and what to do about it.
pub fn hook_refused(program: &str, kind: &str, error: ProgramError) -> anyhow::Error {
    let mut message = format!("the kernel refused {kind} program `{program}`: ");
    match &error {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            let tail: Vec<&str> = log.lines().rev().take(8).collect();
            let _ = write!(message, "{io_error}");
            if !tail.is_empty() {
                let _ = write!(message, "\nverifier log (last lines):");
                for line in tail.iter().rev() {
                    let _ = write!(message, "\n    {line}");
                }
            }
        }
        other => {
            let _ = write!(message, "{other}");
            if let Some(source) = std::error::Error::source(other) {
                let _ = write!(message, ": {source}");
            }
        }
    }
    let _ = write!(
        message,
        "\nrun `memlock-trace probe` to see which hooks this kernel allows{}",
        if kind == "tracepoint" {
            "; tracepoints need tracefs mounted at /sys/kernel/tracing"
        } else {
            ""
        }
    );
    message.push_str(&perf_paranoid_hint(&message));
    anyhow!(message)
}

/// Debian and Ubuntu patch the kernel so that `kernel.perf_event_paranoid` 3 (their default)
/// refuses `perf_event_open` to everyone without CAP_SYS_ADMIN, CAP_PERFMON included: a
/// least-privilege tracer then fails with EACCES attaching its first tracepoint. Says so.
pub fn perf_paranoid_hint(refusal: &str) -> String {
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok());
    match paranoid {
        Some(level)
            if level > 2
                && refusal.contains("perf_event_open")
                && refusal.contains("os error 13") =>
        {
            format!(
                "\nkernel.perf_event_paranoid is {level}: this kernel then lets only CAP_SYS_ADMIN \
             open perf events (a Debian/Ubuntu patch; CAP_PERFMON is not enough). Run as root, or \
             `sysctl kernel.perf_event_paranoid=2` to keep to CAP_BPF + CAP_PERFMON"
            )
        }
        _ => String::new(),
    }
}

/// The kernel-internal `ENOTSUPP` (include/linux/errno.h), which strerror does not know: the
/// trampoline cannot handle this function (e.g. `vma_merge`'s 11 arguments on 6.1).
const ENOTSUPP: i32 = 524;

/// Whether the kernel refuses fentry as such, rather than this one function (ENOTSUPP for
/// one function's arguments, EBUSY for one already patched).
pub fn is_permission_error(error: &ProgramError) -> bool {
    let errno = match error {
        ProgramError::LoadError { io_error, .. } => io_error.raw_os_error(),
        ProgramError::SyscallError(e) => e.io_error.raw_os_error(),
        _ => None,
    };
    matches!(errno, Some(libc::EPERM | libc::EACCES))
}

/// `io::Error`'s text, naming ENOTSUPP where strerror says "Unknown error 524".
fn errno_text(error: &std::io::Error) -> String {
    match error.raw_os_error() {
        Some(ENOTSUPP) => "ENOTSUPP (524): the trampoline cannot take this function".into(),
        _ => error.to_string(),
    }
}

/// The kernel's reason in one line: the errno, and the verifier's last words if any.
pub fn refusal_reason(error: &ProgramError) -> String {
    match error {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            match log.lines().rev().find(|l| !l.trim().is_empty()) {
                Some(last) => format!(
                    "BPF_PROG_LOAD: {}; verifier: {}",
                    errno_text(io_error),
                    last.trim()
                ),
                None => format!("BPF_PROG_LOAD: {}", errno_text(io_error)),
            }
        }
        ProgramError::SyscallError(e) => format!("{}: {}", e.call, errno_text(&e.io_error)),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
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

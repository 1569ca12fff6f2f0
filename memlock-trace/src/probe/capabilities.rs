//! What the kernel lets us attach: one empty program of each kind, loaded and attached,
//! with the kernel's answer (`memlock-trace probe`).

use anyhow::{Context as _, Result};
use aya::programs::ProgramError;

use super::{VMLINUX_BTF, check_privileges, ensure_tracefs};
use crate::btf::KernelBtf;
use crate::object::{self, program};

/// Whether the running kernel lets us use one kind of hook, and if not, its reason.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Capability {
    pub name: &'static str,
    pub usable: bool,
    /// False when this process may not try (no CAP_BPF): `usable` then says nothing.
    pub checked: bool,
    pub detail: String,
}

/// The hook kinds [`capabilities`] tries.
pub const KINDS: [&str; 6] = [
    "ring_buffer",
    "fentry",
    "kprobe",
    "tp_btf",
    "tracepoint",
    "perf_event",
];

/// What an unprivileged process can see: the kernel's BTF, and each hook kind named as not
/// checked, with the capabilities trying it needs.
pub fn unprivileged(missing: &str) -> Vec<Capability> {
    let btf = std::fs::File::open(VMLINUX_BTF);
    let mut caps = vec![Capability {
        name: "btf",
        usable: btf.is_ok(),
        checked: true,
        detail: match btf {
            Ok(_) => VMLINUX_BTF.into(),
            Err(e) => format!("{VMLINUX_BTF}: {e}"),
        },
    }];
    caps.extend(KINDS.map(|name| Capability {
        name,
        usable: false,
        checked: false,
        detail: format!("not checked: needs {missing}"),
    }));
    caps
}

/// Loads and attaches one empty program of each kind (fentry, kprobe, tp_btf, tracepoint,
/// perf event) and reports what the kernel said.
pub fn capabilities() -> Result<Vec<Capability>> {
    use aya::{
        Btf,
        programs::{BtfTracePoint, FEntry, KProbe, PerfEvent, TracePoint, perf_event},
    };

    check_privileges()?;
    ensure_tracefs()?;
    let kernel_btf = KernelBtf::load()?;
    let mut caps = vec![Capability {
        name: "btf",
        usable: true,
        checked: true,
        detail: VMLINUX_BTF.into(),
    }];
    let config = memlock_trace_common::Config {
        filter: memlock_trace_common::filter::TGIDS,
        offsets: kernel_btf.offsets()?,
        ..Default::default()
    };
    let mut ebpf = object::load(object::new_loader(), &config, |_| Ok(()))?;
    caps.push(Capability {
        name: "ring_buffer",
        usable: true,
        checked: true,
        detail: "BPF_MAP_TYPE_RINGBUF created".into(),
    });
    let btf = Btf::from_sys_fs().context("reading the kernel BTF for aya")?;

    let fentry: &mut FEntry = program(&mut ebpf, "can_fentry")?.try_into()?;
    caps.push(tried(
        "fentry",
        "fentry/fexit on handle_mm_fault",
        fentry
            .load("handle_mm_fault", &btf)
            .and_then(|()| fentry.attach().map(drop)),
    ));

    let kprobe: &mut KProbe = program(&mut ebpf, "can_kprobe")?.try_into()?;
    caps.push(tried(
        "kprobe",
        "kprobe on handle_mm_fault",
        kprobe
            .load()
            .and_then(|()| kprobe.attach("handle_mm_fault", 0).map(drop)),
    ));

    let tp_btf: &mut BtfTracePoint = program(&mut ebpf, "can_tp_btf")?.try_into()?;
    caps.push(tried(
        "tp_btf",
        "tp_btf sched_process_exit",
        tp_btf
            .load("sched_process_exit", &btf)
            .and_then(|()| tp_btf.attach().map(drop)),
    ));

    // The fault tracepoint where the architecture has one (x86), else one every kernel has.
    let (category, event) =
        crate::arch::FAULT_TRACEPOINT.unwrap_or(("sched", "sched_process_exit"));
    let tracepoint: &mut TracePoint = program(&mut ebpf, "can_tracepoint")?.try_into()?;
    caps.push(tried(
        "tracepoint",
        &format!("tracepoint {category}:{event}"),
        tracepoint
            .load()
            .and_then(|()| tracepoint.attach(category, event).map(drop)),
    ));

    let perf: &mut PerfEvent = program(&mut ebpf, "can_perf_event")?.try_into()?;
    caps.push(tried(
        "perf_event",
        "software event PAGE_FAULTS_MIN",
        perf.load().and_then(|()| {
            perf.attach(
                perf_event::PerfEventConfig::Software(perf_event::SoftwareEvent::PageFaultsMin),
                perf_event::PerfEventScope::AllProcessesOneCpu { cpu: 0 },
                perf_event::SamplePolicy::Period(1),
                false,
            )
            .map(drop)
        }),
    ));
    Ok(caps)
}

/// The capability `name`, from what the kernel said to loading and attaching a program
/// on `target`.
fn tried(name: &'static str, target: &str, result: Result<(), ProgramError>) -> Capability {
    let (usable, detail) = outcome(result);
    Capability {
        name,
        usable,
        checked: true,
        detail: with_target(usable, detail, target),
    }
}

fn outcome(result: Result<(), ProgramError>) -> (bool, String) {
    match result {
        Ok(()) => (true, "loaded and attached".into()),
        // The errno once, and the verifier's last words only when it said any.
        Err(e @ (ProgramError::LoadError { .. } | ProgramError::SyscallError(_))) => {
            (false, object::refusal_reason(&e))
        }
        Err(e) => {
            let mut reason = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                reason = format!("{reason}: {s}");
                source = s.source();
            }
            (false, reason)
        }
    }
}

fn with_target(usable: bool, detail: String, target: &str) -> String {
    if usable {
        return format!("{target}: {detail}");
    }
    // The raw errors are terse; say what they mean on the kernels we know.
    let hint = if detail.contains("kprobe/type") {
        " (no kprobe PMU: the kernel is built without CONFIG_KPROBES)"
    } else if target.starts_with("fentry") && detail.contains("os error 1") {
        " (EPERM at load: this kernel forbids BPF trampolines / ftrace function hooks)"
    } else {
        ""
    };
    format!("{target}: refused: {detail}{hint}")
}

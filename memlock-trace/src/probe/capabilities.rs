//! What the kernel lets us attach: one empty program of each kind, loaded and attached,
//! with the kernel's answer (`memlock-trace probe`).

use anyhow::{Context as _, Result};

use super::{VMLINUX_BTF, check_privileges, ensure_tracefs};
use crate::btf::KernelBtf;
use crate::object::{self, program};

/// Whether the running kernel lets us use one kind of hook, and if not, its reason.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Capability {
    pub name: &'static str,
    pub usable: bool,
    pub detail: String,
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
        detail: VMLINUX_BTF.into(),
    }];
    let config = memlock_trace_common::Config {
        filter: memlock_trace_common::filter::TGIDS,
        offsets: kernel_btf.offsets()?,
        ..Default::default()
    };
    let mut ebpf = object::load(&config, |_| Ok(()))?;
    caps.push(Capability {
        name: "ring_buffer",
        usable: true,
        detail: "BPF_MAP_TYPE_RINGBUF created".into(),
    });
    let btf = Btf::from_sys_fs().context("reading the kernel BTF for aya")?;

    fn outcome<E: std::error::Error>(result: std::result::Result<(), E>) -> (bool, String) {
        match result {
            Ok(()) => (true, "loaded and attached".into()),
            Err(e) => {
                let mut reason = e.to_string();
                let mut source = e.source();
                while let Some(s) = source {
                    reason = format!("{reason}: {s}");
                    source = s.source();
                }
                (false, reason)
            }
        }
    }

    let fentry: &mut FEntry = program(&mut ebpf, "can_fentry")?.try_into()?;
    let (usable, detail) = outcome(
        fentry
            .load("handle_mm_fault", &btf)
            .and_then(|()| fentry.attach().map(drop)),
    );
    caps.push(Capability {
        name: "fentry",
        usable,
        detail: with_target(usable, detail, "fentry/fexit on handle_mm_fault"),
    });

    let kprobe: &mut KProbe = program(&mut ebpf, "can_kprobe")?.try_into()?;
    let (usable, detail) = outcome(
        kprobe
            .load()
            .and_then(|()| kprobe.attach("handle_mm_fault", 0).map(drop)),
    );
    caps.push(Capability {
        name: "kprobe",
        usable,
        detail: with_target(usable, detail, "kprobe on handle_mm_fault"),
    });

    let tp_btf: &mut BtfTracePoint = program(&mut ebpf, "can_tp_btf")?.try_into()?;
    let (usable, detail) = outcome(
        tp_btf
            .load("sched_process_exit", &btf)
            .and_then(|()| tp_btf.attach().map(drop)),
    );
    caps.push(Capability {
        name: "tp_btf",
        usable,
        detail: with_target(usable, detail, "tp_btf sched_process_exit"),
    });

    let tracepoint: &mut TracePoint = program(&mut ebpf, "can_tracepoint")?.try_into()?;
    let (usable, detail) = outcome(
        tracepoint
            .load()
            .and_then(|()| tracepoint.attach("exceptions", "page_fault_user").map(drop)),
    );
    caps.push(Capability {
        name: "tracepoint",
        usable,
        detail: with_target(usable, detail, "tracepoint exceptions:page_fault_user"),
    });

    let perf: &mut PerfEvent = program(&mut ebpf, "can_perf_event")?.try_into()?;
    let (usable, detail) = outcome(perf.load().and_then(|()| {
        perf.attach(
            perf_event::PerfEventConfig::Software(perf_event::SoftwareEvent::PageFaultsMin),
            perf_event::PerfEventScope::AllProcessesOneCpu { cpu: 0 },
            perf_event::SamplePolicy::Period(1),
            false,
        )
        .map(drop)
    }));
    caps.push(Capability {
        name: "perf_event",
        usable,
        detail: with_target(usable, detail, "software event PAGE_FAULTS_MIN"),
    });
    Ok(caps)
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

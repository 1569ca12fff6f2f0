//! The tracepoints that time the causes of a fault's time (reclaim, compaction, throttling,
//! time off CPU): attached with timed faults, each cause on its own, so that a kernel without
//! one (5.10 has no `mm_vmscan_throttled`) measures the others and names the one it cannot;
//! and the one that tells a major fault's kind.

use aya::{Btf, Ebpf, programs::TracePoint};
use memlock_trace_common::causes::cause;
use serde::Serialize;

use crate::object::{attach_tp_btf, hook_refused, program};

/// Which causes this session measures, and why not the others.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CauseHooks {
    /// By [`cause`] index.
    pub measured: [bool; cause::COUNT],
    /// `cause: reason` for each not measured.
    pub not_measured: Vec<String>,
    /// Whether timed major faults are told by kind (swap-in, file read): the page-cache
    /// tracepoint that tells a private file mapping's reads from its swap-ins attached.
    pub major_kinds: bool,
}

/// A program and where it attaches.
#[derive(Clone, Copy)]
enum Hook {
    /// A tracepoint (program, category, name), perf-attached.
    Tracepoint(&'static str, &'static str, &'static str),
    /// A raw BTF tracepoint (program, category, name): no perf event, so no grace period
    /// at the stop, and the cheapest hook on a path as hot as the context switch.
    TpBtf(&'static str, &'static str, &'static str),
}

impl Hook {
    fn tracepoint(self) -> String {
        match self {
            Self::Tracepoint(_, category, name) => format!("tracepoint {category}:{name}"),
            Self::TpBtf(_, category, name) => format!("tp_btf {category}:{name}"),
        }
    }
}

/// The program that notes a traced thread's reads into the page cache, and its tracepoint.
const PAGE_READ: Hook =
    Hook::Tracepoint("cause_page_read", "filemap", "mm_filemap_add_to_page_cache");

/// Each cause's programs and their tracepoints.
const CAUSE_HOOKS: [&[Hook]; cause::COUNT] = [
    &[
        Hook::Tracepoint(
            "cause_direct_reclaim_begin",
            "vmscan",
            "mm_vmscan_direct_reclaim_begin",
        ),
        Hook::Tracepoint(
            "cause_direct_reclaim_end",
            "vmscan",
            "mm_vmscan_direct_reclaim_end",
        ),
    ],
    &[
        Hook::Tracepoint(
            "cause_memcg_reclaim_begin",
            "vmscan",
            "mm_vmscan_memcg_reclaim_begin",
        ),
        Hook::Tracepoint(
            "cause_memcg_reclaim_end",
            "vmscan",
            "mm_vmscan_memcg_reclaim_end",
        ),
    ],
    &[
        Hook::Tracepoint(
            "cause_compaction_begin",
            "compaction",
            "mm_compaction_begin",
        ),
        Hook::Tracepoint("cause_compaction_end", "compaction", "mm_compaction_end"),
    ],
    &[Hook::Tracepoint(
        "cause_throttled",
        "vmscan",
        "mm_vmscan_throttled",
    )],
    &[Hook::TpBtf("cause_off_cpu", "sched", "sched_switch")],
];

/// Attaches every cause's tracepoints the kernel has; the hooks line and what it measures.
pub(in crate::faults) fn attach_causes(ebpf: &mut Ebpf, btf: &Btf) -> (String, CauseHooks) {
    let mut hooks = CauseHooks::default();
    let mut attached = Vec::new();
    for (index, programs) in CAUSE_HOOKS.iter().enumerate() {
        match attach_all(ebpf, btf, programs) {
            Ok(()) => {
                hooks.measured[index] = true;
                attached.extend(programs.iter().map(|hook| hook.tracepoint()));
            }
            Err(reason) => hooks
                .not_measured
                .push(format!("{}: {reason}", cause::NAMES[index])),
        }
    }
    match attach_all(ebpf, btf, &[PAGE_READ]) {
        Ok(()) => {
            hooks.major_kinds = true;
            attached.push(PAGE_READ.tracepoint());
        }
        Err(reason) => hooks
            .not_measured
            .push(format!("major faults by kind: {reason}")),
    }
    let line = format!(
        "fault time by cause and major faults by kind: {}",
        attached.join(", ")
    );
    (line, hooks)
}

fn attach_all(ebpf: &mut Ebpf, btf: &Btf, hooks: &[Hook]) -> Result<(), String> {
    for &hook in hooks {
        attach_one(ebpf, btf, hook).map_err(|e| {
            // The kernel's reason, without a verifier log.
            let reason = format!("{e:#}");
            let first = reason.lines().next().unwrap_or_default().to_string();
            format!("{} refused ({first})", hook.tracepoint())
        })?;
    }
    Ok(())
}

fn attach_one(ebpf: &mut Ebpf, btf: &Btf, hook: Hook) -> anyhow::Result<()> {
    match hook {
        Hook::Tracepoint(name, category, tracepoint) => {
            let program: &mut TracePoint = program(ebpf, name)?.try_into()?;
            program
                .load()
                .map_err(|e| hook_refused(name, "tracepoint", e))?;
            program
                .attach(category, tracepoint)
                .map_err(|e| hook_refused(name, "tracepoint", e))?;
        }
        Hook::TpBtf(name, _, tracepoint) => attach_tp_btf(ebpf, name, tracepoint, btf)?,
    }
    Ok(())
}

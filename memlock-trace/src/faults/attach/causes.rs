//! The tracepoints that time the causes of a fault's time (reclaim, compaction, throttling):
//! attached with timed faults, each cause on its own, so that a kernel without one (5.10 has
//! no `mm_vmscan_throttled`) measures the others and names the one it cannot; and the one
//! that tells a major fault's kind.

use aya::{Ebpf, programs::TracePoint};
use memlock_trace_common::causes::cause;
use serde::Serialize;

use crate::object::{hook_refused, program};

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

/// The program that notes a traced thread's reads into the page cache, and its tracepoint.
const PAGE_READ: (&str, &str, &str) =
    ("cause_page_read", "filemap", "mm_filemap_add_to_page_cache");

/// Each cause's programs and their tracepoints (category, name).
const CAUSE_TRACEPOINTS: [&[(&str, &str, &str)]; cause::COUNT] = [
    &[
        (
            "cause_direct_reclaim_begin",
            "vmscan",
            "mm_vmscan_direct_reclaim_begin",
        ),
        (
            "cause_direct_reclaim_end",
            "vmscan",
            "mm_vmscan_direct_reclaim_end",
        ),
    ],
    &[
        (
            "cause_memcg_reclaim_begin",
            "vmscan",
            "mm_vmscan_memcg_reclaim_begin",
        ),
        (
            "cause_memcg_reclaim_end",
            "vmscan",
            "mm_vmscan_memcg_reclaim_end",
        ),
    ],
    &[
        (
            "cause_compaction_begin",
            "compaction",
            "mm_compaction_begin",
        ),
        ("cause_compaction_end", "compaction", "mm_compaction_end"),
    ],
    &[("cause_throttled", "vmscan", "mm_vmscan_throttled")],
];

/// Attaches every cause's tracepoints the kernel has; the hooks line and what it measures.
pub(in crate::faults) fn attach_causes(ebpf: &mut Ebpf) -> (String, CauseHooks) {
    let mut hooks = CauseHooks::default();
    let mut attached = Vec::new();
    for (index, programs) in CAUSE_TRACEPOINTS.iter().enumerate() {
        match attach_all(ebpf, programs) {
            Ok(()) => {
                hooks.measured[index] = true;
                attached.extend(programs.iter().map(|(_, c, n)| format!("{c}:{n}")));
            }
            Err(reason) => hooks
                .not_measured
                .push(format!("{}: {reason}", cause::NAMES[index])),
        }
    }
    match attach_all(ebpf, &[PAGE_READ]) {
        Ok(()) => {
            hooks.major_kinds = true;
            attached.push(format!("{}:{}", PAGE_READ.1, PAGE_READ.2));
        }
        Err(reason) => hooks
            .not_measured
            .push(format!("major faults by kind: {reason}")),
    }
    let line = format!(
        "fault time by cause and major faults by kind: tracepoint {}",
        attached.join(", ")
    );
    (line, hooks)
}

fn attach_all(ebpf: &mut Ebpf, programs: &[(&str, &str, &str)]) -> Result<(), String> {
    for &(name, category, tracepoint) in programs {
        attach_one(ebpf, name, category, tracepoint).map_err(|e| {
            // The kernel's reason, without a verifier log.
            let reason = format!("{e:#}");
            let first = reason.lines().next().unwrap_or_default().to_string();
            format!("{category}:{tracepoint} refused ({first})")
        })?;
    }
    Ok(())
}

fn attach_one(ebpf: &mut Ebpf, name: &str, category: &str, tracepoint: &str) -> anyhow::Result<()> {
    let program: &mut TracePoint = program(ebpf, name)?.try_into()?;
    program
        .load()
        .map_err(|e| hook_refused(name, "tracepoint", e))?;
    program
        .attach(category, tracepoint)
        .map_err(|e| hook_refused(name, "tracepoint", e))?;
    Ok(())
}

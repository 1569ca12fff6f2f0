//! `probe` reports what the kernel really allows. The expectations come from the kernel's
//! own, independent signals: the kprobe PMU in sysfs, and whether ftrace function hooks
//! (which BPF trampolines need) are readable in tracefs.

mod common;

use std::path::Path;

use common::require_privileges;
use memlock_trace::probe::{Capability, capabilities};

fn find<'a>(caps: &'a [Capability], name: &str) -> &'a Capability {
    caps.iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no {name} in {caps:?}"))
}

#[test]
fn capabilities_match_the_kernel() {
    require_privileges();
    let caps = capabilities().expect("probe");
    let kernel = memlock_trace::probe::kernel_release();

    for always in ["btf", "ring_buffer", "tracepoint", "tp_btf", "perf_event"] {
        assert!(
            find(&caps, always).usable,
            "{always} refused on {kernel}: {caps:?}"
        );
    }

    let kprobe_pmu = Path::new("/sys/bus/event_source/devices/kprobe").exists();
    let kprobe = find(&caps, "kprobe");
    assert_eq!(kprobe.usable, kprobe_pmu, "kprobe on {kernel}: {kprobe:?}");

    let ftrace_functions =
        std::fs::read_to_string("/sys/kernel/tracing/available_filter_functions").is_ok_and(|f| {
            f.lines()
                .any(|l| l.split_whitespace().next() == Some("handle_mm_fault"))
        });
    let fentry = find(&caps, "fentry");
    assert_eq!(
        fentry.usable, ftrace_functions,
        "fentry on {kernel}: {fentry:?}"
    );

    for refused in caps.iter().filter(|c| !c.usable) {
        assert!(
            refused.detail.contains("refused: "),
            "a refusal carries the kernel's reason: {refused:?}"
        );
    }
}

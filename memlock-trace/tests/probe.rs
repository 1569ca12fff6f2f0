//! Runs on: host, 5.10, 6.1, 6.12, arm64
//!
//! `probe` reports what the kernel really allows. The expectations come from the kernel's
//! own, independent signals: the kprobe PMU in sysfs, and whether ftrace function hooks
//! (which BPF trampolines need) are readable in tracefs.

mod common;
mod support;

use std::path::Path;

use common::require_privileges;
use memlock_trace::probe::{Capability, capabilities};
use support::{BIN, succeeded};

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
    // A trampoline is called from the function's ftrace site: arm64 has had those direct
    // calls since 6.4 (DYNAMIC_FTRACE_WITH_DIRECT_CALLS); before, every attach is ENOTSUPP.
    let direct_calls = memlock_trace::arch::NAME != "aarch64"
        || memlock_trace::probe::kernel_version(&kernel).is_some_and(|v| v >= (6, 4));
    let fentry = find(&caps, "fentry");
    assert_eq!(
        fentry.usable,
        ftrace_functions && direct_calls,
        "fentry on {kernel}: {fentry:?}"
    );

    for refused in caps.iter().filter(|c| !c.usable) {
        assert!(
            refused.detail.contains("refused: "),
            "a refusal carries the kernel's reason: {refused:?}"
        );
    }
}

/// Every line of `probe`'s text within 100 columns, the verifier's empty log not printed.
fn assert_fits(text: &str) {
    for line in text.lines() {
        assert!(
            line.chars().count() <= 100,
            "{} columns: {line}",
            line.chars().count()
        );
    }
    assert!(!text.contains("Verifier output: :"), "{text}");
}

#[test]
fn probe_fits_a_terminal() {
    require_privileges();
    let out = std::process::Command::new(BIN)
        .arg("probe")
        .output()
        .expect("run probe");
    let text = succeeded("probe", &out);
    assert_fits(&text);
    // A refusal's errno once.
    for line in text.lines().filter(|l| l.contains("os error")) {
        assert_eq!(line.matches("os error").count(), 1, "{line}");
    }
}

#[test]
fn unprivileged_probe_reports_what_it_sees() {
    require_privileges();
    // SAFETY: the child only drops privileges and execs.
    let out = unsafe {
        std::os::unix::process::CommandExt::pre_exec(
            std::process::Command::new(BIN).arg("probe"),
            || {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(65534, 65534, 65534) != 0
                    || libc::setresuid(65534, 65534, 65534) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            },
        )
        .output()
        .expect("run probe as nobody")
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{text}{stderr}", out.status);
    assert_fits(&text);
    assert!(text.starts_with("kernel "), "{text}");
    assert!(text.contains("missing CAP_BPF"), "{text}");
    assert!(text.contains("CAP_PERFMON"), "{text}");
    for family in ["syscalls", "faults", "vma"] {
        assert!(
            text.contains(&format!("hooks {family}: not checked: needs CAP_BPF")),
            "{text}"
        );
    }
}

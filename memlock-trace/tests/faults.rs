//! Runs on: host, 5.10, 6.12, arm64: the fault family's hooks are 6.12's on 6.1 (fentry/fexit
//! handle_mm_fault), where test:fault_cli and test:mappings count them; 6.12 also has per-VMA
//! locks, whose retried faults the accuracy tests count against getrusage
//!
//! Page-fault accuracy with the real programs loaded into the running kernel.
//!
//! A child (`memlock-trace workload faults`) takes known faults on command. Between commands
//! it is blocked in `read(0)`, so for every command the window between two blocked states is
//! closed on both sides: the tracer's counts for the child must equal the kernel's own
//! `/proc/PID/stat` minflt/majflt deltas exactly, and each class must hold the faults the
//! command is known to take.
//!
//! Every hook set is tried: the ones the kernel allows (per the capability probe) must load
//! and pass, the others must be refused with the kernel's reason. Needs root.
#![cfg(feature = "lab")]

use std::{collections::BTreeMap, path::Path};

mod common;
#[path = "faults/harness.rs"]
mod harness;
#[path = "faults/hooks.rs"]
mod hooks;
#[path = "faults/window.rs"]
mod window;

use harness::{Delta, Workload, evict, sparse_file};
use hooks::allowed_sets;
use memlock_trace::{
    faults::HookSet,
    process::Targets,
    tracer::{Options, Tracer},
};
use window::Windows;

/// What the tracer records, which decides the road each fault takes through the maps.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Recording {
    /// Latency, per thread: statistics in the per-key hash maps.
    PerThread,
    /// Latency, per process, one target: the single-process fast path.
    PerProcess,
    /// No latency, per process (on the tracepoint set: the targets' counting perf events
    /// rather than a program per fault).
    CountOnly,
    /// `--latency-sample 8`, per process: one fault in 8 timed, on the tracepoint set by the
    /// completion events, which also give the counts; on the others by the programs, which
    /// count every fault.
    Sampled,
}

const SAMPLE: u32 = 8;

/// Runs every command against a tracer forced to `set` and checks each window.
fn accuracy(set: HookSet, recording: Recording) {
    common::require_privileges();
    let Some(mut tracer) = hooks::load(set, recording) else {
        return;
    };
    assert!(
        allowed_sets().contains(&set),
        "{} hooks loaded where the capability probe says they cannot",
        set.name()
    );
    assert_eq!(tracer.fault_hooks.as_ref().unwrap().hook_set, set);
    let file_pages = 32;
    let file = sparse_file(file_pages);
    let mut child = Workload::spawn();
    let pid = child.pid();
    tracer
        .add_target(pid)
        .expect("adding the workload to the filter");
    assert_eq!(
        tracer.fault_fast_path(),
        (recording != Recording::PerThread).then_some(pid),
        "the single-process fast path is used exactly when one process is traced per process"
    );
    warm_up(&mut child, &file);

    let mut windows = Windows::new(&tracer, child, set, recording);
    check_timing_plan(&windows);
    check_lazy_and_populated_faults(&mut windows);
    check_lock_on_fault(&mut windows);
    check_file_faults(&mut windows, &file, file_pages as u64);
    check_failed_and_future_locked_faults(&mut windows);

    let _ = std::fs::remove_file(&file);
}

/// Warms every path once (code, stack, libc), so each measured window holds only the
/// faults its command is known to take.
fn warm_up(child: &mut Workload, file: &Path) {
    for warm in [
        "noop",
        "noop",
        "touch 1",
        "mlock 1",
        "populate 1",
        "protect 1",
        "remap 1",
        "advise 1",
        "onfault 1",
        "segv",
        "mlockall 1",
        "noop",
    ] {
        child.run(warm);
    }
    child.run(&format!("file 1 {}", file.display()));
}

/// The faults timed as the recording asks.
fn check_timing_plan(windows: &Windows) {
    let sampled = windows.recording == Recording::Sampled;
    let hooks = windows.tracer.fault_hooks.as_ref().unwrap();
    assert_eq!(hooks.latency_sample, if sampled { SAMPLE } else { 1 });
    // With specific targets the completion events run on the targets' threads only (5.13+).
    if windows.set == HookSet::Tracepoint && !windows.count_only() {
        assert!(
            hooks
                .hooks
                .iter()
                .any(|h| h.contains("on each target thread"))
                || !hooks.plan.per_target_completion(),
            "{:?}",
            hooks.hooks
        );
    }
}

/// Nothing, lazy first touches, then the calls that populate pages, each counted to its call.
fn check_lazy_and_populated_faults(windows: &mut Windows) {
    let (d, ..) = windows.run("noop");
    assert_eq!(
        d,
        Delta {
            failed: Some(0),
            in_locked_vma: windows.zero_if_vma(0),
            in_lockonfault_vma: windows.zero_if_vma(0),
            ..Delta::default()
        }
    );

    // Lazy first touch: one minor user fault per page, each timed.
    let (d, ..) = windows.run("touch 1000");
    assert_eq!((d.user, d.minor, d.populated), (1000, 1000, 0), "{d:?}");
    windows.check_timed(&d, "user", 1000);
    assert_eq!(d.latency_unmatched, 0, "{d:?}");

    // mlock of untouched pages: the kernel populates every page inside the call.
    let (d, ..) = windows.run("mlock 500");
    assert_eq!((d.user, d.populated), (0, 500), "{d:?}");
    assert_eq!(d.populated_by, BTreeMap::from([("mlock", 500)]));
    assert_eq!(d.in_locked_vma, windows.zero_if_vma(500));
    if windows.vma_hooks() {
        // Hooks inside handle_mm_fault time populated faults one by one too.
        windows.check_timed(&d, "populated", 500);
    }

    let (d, ..) = windows.run("populate 300");
    assert_eq!((d.user, d.populated), (0, 300), "{d:?}");
    assert_eq!(d.populated_by, BTreeMap::from([("mmap", 300)]));

    // Calls that populate only where memory is locked (the programs leave a call out when
    // it cannot: `may_populate`), here counted to the call. A locked read-only mapping
    // (mlock maps the zero page) made writable (mprotect copies each page):
    let (d, ..) = windows.run("protect 40");
    assert_eq!((d.user, d.populated), (0, 80), "{d:?}");
    assert_eq!(
        d.populated_by,
        BTreeMap::from([("mlock", 40), ("mprotect", 40)])
    );
    // A locked mapping doubled by mremap, which populates the new half:
    let (d, ..) = windows.run("remap 30");
    assert_eq!((d.user, d.populated), (0, 60), "{d:?}");
    assert_eq!(
        d.populated_by,
        BTreeMap::from([("mmap", 30), ("mremap", 30)])
    );
    // MADV_POPULATE_WRITE, where the kernel has it (5.14; before, the step answers address
    // 0: EINVAL, nothing populated).
    let (d, addr, _) = windows.run("advise 20");
    let release = memlock_trace::probe::kernel_release();
    let has_populate_write =
        memlock_trace::probe::kernel_version(&release).is_some_and(|v| v >= (5, 14));
    assert_eq!(addr != 0, has_populate_write, "`advise 20` on {release}");
    let expected = if has_populate_write {
        BTreeMap::from([("madvise", 20)])
    } else {
        BTreeMap::new()
    };
    assert_eq!(d.populated_by, expected, "{d:?}");
}

/// Lock on fault: nothing populated, every touch a fault in a locked VMA, attributed to its
/// mapping wherever a program runs per fault.
fn check_lock_on_fault(windows: &mut Windows) {
    let (d, onfault_addr, by_mapping) = windows.run("onfault 64");
    assert_eq!((d.user, d.populated), (64, 0), "{d:?}");
    assert_eq!(
        (d.in_locked_vma, d.in_lockonfault_vma),
        (windows.zero_if_vma(64), windows.zero_if_vma(64))
    );
    let (set, count_only) = (windows.set, windows.count_only());
    let tracer = windows.tracer;
    // Counting events see no addresses: nothing to attribute.
    let counting = tracer.fault_hooks.as_ref().unwrap().plan
        == memlock_trace::faults::plan::FaultPlan::CountingEvents;
    // Counting events need perf_event_attr.inherit_thread (5.13); before, the hooks say so.
    let inherit_thread = memlock_trace::probe::KernelBtf::load()
        .expect("kernel BTF")
        .field_offset("perf_event_attr", "inherit_thread")
        .is_ok();
    assert_eq!(
        counting,
        count_only && set == HookSet::Tracepoint && inherit_thread
    );
    if count_only && set == HookSet::Tracepoint && !inherit_thread {
        let hooks = &tracer.fault_hooks.as_ref().unwrap().hooks;
        assert!(
            hooks.iter().any(|h| h.contains("inherit_thread")),
            "{hooks:?}"
        );
    }
    if !counting {
        let mapping = by_mapping
            .iter()
            .find(|m| m.start == format!("{onfault_addr:#x}"))
            .unwrap_or_else(|| panic!("no mapping at {onfault_addr:#x} in {by_mapping:#?}"));
        // Every set that runs a program per fault sees the VMA (fentry/kprobe are handed it,
        // the tracepoint set looks it up at the completion), so VM_LOCKONFAULT is known even
        // where smaps does not show it (before Linux 6.2).
        assert_eq!(
            (
                mapping.faults,
                mapping.locked,
                mapping.lockonfault,
                mapping.locked_source
            ),
            (64, Some(true), Some(true), "vma"),
            "{mapping:?}"
        );
    }
}

/// Read faults on a file mapping: minor while its pages are cached, major once evicted.
fn check_file_faults(windows: &mut Windows, file: &Path, file_pages: u64) {
    // Read faults on a file mapping whose pages are cached: minor. Under memory pressure (CI's
    // guests beside the host stage) a page can be reclaimed before it is read, and its fault
    // is then major for the kernel too (once in CI: 31 minor, 1 major, both the kernel's
    // figures, which the window checks the split against): so all are user faults, and at
    // most a few of them major.
    let (d, ..) = windows.run(&format!("file {file_pages} {}", file.display()));
    assert_eq!(
        (d.user, d.minor + d.major),
        (file_pages, file_pages),
        "{d:?}"
    );
    assert!(d.major <= file_pages / 8, "{d:?}");

    // Not cached: major (the kernel reads each page).
    evict(file);
    let (d, ..) = windows.run(&format!("file {file_pages} {}", file.display()));
    // The window already matched the tracer's majors to the kernel's.
    let proc_majors = d.major;
    if proc_majors == 0 {
        eprintln!(
            "*** {} is not evictable (tmpfs?): the kernel counted no major faults, nor did the tracer",
            file.display()
        );
    } else {
        assert_eq!(
            proc_majors, file_pages,
            "the kernel's own count of major faults"
        );
        assert_eq!((d.major, d.user), (file_pages, file_pages), "{d:?}");
        windows.check_timed(&d, "major", file_pages);
    }
}

/// A failed fault and its restart; a mapping born locked by mlockall(MCL_FUTURE).
fn check_failed_and_future_locked_faults(windows: &mut Windows) {
    // A SIGSEGV then its successful restart: one failed fault (every hook set counts it at
    // the signal, though fentry/kprobe never see it reach handle_mm_fault), one completed.
    // The kernel may count a minor fault more (2 once in CI, with five guests taking memory
    // and CPU beside the host stage), which the window has already matched to
    // /proc/PID/stat like every other.
    let (d, ..) = windows.run("segv");
    assert!(d.user >= 1, "{d:?}");
    assert_eq!(d.failed, Some(1), "{d:?}");

    // mlockall(MCL_FUTURE): a new mapping is born locked and populated by mmap.
    let (d, ..) = windows.run("mlockall 50");
    assert_eq!(d.populated_by.get("mmap"), Some(&50), "{d:?}");
}

/// One accuracy test per hook set and recording, named after them.
macro_rules! accuracy_tests {
    ($($(#[$doc:meta])* $name:ident: $set:ident, $recording:ident;)*) => {$(
        $(#[$doc])*
        #[test]
        fn $name() {
            accuracy(HookSet::$set, Recording::$recording);
        }
    )*};
}

accuracy_tests! {
    accuracy_fentry: Fentry, PerThread;
    accuracy_fentry_per_process: Fentry, PerProcess;
    accuracy_fentry_count_only: Fentry, CountOnly;
    accuracy_kprobe: Kprobe, PerThread;
    accuracy_tracepoint: Tracepoint, PerThread;
    accuracy_tracepoint_per_process: Tracepoint, PerProcess;
    /// Count-only on the tracepoint set: the targets' counting perf events.
    accuracy_tracepoint_count_only: Tracepoint, CountOnly;
    /// `--latency-sample 8`: counts exact, one fault in 8 timed.
    accuracy_tracepoint_sampled: Tracepoint, Sampled;
    /// fentry: the programs count every fault and read the clock for one in 8.
    accuracy_fentry_sampled: Fentry, Sampled;
}

/// `auto` picks the best set the kernel allows and says why the better ones were refused.
#[test]
fn auto_picks_the_best_allowed_set() {
    common::require_privileges();
    let tracer = Tracer::load_with(&Targets::Tgids(Vec::new()), &Options::default())
        .expect("no fault hook set at all: even the tracepoint set was refused");
    let hooks = tracer.fault_hooks.as_ref().expect("faults traced");
    let refused: Vec<HookSet> = hooks.refused.iter().map(|r| r.hook_set).collect();
    let better: Vec<HookSet> = HookSet::ALL
        .into_iter()
        .take_while(|&s| s != hooks.hook_set)
        .collect();
    assert_eq!(refused, better, "{hooks:#?}");
    for r in &hooks.refused {
        assert!(
            r.refused.reason.contains("refused"),
            "a refusal without the kernel's reason: {r:?}"
        );
    }
    let best = *allowed_sets()
        .first()
        .expect("the capability probe allows no fault hook set");
    assert_eq!(hooks.hook_set, best, "{hooks:#?}");
    eprintln!(
        "kernel {}: {} hooks, refused {:?}",
        memlock_trace::probe::kernel_release(),
        hooks.hook_set.name(),
        hooks.refused
    );
}

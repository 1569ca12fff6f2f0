//! The hook sets of `faults.rs`: which ones the capability probe allows, and loading the
//! tracer forced to one of them, a refusal checked against the probe and the kernel's reason.

use memlock_trace::{
    faults::{FaultOptions, HookChoice, HookSet},
    process::Targets,
    tracer::{Options, Tracer},
};

use super::{Recording, SAMPLE};

/// Hook sets this kernel allows, according to `memlock-trace probe`'s capability check
/// (empty programs of each kind, independent of the fault programs under test).
pub(super) fn allowed_sets() -> Vec<HookSet> {
    // Probed once per test binary: each probe loads the whole object, which the emulated
    // VM stage pays for in seconds.
    static ALLOWED: std::sync::OnceLock<Vec<HookSet>> = std::sync::OnceLock::new();
    ALLOWED.get_or_init(probe_allowed_sets).clone()
}

fn probe_allowed_sets() -> Vec<HookSet> {
    let caps = memlock_trace::probe::capabilities().expect("probing the kernel's capabilities");
    let usable = |name: &str| caps.iter().any(|c| c.name == name && c.usable);
    let mut sets = Vec::new();
    if usable("fentry") {
        sets.push(HookSet::Fentry);
    }
    if usable("kprobe") {
        sets.push(HookSet::Kprobe);
    }
    if usable("tracepoint") && usable("perf_event") {
        sets.push(HookSet::Tracepoint);
    }
    sets
}

fn forced(set: HookSet) -> HookChoice {
    match set {
        HookSet::Fentry => HookChoice::Fentry,
        HookSet::Kprobe => HookChoice::Kprobe,
        HookSet::Tracepoint => HookChoice::Tracepoint,
    }
}

/// The fault options of `recording`, forced to `set`.
fn options(set: HookSet, recording: Recording) -> FaultOptions {
    FaultOptions {
        hooks: forced(set),
        latency: recording != Recording::CountOnly,
        per_thread: recording == Recording::PerThread,
        latency_sample: if recording == Recording::Sampled {
            SAMPLE
        } else {
            1
        },
        ..FaultOptions::default()
    }
}

/// A tracer forced to `set`, recording as `recording`; `None` when the kernel refused it,
/// which must be what the capability probe says, with the kernel's reason.
pub(super) fn load(set: HookSet, recording: Recording) -> Option<Tracer> {
    let loaded = Tracer::load_with(
        &Targets::Tgids(Vec::new()),
        &Options {
            faults: options(set, recording),
            ..Options::default()
        },
    );
    match loaded {
        Ok(tracer) => Some(tracer),
        Err(error) => {
            check_refusal(set, recording, &format!("{error:#}"));
            None
        }
    }
}

/// A refused hook set: one the kernel cannot sample with (as probe says), or one the
/// capability probe does not allow, refused with the kernel's reason.
fn check_refusal(set: HookSet, recording: Recording, message: &str) {
    let btf = memlock_trace::probe::KernelBtf::load().expect("kernel BTF");
    if set == HookSet::Tracepoint
        && recording == Recording::Sampled
        && btf
            .field_offset("perf_event_attr", "inherit_thread")
            .is_err()
    {
        // Before 5.13 (Debian 11's 5.10) the tracepoint set cannot sample: loading it
        // says why, and `probe` names the same missing field.
        let need = memlock_trace::faults::plan::SAMPLING_NEEDS_INHERIT_THREAD;
        assert!(message.contains(need), "{message}");
        assert!(
            memlock_trace::faults::attach::tracepoint_set_limits(&btf).contains(&need),
            "probe must name it"
        );
        eprintln!(
            "\n*** kernel {} cannot sample on the tracepoint set, as probe says: {need}\n",
            memlock_trace::probe::kernel_release(),
        );
        return;
    }
    assert!(
        !allowed_sets().contains(&set),
        "\n\n*** kernel {} allows {} hooks (capability probe) but the fault programs were refused:\n{message}\n",
        memlock_trace::probe::kernel_release(),
        set.name(),
    );
    // A refusal must carry the kernel's reason.
    assert!(message.contains("refused"), "{message}");
    eprintln!(
        "\n*** kernel {} refuses {} hooks, as the capability probe says: accuracy tested with the others.\n{message}\n",
        memlock_trace::probe::kernel_release(),
        set.name(),
    );
}

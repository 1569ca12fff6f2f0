//! Picks the best page-fault hook set the kernel allows (fentry/fexit, then
//! kprobe/kretprobe, then tracepoints with software perf events) and attaches it, with the
//! populating calls' tracepoints and the signal tracepoint every set shares.

mod causes;
mod syscall_hooks;

pub use causes::CauseHooks;

use std::os::fd::{AsFd as _, OwnedFd};

use anyhow::{Result, anyhow, bail};
use aya::{
    Ebpf,
    programs::{
        BtfTracePoint, FEntry, FExit, KProbe, PerfEvent, TracePoint,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};

use super::{
    BenchFloor, FaultHooks, FaultOptions, HookChoice, HookSet, Refusal, Unobservable,
    plan::{
        FAULT_FUNCTION, FaultPlan, FaultStart, KernelSupport, SAMPLING_NEEDS_INHERIT_THREAD,
        wants_counting_events,
    },
};
use crate::object::{
    AttachContext, Refused, attach_tp_btf, hook_refused, load_side_by_side, program,
};
use syscall_hooks::{attach_mappings_changed, attach_populate};

/// How the tracepoint set counts without a latency before 5.13.
const COUNT_ONLY_BY_BPF: &str =
    "count-only by BPF per fault (counting events need perf_event_attr.inherit_thread, 5.13)";

/// What the tracepoint set cannot do on this kernel, whichever set a session picks, for
/// `probe` to name: a forced `--fault-hooks tracepoint` meets these.
pub fn tracepoint_set_limits(btf: &crate::probe::KernelBtf) -> Vec<&'static str> {
    if KernelSupport::of(btf).inherit_thread {
        Vec::new()
    } else {
        vec![SAMPLING_NEEDS_INHERIT_THREAD, COUNT_ONLY_BY_BPF]
    }
}

const FENTRY: &str = "handle_mm_fault_fentry";
const FEXIT: &str = "handle_mm_fault_fexit";
const KPROBE: &str = "handle_mm_fault_kprobe";
const KRETPROBE: &str = "handle_mm_fault_kretprobe";
const EXCEPTION_ENTRY: &str = "fault_exception_entry";
const ENTRY_USER_BTF: &str = "fault_entry_user_btf";
const ENTRY_KERNEL_BTF: &str = "fault_entry_kernel_btf";
const PERF_MIN: &str = "fault_perf_min";
const PERF_MAJ: &str = "fault_perf_maj";
const PERF_MIN_LOCAL: &str = "fault_perf_min_local";
const PERF_MAJ_LOCAL: &str = "fault_perf_maj_local";
const PERF_START: &str = "fault_perf_start";
/// The benchmark's programs for the tracepoint set's per-fault hooks (see [`BenchFloor`]),
/// in place of the fault family's own.
struct FloorPrograms {
    entry_user: &'static str,
    entry_kernel: &'static str,
    perf_min: &'static str,
    perf_maj: &'static str,
}
const FAULT_SIGNAL: &str = "fault_signal";

/// Tries the hook sets `options.hooks` allows, best first, and attaches the first the kernel
/// accepts. A forced set the kernel refuses is an error with the kernel's reason.
pub fn attach(cx: &mut AttachContext<'_>, options: &FaultOptions) -> Result<FaultHooks> {
    let specific_targets = cx.specific_targets;
    let has_fault_function = cx.btf.has_function(FAULT_FUNCTION);
    let kernel = KernelSupport::of(cx.btf);
    let (ebpf, aya_btf) = cx.ebpf_and_btf()?;
    let candidates: &[HookSet] = match options.hooks {
        HookChoice::Off => bail!("--fault-hooks off: the fault family is not attached"),
        HookChoice::Auto => &HookSet::ALL,
        HookChoice::Fentry => &[HookSet::Fentry],
        HookChoice::Kprobe => &[HookSet::Kprobe],
        HookChoice::Tracepoint => &[HookSet::Tracepoint],
    };
    let mut refused = Vec::new();
    for &set in candidates {
        let plan = FaultPlan::decide(set, options, specific_targets, &kernel);
        let attached = plan.map_err(|reason| anyhow!("{reason}")).and_then(|plan| {
            let hooks = match set {
                HookSet::Fentry => attach_fentry(ebpf, has_fault_function, aya_btf),
                HookSet::Kprobe => attach_kprobe(ebpf),
                HookSet::Tracepoint => {
                    attach_tracepoints(ebpf, aya_btf, options, &kernel, specific_targets, plan)
                }
            };
            hooks.map(|hooks| (plan, hooks))
        });
        match attached {
            Ok((plan, mut hooks)) => {
                hooks.push(plan.vma_lookup(&kernel));
                hooks.extend(attach_populate(ebpf, aya_btf, set, kernel.find_vma)?);
                let retry = set == HookSet::Tracepoint && kernel.find_vma;
                hooks.push(attach_mappings_changed(
                    ebpf,
                    aya_btf,
                    kernel.find_vma,
                    retry,
                )?);
                hooks.push(attach_signal(ebpf, aya_btf)?);
                // Only timed faults are split into causes.
                let causes = options.latency.then(|| {
                    let (line, causes) = causes::attach_causes(ebpf, aya_btf);
                    hooks.push(line);
                    causes
                });
                let mut unobserved = Vec::new();
                if set == HookSet::Tracepoint {
                    // page_fault_user + perf events see neither the VM_FAULT_RETRY results
                    // nor the VMA.
                    unobserved.extend([Unobservable::Retried, Unobservable::InLockedVma]);
                }
                return Ok(FaultHooks {
                    plan,
                    latency_sample: options.latency_period(),
                    completion_programs: plan
                        .per_target_completion()
                        .then(|| completion_names(options.bench.floor, &kernel)),
                    start_program: plan
                        .start_on_target_threads()
                        .then(|| start_name(options.bench.floor)),
                    hook_set: set,
                    hooks,
                    refused,
                    latency: options.latency,
                    unobserved,
                    causes,
                });
            }
            Err(error) => {
                unload(ebpf, set);
                if options.hooks != HookChoice::Auto {
                    return Err(error.context(format!(
                        "--fault-hooks {}: the kernel refused it",
                        set.name()
                    )));
                }
                refused.push(Refusal {
                    hook_set: set,
                    refused: Refused::of(&error),
                });
            }
        }
    }
    let reasons: Vec<String> = refused
        .iter()
        .map(|r| format!("{}: {}", r.hook_set.name(), r.refused.reason))
        .collect();
    bail!(
        "this kernel offers none of the page-fault hook sets (fentry/fexit or kprobes on \
         {FAULT_FUNCTION}, or the exceptions:page_fault_user tracepoint with software perf \
         events); use --fault-hooks off to trace syscalls only.\n{}",
        reasons.join("\n")
    )
}

fn attach_fentry(ebpf: &mut Ebpf, has_function: bool, aya_btf: &aya::Btf) -> Result<Vec<String>> {
    if !has_function {
        bail!("{FAULT_FUNCTION} is not a function in this kernel's BTF");
    }
    let entry: &mut FEntry = program(ebpf, FENTRY)?.try_into()?;
    entry
        .load(FAULT_FUNCTION, aya_btf)
        .map_err(|e| hook_refused(FENTRY, "fentry", e))?;
    entry
        .attach()
        .map_err(|e| hook_refused(FENTRY, "fentry", e))?;
    let exit: &mut FExit = program(ebpf, FEXIT)?.try_into()?;
    exit.load(FAULT_FUNCTION, aya_btf)
        .map_err(|e| hook_refused(FEXIT, "fexit", e))?;
    exit.attach().map_err(|e| hook_refused(FEXIT, "fexit", e))?;
    Ok(vec![
        format!("fentry/{FAULT_FUNCTION}"),
        format!("fexit/{FAULT_FUNCTION}"),
    ])
}

/// The kprobe PMU, which aya attaches kprobes through (4.17+).
const KPROBE_PMU: &str = "/sys/bus/event_source/devices/kprobe";

fn attach_kprobe(ebpf: &mut Ebpf) -> Result<Vec<String>> {
    // Said before the programs are verified, for nothing (15,000 instructions, ~20 ms of a
    // start, on a kernel built without kprobes).
    if !std::path::Path::new(KPROBE_PMU).exists() {
        bail!("the kernel refused kprobes: it has none (no {KPROBE_PMU})");
    }
    for name in [KPROBE, KRETPROBE] {
        let probe: &mut KProbe = program(ebpf, name)?.try_into()?;
        probe.load().map_err(|e| hook_refused(name, "kprobe", e))?;
        probe
            .attach(FAULT_FUNCTION, 0)
            .map_err(|e| hook_refused(name, "kprobe", e))?;
    }
    Ok(vec![
        format!("kprobe/{FAULT_FUNCTION}"),
        format!("kretprobe/{FAULT_FUNCTION}"),
    ])
}

/// The tracepoint set as `plan` has it: fault starts, completions, or counting events.
fn attach_tracepoints(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    options: &FaultOptions,
    kernel: &KernelSupport,
    specific_targets: bool,
    plan: FaultPlan,
) -> Result<Vec<String>> {
    let mut hooks = Vec::new();
    let start = match plan {
        FaultPlan::Completions { start, .. } => start,
        _ => {
            return Ok(vec![
                "perf counting events software:PAGE_FAULTS_MIN/MAJ on each target thread (no BPF per fault)".into(),
            ]);
        }
    };
    match start {
        FaultStart::TargetThreads => {
            load_perf_event(ebpf, start_name(options.bench.floor))?;
            // Opened on each target thread as targets are added (`FaultCounters`).
            hooks.push(
                "perf_event/software:PAGE_FAULTS on each target thread (start, period 1)".into(),
            );
        }
        FaultStart::Tracepoints => hooks.extend(attach_fault_entry(ebpf, btf, options)?),
        FaultStart::Untimed => {}
    }
    if wants_counting_events(options, specific_targets) {
        hooks.push(COUNT_ONLY_BY_BPF.into());
    }
    let cpus = aya::util::online_cpus().map_err(|(what, e)| anyhow!("{what}: {e}"))?;
    let [min, maj] = completion_names(options.bench.floor, kernel);
    if !kernel.percpu_lookup && options.bench.floor.is_none() {
        hooks.push(
            "fault starts matched on the completing CPU only (no bpf_map_lookup_percpu_elem, \
             5.19)"
                .into(),
        );
    }
    let per_target = plan.per_target_completion();
    load_perf_events(ebpf, &[min, maj])?;
    for (name, event, label) in [
        (min, SoftwareEvent::PageFaultsMin, "PAGE_FAULTS_MIN"),
        (maj, SoftwareEvent::PageFaultsMaj, "PAGE_FAULTS_MAJ"),
    ] {
        let perf = load_perf_event(ebpf, name)?;
        if per_target {
            // Opened on each target thread as targets are added (`FaultCounters`).
            hooks.push(format!(
                "perf_event/software:{label} on each target thread (period {})",
                options.latency_period()
            ));
            continue;
        }
        for &cpu in &cpus {
            // Period 1: the program runs for every fault. Software events sample the first
            // overflow of each event unthrottled, so no fault is lost to throttling.
            perf.attach(
                PerfEventConfig::Software(event),
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Period(1),
                false,
            )
            .map_err(|e| hook_refused(&format!("{name} on cpu {cpu}"), "perf_event", e))?;
        }
        hooks.push(format!("perf_event/software:{label} x{} cpus", cpus.len()));
    }
    Ok(hooks)
}

/// Loads the perf_event programs `names` not loaded yet, side by side (the completions are
/// the fault family's largest programs to verify).
fn load_perf_events(ebpf: &mut Ebpf, names: &[&str]) -> Result<()> {
    let mut waiting: Vec<&str> = Vec::new();
    for &name in names {
        let perf: &mut PerfEvent = program(ebpf, name)?.try_into()?;
        if perf.fd().is_err() && !waiting.contains(&name) {
            waiting.push(name);
        }
    }
    load_side_by_side(ebpf, &waiting, |name, program| {
        let perf: &mut PerfEvent = program.try_into()?;
        perf.load().map_err(|e| hook_refused(name, "perf_event", e))
    })
}

/// Loads perf_event program `name` unless it is loaded already (the per-thread floor's
/// start and minor completion are one empty program).
fn load_perf_event<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut PerfEvent> {
    let perf: &mut PerfEvent = program(ebpf, name)?.try_into()?;
    if perf.fd().is_err() {
        perf.load()
            .map_err(|e| hook_refused(name, "perf_event", e))?;
    }
    Ok(perf)
}

/// The completion programs (minor, major) for this kernel, or the floor's.
fn completion_names(floor: Option<BenchFloor>, kernel: &KernelSupport) -> [&'static str; 2] {
    if let Some(p) = floor_programs(floor) {
        [p.perf_min, p.perf_maj]
    } else if kernel.percpu_lookup {
        [PERF_MIN, PERF_MAJ]
    } else {
        [PERF_MIN_LOCAL, PERF_MAJ_LOCAL]
    }
}

/// The program the per-thread `PAGE_FAULTS` events run, or the floor's (an empty one).
fn start_name(floor: Option<BenchFloor>) -> &'static str {
    floor_programs(floor).map_or(PERF_START, |p| p.perf_min)
}

/// A copy of a program's fd, for the events opened on target threads.
pub fn program_fd(ebpf: &Ebpf, name: &str) -> Result<OwnedFd> {
    let program = ebpf
        .program(name)
        .ok_or_else(|| anyhow!("program {name} missing"))?;
    Ok(program.fd()?.as_fd().try_clone_to_owned()?)
}

/// Copies of the completion programs' fds, for the events opened on target threads.
pub fn completion_fds(ebpf: &Ebpf, names: [&str; 2]) -> Result<[OwnedFd; 2]> {
    Ok([program_fd(ebpf, names[0])?, program_fd(ebpf, names[1])?])
}

/// `signal:signal_generate`, where failed faults are counted (every hook set): tp_btf, since
/// a perf-attached tracepoint costs a grace period when the session ends.
fn attach_signal(ebpf: &mut Ebpf, btf: &aya::Btf) -> Result<String> {
    attach_tp_btf(ebpf, FAULT_SIGNAL, "signal_generate", btf)?;
    Ok("tp_btf signal:signal_generate".into())
}

/// The benchmark's floor programs, with the `bench` feature: programs that return at once,
/// or only read the clock.
#[cfg(feature = "bench")]
fn floor_programs(floor: Option<BenchFloor>) -> Option<FloorPrograms> {
    match floor? {
        BenchFloor::Empty | BenchFloor::PerThread => Some(FloorPrograms {
            entry_user: "bench_empty_entry_user",
            entry_kernel: "bench_empty_entry_kernel",
            perf_min: "bench_empty_perf_min",
            perf_maj: "bench_empty_perf_maj",
        }),
        BenchFloor::Clock => Some(FloorPrograms {
            entry_user: "bench_clock_entry_user",
            entry_kernel: "bench_clock_entry_kernel",
            perf_min: "bench_clock_perf_min",
            perf_maj: "bench_clock_perf_maj",
        }),
    }
}

/// The product has no floor programs (nor the flag that asks for them).
#[cfg(not(feature = "bench"))]
fn floor_programs(_floor: Option<BenchFloor>) -> Option<FloorPrograms> {
    None
}

/// The fault-start tracepoints: BTF-typed (tp_btf, cheaper) where the kernel allows it,
/// else classic.
fn attach_fault_entry(
    ebpf: &mut Ebpf,
    btf: &aya::Btf,
    options: &FaultOptions,
) -> Result<Vec<String>> {
    if crate::arch::FAULT_TRACEPOINT.is_none() {
        bail!(
            "the start of each fault needs the exceptions:page_fault_user tracepoint, which \
             {} kernels do not have (it is x86's): fault latency needs fentry or kprobes on \
             {FAULT_FUNCTION} here",
            crate::arch::NAME
        );
    }
    let btf_attempt = (|| -> Result<Vec<String>> {
        if options.bench.classic_tracepoints {
            bail!("--classic-tracepoints");
        }
        let mut hooks = Vec::new();
        let (user, kernel) = floor_programs(options.bench.floor)
            .map_or((ENTRY_USER_BTF, ENTRY_KERNEL_BTF), |p| {
                (p.entry_user, p.entry_kernel)
            });
        for (name, tp) in [(user, "page_fault_user"), (kernel, "page_fault_kernel")] {
            let p: &mut BtfTracePoint = program(ebpf, name)?.try_into()?;
            p.load(tp, btf)
                .map_err(|e| hook_refused(name, "tp_btf", e))?;
            p.attach().map_err(|e| hook_refused(name, "tp_btf", e))?;
            hooks.push(format!("tp_btf/{tp}"));
        }
        Ok(hooks)
    })();
    if let Ok(hooks) = btf_attempt {
        return Ok(hooks);
    }
    for name in [ENTRY_USER_BTF, ENTRY_KERNEL_BTF] {
        if let Some(aya::programs::Program::BtfTracePoint(p)) = ebpf.program_mut(name) {
            let _ = p.unload();
        }
    }
    let entry: &mut TracePoint = program(ebpf, EXCEPTION_ENTRY)?.try_into()?;
    entry
        .load()
        .map_err(|e| hook_refused(EXCEPTION_ENTRY, "tracepoint", e))?;
    let mut hooks = Vec::new();
    for tp in ["page_fault_user", "page_fault_kernel"] {
        entry
            .attach("exceptions", tp)
            .map_err(|e| hook_refused(&format!("exceptions:{tp}"), "tracepoint", e))?;
        hooks.push(format!("tracepoint/exceptions:{tp}"));
    }
    Ok(hooks)
}

/// Drops whatever a refused hook set managed to load or attach.
fn unload(ebpf: &mut Ebpf, set: HookSet) {
    let names: &[&str] = match set {
        HookSet::Fentry => &[FENTRY, FEXIT],
        HookSet::Kprobe => &[KPROBE, KRETPROBE],
        HookSet::Tracepoint => &[
            EXCEPTION_ENTRY,
            ENTRY_USER_BTF,
            ENTRY_KERNEL_BTF,
            PERF_MIN,
            PERF_MAJ,
            PERF_MIN_LOCAL,
            PERF_MAJ_LOCAL,
            PERF_START,
        ],
    };
    for name in names {
        if let Some(program) = ebpf.program_mut(name) {
            let _ = match program {
                aya::programs::Program::FEntry(p) => p.unload(),
                aya::programs::Program::FExit(p) => p.unload(),
                aya::programs::Program::KProbe(p) => p.unload(),
                aya::programs::Program::TracePoint(p) => p.unload(),
                aya::programs::Program::PerfEvent(p) => p.unload(),
                aya::programs::Program::BtfTracePoint(p) => p.unload(),
                _ => Ok(()),
            };
        }
    }
}

//! Page-fault tracing, loader side: configure and pick the hook set, attach it, and read
//! the kernel's per-CPU aggregation back into per-process (and per-thread) summaries.

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    path::Path,
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, PerCpuHashMap},
    programs::{
        BtfTracePoint, FEntry, FExit, KProbe, PerfEvent, TracePoint,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use hdrhistogram::Histogram;
use memlock_trace_common::faults::{
    FaultConfig, FaultEntry, FaultKey, FaultStats, HIST_BUCKETS, Hist, HistKey, MAX_FAULT_HISTS,
    MAX_FAULT_KEYS, MAX_FAULT_REGIONS, MAX_FAULT_STACK_COUNTS, REGION_SLOTS, RegionKey, RegionSlot,
    RegionValue, SLOTS, StackKey, bucket_range, class, fault_counter, names, populate, stat,
};
use serde::Serialize;

use crate::{
    aggregate::Latency,
    mappings::{Mapping, MappingCache},
    probe::KernelBtf,
    tracer::hook_refused,
};

/// `--fault-hooks`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum HookChoice {
    /// The best set the kernel allows: fentry, then kprobe, then tracepoint.
    #[default]
    Auto,
    Fentry,
    Kprobe,
    Tracepoint,
    /// Do not trace page faults.
    Off,
}

/// A hook set for page faults, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HookSet {
    Fentry,
    Kprobe,
    Tracepoint,
}

impl HookSet {
    pub const ALL: [HookSet; 3] = [HookSet::Fentry, HookSet::Kprobe, HookSet::Tracepoint];

    pub fn name(self) -> &'static str {
        match self {
            HookSet::Fentry => "fentry",
            HookSet::Kprobe => "kprobe",
            HookSet::Tracepoint => "tracepoint",
        }
    }
}

/// What the user asked of fault tracing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultOptions {
    pub hooks: HookChoice,
    /// Time each fault (otherwise counts only, the cheapest mode).
    pub latency: bool,
    pub per_thread: bool,
    /// Stream sampled fault events.
    pub events: bool,
    /// Keep one streamed fault in this many.
    pub sample_every: u32,
    /// Mappings listed per process.
    pub top_mappings: usize,
    /// Count faults per user call stack (`--stacks`).
    pub stacks: bool,
    /// Stacks listed per process.
    pub top_stacks: usize,
}

impl Default for FaultOptions {
    fn default() -> Self {
        Self {
            hooks: HookChoice::Auto,
            latency: true,
            per_thread: false,
            events: false,
            sample_every: 1,
            top_mappings: 10,
            stacks: false,
            top_stacks: 10,
        }
    }
}

/// `VM_LOCKED` and `VM_LOCKONFAULT` are `#define`s, not in BTF
/// (include/linux/mm.h; unchanged since VM_LOCKONFAULT was added in 4.4).
pub const VM_LOCKED: u64 = 0x0000_2000;
pub const VM_LOCKONFAULT: u64 = 0x0008_0000;
/// Without a VMA, faults within 64 KiB are counted together (one region-table slot each).
const REGION_SHIFT: u32 = 16;

/// Slots of the per-CPU region table: [`REGION_SLOTS`], fewer where that would take more
/// than 8 MiB over all CPUs.
fn region_slots(cpus: usize) -> u32 {
    let fit = entries_within(8 << 20, cpus, size_of::<RegionSlot>(), REGION_SLOTS);
    // A power of two: the programs index with a mask.
    1 << (31 - fit.leading_zeros())
}

/// Entries of a per-CPU map with `value`-byte values that fit `budget` bytes over `cpus`
/// CPUs, between 256 and `most`.
fn entries_within(budget: usize, cpus: usize, value: usize, most: u32) -> u32 {
    u32::try_from(budget / (cpus.max(1) * value))
        .unwrap_or(u32::MAX)
        .clamp(256, most)
}

/// This architecture's numbers for the [`populate`] calls.
fn populate_nrs() -> [u32; populate::COUNT] {
    let mut nrs = [u32::MAX; populate::COUNT];
    let known: [(usize, libc::c_long); 12] = [
        (populate::MLOCK, libc::SYS_mlock),
        (populate::MLOCK2, libc::SYS_mlock2),
        (populate::MLOCKALL, libc::SYS_mlockall),
        (populate::MMAP, libc::SYS_mmap),
        (populate::MREMAP, libc::SYS_mremap),
        (populate::BRK, libc::SYS_brk),
        (populate::MADVISE, libc::SYS_madvise),
        (populate::MPROTECT, libc::SYS_mprotect),
        (populate::PKEY_MPROTECT, libc::SYS_pkey_mprotect),
        (populate::REMAP_FILE_PAGES, libc::SYS_remap_file_pages),
        (populate::EXECVE, libc::SYS_execve),
        (populate::EXECVEAT, libc::SYS_execveat),
    ];
    for (index, nr) in known {
        nrs[index] = nr as u32;
    }
    nrs
}

/// Possible CPUs: how many values each per-CPU map holds.
fn possible_cpus() -> Result<usize> {
    Ok(aya::util::nr_cpus()
        .map_err(|(what, e)| anyhow!("{what}: {e}"))?
        .max(1))
}

/// The `FAULT_CONFIG` global for this kernel: result and flag bits from its BTF.
pub fn config(btf: &KernelBtf, options: &FaultOptions) -> Result<FaultConfig> {
    let cpus = possible_cpus()?;
    let reason = |member: &str| btf.enum_value("vm_fault_reason", member);
    let error = [
        "VM_FAULT_OOM",
        "VM_FAULT_SIGBUS",
        "VM_FAULT_SIGSEGV",
        "VM_FAULT_HWPOISON",
        "VM_FAULT_HWPOISON_LARGE",
        "VM_FAULT_FALLBACK",
    ]
    .iter()
    .try_fold(0u64, |acc, m| reason(m).map(|v| acc | v))?;
    Ok(FaultConfig {
        per_thread: u32::from(options.per_thread),
        latency: u32::from(options.latency),
        events: u32::from(options.events),
        sample_every: options.sample_every.max(1),
        vm_fault_major: reason("VM_FAULT_MAJOR")? as u32,
        vm_fault_retry: reason("VM_FAULT_RETRY")? as u32,
        vm_fault_error: error as u32,
        fault_flag_tried: btf.enum_value("fault_flag", "FAULT_FLAG_TRIED")? as u32,
        fault_flag_user: btf.enum_value("fault_flag", "FAULT_FLAG_USER")? as u32,
        vm_fault_oom: reason("VM_FAULT_OOM")? as u32,
        nr_cpus: u32::try_from(cpus).unwrap_or(u32::MAX),
        stacks: u32::from(options.stacks),
        vm_locked: VM_LOCKED,
        vm_lockonfault: VM_LOCKONFAULT,
        vma_vm_flags: btf.field_offset("vm_area_struct", "vm_flags")?,
        vma_vm_start: btf.field_offset("vm_area_struct", "vm_start")?,
        region_shift: REGION_SHIFT,
        region_slots_mask: region_slots(cpus) - 1,
        populate_nrs: populate_nrs(),
        _pad2: 0,
    })
}

/// Sets the fault globals and sizes the per-CPU maps for this machine before load: an LRU
/// per-CPU hash preallocates `max_entries` x possible CPUs values.
pub fn prepare_loader<'a>(loader: &mut EbpfLoader<'a>, config: &'a FaultConfig) -> Result<()> {
    let cpus = possible_cpus()?;
    let fit = |budget: usize, value: usize, most: u32| entries_within(budget, cpus, value, most);
    loader
        .override_global(names::FAULT_CONFIG, config, true)
        .map_max_entries(
            names::FAULT_STATS,
            fit(8 << 20, size_of::<FaultStats>(), MAX_FAULT_KEYS),
        )
        .map_max_entries(
            names::FAULT_HIST,
            fit(16 << 20, size_of::<Hist>(), MAX_FAULT_HISTS),
        )
        .map_max_entries(names::FAULT_REGION_SLOTS, region_slots(cpus))
        .map_max_entries(
            names::FAULT_REGIONS,
            fit(8 << 20, size_of::<RegionValue>(), MAX_FAULT_REGIONS),
        );
    // Each entry preallocates its 520-byte key once (plus ~64 bytes of element) and an
    // 8-byte count per CPU: 16 MiB is ~28000 entries on 2 CPUs, ~15000 on 64. Without
    // --stacks none is used, so keep the map at its smallest.
    let stack_counts = if config.stacks != 0 {
        let entry = size_of::<StackKey>() + 64 + cpus * size_of::<u64>();
        u32::try_from((16 << 20) / entry)
            .unwrap_or(u32::MAX)
            .clamp(256, MAX_FAULT_STACK_COUNTS)
    } else {
        1
    };
    loader.map_max_entries(names::FAULT_STACK_COUNTS, stack_counts);
    Ok(())
}

/// Whether count-only mode on the tracepoint set can use counting perf events on the
/// targets' threads (see `fault_counting`) instead of a BPF program per fault: it needs
/// specific processes, and nothing per fault (no latency, events, per-thread keys or stacks).
fn counting(options: &FaultOptions, specific_targets: bool) -> bool {
    specific_targets
        && !options.latency
        && !options.events
        && !options.per_thread
        && !options.stacks
}

/// A better hook set the kernel refused, and its reason.
#[derive(Clone, Debug, Serialize)]
pub struct Refusal {
    pub hook_set: HookSet,
    pub reason: String,
}

/// The fault hooks in use: named in the text output and the JSON summary.
#[derive(Clone, Debug, Serialize)]
pub struct FaultHooks {
    pub hook_set: HookSet,
    /// The kernel hooks attached.
    pub hooks: Vec<String>,
    /// Better sets tried first and refused.
    pub refused: Vec<Refusal>,
    pub latency: bool,
    /// Faults taken through the exception are counted by counting perf events on the
    /// targets' threads, not by a BPF program per fault (count-only, specific targets).
    pub counting: bool,
    /// Fault classes this hook set cannot observe (reported as null).
    pub unobserved: Vec<&'static str>,
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
/// The same hooks with programs that return at once, or only read the clock: see
/// [`EMPTY_PROGRAMS_ENV`]. Entry user, entry kernel, perf min, perf maj.
const EMPTY_PROGRAMS: [&str; 4] = [
    "bench_empty_entry_user",
    "bench_empty_entry_kernel",
    "bench_empty_perf_min",
    "bench_empty_perf_maj",
];
const CLOCK_PROGRAMS: [&str; 4] = [
    "bench_clock_entry_user",
    "bench_clock_entry_kernel",
    "bench_clock_perf_min",
    "bench_clock_perf_maj",
];
const POPULATE_ENTER: &str = "populate_enter";
const POPULATE_EXIT_COUNTED: &str = "populate_exit_counted";
const POPULATE_EXIT: &str = "populate_exit";
const FAULT_SIGNAL: &str = "fault_signal";
const FAULT_FUNCTION: &str = "handle_mm_fault";

/// Tries the hook sets `options.hooks` allows, best first, and attaches the first the kernel
/// accepts. A forced set the kernel refuses is an error with the kernel's reason.
pub fn attach(
    ebpf: &mut Ebpf,
    btf: &KernelBtf,
    options: &FaultOptions,
    specific_targets: bool,
) -> Result<Option<FaultHooks>> {
    let candidates: &[HookSet] = match options.hooks {
        HookChoice::Off => return Ok(None),
        HookChoice::Auto => &HookSet::ALL,
        HookChoice::Fentry => &[HookSet::Fentry],
        HookChoice::Kprobe => &[HookSet::Kprobe],
        HookChoice::Tracepoint => &[HookSet::Tracepoint],
    };
    let mut refused = Vec::new();
    for &set in candidates {
        let attached = match set {
            HookSet::Fentry => attach_fentry(ebpf, btf),
            HookSet::Kprobe => attach_kprobe(ebpf),
            HookSet::Tracepoint => {
                attach_tracepoints(ebpf, options, counting(options, specific_targets))
            }
        };
        match attached {
            Ok(mut hooks) => {
                hooks.extend(attach_populate(ebpf, set)?);
                hooks.push(attach_signal(ebpf)?);
                let mut unobserved = Vec::new();
                if set == HookSet::Tracepoint {
                    // page_fault_user + perf events see neither the VM_FAULT_RETRY results
                    // nor the VMA.
                    unobserved.extend(["retried", "in_locked_vma"]);
                }
                let counting = set == HookSet::Tracepoint && counting(options, specific_targets);
                return Ok(Some(FaultHooks {
                    counting,
                    hook_set: set,
                    hooks,
                    refused,
                    latency: options.latency,
                    unobserved,
                }));
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
                    reason: format!("{error:#}"),
                });
            }
        }
    }
    let reasons: Vec<String> = refused
        .iter()
        .map(|r| format!("{}: {}", r.hook_set.name(), r.reason))
        .collect();
    bail!(
        "this kernel offers none of the page-fault hook sets (fentry/fexit or kprobes on \
         {FAULT_FUNCTION}, or the exceptions:page_fault_user tracepoint with software perf \
         events); use --fault-hooks off to trace syscalls only.\n{}",
        reasons.join("\n")
    )
}

fn attach_fentry(ebpf: &mut Ebpf, btf: &KernelBtf) -> Result<Vec<String>> {
    if !btf.has_function(FAULT_FUNCTION) {
        bail!("{FAULT_FUNCTION} is not a function in this kernel's BTF");
    }
    let aya_btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF for fentry")?;
    let entry: &mut FEntry = program(ebpf, FENTRY)?.try_into()?;
    entry
        .load(FAULT_FUNCTION, &aya_btf)
        .map_err(|e| hook_refused(FENTRY, "fentry", e))?;
    entry
        .attach()
        .map_err(|e| hook_refused(FENTRY, "fentry", e))?;
    let exit: &mut FExit = program(ebpf, FEXIT)?.try_into()?;
    exit.load(FAULT_FUNCTION, &aya_btf)
        .map_err(|e| hook_refused(FEXIT, "fexit", e))?;
    exit.attach().map_err(|e| hook_refused(FEXIT, "fexit", e))?;
    Ok(vec![
        format!("fentry/{FAULT_FUNCTION}"),
        format!("fexit/{FAULT_FUNCTION}"),
    ])
}

fn attach_kprobe(ebpf: &mut Ebpf) -> Result<Vec<String>> {
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

fn attach_tracepoints(
    ebpf: &mut Ebpf,
    options: &FaultOptions,
    counting: bool,
) -> Result<Vec<String>> {
    let mut hooks = Vec::new();
    if counting {
        return Ok(vec![
            "perf counting events software:PAGE_FAULTS_MIN/MAJ on each target thread (no BPF per fault)".into(),
        ]);
    }
    if options.latency {
        hooks.extend(attach_fault_entry(ebpf)?);
    }
    let cpus = aya::util::online_cpus().map_err(|(what, e)| anyhow!("{what}: {e}"))?;
    let (min, maj) = floor_programs().map_or((PERF_MIN, PERF_MAJ), |p| (p[2], p[3]));
    for (name, event, label) in [
        (min, SoftwareEvent::PageFaultsMin, "PAGE_FAULTS_MIN"),
        (maj, SoftwareEvent::PageFaultsMaj, "PAGE_FAULTS_MAJ"),
    ] {
        let perf: &mut PerfEvent = program(ebpf, name)?.try_into()?;
        perf.load()
            .map_err(|e| hook_refused(name, "perf_event", e))?;
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

/// `signal:signal_generate`, where failed faults are counted (every hook set).
fn attach_signal(ebpf: &mut Ebpf) -> Result<String> {
    let program: &mut TracePoint = program(ebpf, FAULT_SIGNAL)?.try_into()?;
    program
        .load()
        .map_err(|e| hook_refused(FAULT_SIGNAL, "tracepoint", e))?;
    program
        .attach("signal", "signal_generate")
        .map_err(|e| hook_refused("signal:signal_generate", "tracepoint", e))?;
    Ok("tracepoint/signal:signal_generate".into())
}

/// Set to attach the fault-start tracepoints the classic way even where tp_btf works: how
/// bpftrace 0.17 attaches them, for a like-for-like benchmark.
pub const CLASSIC_TRACEPOINTS_ENV: &str = "MEMLOCK_TRACE_CLASSIC_TRACEPOINTS";

/// Set to attach the tracepoint set's per-fault hooks (tp_btf start, perf completion) with
/// programs that do nothing (`1`), or only read the clock at each end (`clock`): what the
/// hooks alone cost, and what timing a fault on them cannot go below, the floors under any
/// tool doing this job, for `cargo xtask bench`. Nothing is counted.
pub const EMPTY_PROGRAMS_ENV: &str = "MEMLOCK_TRACE_BENCH_EMPTY_PROGRAMS";

/// The benchmark's floor programs, when [`EMPTY_PROGRAMS_ENV`] asks for them.
fn floor_programs() -> Option<[&'static str; 4]> {
    match std::env::var(EMPTY_PROGRAMS_ENV).ok()?.as_str() {
        "clock" => Some(CLOCK_PROGRAMS),
        _ => Some(EMPTY_PROGRAMS),
    }
}

/// The fault-start tracepoints: BTF-typed (tp_btf, cheaper) where the kernel allows it,
/// else classic.
fn attach_fault_entry(ebpf: &mut Ebpf) -> Result<Vec<String>> {
    let classic = std::env::var_os(CLASSIC_TRACEPOINTS_ENV).is_some();
    let btf_attempt = (|| -> Result<Vec<String>> {
        if classic {
            bail!("{CLASSIC_TRACEPOINTS_ENV} is set");
        }
        let btf = aya::Btf::from_sys_fs().context("reading the kernel's BTF")?;
        let mut hooks = Vec::new();
        let (user, kernel) =
            floor_programs().map_or((ENTRY_USER_BTF, ENTRY_KERNEL_BTF), |p| (p[0], p[1]));
        for (name, tp) in [(user, "page_fault_user"), (kernel, "page_fault_kernel")] {
            let p: &mut BtfTracePoint = program(ebpf, name)?.try_into()?;
            p.load(tp, &btf)
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

/// The populating calls' enter/exit tracepoints: with the tracepoint set they count the
/// pages populated; with the others they only name the call a populated fault happened in.
fn attach_populate(ebpf: &mut Ebpf, set: HookSet) -> Result<Vec<String>> {
    let exit_program = if set == HookSet::Tracepoint {
        POPULATE_EXIT_COUNTED
    } else {
        POPULATE_EXIT
    };
    let mut attached = Vec::new();
    for (index, name) in populate::NAMES.iter().enumerate() {
        if index == populate::OTHER || populate_nrs()[index] == u32::MAX {
            continue;
        }
        let enter = format!("sys_enter_{name}");
        let exit = format!("sys_exit_{name}");
        if !Path::new(crate::probe::TRACEFS)
            .join("events/syscalls")
            .join(&enter)
            .exists()
        {
            continue;
        }
        for (program_name, tp) in [(POPULATE_ENTER, &enter), (exit_program, &exit)] {
            let program: &mut TracePoint = program(ebpf, program_name)?.try_into()?;
            if program.fd().is_err() {
                program
                    .load()
                    .map_err(|e| hook_refused(program_name, "tracepoint", e))?;
            }
            program
                .attach("syscalls", tp)
                .map_err(|e| hook_refused(tp, "tracepoint", e))?;
        }
        attached.push((*name).to_string());
    }
    Ok(vec![format!(
        "tracepoints syscalls:sys_{{enter,exit}}_{{{}}}",
        attached.join(",")
    )])
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))
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

// ---------------------------------------------------------------------------------------
// Reading the kernel's aggregation.
// ---------------------------------------------------------------------------------------

/// Everything the kernel aggregated, summed over CPUs.
#[derive(Clone, Debug, Default)]
pub struct FaultReport {
    pub stats: BTreeMap<FaultKey, KeyStats>,
    pub hists: BTreeMap<HistKey, [u64; HIST_BUCKETS]>,
    /// Faults per region, per process.
    pub regions: BTreeMap<u32, Vec<(RegionKey, RegionValue)>>,
    /// Faults per user call stack (`--stacks`).
    pub stacks: Option<crate::stacks::StackReport>,
    pub health: FaultHealth,
}

impl FaultReport {
    /// Adds the faults counting perf events counted per process (count-only mode).
    pub fn add_counted(&mut self, counted: BTreeMap<u32, (u64, u64)>) {
        for (tgid, (minor, major)) in counted {
            let s = self.stats.entry(FaultKey { tgid, tid: 0 }).or_default();
            s.counts[stat::USER_MINOR] += minor;
            s.counts[stat::USER_MAJOR] += major;
        }
    }
}

/// One key's counters, summed over CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyStats {
    pub counts: [u64; stat::COUNT],
    pub populated_by: [u64; SLOTS],
    pub max_ns: [u64; SLOTS],
    pub comm: String,
}

/// The fault hooks' own health.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FaultHealth {
    /// Processes (threads) whose statistics the bounded LRU map evicted: their counts are
    /// lost. Non-zero means the map is too small for this machine's process count.
    pub stats_evicted: u64,
    pub histograms_evicted: u64,
    pub regions_evicted: u64,
    /// Faults not counted because a map update failed.
    pub update_failed: u64,
    /// Sampled fault events lost to a full ring buffer.
    pub events_dropped: u64,
    /// `--stacks` only: faults whose call stack could not be recorded (stack map bucket
    /// collision or full, no user stack, count map update failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stacks_dropped: Option<u64>,
    /// `--stacks` only: (process, stack) counts the bounded LRU map evicted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stacks_evicted: Option<u64>,
}

fn comm_of(bytes: &[u8]) -> String {
    crate::decode::comm_str(bytes)
}

/// Points the fault hooks' single-process fast path at `tgid` (0 turns it off).
pub fn set_sole_target(ebpf: &mut Ebpf, tgid: u32) -> Result<()> {
    let map = ebpf
        .map_mut(names::FAULT_SOLE_TGID)
        .ok_or_else(|| anyhow!("map {} missing", names::FAULT_SOLE_TGID))?;
    let mut sole: aya::maps::Array<&mut MapData, u32> = aya::maps::Array::try_from(map)?;
    sole.set(0, tgid, 0)
        .with_context(|| format!("setting the fault fast path's target to {tgid}"))
}

/// The processes that have fault statistics.
pub fn pids(ebpf: &Ebpf) -> Result<std::collections::BTreeSet<u32>> {
    let map = ebpf
        .map(names::FAULT_STATS)
        .ok_or_else(|| anyhow!("map {} missing", names::FAULT_STATS))?;
    let stats: PerCpuHashMap<&MapData, FaultKey, FaultStats> = PerCpuHashMap::try_from(map)?;
    Ok(stats
        .keys()
        .filter_map(Result::ok)
        .map(|k| k.tgid)
        .collect())
}

/// Reads every fault map. Pending region caches are folded into their regions, and faults
/// still pending in threads that no longer exist are counted as failed.
/// `sole`: the process the single-process fast path counted for, if it was used.
pub fn read(ebpf: &Ebpf, per_thread: bool, sole: Option<u32>) -> Result<FaultReport> {
    let map = |name: &str| ebpf.map(name).ok_or_else(|| anyhow!("map {name} missing"));
    let mut report = FaultReport::default();

    let stats: PerCpuHashMap<&MapData, FaultKey, FaultStats> =
        PerCpuHashMap::try_from(map(names::FAULT_STATS)?)?;
    let mut user_minor: BTreeMap<FaultKey, [u64; HIST_BUCKETS]> = BTreeMap::new();
    let mut add = |key: FaultKey, values: &[FaultStats]| {
        let entry = report.stats.entry(key).or_default();
        for v in values {
            for (sum, x) in entry.counts.iter_mut().zip(v.counts) {
                *sum += x;
            }
            for (sum, x) in entry.populated_by.iter_mut().zip(v.populated_by) {
                *sum += x;
            }
            for (max, x) in entry.max_ns.iter_mut().zip(v.max_ns) {
                *max = (*max).max(x);
            }
            if entry.comm.is_empty() {
                entry.comm = comm_of(&v.comm);
            }
            if v.user_minor_hist.iter().any(|&n| n > 0) {
                let hist = user_minor.entry(key).or_insert([0; HIST_BUCKETS]);
                for (h, &n) in hist.iter_mut().zip(v.user_minor_hist.iter()) {
                    *h += u64::from(n);
                }
            }
        }
    };
    let mut hashed = 0u64;
    for item in stats.iter() {
        let Ok((key, values)) = item else { continue };
        add(key, &values);
        hashed += 1;
    }
    if let Some(tgid) = sole {
        // The single-process fast path's statistics: the same process's, by another road.
        let fast: PerCpuArray<&MapData, FaultStats> =
            PerCpuArray::try_from(map(names::FAULT_SOLE_STATS)?)?;
        let values = fast.get(&0, 0)?;
        if values.iter().any(|v| v.comm[0] != 0) {
            add(FaultKey { tgid, tid: 0 }, &values);
        }
    }

    let hists: PerCpuHashMap<&MapData, HistKey, Hist> =
        PerCpuHashMap::try_from(map(names::FAULT_HIST)?)?;
    for item in hists.iter() {
        let Ok((key, values)) = item else { continue };
        let sum = report.hists.entry(key).or_insert([0; HIST_BUCKETS]);
        for v in values.iter() {
            for (s, &c) in sum.iter_mut().zip(v.counts.iter()) {
                *s += u64::from(c);
            }
        }
    }

    for (key, buckets) in user_minor {
        let slot = report
            .hists
            .entry(HistKey {
                key,
                class: class::USER_MINOR,
                _pad: 0,
            })
            .or_insert([0; HIST_BUCKETS]);
        for (h, n) in slot.iter_mut().zip(buckets) {
            *h += n;
        }
    }

    let regions: PerCpuHashMap<&MapData, RegionKey, RegionValue> =
        PerCpuHashMap::try_from(map(names::FAULT_REGIONS)?)?;
    let mut region_sums: BTreeMap<RegionKey, RegionValue> = BTreeMap::new();
    for item in regions.iter() {
        let Ok((key, values)) = item else { continue };
        let sum = region_sums.entry(key).or_default();
        for v in values.iter() {
            sum.faults += v.faults;
            sum.vm_flags |= v.vm_flags;
        }
    }
    let regions_hashed = region_sums.len() as u64;
    // What the per-CPU runs and region tables hold and have not moved to the hash map yet.
    for name in [names::FAULT_REGION_RUN, names::FAULT_REGION_SLOTS] {
        let slots: PerCpuArray<&MapData, RegionSlot> = PerCpuArray::try_from(map(name)?)?;
        for index in 0..slots.len() {
            for slot in slots.get(&index, 0)?.iter() {
                if slot.value.faults > 0 {
                    let sum = region_sums.entry(slot.key).or_default();
                    sum.faults += slot.value.faults;
                    sum.vm_flags |= slot.value.vm_flags;
                }
            }
        }
    }
    for (key, value) in region_sums {
        report
            .regions
            .entry(key.tgid)
            .or_default()
            .push((key, value));
    }

    // A fault still pending in a thread that is gone never completed: it failed (the
    // process died of it, typically).
    let entries: HashMap<&MapData, u32, FaultEntry> = HashMap::try_from(map(names::FAULT_ENTRY)?)?;
    for item in entries.iter() {
        let Ok((tid, entry)) = item else { continue };
        if entry.pending != 0 && !Path::new(&format!("/proc/{}/task/{tid}", entry.tgid)).exists() {
            let key = FaultKey {
                tgid: entry.tgid,
                tid: if per_thread { tid } else { 0 },
            };
            if let Some(s) = report.stats.get_mut(&key) {
                s.counts[stat::FAILED] += 1;
            }
        }
    }

    let counters: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map(names::FAULT_COUNTERS)?)?;
    let sum = |index: u32| -> u64 { counters.get(&index, 0).map(|v| v.iter().sum()).unwrap_or(0) };
    report.health = FaultHealth {
        stats_evicted: sum(fault_counter::STATS_INSERTS).saturating_sub(hashed),
        histograms_evicted: sum(fault_counter::HIST_INSERTS)
            .saturating_sub(report.hists.len() as u64),
        regions_evicted: sum(fault_counter::REGION_INSERTS).saturating_sub(regions_hashed),
        update_failed: sum(fault_counter::UPDATE_FAILED),
        events_dropped: sum(fault_counter::EVENTS_DROPPED),
        // Set by the tracer with --stacks.
        stacks_dropped: None,
        stacks_evicted: None,
    };
    Ok(report)
}

// ---------------------------------------------------------------------------------------
// Summaries.
// ---------------------------------------------------------------------------------------

/// Latency of one reported class, from the kernel's log-linear buckets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ClassLatency {
    /// Faults timed.
    pub count: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p99_9: u64,
    /// Exact.
    pub max: u64,
}

impl ClassLatency {
    /// Each bucket's faults are recorded at the bucket's midpoint (so percentiles are good to
    /// half a bucket, 1/16 of the value); the max is the kernel's exact one.
    pub fn from_buckets(buckets: &[u64; HIST_BUCKETS], max: u64) -> Option<Self> {
        let mut h = Histogram::<u64>::new(3).expect("3 significant figures is valid");
        let mut count = 0;
        for (b, &n) in buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let (low, high) = bucket_range(b);
            let mid = (low + (high - low) / 2).min(max).max(1);
            // Auto-resizing: recording cannot fail.
            let _ = h.record_n(mid, n);
            count += n;
        }
        if count == 0 {
            return None;
        }
        let Latency { p50, p90, p99, .. } = Latency::of(&h);
        let clamp = |v: u64| v.min(max);
        Some(Self {
            count,
            p50: clamp(p50),
            p90: clamp(p90),
            p99: clamp(p99),
            p99_9: clamp(h.value_at_quantile(0.999)),
            max,
        })
    }
}

/// A mapping's share of a process's faults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MappingFaults {
    /// `[heap]`, `[stack]`, a file path, `anonymous`; `unmapped` when no current mapping holds
    /// the address any more, `unknown` when the process's mappings could not be read (it
    /// exited before a snapshot).
    pub mapping: String,
    pub start: String,
    pub end: String,
    pub faults: u64,
    /// `VM_LOCKED` / `VM_LOCKONFAULT` of the VMA: as the fault hook saw it (`"vma"`), or from
    /// `/proc/PID/smaps` when the summary was made (`"smaps"`), or unknown.
    pub locked: Option<bool>,
    pub lockonfault: Option<bool>,
    pub locked_source: &'static str,
}

/// One process's (or thread's) faults: the `"faults"` object of the JSON summary.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FaultSummary {
    /// Completed faults, as the kernel's `min_flt`/`maj_flt` count them.
    pub minor: u64,
    pub major: u64,
    /// Taken through the page-fault exception (user code, or the kernel touching user memory).
    pub user: u64,
    /// Populated by the kernel without an exception (mlock, MAP_POPULATE, ...).
    pub populated: u64,
    pub retried: Option<u64>,
    pub failed: Option<u64>,
    /// Populated pages per system call.
    pub populated_by: BTreeMap<&'static str, u64>,
    /// Completed faults in VM_LOCKED / VM_LOCKONFAULT VMAs (hooks that see the VMA).
    pub in_locked_vma: Option<u64>,
    pub in_lockonfault_vma: Option<u64>,
    pub latency_ns: BTreeMap<&'static str, ClassLatency>,
    /// Faults counted without a latency (their start was not seen).
    pub latency_unmatched: u64,
    pub by_mapping: Vec<MappingFaults>,
    /// `--stacks`: the top user call stacks by faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stacks: Option<Vec<crate::stacks::StackFaults>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub threads: Vec<ThreadFaults>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ThreadFaults {
    pub tid: u32,
    pub comm: String,
    #[serde(flatten)]
    pub faults: FaultSummary,
}

/// Reported classes and the kernel classes they merge.
const LATENCY_CLASSES: [(&str, &[u32]); 6] = [
    ("minor", &[class::USER_MINOR, class::POPULATED_MINOR]),
    ("major", &[class::USER_MAJOR, class::POPULATED_MAJOR]),
    ("user", &[class::USER_MINOR, class::USER_MAJOR]),
    (
        "populated",
        &[class::POPULATED_MINOR, class::POPULATED_MAJOR],
    ),
    ("retried", &[class::RETRIED]),
    ("failed", &[class::FAILED]),
];

fn summarize_key(
    report: &FaultReport,
    key: FaultKey,
    s: &KeyStats,
    hooks: &FaultHooks,
) -> FaultSummary {
    let c = &s.counts;
    let observed = |name: &str| !hooks.unobserved.contains(&name);
    let mut latency_ns = BTreeMap::new();
    for (name, classes) in LATENCY_CLASSES {
        let mut merged = [0u64; HIST_BUCKETS];
        let mut max = 0;
        for &cls in classes {
            if let Some(h) = report.hists.get(&HistKey {
                key,
                class: cls,
                _pad: 0,
            }) {
                for (m, x) in merged.iter_mut().zip(h) {
                    *m += x;
                }
            }
            max = max.max(s.max_ns[cls as usize]);
        }
        if let Some(l) = ClassLatency::from_buckets(&merged, max) {
            latency_ns.insert(name, l);
        }
    }
    FaultSummary {
        minor: c[stat::USER_MINOR] + c[stat::POPULATED_MINOR],
        major: c[stat::USER_MAJOR] + c[stat::POPULATED_MAJOR],
        user: c[stat::USER_MINOR] + c[stat::USER_MAJOR],
        populated: c[stat::POPULATED_MINOR] + c[stat::POPULATED_MAJOR],
        retried: observed("retried").then_some(c[stat::RETRIED]),
        failed: observed("failed").then_some(c[stat::FAILED]),
        populated_by: populate::NAMES
            .iter()
            .zip(s.populated_by)
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| (*name, n))
            .collect(),
        in_locked_vma: observed("in_locked_vma").then_some(c[stat::IN_LOCKED]),
        in_lockonfault_vma: observed("in_locked_vma").then_some(c[stat::IN_LOCKONFAULT]),
        latency_ns,
        latency_unmatched: c[stat::LATENCY_UNMATCHED],
        by_mapping: Vec::new(),
        stacks: None,
        threads: Vec::new(),
    }
}

fn add_counts(into: &mut KeyStats, from: &KeyStats) {
    for (a, b) in into.counts.iter_mut().zip(from.counts) {
        *a += b;
    }
    for (a, b) in into.populated_by.iter_mut().zip(from.populated_by) {
        *a += b;
    }
    for (a, b) in into.max_ns.iter_mut().zip(from.max_ns) {
        *a = (*a).max(b);
    }
}

/// Per-process summaries (with their threads when the kernel kept them per thread).
pub fn summarize(
    report: &FaultReport,
    hooks: &FaultHooks,
    mappings: &mut MappingCache,
    top_mappings: usize,
) -> BTreeMap<u32, (String, FaultSummary)> {
    // Fold thread keys into their process; histograms too.
    let mut processes: BTreeMap<u32, KeyStats> = BTreeMap::new();
    let mut merged = report.clone();
    for (key, s) in &report.stats {
        let p = processes.entry(key.tgid).or_default();
        add_counts(p, s);
        if p.comm.is_empty() || key.tid == key.tgid {
            p.comm.clone_from(&s.comm);
        }
        if key.tid != 0 {
            for cls in 0..class::COUNT as u32 {
                if let Some(h) = report.hists.get(&HistKey {
                    key: *key,
                    class: cls,
                    _pad: 0,
                }) {
                    let total = merged
                        .hists
                        .entry(HistKey {
                            key: FaultKey {
                                tgid: key.tgid,
                                tid: 0,
                            },
                            class: cls,
                            _pad: 0,
                        })
                        .or_insert([0; HIST_BUCKETS]);
                    for (t, x) in total.iter_mut().zip(h) {
                        *t += x;
                    }
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    for (&tgid, s) in &processes {
        let key = FaultKey { tgid, tid: 0 };
        let mut summary = summarize_key(&merged, key, s, hooks);
        let comm = mappings.comm(tgid).unwrap_or_else(|| s.comm.clone());
        summary.by_mapping = by_mapping(
            report.regions.get(&tgid).map_or(&[][..], Vec::as_slice),
            mappings.get(tgid),
            top_mappings,
        );
        summary.threads = report
            .stats
            .iter()
            .filter(|(k, _)| k.tgid == tgid && k.tid != 0)
            .map(|(k, ts)| ThreadFaults {
                tid: k.tid,
                comm: ts.comm.clone(),
                faults: summarize_key(report, *k, ts, hooks),
            })
            .collect();
        out.insert(tgid, (comm, summary));
    }
    out
}

/// Attributes region counts to the process's mappings and returns the top `top` by faults.
pub fn by_mapping(
    regions: &[(RegionKey, RegionValue)],
    maps: Option<&[Mapping]>,
    top: usize,
) -> Vec<MappingFaults> {
    let mut per_mapping: StdHashMap<(u64, u64), MappingFaults> = StdHashMap::new();
    for (key, value) in regions {
        // The key is a VMA start or the page of a run's first fault: the mapping that
        // contains it.
        let found = maps.and_then(|maps| {
            maps.iter()
                .find(|m| m.start <= key.start && key.start < m.end)
        });
        let (range, mut entry) = match found {
            Some(m) => (
                (m.start, m.end),
                MappingFaults {
                    mapping: m.name.clone(),
                    start: format!("{:#x}", m.start),
                    end: format!("{:#x}", m.end),
                    faults: 0,
                    locked: Some(m.locked),
                    lockonfault: m.lockonfault,
                    locked_source: "smaps",
                },
            ),
            None => (
                (key.start, key.start),
                MappingFaults {
                    // Unmapped since (a live process), or the process exited before its
                    // mappings could be read.
                    mapping: if maps.is_some() {
                        "unmapped"
                    } else {
                        "unknown"
                    }
                    .into(),
                    start: format!("{:#x}", key.start),
                    end: String::new(),
                    faults: 0,
                    locked: None,
                    lockonfault: None,
                    locked_source: "unknown",
                },
            ),
        };
        if key.exact != 0 {
            // The hook read the VMA's own flags at fault time: better than a later snapshot.
            entry.locked = Some(value.vm_flags & VM_LOCKED != 0);
            entry.lockonfault = Some(value.vm_flags & VM_LOCKONFAULT != 0);
            entry.locked_source = "vma";
        }
        let slot = per_mapping.entry(range).or_insert(entry);
        slot.faults += value.faults;
        if key.exact != 0 {
            slot.locked = Some(slot.locked == Some(true) || value.vm_flags & VM_LOCKED != 0);
            slot.lockonfault =
                Some(slot.lockonfault == Some(true) || value.vm_flags & VM_LOCKONFAULT != 0);
        }
    }
    let mut list: Vec<MappingFaults> = per_mapping.into_values().collect();
    list.sort_by(|a, b| b.faults.cmp(&a.faults).then_with(|| a.start.cmp(&b.start)));
    list.truncate(top);
    list
}

#[cfg(test)]
mod tests {
    use memlock_trace_common::faults::bucket_of;

    use super::*;

    #[test]
    fn latency_from_buckets_is_within_a_bucket() {
        let mut buckets = [0u64; HIST_BUCKETS];
        // 1000 faults at 1..=1000 us.
        for us in 1..=1000u64 {
            buckets[bucket_of(us * 1000)] += 1;
        }
        let l = ClassLatency::from_buckets(&buckets, 1_000_000).unwrap();
        assert_eq!(l.count, 1000);
        assert_eq!(l.max, 1_000_000);
        for (got, want) in [(l.p50, 500_000), (l.p90, 900_000), (l.p99, 990_000)] {
            assert!(got.abs_diff(want) * 8 <= want, "{got} vs {want}: {l:?}");
        }
        assert!(l.p99_9 <= l.max && l.p99_9 >= l.p99);
        assert_eq!(ClassLatency::from_buckets(&[0; HIST_BUCKETS], 0), None);
    }

    fn mapping(start: u64, end: u64, name: &str, locked: bool) -> Mapping {
        Mapping {
            start,
            end,
            offset: 0,
            name: name.into(),
            locked,
            lockonfault: Some(false),
        }
    }

    #[test]
    fn regions_attribute_to_mappings() {
        let maps = [
            mapping(0x10000, 0x40000, "[heap]", false),
            mapping(0x48000, 0x58000, "/lib/x.so", true),
        ];
        let region = |start, faults| {
            let key = RegionKey {
                tgid: 1,
                exact: 0,
                start,
            };
            (
                key,
                RegionValue {
                    faults,
                    vm_flags: 0,
                },
            )
        };
        let regions = [
            region(0x10000, 16),
            region(0x20000, 4),
            // The page of a run's first fault, inside the library.
            region(0x49000, 3),
            region(0x90000, 1),
        ];
        let list = by_mapping(&regions, Some(&maps), 10);
        assert_eq!(list.len(), 3, "{list:?}");
        assert_eq!((list[0].mapping.as_str(), list[0].faults), ("[heap]", 20));
        assert_eq!(
            (list[1].mapping.as_str(), list[1].faults, list[1].locked),
            ("/lib/x.so", 3, Some(true))
        );
        assert_eq!((list[2].mapping.as_str(), list[2].faults), ("unmapped", 1));
        assert_eq!(by_mapping(&regions, Some(&maps), 1).len(), 1);
    }

    #[test]
    fn exact_regions_use_the_vma_flags() {
        let maps = [mapping(0x10000, 0x40000, "anonymous", false)];
        let regions = [(
            RegionKey {
                tgid: 1,
                exact: 1,
                start: 0x10000,
            },
            RegionValue {
                faults: 5,
                vm_flags: VM_LOCKED | 0x3,
            },
        )];
        let list = by_mapping(&regions, Some(&maps), 10);
        assert_eq!(list[0].locked, Some(true));
        assert_eq!(list[0].locked_source, "vma");
    }
}

//! Loading the eBPF object into the kernel and attaching its programs.

use std::{collections::BTreeMap, fmt::Write as _};

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::{ProgramError, TracePoint},
};
use memlock_trace_common::{
    Config, counter,
    faults::FaultConfig,
    filter, names,
    process::ProcessConfig,
    vma::{VMA_CONFIG, VmaConfig},
};

use crate::{
    fault_counting::FaultCounters,
    faults::{self, FaultHooks, FaultOptions, FaultReport},
    filter::{Filters, ProcessHealth},
    probe::{self, KernelBtf},
    syscall::Syscall,
};

mod vma;
pub use vma::{HookedFunction, VmaHooks};

/// The eBPF object built by `build.rs`, embedded so the binary is self-contained.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memlock-trace"));

/// Which processes to trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Targets {
    /// Every process on the system.
    All,
    /// Only these thread groups (and ones added later with [`Tracer::add_target`]).
    Tgids(Vec<u32>),
}

/// The tracer's own health, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Health {
    /// Events lost because the ring buffer was full.
    pub dropped_events: u64,
    /// Syscalls not traced because the in-flight table was full.
    pub untracked_calls: u64,
    /// Kernel reads that failed (fields reported as 0).
    pub failed_reads: u64,
    /// VMA records (snapshots, stores, function calls) lost because the ring buffer was full.
    pub dropped_vma_records: u64,
    /// Fork/exit tracking and the per-process table (see `filter.rs`).
    pub processes: ProcessHealth,
}

/// What to load beyond the defaults.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Report every VMA store of traced processes, not only mlock-related ones.
    pub all_vma_stores: bool,
    /// Fail unless the VMA family attaches (`verify` needs it); otherwise it is best-effort.
    pub require_vma: bool,
    /// `--comm`, `--cgroup`, `--follow-children`.
    pub filters: Filters,
    /// Page-fault hooks and what they record.
    pub faults: FaultOptions,
}

/// Loaded and attached programs; dropping it detaches everything.
pub struct Tracer {
    pub(crate) ebpf: Ebpf,
    targets: HashMap<MapData, u32, u8>,
    /// Hook family -> the hooks it uses on this kernel, for the user to see.
    pub hooks: BTreeMap<&'static str, String>,
    /// The VMA family's hook set, when it attached (decoding function events needs it).
    pub vma: Option<VmaHooks>,
    /// The page-fault hook set chosen for this kernel (None with `--fault-hooks off`).
    pub fault_hooks: Option<FaultHooks>,
    /// Count-only on the tracepoint set: the targets' perf counters.
    fault_counters: Option<FaultCounters>,
    fault_options: FaultOptions,
    /// The fault hooks' fast path for a single traced process (see `FAULT_SOLE_TGID` in the
    /// eBPF crate).
    sole: SoleTarget,
}

/// Whether the fault hooks may use their single-process fast path, and for whom.
#[derive(Clone, Copy, Debug)]
struct SoleTarget {
    /// Nothing can make a second process a target, nor filter the one there is.
    allowed: bool,
    targets: usize,
    /// The process whose statistics the fast path has held, if any: they stay there when a
    /// second target ends the fast path.
    tgid: Option<u32>,
}

impl Tracer {
    /// [`Tracer::load_with`] with the defaults (best fault hooks, with latency).
    pub fn load(targets: &Targets) -> Result<Self> {
        Self::load_with(targets, &Options::default())
    }

    /// Checks privileges and kernel support, loads the programs with this kernel's struct
    /// offsets and attaches them.
    /// [`Tracer::load`] with [`Options`].
    pub fn load_with(targets: &Targets, options: &Options) -> Result<Self> {
        probe::check_privileges()?;
        probe::ensure_tracefs()?;
        let btf = KernelBtf::load()?;
        let config = Config {
            filter: match targets {
                Targets::All => filter::ALL,
                Targets::Tgids(_) => filter::TGIDS,
            },
            _pad: 0,
            offsets: btf.offsets()?,
        };
        // Without the fields it reads, the VMA family stays unattached (or fails if required).
        let vma_config = vma::config(&btf, options.all_vma_stores);
        if let (Err(error), true) = (&vma_config, options.require_vma) {
            return Err(anyhow!(
                "VMA tracing is not possible on this kernel: {error:#}"
            ));
        }
        let vma_global = vma_config.as_ref().copied().unwrap_or(VmaConfig::ZERO);
        let filters = &options.filters;
        let fault_options = &options.faults;
        let fault_config = faults::config(&btf, fault_options)?;
        let globals = Globals {
            vma: vma_global,
            process: filters.process_config(&btf)?,
            max_targets: filters.max_targets,
            faults: Some(fault_config),
        };
        let mut ebpf = load_object_with(&config, &globals)?;

        let targets_map = ebpf
            .take_map(names::TARGET_TGIDS)
            .ok_or_else(|| anyhow!("map {} missing from the eBPF object", names::TARGET_TGIDS))?;
        let mut tracer = Self {
            targets: HashMap::try_from(targets_map)?,
            ebpf,
            hooks: BTreeMap::new(),
            vma: None,
            fault_hooks: None,
            fault_counters: None,
            fault_options: fault_options.clone(),
            sole: SoleTarget {
                allowed: matches!(targets, Targets::Tgids(_))
                    && !filters.follow_children
                    && filters.comm.is_none()
                    && filters.cgroup.is_none()
                    && !fault_options.per_thread,
                targets: 0,
                tgid: None,
            },
        };
        if let Targets::Tgids(tgids) = targets {
            let hooks = crate::filter::attach(&mut tracer.ebpf, filters)?;
            tracer.hooks.insert("processes", hooks);
            for &tgid in tgids {
                tracer.add_target(tgid)?;
            }
        }
        tracer.attach_syscalls()?;
        let vma = match vma_config {
            Ok(_) => tracer.attach_vma(&btf),
            Err(error) => Err(error),
        };
        match vma {
            Ok(hooks) => {
                tracer.hooks.insert("vma", hooks.describe());
                tracer.vma = Some(hooks);
            }
            Err(error) if options.require_vma => return Err(error),
            Err(error) => {
                tracer.hooks.insert("vma", format!("not traced: {error:#}"));
            }
        }
        let specific_targets = matches!(targets, Targets::Tgids(_));
        tracer.fault_hooks =
            faults::attach(&mut tracer.ebpf, &btf, fault_options, specific_targets)?;
        if tracer.fault_hooks.as_ref().is_some_and(|h| h.counting) {
            let mut counters = FaultCounters::default();
            if let Targets::Tgids(tgids) = targets {
                for &tgid in tgids {
                    counters.add(tgid)?;
                }
            }
            tracer.fault_counters = Some(counters);
        }
        if let Some(hooks) = &tracer.fault_hooks {
            let mut line = format!("{} ({})", hooks.hook_set.name(), hooks.hooks.join(", "));
            for refusal in &hooks.refused {
                let reason = refusal.reason.lines().next().unwrap_or_default();
                let _ = write!(line, "; {} refused: {reason}", refusal.hook_set.name());
            }
            tracer.hooks.insert("faults", line);
        }
        Ok(tracer)
    }

    /// Starts tracing thread group `tgid` (all its threads, present and future).
    pub fn add_target(&mut self, tgid: u32) -> Result<()> {
        self.targets
            .insert(tgid, 1, 0)
            .with_context(|| format!("adding pid {tgid} to the trace filter"))?;
        if let Some(counters) = &mut self.fault_counters {
            counters.add(tgid)?;
        }
        self.sole.targets += 1;
        if self.sole.allowed && self.sole.targets <= 2 {
            // The first target takes the fast path, a second one ends it.
            let sole = if self.sole.targets == 1 { tgid } else { 0 };
            faults::set_sole_target(&mut self.ebpf, sole)?;
            self.sole.tgid.get_or_insert(tgid);
        }
        Ok(())
    }

    fn attach_syscalls(&mut self) -> Result<()> {
        for syscall in Syscall::ALL {
            let enter = format!("sys_enter_{}", syscall.name());
            self.tracepoint(&enter)?
                .attach("syscalls", &enter)
                .map_err(|e| hook_refused(&enter, "tracepoint", e))?;
        }
        let exit_prog = "sys_exit_mlock_family";
        for syscall in Syscall::ALL {
            let exit = format!("sys_exit_{}", syscall.name());
            self.tracepoint(exit_prog)?
                .attach("syscalls", &exit)
                .map_err(|e| hook_refused(&exit, "tracepoint", e))?;
        }
        self.hooks.insert(
            "syscalls",
            "tracepoints syscalls:sys_{enter,exit}_{mlock,mlock2,munlock,mlockall,munlockall}"
                .into(),
        );
        Ok(())
    }

    /// The named tracepoint program, loaded into the kernel on first use.
    fn tracepoint(&mut self, name: &str) -> Result<&mut TracePoint> {
        let program: &mut TracePoint = self
            .ebpf
            .program_mut(name)
            .ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))?
            .try_into()?;
        if program.fd().is_err() {
            program
                .load()
                .map_err(|e| hook_refused(name, "tracepoint", e))?;
        }
        Ok(program)
    }

    /// The ring buffer all events arrive on. Can be taken once.
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map(names::EVENTS)
            .ok_or_else(|| anyhow!("the event ring buffer was already taken"))?;
        Ok(RingBuf::try_from(map)?)
    }

    /// The ring buffer of sampled fault events (`--events`); None when faults are not traced.
    /// Can be taken once.
    pub fn take_fault_events(&mut self) -> Result<Option<RingBuf<MapData>>> {
        if self.fault_hooks.is_none() {
            return Ok(None);
        }
        let map = self
            .ebpf
            .take_map(memlock_trace_common::faults::names::FAULT_EVENTS)
            .ok_or_else(|| anyhow!("the fault event ring buffer was already taken"))?;
        Ok(Some(RingBuf::try_from(map)?))
    }

    /// The kernel's fault aggregation so far (None when faults are not traced).
    pub fn fault_report(&self) -> Result<Option<FaultReport>> {
        if self.fault_hooks.is_none() {
            return Ok(None);
        }
        let mut report = faults::read(&self.ebpf, self.fault_options.per_thread, self.sole.tgid)?;
        if let Some(counters) = &self.fault_counters {
            report.add_counted(counters.read());
        }
        if self.fault_options.stacks {
            let stacks = crate::stacks::read(&self.ebpf)?;
            report.health.stacks_dropped = Some(stacks.dropped);
            report.health.stacks_evicted = Some(stacks.evicted);
            report.stacks = Some(stacks);
        }
        Ok(Some(report))
    }

    /// Processes with fault statistics (cheap: keys only).
    pub fn fault_pids(&self) -> Result<std::collections::BTreeSet<u32>> {
        let mut pids = faults::pids(&self.ebpf)?;
        pids.extend(self.sole.tgid);
        Ok(pids)
    }

    /// The process the fault hooks' single-process fast path counts for, while it is on.
    pub fn fault_fast_path(&self) -> Option<u32> {
        self.sole.tgid.filter(|_| self.sole.targets == 1)
    }

    pub fn fault_options(&self) -> &FaultOptions {
        &self.fault_options
    }

    pub fn health(&self) -> Result<Health> {
        let map = self
            .ebpf
            .map(names::COUNTERS)
            .ok_or_else(|| anyhow!("map {} missing", names::COUNTERS))?;
        let counters: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map)?;
        let sum = |index: u32| -> Result<u64> { Ok(counters.get(&index, 0)?.iter().sum()) };
        Ok(Health {
            dropped_events: sum(counter::RINGBUF_DROPPED)?,
            untracked_calls: sum(counter::INFLIGHT_FULL)?,
            failed_reads: sum(counter::READ_FAILED)?,
            dropped_vma_records: sum(counter::VMA_DROPPED)?,
            processes: crate::filter::health(&self.ebpf)?,
        })
    }
}

/// Creates the object's maps with `config` baked into its read-only globals; no program is
/// loaded yet.
pub fn load_object(config: &Config) -> Result<Ebpf> {
    load_object_with(config, &Globals::default())
}

/// Load-time settings of the hook families beyond [`Config`].
#[derive(Clone, Copy, Debug)]
pub struct Globals {
    pub vma: VmaConfig,
    /// The process filters (`--comm`, `--cgroup`, `--follow-children`).
    pub process: ProcessConfig,
    /// Capacity of the target set, when not `MAX_TARGETS`.
    pub max_targets: Option<u32>,
    /// The fault hooks' globals and map sizes.
    pub faults: Option<FaultConfig>,
}

impl Default for Globals {
    fn default() -> Self {
        Self {
            vma: VmaConfig::ZERO,
            process: ProcessConfig::default(),
            max_targets: None,
            faults: None,
        }
    }
}

/// [`load_object`] with every family's globals.
pub fn load_object_with(config: &Config, globals: &Globals) -> Result<Ebpf> {
    let mut loader = EbpfLoader::new();
    loader
        .override_global(names::CONFIG, config, true)
        .override_global(VMA_CONFIG, &globals.vma, true)
        .override_global(
            memlock_trace_common::process::names::PROCESS_CONFIG,
            &globals.process,
            true,
        );
    if let Some(max) = globals.max_targets {
        loader.map_max_entries(names::TARGET_TGIDS, max);
    }
    if let Some(fault_config) = &globals.faults {
        faults::prepare_loader(&mut loader, fault_config)?;
    }
    loader.load(EBPF_OBJECT).context(
        "creating the eBPF maps failed (is RLIMIT_MEMLOCK too low on a kernel older than 5.11?)",
    )
}

/// Turns a refused load or attach into a message naming the program, the kernel's reason
/// (the last lines of the verifier log) and what to do about it.
pub fn hook_refused(program: &str, kind: &str, error: ProgramError) -> anyhow::Error {
    let mut message = format!("the kernel refused {kind} program `{program}`: ");
    match &error {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            let tail: Vec<&str> = log.lines().rev().take(8).collect();
            let _ = write!(message, "{io_error}");
            if !tail.is_empty() {
                let _ = write!(message, "\nverifier log (last lines):");
                for line in tail.iter().rev() {
                    let _ = write!(message, "\n    {line}");
                }
            }
        }
        other => {
            let _ = write!(message, "{other}");
            if let Some(source) = std::error::Error::source(other) {
                let _ = write!(message, ": {source}");
            }
        }
    }
    let _ = write!(
        message,
        "\nrun `memlock-trace probe` to see which hooks this kernel allows{}",
        if kind == "tracepoint" {
            "; tracepoints need tracefs mounted at /sys/kernel/tracing"
        } else {
            ""
        }
    );
    message.push_str(&crate::filter::perf_paranoid_hint(&message));
    anyhow!(message)
}

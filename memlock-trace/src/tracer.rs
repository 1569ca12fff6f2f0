//! The tracer: loads the eBPF object with this kernel's offsets and every family's globals,
//! attaches each hook family through [`HookFamily::attach`], and reads back what they
//! share (the event rings, the health counters, the target set).

use std::collections::BTreeMap;

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    maps::{HashMap, MapData, RingBuf},
};
use memlock_trace_common::{counter, names, process::ProcessKey};

use aya_log::EbpfLogger;

use crate::{
    faults::{self, FaultHooks, FaultOptions, FaultReport, HookChoice, counting::FaultCounters},
    kernel_log::{self, KernelLog},
    object::{self, AttachContext, HookFamily, HookLine},
    per_cpu::CpuCounters,
    probe::{self, KernelBtf},
    process::{Filters, ProcessHealth, ProcessHooks, Targets, filters, identity::Identity},
    syscalls::{self, SyscallHooks},
    vma::VmaHooks,
};

mod globals;

use globals::{Globals, Reach};

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
    /// Reads of a living process's `/proc/PID/smaps` that failed (user space, not the
    /// kernel programs): its faults went to its last mappings read, or `unknown`.
    pub unreadable_mappings: u64,
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
    /// The programs' own diagnostics (`-v`): an aya-log level, 0 for none.
    pub kernel_log: u8,
    /// Tests only (`--test-unreadable-mm`): the syscall programs take `task_struct.min_flt`
    /// for the `mm` pointer, so their `mm_struct` reads fail.
    pub unreadable_mm: bool,
    /// Tests only (`--test-ring-bytes`): the size of the event ring buffer, to make it drop.
    pub ring_bytes: Option<u32>,
    /// System-wide, leave this process out. The session's own faults are its reading of the
    /// maps, counted while it reads them: its row disagreed with itself (614 faults, 1,645
    /// of them timed). Tests that trace themselves in-process keep it false.
    pub leave_out_self: bool,
}

/// Loaded and attached programs; dropping it detaches everything.
pub struct Tracer {
    pub(crate) ebpf: Ebpf,
    targets: HashMap<MapData, u32, u8>,
    /// Hook family -> the hooks it uses on this kernel, for the user to see.
    pub hooks: BTreeMap<&'static str, HookLine>,
    /// The VMA family's hook set, when it attached (decoding function events needs it).
    pub vma: Option<VmaHooks>,
    /// The page-fault hook set chosen for this kernel (None with `--fault-hooks off`).
    pub fault_hooks: Option<FaultHooks>,
    /// Count-only on the tracepoint set: the targets' perf counters.
    fault_counters: Option<FaultCounters>,
    fault_options: FaultOptions,
    /// `--stacks`: the kept stacks' modules, known from before the session starts (a
    /// launched command's at its exec); the session takes it.
    pub stacks: Option<crate::unwind::StackCollector>,
    /// The fault hooks' fast path for a single traced process (see `FAULT_SOLE_TGID` in the
    /// eBPF crate).
    sole: SoleTarget,
    /// `-v`: the programs' log records, read by [`Tracer::flush_kernel_log`].
    kernel_log: Option<EbpfLogger<KernelLog>>,
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
        // aya's loader parses the kernel's BTF as it is made: on a thread, while this one
        // reads the offsets.
        let loader = object::NewLoader::start();
        let btf = KernelBtf::load()?;
        let globals = Globals::read(&btf, targets, options)?;
        let loader = loader.finish();
        // aya's parse of the kernel BTF, which tp_btf and fentry programs load against (the
        // loader's own is out of reach): on a second thread, while this one creates the maps.
        let aya_btf = std::thread::spawn(aya::Btf::from_sys_fs);
        let ebpf = object::load(loader, &globals.config, |loader| {
            globals.prepare(loader, options)
        })?;
        let mut tracer = Self::new(ebpf, options, globals.reach)?;
        // An error is the families' to report, when they parse it again and need it.
        let aya_btf = aya_btf.join().ok().and_then(Result::ok);
        let aya_btf = tracer.attach_targets(
            &btf,
            aya_btf,
            targets,
            &options.filters,
            globals.syscall_hooks_possible,
        )?;
        tracer.attach_families(&btf, aya_btf, options, globals)?;
        tracer.start_fault_counters(targets)?;
        Ok(tracer)
    }

    /// The tracer over the loaded object, before anything is attached.
    fn new(mut ebpf: Ebpf, options: &Options, reach: Reach) -> Result<Self> {
        // Before any program is attached, so that nothing they log is missed.
        let kernel_log = match options.kernel_log {
            0 => None,
            _ => Some(kernel_log::start(&mut ebpf)?),
        };
        let targets_map = ebpf
            .take_map(names::TARGET_TGIDS)
            .ok_or_else(|| anyhow!("map {} missing from the eBPF object", names::TARGET_TGIDS))?;
        let fault_options = &options.faults;
        Ok(Self {
            targets: HashMap::try_from(targets_map)?,
            ebpf,
            hooks: BTreeMap::new(),
            vma: None,
            fault_hooks: None,
            fault_counters: None,
            fault_options: fault_options.clone(),
            stacks: fault_options
                .stacks
                .then(|| crate::unwind::StackCollector::new(fault_options.stack_sample)),
            sole: SoleTarget {
                allowed: reach.sole_target_allowed(),
                targets: 0,
                tgid: None,
            },
            kernel_log,
        })
    }

    /// Process identity (exec, exit) everywhere; targets first, so that nothing they do
    /// after the hooks attach is missed. Gives `aya_btf` back for the families.
    fn attach_targets(
        &mut self,
        btf: &KernelBtf,
        aya_btf: Option<aya::Btf>,
        targets: &Targets,
        filters: &Filters,
        syscall_hooks_possible: u32,
    ) -> Result<Option<aya::Btf>> {
        let mut cx = AttachContext::new(&mut self.ebpf, btf, true, syscall_hooks_possible)
            .with_aya_btf(aya_btf);
        let hooks = ProcessHooks::attach(&mut cx, filters)?;
        let aya_btf = cx.into_aya_btf();
        self.hooks.insert(ProcessHooks::NAME, hooks.hook_line());
        if let Targets::Tgids(tgids) = targets {
            for &tgid in tgids {
                self.add_target(tgid)?;
            }
        }
        Ok(aya_btf)
    }

    /// The hook families. A family the kernel cannot serve is reported as not traced, with
    /// its reason, and the others carry on: one family never stops the tracer (unless the
    /// user required it).
    fn attach_families(
        &mut self,
        btf: &KernelBtf,
        aya_btf: Option<aya::Btf>,
        options: &Options,
        globals: Globals,
    ) -> Result<()> {
        let fault_options = &options.faults;
        let mut cx = AttachContext::new(
            &mut self.ebpf,
            btf,
            globals.reach.per_process_events(),
            globals.syscall_hooks_possible,
        )
        .with_aya_btf(aya_btf);
        let syscalls = match SyscallHooks::attach(&mut cx, &globals.rss) {
            Ok(hooks) => hooks.hook_line(),
            Err(error) => HookLine::not_traced(&error),
        };
        self.hooks.insert(SyscallHooks::NAME, syscalls);
        match globals.vma.and_then(|_| VmaHooks::attach(&mut cx, &())) {
            Ok(hooks) => {
                self.hooks.insert(VmaHooks::NAME, hooks.hook_line());
                self.vma = Some(hooks);
            }
            Err(error) if options.require_vma => return Err(error),
            Err(error) => {
                self.hooks
                    .insert(VmaHooks::NAME, HookLine::not_traced(&error));
            }
        }
        if fault_options.hooks != HookChoice::Off {
            match FaultHooks::attach(&mut cx, fault_options) {
                Ok(hooks) => {
                    self.hooks.insert(FaultHooks::NAME, hooks.hook_line());
                    self.fault_hooks = Some(hooks);
                }
                // A hook set the user forced is theirs to give up on.
                // So is sampled latency: counts without it would not be what was asked.
                Err(error)
                    if fault_options.hooks != HookChoice::Auto
                        || fault_options.samples_latency() =>
                {
                    return Err(error);
                }
                Err(error) => {
                    self.hooks
                        .insert(FaultHooks::NAME, HookLine::not_traced(&error));
                }
            }
        }
        if fault_options.stacks {
            crate::unwind::attach(&mut cx)?;
        }
        Ok(())
    }

    /// Count-only on the tracepoint set (and sampled completion): the targets' perf
    /// counters, opened once the fault hooks are attached.
    fn start_fault_counters(&mut self, targets: &Targets) -> Result<()> {
        let Some(hooks) = self
            .fault_hooks
            .as_ref()
            .filter(|h| h.plan.per_target_events())
        else {
            return Ok(());
        };
        let mut counters = match hooks.completion_programs {
            Some(names) => FaultCounters::with_completion(faults::counting::Completion {
                programs: faults::attach::completion_fds(&self.ebpf, names)?,
                period: u64::from(hooks.latency_sample),
                start: hooks
                    .start_program
                    .map(|name| faults::attach::program_fd(&self.ebpf, name))
                    .transpose()?,
            }),
            None => FaultCounters::default(),
        };
        if let Targets::Tgids(tgids) = targets {
            for &tgid in tgids {
                counters.add(tgid)?;
            }
        }
        self.fault_counters = Some(counters);
        Ok(())
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
            faults::read::set_sole_target(&mut self.ebpf, sole)?;
            self.sole.tgid.get_or_insert(tgid);
        }
        Ok(())
    }

    /// Detaches every hook at once ([`crate::detach`]) and forgets the tracer, whose hook
    /// descriptors are closed behind aya's back (its maps stay open until the exit): for the
    /// end of a session, once its summary is written, right before the process exits.
    pub fn detach_all(self) {
        // Before any descriptor is closed: from here on, nothing drops it.
        let _never_dropped = std::mem::ManuallyDrop::new(self);
        crate::detach::close_all();
    }

    /// Processes of the target set still alive. The exit program removes a process when its
    /// last thread exits; /proc is asked too, for a pid added after its process had gone.
    pub fn live_targets(&self) -> usize {
        self.targets
            .keys()
            .filter_map(Result::ok)
            .filter(|pid| crate::procfs::is_alive(*pid))
            .count()
    }

    /// The name each traced process had when it exited, by (pid, start time).
    pub fn exit_comms(&self) -> Result<BTreeMap<ProcessKey, crate::output::Outside>> {
        filters::exit_comms(&self.ebpf)
    }

    /// Who each counted process is (its name after exec, its cgroup), by (pid, start time).
    pub fn identities(&self) -> Result<BTreeMap<ProcessKey, Identity>> {
        crate::process::identity::read(&self.ebpf)
    }

    /// The mlock-family calls the kernel counted, per process, call and outcome.
    pub fn syscall_report(&self) -> Result<syscalls::read::SyscallReport> {
        syscalls::read::read(&self.ebpf)
    }

    /// `-v`: prints the programs' log records written since the last call.
    pub fn flush_kernel_log(&mut self) {
        if let Some(log) = &mut self.kernel_log {
            log.flush();
        }
    }

    /// The ring buffer all events arrive on. Can be taken once.
    pub fn take_events(&mut self) -> Result<RingBuf<MapData>> {
        self.take_ring(names::EVENTS, "event")
    }

    /// The ring buffer `name` (the `what` ring buffer, to the user), out of the object.
    fn take_ring(&mut self, name: &str, what: &str) -> Result<RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map(name)
            .ok_or_else(|| anyhow!("the {what} ring buffer was already taken"))?;
        Ok(RingBuf::try_from(map)?)
    }

    /// The ring buffer of sampled fault events (`--events`); None when faults are not traced.
    /// Can be taken once.
    pub fn take_fault_events(&mut self) -> Result<Option<RingBuf<MapData>>> {
        if self.fault_hooks.is_none() {
            return Ok(None);
        }
        let name = memlock_trace_common::faults::names::FAULT_EVENTS;
        self.take_ring(name, "fault event").map(Some)
    }

    /// The kernel's fault aggregation so far (None when faults are not traced).
    pub fn fault_report(&self) -> Result<Option<FaultReport>> {
        if self.fault_hooks.is_none() {
            return Ok(None);
        }
        let mut report =
            faults::read::read(&self.ebpf, self.fault_options.per_thread, self.sole.tgid)?;
        let counted_by_perf = self
            .fault_hooks
            .as_ref()
            .is_some_and(|h| h.plan.counted_by_perf());
        if let Some(counters) = self.fault_counters.as_ref().filter(|_| counted_by_perf) {
            report.add_counted(counters.read());
        }
        // The fast path and the perf counters count by pid: the start time is the latest
        // the kernel recorded for it, read after the counts (see `learn_starts`).
        let identities = self.identities()?;
        report.learn_starts(|tgid| {
            identities
                .keys()
                .filter(|k| k.tgid == tgid)
                .map(|k| k.start_ns)
                .max()
                .unwrap_or(0)
        });
        Ok(Some(report))
    }

    /// `--stacks`: the ring buffer of kept stacks (None without it). Can be taken once.
    pub fn take_stack_samples(&mut self) -> Result<Option<RingBuf<MapData>>> {
        if !self.fault_options.stacks {
            return Ok(None);
        }
        let name = memlock_trace_common::stacks::names::STACK_SAMPLES;
        self.take_ring(name, "stack").map(Some)
    }

    /// `--stacks`: (calls, faults) whose stacks the kernel could not keep (ring buffer
    /// full); None without `--stacks`.
    pub fn stacks_dropped(&self) -> Result<Option<(u64, u64)>> {
        if !self.fault_options.stacks {
            return Ok(None);
        }
        crate::unwind::kernel_dropped(&self.ebpf).map(Some)
    }

    /// Processes with fault statistics (cheap: keys only).
    pub fn fault_pids(&self) -> Result<std::collections::BTreeSet<u32>> {
        let mut pids = faults::read::pids(&self.ebpf)?;
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
        let counters = CpuCounters::open(&self.ebpf, names::COUNTERS)?;
        let sum = |index: u32| counters.sum(index);
        Ok(Health {
            dropped_events: sum(counter::RINGBUF_DROPPED)?,
            untracked_calls: sum(counter::INFLIGHT_FULL)?,
            failed_reads: sum(counter::READ_FAILED)?,
            dropped_vma_records: sum(counter::VMA_DROPPED)?,
            processes: filters::health(&self.ebpf)?,
            unreadable_mappings: 0,
        })
    }
}

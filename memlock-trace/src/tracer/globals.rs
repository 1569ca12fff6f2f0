//! What the programs are loaded with beyond the object itself: this kernel's struct
//! offsets, every family's globals and the maps' sizes, decided once from the targets and
//! the options before any map is created.

use anyhow::{Result, anyhow};
use aya::EbpfLoader;
use memlock_trace_common::{
    Config, faults::FaultConfig, filter, mapping::MAPPING_CONFIG, mapping::MappingConfig, names,
    process::ProcessConfig, process::names::PROCESS_CONFIG, rss::RssConfig, stacks::StackConfig,
    vma::VMA_CONFIG, vma::VmaConfig,
};

use super::Options;
use crate::{faults, kernel_log, probe::KernelBtf, process::Targets, syscalls, unwind};

/// Who the kernel traces, decided once from the targets and options: the maps' sizes, the
/// hooks' choice and the single-process fast path all read it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reach {
    /// Specific processes (`-p`, a command), not the whole system.
    specific: bool,
    /// `--follow-children`: children join the targets in the kernel.
    follows_children: bool,
    /// `--per-thread`: statistics per thread, not per process.
    per_thread: bool,
    /// `--comm` or `--cgroup`: a process may match only after an exec or a move.
    filtered: bool,
}

impl Reach {
    /// Per-thread perf events (counting, start, completion) reach a target's new threads by
    /// inheritance, but not the children `--follow-children` adds in the kernel: with it, the
    /// fault family hooks every process and the target set filters, as system-wide.
    pub(super) fn per_process_events(self) -> bool {
        self.specific && !self.follows_children
    }

    /// Few keys in the statistics maps: one per traced process.
    fn few_processes(self) -> bool {
        self.per_process_events() && !self.per_thread
    }

    /// Nothing can make a second process a target, nor filter the one there is.
    pub(super) fn sole_target_allowed(self) -> bool {
        self.few_processes() && !self.filtered
    }
}

/// The globals and map sizes the object is loaded with.
pub(super) struct Globals {
    /// The read-only `CONFIG` every program reads.
    pub(super) config: Config,
    /// Without the fields it reads, the VMA family stays unattached (or fails if required).
    pub(super) vma: Result<VmaConfig>,
    vma_global: VmaConfig,
    mapping: MappingConfig,
    process: ProcessConfig,
    faults: FaultConfig,
    stacks: StackConfig,
    pub(super) rss: RssConfig,
    pub(super) reach: Reach,
    /// What the programs are loaded with as `SYSCALL_HOOKS_POSSIBLE`.
    pub(super) syscall_hooks_possible: u32,
}

impl Globals {
    /// Reads what each family needs from the kernel's BTF.
    pub(super) fn read(btf: &KernelBtf, targets: &Targets, options: &Options) -> Result<Self> {
        let mut config = Config {
            filter: if targets.specific() {
                filter::TGIDS
            } else {
                filter::ALL
            },
            leave_out_tgid: if options.leave_out_self {
                std::process::id()
            } else {
                0
            },
            offsets: btf.offsets()?,
        };
        if options.unreadable_mm {
            // A count of faults is no kernel address: every read through it fails.
            config.offsets.task_mm = config.offsets.task_min_flt;
        }
        let vma = crate::vma::config::config(btf, options.all_vma_stores);
        if let (Err(error), true) = (&vma, options.require_vma) {
            return Err(anyhow!(
                "VMA tracing is not possible on this kernel: {error:#}"
            ));
        }
        let vma_global = vma.as_ref().copied().unwrap_or(VmaConfig::ZERO);
        let filters = &options.filters;
        let fault_options = &options.faults;
        Ok(Self {
            config,
            vma,
            vma_global,
            // Without them the in-kernel VMA lookups find nothing: faults fall back to pages
            // named from smaps, and a failed mlock's range goes unchecked (and says so).
            mapping: btf.mapping_config().unwrap_or(MappingConfig::ZERO),
            process: filters.process_config(btf)?,
            faults: faults::sizing::config(btf, fault_options)?,
            stacks: unwind::config(btf, fault_options.stacks, fault_options.stack_sample)?,
            rss: syscalls::rss::config(btf),
            syscall_hooks_possible: crate::object::possible_hooks(btf),
            reach: Reach {
                specific: targets.specific(),
                follows_children: filters.follow_children,
                per_thread: fault_options.per_thread,
                filtered: filters.comm.is_some() || filters.cgroup.is_some(),
            },
        })
    }

    /// Sets the families' globals and map sizes on the loader, before the maps are created.
    pub(super) fn prepare<'a>(
        &'a self,
        loader: &mut EbpfLoader<'a>,
        options: &Options,
    ) -> Result<()> {
        let stacks = options.faults.stacks;
        loader
            .override_global(VMA_CONFIG, &self.vma_global, true)
            .override_global(MAPPING_CONFIG, &self.mapping, true)
            .override_global(PROCESS_CONFIG, &self.process, true)
            .override_global(
                names::SYSCALL_HOOKS_POSSIBLE,
                &self.syscall_hooks_possible,
                true,
            );
        if let Some(max) = options.filters.max_targets {
            loader.map_max_entries(names::TARGET_TGIDS, max);
        }
        syscalls::stacks::prepare_loader(loader, stacks);
        syscalls::rss::prepare_loader(loader, &self.rss);
        syscalls::read::prepare_loader(loader, self.reach.few_processes())?;
        if let Some(bytes) = options.ring_bytes {
            loader.map_max_entries(names::EVENTS, bytes);
        }
        unwind::prepare_loader(loader, &self.stacks, stacks);
        kernel_log::prepare_loader(loader, options.kernel_log);
        faults::sizing::prepare_loader(loader, &self.faults, self.reach.few_processes())
    }
}

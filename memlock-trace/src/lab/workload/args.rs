//! Which reference experiment to run, and at which sizes: every size and count can be
//! changed on the command line, and sizes beyond what the machine has are refused before
//! anything starts.

use std::{ffi::OsString, path::PathBuf};

use anyhow::{Context as _, Result, bail};
use clap::{Args, ValueEnum};

use crate::values::{int, secs_up_to};

/// Largest size in MiB (or KiB where the flag says so): 1 TiB, beyond any machine here and
/// far from overflowing the byte counts computed from it.
const MAX_MIB: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    FirstTouch,
    ThreadCreate,
    ThreadStack,
    DynamicAlloc,
    VmaSplit,
    ThpSplit,
    ForkInherit,
    MallocVsMmap,
    MemlockLimit,
    VmMemory,
    MemoryPressure,
}

impl Scenario {
    pub const ALL: [Scenario; 11] = [
        Scenario::FirstTouch,
        Scenario::ThreadCreate,
        Scenario::ThreadStack,
        Scenario::DynamicAlloc,
        Scenario::VmaSplit,
        Scenario::ThpSplit,
        Scenario::ForkInherit,
        Scenario::MallocVsMmap,
        Scenario::MemlockLimit,
        Scenario::VmMemory,
        Scenario::MemoryPressure,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::FirstTouch => "first-touch",
            Scenario::ThreadCreate => "thread-create",
            Scenario::ThreadStack => "thread-stack",
            Scenario::DynamicAlloc => "dynamic-alloc",
            Scenario::VmaSplit => "vma-split",
            Scenario::ThpSplit => "thp-split",
            Scenario::ForkInherit => "fork-inherit",
            Scenario::MallocVsMmap => "malloc-vs-mmap",
            Scenario::MemlockLimit => "memlock-limit",
            Scenario::VmMemory => "vm-memory",
            Scenario::MemoryPressure => "memory-pressure",
        }
    }

    /// The variants run as separate processes; empty when the scenario is one process.
    pub fn variants(self) -> Vec<String> {
        let v = |names: &[&str]| names.iter().map(|s| s.to_string()).collect();
        match self {
            Scenario::FirstTouch => v(&["lazy", "mlock", "populate"]),
            Scenario::ThreadStack | Scenario::DynamicAlloc => v(&["off", "future"]),
            Scenario::MallocVsMmap => v(&["malloc", "mmap-locked"]),
            Scenario::VmMemory => v(&["mem-lock-off", "mem-lock-on"]),
            // thread-create spawns its own worker processes per (mode, P).
            Scenario::ThreadCreate
            | Scenario::VmaSplit
            | Scenario::ThpSplit
            | Scenario::ForkInherit
            | Scenario::MemlockLimit
            // memory-pressure runs its one process inside the cgroup it makes.
            | Scenario::MemoryPressure => Vec::new(),
        }
    }
}

/// Sizes and counts, all overridable; the defaults fit this 2-core, 24 GiB machine and keep
/// the whole suite within a few minutes.
#[derive(Clone, Debug, Args)]
pub struct ScenarioArgs {
    /// Region size for first-touch (MiB).
    #[arg(long, default_value_t = 16, value_parser = int(1usize, MAX_MIB))]
    pub touch_mib: usize,
    /// Heap size for dynamic-alloc (MiB).
    #[arg(long, default_value_t = 1024, value_parser = int(1usize, MAX_MIB))]
    pub alloc_mib: usize,
    /// Block size for dynamic-alloc's `churn` variant (MiB): above glibc's largest adaptive
    /// mmap threshold (32 MiB), so every `free` hands it back to the kernel.
    #[arg(long, default_value_t = 64, value_parser = int(1usize, MAX_MIB))]
    pub churn_mib: usize,
    /// Rounds of dynamic-alloc's `churn` variant (malloc, touch every page, free).
    #[arg(long, default_value_t = 10, value_parser = int(1usize, 100_000))]
    pub churn_rounds: usize,
    /// Sleep this long before the experiment starts: `advise` then sees the start-up end
    /// before the measured part (the suite's advice runs use it).
    #[arg(long, default_value_t = 0, value_parser = int(0u64, 60_000))]
    pub settle_ms: u64,
    /// Region size for malloc-vs-mmap (MiB).
    #[arg(long, default_value_t = 1024, value_parser = int(1usize, MAX_MIB))]
    pub records_mib: usize,
    /// Random writes and reads for malloc-vs-mmap.
    #[arg(long, default_value_t = 1_000_000, value_parser = int(1usize, 10_000_000_000))]
    pub accesses: usize,
    /// Repetitions where the experiment repeats (malloc-vs-mmap, first-touch).
    #[arg(long, default_value_t = 5, value_parser = int(1usize, 1000))]
    pub runs: usize,
    /// Process counts for thread-create (default: 1 up to the online CPUs, and twice the
    /// CPUs as one oversubscribed point).
    #[arg(long, value_delimiter = ',', value_parser = int(1usize, 256))]
    pub processes: Vec<usize>,
    /// Seconds each thread-create measurement lasts.
    #[arg(long, default_value_t = 1.0, value_parser = secs_up_to(3600.0))]
    pub seconds: f64,
    /// Thread stack size for thread-create (KiB; glibc's default is 8 MiB).
    #[arg(long, default_value_t = 8192, value_parser = int(16usize, MAX_MIB))]
    pub create_stack_kib: usize,
    /// thread-create: disable glibc's thread stack cache, so every thread maps (and under
    /// MCL_FUTURE populates) a fresh stack instead of reusing a cached one.
    #[arg(long)]
    pub no_stack_cache: bool,
    /// Threads for thread-stack.
    #[arg(long, default_value_t = 200, value_parser = int(1usize, 10_000))]
    pub threads: usize,
    /// Stack size for thread-stack (MiB).
    #[arg(long, default_value_t = 10, value_parser = int(1usize, 1024))]
    pub stack_mib: usize,
    /// Stack actually used per thread in thread-stack (KiB).
    #[arg(long, default_value_t = 1024, value_parser = int(0usize, MAX_MIB))]
    pub stack_used_kib: usize,
    /// RLIMIT_MEMLOCK for memlock-limit (KiB).
    #[arg(long, default_value_t = 1024, value_parser = int(0u64, 1 << 30))]
    pub limit_kib: u64,
    /// Guest memory for vm-memory (MiB).
    #[arg(long, default_value_t = 512, value_parser = int(16usize, MAX_MIB))]
    pub guest_mib: usize,
    /// Size of each of memory-pressure's three regions (lazy, populated, locked; MiB).
    #[arg(long, default_value_t = 32, value_parser = int(1usize, MAX_MIB))]
    pub pressure_region_mib: usize,
    /// memory-pressure's memory cgroup limit (MiB): below the regions plus the pressure.
    #[arg(long, default_value_t = 128, value_parser = int(8usize, MAX_MIB))]
    pub pressure_limit_mib: usize,
    /// memory-pressure's fourth allocation, touched to push the regions out (MiB).
    #[arg(long, default_value_t = 256, value_parser = int(1usize, MAX_MIB))]
    pub pressure_mib: usize,
    /// Kernel image for vm-memory (default: the one `cargo xtask test` cached).
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    /// Run only this variant (internal: the parent runs each variant as a child).
    #[arg(long, hide = true)]
    pub variant: Option<String>,
    /// Internal: run as a worker process of thread-create.
    #[arg(long, hide = true)]
    pub worker: bool,
}

impl ScenarioArgs {
    /// Small sizes for a quick whole-suite check (`--tiny`).
    pub fn tiny() -> Self {
        Self {
            touch_mib: 1,
            alloc_mib: 16,
            churn_mib: 40,
            churn_rounds: 4,
            settle_ms: 0,
            records_mib: 8,
            accesses: 20_000,
            runs: 1,
            processes: vec![1, 2],
            seconds: 0.2,
            create_stack_kib: 1024,
            no_stack_cache: false,
            threads: 8,
            stack_mib: 2,
            stack_used_kib: 256,
            limit_kib: 256,
            guest_mib: 128,
            pressure_region_mib: 8,
            pressure_limit_mib: 48,
            pressure_mib: 96,
            kernel: None,
            variant: None,
            worker: false,
        }
    }

    /// The same settings as command-line arguments, for a child `scenario` process (bytes:
    /// a `--kernel` path need not be UTF-8).
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = [
            ("--touch-mib", self.touch_mib.to_string()),
            ("--alloc-mib", self.alloc_mib.to_string()),
            ("--churn-mib", self.churn_mib.to_string()),
            ("--churn-rounds", self.churn_rounds.to_string()),
            ("--settle-ms", self.settle_ms.to_string()),
            ("--records-mib", self.records_mib.to_string()),
            ("--accesses", self.accesses.to_string()),
            ("--runs", self.runs.to_string()),
            (
                "--processes",
                self.processes
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            ("--seconds", self.seconds.to_string()),
            ("--create-stack-kib", self.create_stack_kib.to_string()),
            ("--threads", self.threads.to_string()),
            ("--stack-mib", self.stack_mib.to_string()),
            ("--stack-used-kib", self.stack_used_kib.to_string()),
            ("--limit-kib", self.limit_kib.to_string()),
            ("--guest-mib", self.guest_mib.to_string()),
            (
                "--pressure-region-mib",
                self.pressure_region_mib.to_string(),
            ),
            ("--pressure-limit-mib", self.pressure_limit_mib.to_string()),
            ("--pressure-mib", self.pressure_mib.to_string()),
        ]
        .into_iter()
        // No list given: the child works out the same default from the same CPUs.
        .filter(|(k, v)| *k != "--processes" || !v.is_empty())
        .flat_map(|(k, v)| [OsString::from(k), OsString::from(v)])
        .collect();
        if self.no_stack_cache {
            a.push("--no-stack-cache".into());
        }
        if let Some(k) = &self.kernel {
            a.extend(["--kernel".into(), k.clone().into_os_string()]);
        }
        a
    }

    /// thread-create's process counts: as given, or 1 up to the online CPUs plus one
    /// oversubscribed point (twice the CPUs), which measures time-slicing as well.
    pub fn process_counts(&self) -> Vec<usize> {
        if !self.processes.is_empty() {
            return self.processes.clone();
        }
        let cpus = online_cpus();
        (1..=cpus).chain([cpus * 2]).collect()
    }

    /// Refuses sizes the machine cannot hold before anything starts.
    pub fn check_limits(&self, scenario: Scenario) -> Result<()> {
        let avail_mib = available_memory_mib()?;
        let need = match scenario {
            Scenario::FirstTouch => self.touch_mib,
            Scenario::DynamicAlloc => self.alloc_mib.max(self.churn_mib),
            Scenario::MallocVsMmap => self.records_mib,
            Scenario::ThreadStack => self.threads * self.stack_mib,
            Scenario::VmMemory => self.guest_mib + 256,
            Scenario::MemoryPressure => self.pressure_limit_mib,
            _ => 0,
        };
        if need > avail_mib * 3 / 4 {
            bail!(
                "{} needs about {need} MiB but MemAvailable is {avail_mib} MiB: lower the size \
                 (at most {} MiB)",
                scenario.name(),
                avail_mib * 3 / 4
            );
        }
        if scenario == Scenario::ThreadStack && self.stack_used_kib > self.stack_mib * 1024 - 64 {
            bail!(
                "--stack-used-kib must leave room in the {} MiB stack",
                self.stack_mib
            );
        }
        if scenario == Scenario::MemoryPressure {
            let (region, limit) = (self.pressure_region_mib, self.pressure_limit_mib);
            // The locked region and the process itself must fit, and everything must not.
            if region + 16 > limit || 3 * region + self.pressure_mib <= limit {
                bail!(
                    "memory-pressure needs --pressure-limit-mib ({limit}) at least 16 MiB above \
                     --pressure-region-mib ({region}) and below three regions plus \
                     --pressure-mib ({})",
                    self.pressure_mib
                );
            }
        }
        if self.runs == 0 || self.processes.contains(&0) {
            bail!("--runs and --processes must be positive");
        }
        Ok(())
    }
}

/// The CPUs this process may run on.
pub fn online_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

fn available_memory_mib() -> Result<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map(|kib| kib / 1024)
        .context("no MemAvailable in /proc/meminfo")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: ScenarioArgs,
    }

    #[test]
    fn args_round_trip_through_the_command_line() {
        let tiny = ScenarioArgs::tiny();
        let parsed =
            Wrapper::parse_from(std::iter::once(OsString::from("x")).chain(tiny.to_args())).args;
        assert_eq!(format!("{parsed:?}"), format!("{tiny:?}"));
    }

    #[test]
    fn sizes_beyond_the_machine_are_refused() {
        let mut a = ScenarioArgs::tiny();
        a.alloc_mib = 1 << 30;
        let err = a
            .check_limits(Scenario::DynamicAlloc)
            .unwrap_err()
            .to_string();
        assert!(err.contains("MemAvailable"), "{err}");
        assert!(
            ScenarioArgs::tiny()
                .check_limits(Scenario::DynamicAlloc)
                .is_ok()
        );
    }
}

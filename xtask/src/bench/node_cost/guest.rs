//! `cargo xtask bench --node-cost --guest KERNEL`: the same figures inside a qemu guest booting
//! a stock kernel, where the syscall hooks are fentry/fexit trampolines on the hooked calls
//! (this host refuses them). The guest runs this very binary with `--in-guest`, which
//! measures memlock-trace's setups round after round and prints each run on a line of its
//! own; the host reads them off the console and writes the section. bpftrace is not carried
//! into the guest (its libraries are 200 MB): the comparison with it is the host's table.

use std::{fmt::Write as _, path::Path, time::Duration};

use anyhow::{Context as _, Result, bail};

use super::{
    Run, Setup,
    figures::Figures,
    measure_rounds,
    report::{self, GuestRuns},
    syscall_hooks_line,
};
use crate::{run::workspace_root, vm};

/// What the guest measures: memlock-trace's setups, no bpftrace.
const SETUPS: [Setup; 4] = [
    Setup::Untraced,
    Setup::SystemWide,
    Setup::SystemWideCountOnly,
    Setup::OtherProcess,
];
/// Starts each line the guest prints: a run's figures, or the syscall hooks.
const RUN_MARK: &str = "MEMLOCK-TRACE-NODE-COST-RUN";
const HOOKS_MARK: &str = "MEMLOCK-TRACE-NODE-COST-HOOKS";
/// Where the tracer is put in the guest.
const GUEST_TRACER: &str = "/opt/memlock-trace";

/// Inside the guest: measures and prints every run.
pub(in crate::bench) fn measure_here(tracer: &Path, rounds: usize) -> Result<()> {
    println!("{HOOKS_MARK} {}", syscall_hooks_line(tracer));
    measure_rounds(tracer, None, rounds, &SETUPS, |run| {
        let f = &run.figures;
        let optional = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v}"));
        println!(
            "{RUN_MARK} {} {} {} {} {} {} {} {}",
            run.round,
            SETUPS.iter().position(|&s| s == run.setup).unwrap_or(0),
            f.fork_exec_per_sec,
            optional(f.stress_fork_per_sec),
            f.getppid_ns,
            f.first_touch_ns,
            optional(f.map_bytes.map(|b| b as f64)),
            f.maps,
        );
    })?;
    Ok(())
}

/// On the host: boots each guest in turn (one at a time: side by side they would share the
/// machine's cores mid-measure), reads its runs and writes the section.
pub(in crate::bench) fn run(kernels: &[String], rounds: usize, out: &Path) -> Result<()> {
    if rounds < 3 {
        bail!("--runs must be at least 3 for --node-cost");
    }
    let tracer = crate::bench::build_tracer(crate::bench::TracerBuild::Product)?;
    let xtask = std::env::current_exe().context("finding xtask's own binary")?;
    let mut guests = Vec::new();
    for version in kernels {
        let kernel = vm::kernel(version)?;
        vm::ensure_assets(&vm::cache_dir(), kernel)?;
        eprintln!("xtask bench --node-cost: booting {version} ({rounds} rounds, emulated)");
        let report = vm::run(&vm::VmOptions {
            kernel,
            tests: vec![vm::VmTest {
                name: "node-cost".into(),
                binary: xtask.clone(),
                args: [
                    "bench",
                    "--node-cost",
                    "--runs",
                    &rounds.to_string(),
                    "--in-guest",
                    GUEST_TRACER,
                ]
                .map(String::from)
                .to_vec(),
            }],
            cache_dir: vm::cache_dir(),
            timeout: Duration::from_secs(3600),
            memory_mib: 2048,
            max_cpus: None,
            extra_files: vec![(tracer.clone(), GUEST_TRACER.into())],
            env: Vec::new(),
            programs: false,
        })?;
        let result = report
            .results
            .first()
            .context("the guest reported no result")?;
        if result.exit_code != 0 {
            bail!(
                "kernel {version}: the measuring failed (exit {}):\n{}",
                result.exit_code,
                result.output
            );
        }
        guests.push(parse(&report.kernel_release, &result.output)?);
    }
    let section = report::guest_section(&guests, rounds);
    let out = workspace_root().join(out);
    let existing = std::fs::read_to_string(&out).unwrap_or_default();
    std::fs::write(
        &out,
        super::super::report::replace_section(&existing, report::GUEST_SECTION, &section),
    )
    .with_context(|| format!("writing {}", out.display()))?;
    println!("{section}");
    println!("xtask bench --node-cost: wrote {}", out.display());
    Ok(())
}

/// The runs a guest printed.
fn parse(kernel: &str, console: &str) -> Result<GuestRuns> {
    let mut guest = GuestRuns {
        kernel: kernel.into(),
        hooks: String::new(),
        runs: Vec::new(),
    };
    for line in console.lines().map(str::trim) {
        if let Some(hooks) = line.strip_prefix(HOOKS_MARK) {
            guest.hooks = hooks.trim().into();
        }
        let Some(fields) = line.strip_prefix(RUN_MARK) else {
            continue;
        };
        let f: Vec<&str> = fields.split_whitespace().collect();
        let number = |i: usize| -> Result<f64> {
            f.get(i)
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("field {i} of the guest's line {line:?}"))
        };
        let optional = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok());
        if f.len() != 8 {
            bail!("the guest's line {line:?} has {} fields, not 8", f.len());
        }
        guest.runs.push(Run {
            round: number(0)? as usize,
            setup: *SETUPS
                .get(number(1)? as usize)
                .with_context(|| format!("no setup in {line:?}"))?,
            figures: Figures {
                fork_exec_per_sec: number(2)?,
                stress_fork_per_sec: optional(3),
                getppid_ns: number(4)?,
                first_touch_ns: number(5)?,
                map_bytes: optional(6).map(|b| b as u64),
                maps: number(7)? as usize,
            },
        });
    }
    if guest.runs.is_empty() {
        let mut tail = String::new();
        for line in console
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            let _ = writeln!(tail, "  {line}");
        }
        bail!("kernel {kernel}: the guest printed no run; its last lines:\n{tail}");
    }
    Ok(guest)
}

//! One tracing session: validate the request, load, launch, run the event loop until the
//! command exits, the duration is over, the targets exit or a signal arrives, then print
//! the summary.

use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result, anyhow};

use self::{
    output::{Output, OutputConfig, OutputStart, Scope},
    production::{Production, give_back_freed_memory},
    rings::Rings,
    stop::{Ending, Next, Stop, Stops, targets_ended},
    targets::{describe_targets, targets_are_specific, thread_group},
};
use crate::{
    UsageError,
    cli::TraceArgs,
    faults::FaultHooks,
    object::{HookFamily as _, HookLine},
    output::{Sink, WallClock},
    process::{Targets, launch, pids},
    procfs::MapsFile,
    tracer::{Options, Tracer},
};

pub mod fold;
pub mod groups;
mod order;
mod output;
mod process_summary;
mod production;
mod rings;
mod stop;
pub mod summary;
mod targets;

/// How often the mappings of traced processes are re-read (at most: see
/// `MappingCache::refresh`), so that a process that exits, even a script that runs for
/// 100 ms, is still attributed with recent mappings.
const MAPPINGS_REFRESH: Duration = Duration::from_millis(40);

/// How long the last drain after a stop may read: the summary is written and the tool gone
/// within half a second of SIGTERM, whatever is still flooding the rings.
const FINAL_DRAIN: Duration = Duration::from_millis(150);

/// How often, once the command or `-p` processes are gone, `--follow-children` checks
/// whether a followed process still lives.
const FOLLOWED_POLL: Duration = Duration::from_millis(100);

/// The error when the kernel's verifier gives up on a program with `-v`'s diagnostics in it.
pub const DIAGNOSTICS_REFUSED: &str =
    "this kernel's verifier gave up on the eBPF programs with their own diagnostics (-v)";

/// Loads the tracer. With `-v` the programs carry their own diagnostics (see
/// `memlock-trace-ebpf/src/diag.rs`, written so that the verifiers of 5.10 to 6.18 accept
/// them). Should a kernel's verifier still give up on a program because of them (too
/// complex: E2BIG), that is an error naming the program, not a family or a hook set quietly
/// lost or different from a run without `-v`.
fn load_tracer(targets: &Targets, options: Options) -> Result<Tracer> {
    let tracer = Tracer::load_with(targets, &options);
    if options.kernel_log == 0 {
        return tracer;
    }
    let reason = match &tracer {
        Ok(tracer) => tracer
            .hooks
            .values()
            .find(|h| h.too_complex())
            .map(HookLine::full),
        Err(error) => crate::object::too_complex(error).then(|| format!("{error:#}")),
    };
    match reason {
        Some(reason) => Err(anyhow!(
            "{DIAGNOSTICS_REFUSED}: {}\nrun without -v, which leaves the diagnostics out",
            reason.trim()
        )),
        None => tracer,
    }
}

/// Runs `memlock-trace [OPTIONS] [-- COMMAND]`; returns the process exit code (the launched
/// command's, when there is one).
pub fn run(mut args: TraceArgs) -> Result<i32> {
    // The session's window starts before a launched command can run.
    let started_ns = WallClock::now_ns();
    for &pid in &args.pids {
        if pid == 0 || !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(UsageError(format!("no process with pid {pid}")).into());
        }
    }
    // A thread id given to -p stands for its process; kernel threads are refused.
    let mut processes = Vec::new();
    for &pid in &args.pids {
        let tgid = pids::process_of(pid)?;
        if !processes.contains(&tgid) {
            processes.push(tgid);
        }
    }
    args.pids = processes;
    if let Some(tid) = args.tid {
        // The kernel filters by process: trace the thread's, keep the thread's own figures.
        let tgid = thread_group(tid)?;
        pids::refuse_kernel_thread("-t", tid)?;
        args.pids = vec![tgid];
    }
    // A file that cannot be written is refused before anything is loaded.
    let sink = Sink::open(args.output.as_deref())?;
    let profiles = args.profile.open()?;
    let targets = if args.pids.is_empty() && args.command.is_empty() {
        Targets::All
    } else {
        Targets::Tgids(args.pids.clone())
    };
    // `--user`: looked up now, so that an unknown user is refused before anything loads.
    let run_as = args
        .user
        .as_deref()
        .map(launch::RunAs::resolve)
        .transpose()?;
    let production = Production::setup(&args)?;
    let options = Options {
        all_vma_stores: args.all_vma_changes,
        filters: production.filters.clone(),
        faults: args.fault_options(),
        kernel_log: crate::kernel_log::level(args.verbose),
        unreadable_mm: args.test_unreadable_mm,
        ring_bytes: args.test_ring_bytes,
        leave_out_self: true,
        ..Options::default()
    };
    let mut tracer = load_tracer(&targets, options)?;
    let attached_ns = crate::procfs::boot_time_ns().unwrap_or(u64::MAX);
    // Fork before the runtime starts any thread. The command is added to the filter at its
    // exec trap: what the launcher does before exec is not the command's.
    let mut faults_before_exec = None;
    let launched = match args.command.first() {
        Some(program) => {
            // A command that cannot run is a `CommandError` (exit 126 or 127).
            let at_exec =
                launch::spawn_with_env(&args.command, &args.command_env, run_as.as_ref())?
                    .wait_exec(program)?;
            tracer.add_target(at_exec.pid)?;
            // --stacks: the program and its loader, read before it runs a single
            // instruction (it may exit before any of its stacks is read).
            if let Some(stacks) = tracer.stacks.as_mut() {
                stacks.modules.refresh(at_exec.pid);
            }
            faults_before_exec = at_exec.faults_before_exec;
            Some(at_exec.resume()?)
        }
        None => None,
    };
    // Once, on stderr: the hook set per family (-v: every hook and every refusal in full,
    // the fault family's as a block of its own).
    if !args.quiet {
        for (family, hooks) in &tracer.hooks {
            match &tracer.fault_hooks {
                Some(faults) if args.verbose > 0 && *family == FaultHooks::NAME => {
                    for line in crate::faults::render::fault_hooks_detail(faults).lines() {
                        eprintln!("memlock-trace: {line}");
                    }
                }
                _ if args.verbose > 0 => eprintln!("memlock-trace: {family}: {}", hooks.full()),
                _ => eprintln!("memlock-trace: {family}: {}", hooks.brief()),
            }
        }
    }
    let mut described = describe_targets(&args, launched);
    if let Some(n) = faults_before_exec {
        described.push_str(&format!(
            " from its exec ({n} faults before it, in the launcher and execve, not counted)"
        ));
    }
    for filter in production.filters.describe() {
        described = format!("{described}, {filter}");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let code = runtime.block_on(event_loop(
        tracer,
        args,
        launched,
        production,
        described,
        (sink, profiles),
        (started_ns, attached_ns),
    ));
    // Stopped by a signal or --duration while the command runs: its blocking waitpid must
    // not hold the tracer's exit (dropping the runtime would wait for it).
    runtime.shutdown_background();
    code
}

/// Processes whose fault count can be checked against the kernel's at their exit: those the
/// fault family counted from their start, which filters on name or cgroup (a process may
/// match only after an exec or a move) and `-t` rule out.
fn exit_check(
    args: &TraceArgs,
    tracer: &Tracer,
    launched: Option<u32>,
    attached_ns: u64,
) -> Option<output::ExitCheck> {
    let p = &args.production;
    (tracer.fault_hooks.is_some() && p.comm.is_none() && p.cgroup.is_none() && args.tid.is_none())
        .then_some(output::ExitCheck {
            attached_ns,
            launched,
        })
}

async fn event_loop(
    mut tracer: Tracer,
    args: TraceArgs,
    launched: Option<u32>,
    mut production: Production,
    described: String,
    (sink, profiles): (Sink, crate::profile::ProfileFiles),
    (started_ns, attached_ns): (u64, u64),
) -> Result<i32> {
    // Handlers first, then the "tracing" line: a Ctrl-C from then on always gets a summary.
    let mut stops = Stops::new(args.duration)?;
    if !args.quiet {
        eprintln!("memlock-trace: tracing {described}");
    }
    production.serve_metrics(&tracer.hooks)?;
    // What loading took (the kernel's BTF, the object, the verifier's logs) is freed.
    give_back_freed_memory();
    let config = OutputConfig::of(&args, production.max_processes);
    let mut output = Output::new(
        config,
        OutputStart {
            sink,
            profiles,
            started_ns,
            intervals: args.interval_secs().is_some(),
            metrics: production.metrics.clone(),
            vma_hooks: tracer.vma.clone(),
            // Every process on the machine: names from /proc/PID/maps (see `MapsFile::Maps`).
            maps: if targets_are_specific(&args) || production.filters.narrows() {
                MapsFile::Smaps
            } else {
                MapsFile::Maps
            },
            stacks: tracer.stacks.take(),
            exit_check: exit_check(&args, &tracer, launched, attached_ns),
        },
    );
    let mut rings = Rings::take(&mut tracer, &mut output)?;
    let mut timers = Timers::new(&args, &tracer).await;
    // The first interval holds everything since the hooks attached (no earlier reading of
    // the fault maps to subtract), so nothing done right after "tracing" is missed.
    if let Some(w) = output.window.as_mut() {
        w.start_ns = WallClock::now_ns();
    }
    let mut ending = Ending::new(&args, launched);
    let ended = targets_ended(&args, launched);
    tokio::pin!(ended);
    let reason = loop {
        let next = tokio::select! {
            drained = rings.drain_ready(&mut output) => drained.map(|()| Next::Go)?,
            _ = Timers::tick(&mut timers.interval), if timers.interval.is_some() => {
                rings.drain_all(&mut output);
                output.summary(&tracer, Scope::Interval)?;
                ending.interval_printed(&args)
            }
            // With metrics, after each refresh (its transient allocations are the largest);
            // without, on the same beat: a drain's decoding and reads still come and go.
            _ = timers.health.tick() => {
                if output.metrics.is_some() {
                    output.update_health(&tracer)?;
                }
                give_back_freed_memory();
                Next::Go
            }
            _ = timers.drain.tick() => {
                rings.drain_all(&mut output);
                tracer.flush_kernel_log();
                Next::Go
            }
            _ = Timers::tick(&mut timers.mappings), if timers.mappings.is_some() => {
                output.refresh_mappings(&tracer, MAPPINGS_REFRESH);
                Next::Go
            }
            reason = stops.next() => ending.stopped(reason, &args),
            reason = &mut ended, if ending.outlived.is_none() => {
                ending.targets_ended(reason?, tracer.live_targets(), &args)
            }
            _ = timers.followed.tick(), if ending.outlived.is_some() => {
                match tracer.live_targets() {
                    0 => Next::End(ending.outlived.expect("guarded")),
                    _ => Next::Go,
                }
            }
        };
        match next {
            Next::Go => {}
            Next::StopIntervals => timers.interval = None,
            Next::End(reason) => break reason,
        }
        // An output that refused a write (full disk, closed pipe) ends the session.
        output.out.check()?;
    };
    finish(tracer, output, rings, reason, &args)?;
    Ok(ending.exit_code(reason))
}

/// The session's timers, besides the stops.
struct Timers {
    /// The kernel's loss counters change without any event arriving: refreshed for scrapes
    /// (and freed heap given back, see `give_back_freed_memory`).
    health: tokio::time::Interval,
    /// Small batches do not wake us (`EVENTS_WAKEUP_BYTES`): the rings are drained on a
    /// timer as well.
    drain: tokio::time::Interval,
    /// Mappings re-read while the targets run; system-wide, re-reading every process's
    /// smaps each second would cost more than it tells: they are then read at a summary.
    mappings: Option<tokio::time::Interval>,
    /// `--follow-children`, once the targets are gone: whether a followed process lives.
    followed: tokio::time::Interval,
    /// `--interval`.
    interval: Option<tokio::time::Interval>,
}

impl Timers {
    async fn new(args: &TraceArgs, tracer: &Tracer) -> Self {
        let mut health = tokio::time::interval(Duration::from_secs(1));
        // A refresh that outlasts the period (system-wide on a busy node) must not be
        // followed by a burst of catch-up refreshes: the loop would do nothing else, nor
        // would the metrics server on this thread answer a scrape.
        health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let follow_mappings = targets_are_specific(args) && tracer.fault_hooks.is_some();
        let mut interval = args
            .interval_secs()
            .map(|secs| tokio::time::interval(Duration::from_secs_f64(secs)));
        if let Some(t) = interval.as_mut() {
            t.tick().await; // the first tick is immediate
        }
        Self {
            health,
            drain: tokio::time::interval(Duration::from_millis(
                memlock_trace_common::DRAIN_INTERVAL_MS,
            )),
            mappings: follow_mappings.then(|| tokio::time::interval(MAPPINGS_REFRESH)),
            followed: tokio::time::interval(FOLLOWED_POLL),
            interval,
        }
    }

    /// The next tick of a timer the select arm has checked is there.
    async fn tick(timer: &mut Option<tokio::time::Interval>) {
        timer.as_mut().expect("guarded").tick().await;
    }
}

/// After the stop: the last reading of the rings, the summary, the profiles, what could not
/// be read or printed in order, and the kernel's unhooking.
fn finish(
    mut tracer: Tracer,
    mut output: Output,
    mut rings: Rings,
    reason: Stop,
    args: &TraceArgs,
) -> Result<()> {
    if !rings.drain_final(&mut output, FINAL_DRAIN) {
        eprintln!(
            "memlock-trace: warning: events were still arriving {} ms after the stop: the \
             records after that were not read, and their calls are missing from the summary \
             (fault counts come from kernel maps and are whole)",
            FINAL_DRAIN.as_millis()
        );
    }
    tracer.flush_kernel_log();
    if let (Stop::Signal(name), false) = (reason, args.quiet) {
        eprintln!("memlock-trace: stopped by {name}");
    }
    output.summary(&tracer, Scope::Session)?;
    output.write_profiles(&tracer, args.quiet)?;
    if output.order.late > 0 {
        eprintln!(
            "memlock-trace: warning: {} event lines arrived too late to print in time order",
            output.order.late
        );
    }
    if output.undecodable > 0 {
        eprintln!(
            "memlock-trace: warning: {} ring buffer records could not be decoded",
            output.undecodable
        );
    }
    // The summary is out: what is left is the kernel's unhooking, all at once.
    tracer.detach_all();
    Ok(())
}

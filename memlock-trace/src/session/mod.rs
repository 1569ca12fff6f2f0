//! One tracing session: validate the request, load, launch, run the event loop until the
//! command exits, the duration is over, the targets exit or a signal arrives, then print
//! the summary.

use std::{os::fd::AsRawFd as _, path::Path, time::Duration};

use anyhow::{Context as _, Result, anyhow};
use tokio::io::unix::AsyncFd;

use self::{
    output::{IntervalState, Output, Scope, VmaOutput},
    production::{Production, give_back_freed_memory},
    stop::{Stop, Stops, targets_ended},
    targets::{describe_targets, targets_are_specific, thread_group},
};
use crate::{
    UsageError,
    cli::TraceArgs,
    faults::{FaultHooks, stacks::StackSymbolizer},
    object::{HookFamily as _, HookLine},
    output::{Sink, TextStyle, WallClock},
    process::{ProcessTable, Targets, launch, pids},
    procfs::{MappingCache, MapsFile},
    syscalls::Aggregator,
    tracer::{Options, Tracer},
};

pub mod fold;
pub mod groups;
mod order;
mod output;
mod process_summary;
mod production;
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
            let at_exec = launch::spawn(&args.command, run_as.as_ref())?.wait_exec(program)?;
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
    // SAFETY: the ring buffer owns its fd for as long as the AsyncFd holds it.
    let mut ring = unsafe { AsyncFd::register(tracer.take_events()?) }
        .map_err(std::io::Error::from)
        .context("polling the ring buffer")?;
    // Fault events have their own ring, so a storm of faults cannot crowd out syscall events.
    let mut fault_ring = match tracer.take_fault_events()? {
        // SAFETY: as above.
        Some(r) => Some(
            unsafe { AsyncFd::register(r) }
                .map_err(std::io::Error::from)
                .context("polling the fault event ring buffer")?,
        ),
        None => None,
    };
    // --stacks: the kept stacks, unwound as they arrive (while their process lives).
    let mut stack_ring = match tracer.take_stack_samples()? {
        // SAFETY: as above.
        Some(r) => Some(
            unsafe { AsyncFd::register(r) }
                .map_err(std::io::Error::from)
                .context("polling the stack ring buffer")?,
        ),
        None => None,
    };
    let interval = args.interval_secs();
    let per_thread = args.per_thread || args.tid.is_some();
    let max_processes = production.max_processes;
    let mut output = Output {
        out: sink,
        json: args.json,
        style: TextStyle {
            unit: args.unit(),
            hist: args.hist,
        },
        timestamps: args.timestamp,
        clock: WallClock::measure(),
        tid: args.tid,
        window: interval.map(|_| IntervalState {
            aggregator: Aggregator::with_max_processes(max_processes).per_thread(per_thread),
            vma_counts: Default::default(),
            faults_before: None,
            syscalls_before: None,
            start_ns: started_ns,
        }),
        started_ns,
        max_processes,
        per_thread,
        syscall_events: args.syscall_events(),
        vma_events: args.vma_events(),
        fault_events: args.fault_events(),
        aggregator: Aggregator::with_max_processes(max_processes).per_thread(per_thread),
        undecodable: 0,
        metrics: production.metrics.clone(),
        vma: VmaOutput {
            hooks: tracer.vma.clone(),
            counts: ProcessTable::with_capacity(max_processes),
            ..VmaOutput::default()
        },
        // Every process on the machine: names from /proc/PID/maps (see `MapsFile::Maps`).
        mappings: MappingCache::reading(
            if targets_are_specific(&args) || production.filters.narrows() {
                MapsFile::Smaps
            } else {
                MapsFile::Maps
            },
        ),
        top_mappings: args.top_mappings,
        top_stacks: args.stacks_top,
        symbolizer: StackSymbolizer::default(),
        stacks: tracer.stacks.take(),
        stack_sample: args.stack_sample,
        order: Default::default(),
        cgroups: Default::default(),
        exit_check: exit_check(&args, &tracer, launched, attached_ns),
        by_cgroup: args.production.by == Some(crate::cli::GroupBy::Cgroup),
        profiles,
    };
    // Event lines wait until both rings were read past them.
    output.order.watch(ring.get_ref().as_raw_fd());
    if let Some(fault_ring) = &fault_ring {
        output.order.watch(fault_ring.get_ref().as_raw_fd());
    }
    // The kernel's loss counters change without any event arriving: refresh them for scrapes
    // (and give freed heap back, see `give_back_freed_memory`).
    let mut health_ticker = tokio::time::interval(Duration::from_secs(1));
    // A refresh that outlasts the period (system-wide on a busy node) must not be followed by
    // a burst of catch-up refreshes: the loop would do nothing else, nor would the metrics
    // server on this thread answer a scrape.
    health_ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Small batches do not wake us (`EVENTS_WAKEUP_BYTES`): drain on a timer as well.
    let mut drain_ticker = tokio::time::interval(Duration::from_millis(
        memlock_trace_common::DRAIN_INTERVAL_MS,
    ));
    // System-wide, re-reading every process's smaps each second would cost more than it
    // tells: mappings are then read when a summary is printed.
    let follow_mappings = targets_are_specific(&args) && tracer.fault_hooks.is_some();
    let mut mapping_ticker = tokio::time::interval(MAPPINGS_REFRESH);
    // Set when the session's time is up and the command was sent SIGTERM: it is waited
    // for (and still traced), and the exit status is then timeout(1)'s 124.
    let mut timed_out = false;
    let ended = targets_ended(&args, launched);
    tokio::pin!(ended);
    // --follow-children: once the command or the -p processes are gone, the session lasts
    // while a followed process lives (a daemon outlives its launcher).
    let follow = args.production.follow_children && targets_are_specific(&args);
    let mut outlived: Option<Stop> = None;
    let mut followed_ticker = tokio::time::interval(FOLLOWED_POLL);
    let mut ticker = interval.map(|secs| tokio::time::interval(Duration::from_secs_f64(secs)));
    if let Some(t) = ticker.as_mut() {
        t.tick().await; // the first tick is immediate
    }
    // The first interval holds everything since the hooks attached (no earlier reading of
    // the fault maps to subtract), so nothing done right after "tracing" is missed.
    if let Some(w) = output.window.as_mut() {
        w.start_ns = WallClock::now_ns();
    }
    // `memlock-trace INTERVAL COUNT`: exit after COUNT intervals.
    let mut intervals_left = args.count;
    let reason = loop {
        tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard.context("polling the ring buffer")?;
                // Left ready when the budget ran out: the loop comes back to it next.
                if output.drain(guard.get_inner_mut()) {
                    guard.clear_ready();
                }
            }
            guard = async { fault_ring.as_mut().expect("guarded").readable_mut().await }, if fault_ring.is_some() => {
                let mut guard = guard.context("polling the fault event ring buffer")?;
                if output.drain(guard.get_inner_mut()) {
                    guard.clear_ready();
                }
            }
            guard = async { stack_ring.as_mut().expect("guarded").readable_mut().await }, if stack_ring.is_some() => {
                let mut guard = guard.context("polling the stack ring buffer")?;
                output.drain_stacks(guard.get_inner_mut());
                guard.clear_ready();
            }
            _ = async { ticker.as_mut().expect("guarded").tick().await }, if ticker.is_some() => {
                if let Some(stack_ring) = stack_ring.as_mut() {
                    output.drain_stacks(stack_ring.get_mut());
                }
                output.drain(ring.get_mut());
                if let Some(fault_ring) = fault_ring.as_mut() {
                    output.drain(fault_ring.get_mut());
                }
                output.summary(&tracer, Scope::Interval)?;
                if let Some(left) = intervals_left.as_mut() {
                    *left -= 1;
                    if *left == 0 {
                        match launched.filter(|_| outlived.is_none()) {
                            Some(pid) => {
                                stop::terminate(pid, &args, Stop::CountDone);
                                timed_out = true;
                                ticker = None;
                            }
                            None => break Stop::CountDone,
                        }
                    }
                }
            }
            // With metrics, after each refresh (its transient allocations are the largest);
            // without, on the same beat: a drain's decoding and reads still come and go.
            _ = health_ticker.tick() => {
                if output.metrics.is_some() {
                    output.update_health(&tracer)?;
                }
                give_back_freed_memory();
            }
            _ = drain_ticker.tick() => {
                output.drain(ring.get_mut());
                // Both rings, so that held event lines are not kept waiting for a wakeup.
                if let Some(fault_ring) = fault_ring.as_mut() {
                    output.drain(fault_ring.get_mut());
                }
                if let Some(stack_ring) = stack_ring.as_mut() {
                    output.drain_stacks(stack_ring.get_mut());
                }
                tracer.flush_kernel_log();
            }
            _ = mapping_ticker.tick(), if follow_mappings => {
                output.refresh_mappings(&tracer, MAPPINGS_REFRESH);
            }
            reason = stops.next() => match launched.filter(|_| outlived.is_none()) {
                // As timeout(1): the command is stopped and waited for, not left running.
                Some(pid) if reason == Stop::DurationOver => {
                    stop::terminate(pid, &args, reason);
                    timed_out = true;
                }
                _ => break reason,
            },
            reason = &mut ended, if outlived.is_none() => {
                let reason = reason?;
                if timed_out || !follow || tracer.live_targets() == 0 {
                    break reason;
                }
                if !args.quiet {
                    let gone = match launched {
                        Some(_) => "the command has exited",
                        None => "the -p processes have exited",
                    };
                    let n = tracer.live_targets();
                    let plural = if n == 1 { "" } else { "es" };
                    eprintln!(
                        "memlock-trace: {gone}; still tracing {n} followed \
                         process{plural} until the last exits (--follow-children)"
                    );
                }
                outlived = Some(reason);
            }
            _ = followed_ticker.tick(), if outlived.is_some() => {
                if tracer.live_targets() == 0 {
                    break outlived.expect("guarded");
                }
            }
        }
        // An output that refused a write (full disk, closed pipe) ends the session.
        output.out.check()?;
    };
    if let Some(stack_ring) = stack_ring.as_mut() {
        output.drain_stacks(stack_ring.get_mut());
    }
    // Everything the kernel submitted before we stopped is still in the ring: read it (at
    // least as many bytes as the ring holds), and then only for as long as the exit's
    // promptness allows: a flood still writing would never let the ring empty.
    let mut complete = output.drain_for(
        ring.get_mut(),
        FINAL_DRAIN,
        memlock_trace_common::EVENTS_BYTE_SIZE.into(),
    );
    if let Some(fault_ring) = fault_ring.as_mut() {
        complete &= output.drain_for(
            fault_ring.get_mut(),
            FINAL_DRAIN,
            memlock_trace_common::faults::FAULT_EVENTS_BYTE_SIZE.into(),
        );
    }
    if !complete {
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
    Ok(match reason {
        _ if timed_out => crate::exit::TIMED_OUT.into(),
        Stop::CommandExited(code) => code,
        _ => 0,
    })
}

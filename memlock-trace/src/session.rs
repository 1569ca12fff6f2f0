//! One tracing session: validate the request, load, launch, run the event loop until the
//! command exits, the duration is over, the targets exit or a signal arrives, then print
//! the summary.

use std::{
    io::Write as _,
    os::fd::{FromRawFd as _, OwnedFd},
    path::Path,
    time::Duration,
};

use anyhow::{Context as _, Result};
use aya::maps::{MapData, RingBuf};
use tokio::{io::unix::AsyncFd, signal::unix::{SignalKind, signal}};

use crate::{
    UsageError,
    aggregate::Aggregator,
    cli::TraceArgs,
    decode::{Event, decode},
    faults, launch,
    mappings::MappingCache,
    render,
    tracer::{Targets, Tracer},
};

/// How often the mappings of traced processes are re-read, so that a process that exits is
/// still attributed with recent mappings.
const MAPPINGS_REFRESH: Duration = Duration::from_millis(250);

/// Why tracing stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    CommandExited(i32),
    TargetsExited,
    DurationOver,
    Signal(&'static str),
}

/// Runs `memlock-trace [OPTIONS] [-- COMMAND]`; returns the process exit code (the launched
/// command's, when there is one).
pub fn run(args: TraceArgs) -> Result<i32> {
    for &pid in &args.pids {
        if pid == 0 || !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(UsageError(format!("no process with pid {pid}")).into());
        }
    }
    let targets = if args.pids.is_empty() && args.command.is_empty() {
        Targets::All
    } else {
        Targets::Tgids(args.pids.clone())
    };
    let mut tracer = Tracer::load_with(&targets, &args.fault_options())?;
    // Fork before the runtime starts any thread; the child waits until it is in the filter.
    let launched = match args.command.first() {
        Some(program) => {
            let held = launch::spawn_held(&args.command)?;
            tracer.add_target(held.pid)?;
            Some(held.release(program).map_err(|e| UsageError(format!("{e:#}")))?)
        }
        None => None,
    };
    for (family, hooks) in &tracer.hooks {
        eprintln!("memlock-trace: {family}: {hooks}");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        // Handlers before the "tracing" line: whoever waits for that line and then sends
        // SIGINT must get a summary, not a killed process.
        let signals = Signals::install()?;
        eprintln!("memlock-trace: tracing {}", describe_targets(&args, launched));
        event_loop(tracer, args, launched, signals).await
    })
}

struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
        })
    }
}

fn targets_are_specific(args: &TraceArgs) -> bool {
    !args.pids.is_empty() || !args.command.is_empty()
}

fn describe_targets(args: &TraceArgs, launched: Option<u32>) -> String {
    let mut parts: Vec<String> = args.pids.iter().map(|p| format!("pid {p}")).collect();
    if let (Some(pid), Some(cmd)) = (launched, args.command.first()) {
        parts.push(format!("`{cmd}` (pid {pid})"));
    }
    if parts.is_empty() {
        "all processes (Ctrl-C to stop)".into()
    } else {
        parts.join(", ")
    }
}

async fn event_loop(
    mut tracer: Tracer,
    args: TraceArgs,
    launched: Option<u32>,
    signals: Signals,
) -> Result<i32> {
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
    let mut output = Output {
        json: args.json,
        syscall_events: args.syscall_events(),
        fault_events: args.fault_events(),
        aggregator: Aggregator::default(),
        undecodable: 0,
        mappings: MappingCache::default(),
        top_mappings: args.top_mappings,
    };
    // System-wide, re-reading every process's smaps each second would cost more than it
    // tells: mappings are then read when a summary is printed.
    let follow_mappings = targets_are_specific(&args) && tracer.fault_hooks.is_some();
    let mut mapping_ticker = tokio::time::interval(MAPPINGS_REFRESH);
    let stop = wait_for_stop(&args, launched, signals);
    tokio::pin!(stop);
    let mut ticker = args.interval.map(|secs| tokio::time::interval(Duration::from_secs_f64(secs)));
    if let Some(t) = ticker.as_mut() {
        t.tick().await; // the first tick is immediate
    }
    let reason = loop {
        tokio::select! {
            guard = ring.readable_mut() => {
                let mut guard = guard.context("polling the ring buffer")?;
                output.drain(guard.get_inner_mut());
                guard.clear_ready();
            }
            guard = async { fault_ring.as_mut().expect("guarded").readable_mut().await }, if fault_ring.is_some() => {
                let mut guard = guard.context("polling the fault event ring buffer")?;
                output.drain(guard.get_inner_mut());
                guard.clear_ready();
            }
            _ = async { ticker.as_mut().expect("guarded").tick().await }, if ticker.is_some() => {
                output.summary(&tracer, "interval")?;
            }
            _ = mapping_ticker.tick(), if follow_mappings => {
                output.refresh_mappings(&tracer, MAPPINGS_REFRESH);
            }
            reason = &mut stop => break reason?,
        }
    };
    // Everything the kernel submitted before we stopped is still in the ring: read it all.
    output.drain(ring.get_mut());
    if let Some(fault_ring) = fault_ring.as_mut() {
        output.drain(fault_ring.get_mut());
    }
    if let Stop::Signal(name) = reason {
        eprintln!("memlock-trace: stopped by {name}");
    }
    output.summary(&tracer, "summary")?;
    if output.undecodable > 0 {
        eprintln!("memlock-trace: warning: {} ring buffer records could not be decoded", output.undecodable);
    }
    Ok(match reason {
        Stop::CommandExited(code) => code,
        _ => 0,
    })
}

async fn wait_for_stop(args: &TraceArgs, launched: Option<u32>, signals: Signals) -> Result<Stop> {
    let Signals { int: mut sigint, term: mut sigterm } = signals;
    let duration = args.duration.map(Duration::from_secs_f64);
    let command = async {
        match launched {
            Some(pid) => tokio::task::spawn_blocking(move || launch::wait_exit(pid)).await?,
            None => std::future::pending().await,
        }
    };
    let pids = args.pids.clone();
    let targets = async move {
        if pids.is_empty() {
            return std::future::pending().await;
        }
        for pid in pids {
            wait_pid_exit(pid).await?;
        }
        anyhow::Ok(())
    };
    tokio::select! {
        _ = sigint.recv() => Ok(Stop::Signal("SIGINT")),
        _ = sigterm.recv() => Ok(Stop::Signal("SIGTERM")),
        _ = async { tokio::time::sleep(duration.expect("guarded")).await }, if duration.is_some() => Ok(Stop::DurationOver),
        code = command => Ok(Stop::CommandExited(code?)),
        done = targets => done.map(|()| Stop::TargetsExited),
    }
}

/// Resolves when process `pid` (not necessarily our child) exits, through a pidfd.
async fn wait_pid_exit(pid: u32) -> Result<()> {
    // SAFETY: plain syscall; the returned fd is owned by us.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        // ESRCH: it is already gone.
        return Ok(());
    }
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: the OwnedFd stays open for the AsyncFd's lifetime.
    let fd = unsafe { AsyncFd::register(fd) }
        .map_err(std::io::Error::from)
        .context("polling a pidfd")?;
    let _ = fd.readable().await?;
    Ok(())
}

struct Output {
    json: bool,
    syscall_events: bool,
    fault_events: bool,
    aggregator: Aggregator,
    undecodable: u64,
    mappings: MappingCache,
    top_mappings: usize,
}

impl Output {
    fn drain(&mut self, ring: &mut RingBuf<MapData>) {
        let mut stdout = std::io::stdout().lock();
        while let Some(item) = ring.next() {
            match decode(&item) {
                Ok(Event::Syscall(rec)) => {
                    self.aggregator.record_syscall(&rec);
                    if self.syscall_events {
                        let line = if self.json {
                            render::syscall_json(&rec).to_string()
                        } else {
                            render::syscall_line(&rec)
                        };
                        let _ = writeln!(stdout, "{line}");
                    }
                }
                Ok(Event::Fault(rec)) => {
                    if self.fault_events {
                        let line = if self.json {
                            render::fault_json(&rec).to_string()
                        } else {
                            render::fault_line(&rec)
                        };
                        let _ = writeln!(stdout, "{line}");
                    }
                }
                Err(_) => self.undecodable += 1,
            }
        }
        let _ = stdout.flush();
    }

    /// Snapshots the mappings of every process that has faulted.
    fn refresh_mappings(&mut self, tracer: &Tracer, max_age: Duration) {
        if let Ok(pids) = tracer.fault_pids() {
            for pid in pids {
                self.mappings.refresh(pid, max_age);
            }
        }
    }

    fn summary(&mut self, tracer: &Tracer, kind: &'static str) -> Result<()> {
        let mut summary = self.aggregator.summary(tracer.health()?);
        summary.kind = kind;
        if let (Some(hooks), Some(report)) = (&tracer.fault_hooks, tracer.fault_report()?) {
            for &tgid in report.regions.keys() {
                self.mappings.refresh(tgid, Duration::ZERO);
            }
            let per_process =
                faults::summarize(&report, hooks, &mut self.mappings, self.top_mappings);
            summary.add_faults(hooks.clone(), report.health, per_process);
        }
        let mut stdout = std::io::stdout().lock();
        if self.json {
            writeln!(stdout, "{}", serde_json::to_string(&summary)?)?;
        } else {
            if kind == "interval" {
                writeln!(stdout, "--- interval summary ---")?;
            }
            write!(stdout, "{}", render::summary_text(&summary))?;
        }
        stdout.flush()?;
        Ok(())
    }
}

//! What ends a session: the launched command's exit, the `-p` processes', `--duration`,
//! `INTERVAL COUNT`, SIGINT or SIGTERM. When the session's time is up while the launched
//! command runs, the command is sent SIGTERM and waited for, as `timeout(1)` does (its
//! exit status then 124): a tracer that returned leaving it running would orphan it.

use std::os::fd::{FromRawFd as _, OwnedFd};

use anyhow::{Context as _, Result};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{Signal as Handler, SignalKind, signal},
    time::Sleep,
};

use crate::{cli::TraceArgs, output::Outside, process::launch};

/// Why tracing stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    CommandExited(i32),
    TargetsExited,
    DurationOver,
    /// `INTERVAL COUNT`: the COUNT intervals were printed.
    CountDone,
    Signal(&'static str),
}

/// Signals and `--duration`, polled afresh in each turn of the event loop: once the
/// duration is over, only the signals are left (a command that does not exit on SIGTERM
/// can still be given up on with Ctrl-C).
pub(super) struct Stops {
    sigint: Handler,
    sigterm: Handler,
    deadline: Option<std::pin::Pin<Box<Sleep>>>,
}

impl Stops {
    pub(super) fn new(duration: Option<f64>) -> Result<Self> {
        Ok(Self {
            sigint: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            sigterm: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            deadline: duration
                .map(|secs| Box::pin(tokio::time::sleep(std::time::Duration::from_secs_f64(secs)))),
        })
    }

    /// The next stop (cancel-safe: the deadline and the signal streams keep their state).
    pub(super) async fn next(&mut self) -> Stop {
        tokio::select! {
            _ = self.sigint.recv() => Stop::Signal("SIGINT"),
            _ = self.sigterm.recv() => Stop::Signal("SIGTERM"),
            () = async { self.deadline.as_mut().expect("guarded").await }, if self.deadline.is_some() => {
                self.deadline = None;
                Stop::DurationOver
            }
        }
    }
}

/// What the loop does next about an event that may end the session.
pub(super) enum Next {
    Go,
    /// `INTERVAL COUNT` is done while the launched command is stopped: no more intervals.
    StopIntervals,
    End(Stop),
}

/// How the session ends, as it stands: a launched command is stopped as timeout(1) does and
/// waited for; with `--follow-children` the session outlives the command or the `-p`
/// processes while a followed process lives; `INTERVAL COUNT` ends after COUNT intervals.
pub(super) struct Ending {
    launched: Option<u32>,
    follow: bool,
    intervals_left: Option<u64>,
    /// The session's time was up and the command sent SIGTERM: the exit status is 124.
    timed_out: bool,
    /// The targets ended while followed processes still live: why, for when they are gone.
    pub(super) outlived: Option<Stop>,
}

impl Ending {
    pub(super) fn new(args: &TraceArgs, launched: Option<u32>) -> Self {
        Self {
            launched,
            follow: args.production.follow_children && super::targets_are_specific(args),
            intervals_left: args.count,
            timed_out: false,
            outlived: None,
        }
    }

    /// The launched command, while the session still waits for it.
    fn command(&self) -> Option<u32> {
        self.launched.filter(|_| self.outlived.is_none())
    }

    /// An interval's summary was printed.
    pub(super) fn interval_printed(&mut self, args: &TraceArgs) -> Next {
        let Some(left) = self.intervals_left.as_mut() else {
            return Next::Go;
        };
        *left -= 1;
        if *left > 0 {
            return Next::Go;
        }
        match self.command() {
            Some(pid) => {
                terminate(pid, args, Stop::CountDone);
                self.timed_out = true;
                Next::StopIntervals
            }
            None => Next::End(Stop::CountDone),
        }
    }

    /// A signal, or `--duration` is over: as timeout(1), a running command is stopped and
    /// waited for, not left running.
    pub(super) fn stopped(&mut self, reason: Stop, args: &TraceArgs) -> Next {
        match self.command() {
            Some(pid) if reason == Stop::DurationOver => {
                terminate(pid, args, reason);
                self.timed_out = true;
                Next::Go
            }
            _ => Next::End(reason),
        }
    }

    /// The command or every `-p` process exited; `live` followed processes remain.
    pub(super) fn targets_ended(&mut self, reason: Stop, live: usize, args: &TraceArgs) -> Next {
        if self.timed_out || !self.follow || live == 0 {
            return Next::End(reason);
        }
        if !args.quiet {
            let gone = match self.launched {
                Some(_) => "the command has exited",
                None => "the -p processes have exited",
            };
            let plural = if live == 1 { "" } else { "es" };
            eprintln!(
                "memlock-trace: {gone}; still tracing {live} followed process{plural} until \
                 the last exits (--follow-children)"
            );
        }
        self.outlived = Some(reason);
        Next::Go
    }

    /// The tracer's exit status: the launched command's, or 124 when its time was up.
    pub(super) fn exit_code(&self, reason: Stop) -> i32 {
        match reason {
            _ if self.timed_out => crate::exit::TIMED_OUT.into(),
            Stop::CommandExited(code) => code,
            _ => 0,
        }
    }
}

/// The session's time is up (`why`) while the launched command `pid` runs: SIGTERM to it,
/// as timeout(1) sends, and one line naming it (unless `-q`).
pub(super) fn terminate(pid: u32, args: &TraceArgs, why: Stop) {
    // The command is our child and not yet reaped, so its pid cannot have been reused.
    let sent = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
    if args.quiet && sent.is_ok() {
        return;
    }
    let over = match (why, args.duration) {
        (Stop::CountDone, _) => format!("the {} intervals are done", args.count.unwrap_or(0)),
        (_, Some(secs)) => format!("--duration {secs} s is over"),
        _ => "the session is over".into(),
    };
    let command = args.command.first().map_or_else(String::new, |c| {
        format!("`{}` ", Outside::from(c.as_os_str()))
    });
    match sent {
        Ok(()) => eprintln!(
            "memlock-trace: {over}: sent SIGTERM to the command {command}(pid {pid}), waiting \
             for it to exit (as timeout(1); exit status 124)"
        ),
        Err(e) => eprintln!(
            "memlock-trace: warning: {over}: could not send SIGTERM to the command \
             {command}(pid {pid}): {e}; waiting for it to exit"
        ),
    }
}

/// The launched command exited, or every `-p` process did (never, for neither).
pub(super) async fn targets_ended(args: &TraceArgs, launched: Option<u32>) -> Result<Stop> {
    if let Some(pid) = launched {
        let code = tokio::task::spawn_blocking(move || launch::wait_exit(pid)).await??;
        return Ok(Stop::CommandExited(code));
    }
    if args.pids.is_empty() {
        return std::future::pending().await;
    }
    for &pid in &args.pids {
        wait_pid_exit(pid).await?;
    }
    Ok(Stop::TargetsExited)
}

/// Resolves when process `pid` (not necessarily our child) exits, through a pidfd.
async fn wait_pid_exit(pid: u32) -> Result<()> {
    // SAFETY: pidfd_open takes integers and touches no memory of ours (nix has no wrapper).
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        // ESRCH: it is already gone.
        return Ok(());
    }
    // SAFETY: `fd` was just returned by pidfd_open, so it is open and owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: the OwnedFd stays open for the AsyncFd's lifetime.
    let fd = unsafe { AsyncFd::register(fd) }
        .map_err(std::io::Error::from)
        .context("polling a pidfd")?;
    let _ = fd.readable().await?;
    Ok(())
}

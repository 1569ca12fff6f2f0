//! Memory pressure, made for an experiment and put back however it ends: swap (the machine's,
//! or zram set up here) and a memory cgroup limited below the experiment's working set. The
//! `memory-pressure` scenario and `verify`'s pressure step run their process inside it.
//!
//! "However it ends": both are taken down on drop (an error, a panic); from set-up to drop,
//! SIGINT, SIGTERM and SIGHUP are kept and passed on to the experiment's process rather than
//! killing the process that holds them, which then stops and drops them; a SIGKILLed holder
//! takes its experiment with it (`PR_SET_PDEATHSIG`) and the next experiment removes what it
//! left ([`swap`], [`cgroup`]).

pub mod cgroup;
pub mod delays;
pub mod swap;

use std::{
    io::{ErrorKind, Read as _},
    os::unix::process::{CommandExt as _, ExitStatusExt as _},
    process::{Command, Output},
    sync::atomic::{AtomicI32, Ordering},
};

use anyhow::{Context as _, Result, bail};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
use serde_json::{Value, json};

use self::delays::DelayAccounting;
pub use self::{cgroup::PressureCgroup, delays::Delays, swap::Swap};
use crate::lab::workload::Faults;

/// The experiment's process, for the signal handler to pass signals on to.
static CHILD: AtomicI32 = AtomicI32::new(0);
/// A termination signal that arrived while the pressure was set up (0: none).
static PENDING: AtomicI32 = AtomicI32::new(0);

/// Swap and a limited memory cgroup, for as long as this lives.
pub struct Pressure {
    pub cgroup: PressureCgroup,
    // Dropped after the cgroup: swap goes off once nothing of the experiment is charged.
    pub swap: Swap,
    /// On for the experiment (an error: why the kernel's delays cannot be read).
    delay_accounting: Result<DelayAccounting, String>,
    // Dropped last: a signal until then is kept for later, not fatal.
    _signals: Forwarding,
}

impl Pressure {
    /// Swap of `swap_bytes` (unless the machine has its own) and a cgroup limited to
    /// `limit_bytes`. A machine that can have neither says which and why.
    pub fn set_up(limit_bytes: u64, swap_bytes: u64) -> Result<Self> {
        let signals = Forwarding::install()?;
        let swap = Swap::ensure(swap_bytes).context("swap for the memory-pressure experiment")?;
        let cgroup = PressureCgroup::make(limit_bytes)
            .context("a memory cgroup for the memory-pressure experiment")?;
        let pressure = Self {
            cgroup,
            swap,
            delay_accounting: DelayAccounting::turn_on().map_err(|e| format!("{e:#}")),
            _signals: signals,
        };
        interrupted()?;
        Ok(pressure)
    }

    /// Where the experiment ran, for its report.
    pub fn describe(&self) -> Value {
        json!({
            "cgroup": self.cgroup.dir.display().to_string(),
            "cgroup_version": self.cgroup.version.name(),
            "limit_bytes": self.cgroup.limit_bytes,
            "swap": self.swap.describe(),
        })
    }

    /// Runs `command` inside the cgroup (it moves itself in before exec, and is killed should
    /// this process die first) and waits for it; termination signals meanwhile go to it.
    /// Returns its output, and the kernel's figures of its whole life, exit included.
    pub fn run(&self, command: &mut Command) -> Result<Ended> {
        let procs = std::ffi::CString::new(
            self.cgroup
                .procs_file()
                .into_os_string()
                .into_encoded_bytes(),
        )?;
        let parent = std::process::id() as i32;
        // SAFETY: between fork and exec the closure only makes async-signal-safe calls
        // (prctl, getppid, open, write, close) on memory prepared before the fork.
        unsafe {
            command.pre_exec(move || {
                // A SIGKILLed parent cannot take the pressure down: its experiment goes with
                // it, so that the next one can.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("the parent is gone"));
                }
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                let error = std::io::Error::last_os_error();
                libc::close(fd);
                if written != 1 {
                    return Err(error);
                }
                Ok(())
            });
        }
        interrupted()?;
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("starting the experiment in its memory cgroup")?;
        let pid = child.id() as i32;
        CHILD.store(pid, Ordering::SeqCst);
        if let signal @ 1.. = PENDING.load(Ordering::SeqCst) {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, signal) };
        }
        let mut stdout = Vec::new();
        let read = child.stdout.take().expect("piped").read_to_end(&mut stdout);
        let delays = self.delays_at_exit(pid);
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let waited = loop {
            // SAFETY: waits for the child spawned above, which nothing else reaps.
            let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
            if waited >= 0 || std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
                break waited;
            }
        };
        let error = std::io::Error::last_os_error();
        CHILD.store(0, Ordering::SeqCst);
        if waited != pid {
            return Err(error).context("waiting for the experiment");
        }
        read.context("reading the experiment's result")?;
        interrupted()?;
        let faults = Faults {
            minflt: usage.ru_minflt as u64,
            majflt: usage.ru_majflt as u64,
        };
        let output = Output {
            status: std::process::ExitStatus::from_raw(status),
            stdout,
            stderr: Vec::new(),
        };
        Ok(Ended {
            output,
            faults,
            delays,
        })
    }

    /// The delays of the experiment's process (one thread) once it has exited, read before
    /// it is reaped.
    fn delays_at_exit(&self, pid: i32) -> Result<Delays, String> {
        self.delay_accounting.as_ref().map_err(String::clone)?;
        loop {
            // SAFETY: an all-zero siginfo_t is valid.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: waits for our own child to exit, leaving it to be reaped by wait4.
            let waited = unsafe {
                libc::waitid(
                    libc::P_PID,
                    pid as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOWAIT,
                )
            };
            if waited == 0 {
                break;
            }
            let error = std::io::Error::last_os_error();
            if error.kind() != ErrorKind::Interrupted {
                return Err(format!("waiting for the experiment to exit: {error}"));
            }
        }
        delays::of_task(pid).map_err(|e| format!("{e:#}"))
    }
}

/// An experiment's end, as the kernel saw it.
pub struct Ended {
    pub output: Output,
    /// Its faults, as `wait4` reports them.
    pub faults: Faults,
    /// Its delays, as taskstats reports them (an error: why they are not measured).
    pub delays: Result<Delays, String>,
}

/// An error once a termination signal has arrived.
fn interrupted() -> Result<()> {
    match PENDING.load(Ordering::SeqCst) {
        0 => Ok(()),
        signal => bail!(
            "the memory-pressure experiment was stopped by signal {signal}; swap and its \
             memory cgroup are put back"
        ),
    }
}

/// Termination signals kept (and passed on to the experiment's process) until dropped.
struct Forwarding {
    previous: Vec<(Signal, SigAction)>,
}

extern "C" fn keep(signal: libc::c_int) {
    PENDING.store(signal, Ordering::SeqCst);
    let child = CHILD.load(Ordering::SeqCst);
    if child > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(child, signal) };
    }
}

impl Forwarding {
    fn install() -> Result<Self> {
        PENDING.store(0, Ordering::SeqCst);
        // No SA_RESTART: a wait for the swap lock ends at the signal.
        let action = SigAction::new(SigHandler::Handler(keep), SaFlags::empty(), SigSet::empty());
        let mut previous = Vec::new();
        for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            // SAFETY: `keep` only stores to atomics and calls kill.
            previous.push((signal, unsafe { sigaction(signal, &action) }?));
        }
        Ok(Self { previous })
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        for (signal, action) in &self.previous {
            // SAFETY: puts back the action that was there before `install`.
            let _ = unsafe { sigaction(*signal, action) };
        }
    }
}

//! Memory pressure, made for an experiment and put back however it ends: swap (the machine's,
//! or zram set up here) and a memory cgroup limited below the experiment's working set. The
//! `memory-pressure` scenario and `verify`'s pressure step run their process inside it.
//!
//! "However it ends": both are taken down on drop (an error, a panic), and while the
//! experiment's process runs, SIGINT, SIGTERM and SIGHUP are passed on to it rather than
//! killing the process that holds them, so that it still gets to drop them.

pub mod cgroup;
pub mod swap;

use std::{
    io::Read as _,
    os::unix::process::{CommandExt as _, ExitStatusExt as _},
    process::{Command, Output},
    sync::atomic::{AtomicI32, Ordering},
};

use anyhow::{Context as _, Result};
use serde_json::{Value, json};

pub use self::{cgroup::PressureCgroup, swap::Swap};
use crate::lab::workload::Faults;

/// The experiment's process, for the signal handler to pass signals on to.
static CHILD: AtomicI32 = AtomicI32::new(0);

/// Swap and a limited memory cgroup, for as long as this lives.
pub struct Pressure {
    pub cgroup: PressureCgroup,
    // Dropped after the cgroup: swap goes off once nothing of the experiment is charged.
    pub swap: Swap,
}

impl Pressure {
    /// Swap of `swap_bytes` (unless the machine has its own) and a cgroup limited to
    /// `limit_bytes`. A machine that can have neither says which and why.
    pub fn set_up(limit_bytes: u64, swap_bytes: u64) -> Result<Self> {
        let swap = Swap::ensure(swap_bytes).context("swap for the memory-pressure experiment")?;
        let cgroup = PressureCgroup::make(limit_bytes)
            .context("a memory cgroup for the memory-pressure experiment")?;
        Ok(Self { cgroup, swap })
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

    /// Runs `command` inside the cgroup (it moves itself in before exec) and waits for it;
    /// termination signals meanwhile go to it. Returns its output and its faults as `wait4`
    /// reports them: the kernel's count of its whole life, exit included.
    pub fn run(&self, command: &mut Command) -> Result<(Output, Faults)> {
        let procs = std::ffi::CString::new(
            self.cgroup
                .procs_file()
                .into_os_string()
                .into_encoded_bytes(),
        )?;
        // SAFETY: between fork and exec the closure only makes async-signal-safe calls
        // (open, write, close) on memory prepared before the fork.
        unsafe {
            command.pre_exec(move || {
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
        let _forwarding = Forwarding::install();
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .spawn()
            .context("starting the experiment in its memory cgroup")?;
        let pid = child.id() as i32;
        CHILD.store(pid, Ordering::SeqCst);
        let mut stdout = Vec::new();
        let read = child.stdout.take().expect("piped").read_to_end(&mut stdout);
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waits for the child spawned above, which nothing else reaps.
        let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        let error = std::io::Error::last_os_error();
        CHILD.store(0, Ordering::SeqCst);
        read.context("reading the experiment's result")?;
        if waited != pid {
            return Err(error).context("waiting for the experiment");
        }
        let faults = Faults {
            minflt: usage.ru_minflt as u64,
            majflt: usage.ru_majflt as u64,
        };
        let output = Output {
            status: std::process::ExitStatus::from_raw(status),
            stdout,
            stderr: Vec::new(),
        };
        Ok((output, faults))
    }
}

/// Termination signals passed on to the experiment's process until dropped.
struct Forwarding {
    previous: Vec<(libc::c_int, libc::sighandler_t)>,
}

extern "C" fn pass_on(signal: libc::c_int) {
    let child = CHILD.load(Ordering::SeqCst);
    if child > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(child, signal) };
    }
}

impl Forwarding {
    fn install() -> Self {
        let previous = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP]
            .into_iter()
            .map(|s| {
                // SAFETY: `pass_on` only reads an atomic and calls kill.
                (s, unsafe {
                    libc::signal(s, pass_on as *const () as libc::sighandler_t)
                })
            })
            .collect();
        Self { previous }
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        for &(signal, handler) in &self.previous {
            // SAFETY: puts back the handler that was there before `install`.
            unsafe { libc::signal(signal, handler) };
        }
    }
}

//! Launching a command so that it is traced from its first instruction, and only from its
//! `exec`: the forked child asks to be ptraced and execs; the kernel stops it at the exec
//! trap, before the new program runs a single instruction. Only then is its pid added to
//! the filter and the child let go, so nothing the launcher does between `fork` and `exec`
//! (comm `memlock-trace`, copy-on-write faults) is counted against the command.

use std::{ffi::CString, fs::File, io::Read as _, os::fd::OwnedFd};

use anyhow::{Context as _, Result, bail};
use nix::{
    fcntl::OFlag,
    sys::{
        ptrace,
        signal::{Signal, kill},
        wait::{WaitStatus, waitpid},
    },
    unistd::{ForkResult, Pid, execvp, fork, pipe2},
};

use crate::{CommandError, exit};

/// A forked child on its way to `exec`.
pub struct Launched {
    pub pid: u32,
    exec_error: File,
}

/// The launched command stopped at its exec trap: not running until [`AtExec::resume`]
/// (dropped without it, the command is killed, never left running untraced).
pub struct AtExec {
    pub pid: u32,
    /// The child's minor + major faults before the stop (`/proc/PID/stat` fields 10 and 12):
    /// the launcher's after `fork` and the kernel's inside `execve`, none of the command's.
    pub faults_before_exec: Option<u64>,
    resumed: bool,
}

/// Forks `argv`; call only while the process is single-threaded (before the tokio runtime).
pub fn spawn(argv: &[String]) -> Result<Launched> {
    if argv.is_empty() {
        bail!("no command given after `--`");
    }
    let cargs: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<_, _>>()
        .context("command arguments must not contain NUL bytes")?;
    let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).context("pipe")?;
    // SAFETY: the child only calls async-signal-safe functions (ptrace, prctl, execvp,
    // write, _exit) on memory prepared before the fork.
    match unsafe { fork() }.context("fork")? {
        ForkResult::Child => {
            drop(err_r);
            child_exec(err_w, &cargs);
        }
        ForkResult::Parent { child } => {
            drop(err_w);
            Ok(Launched {
                pid: child.as_raw() as u32,
                exec_error: File::from(err_r),
            })
        }
    }
}

fn child_exec(err: OwnedFd, argv: &[CString]) -> ! {
    // A successful exec then stops us with SIGTRAP until the parent has added our pid.
    if ptrace::traceme().is_err() {
        // SAFETY: _exit ends this forked child at once, without running the parent's atexit
        // handlers or flushing its buffers twice; nothing can observe a half-done state.
        unsafe { libc::_exit(126) };
    }
    // The tracer's capabilities are not the command's: ambient ones would survive exec.
    // SAFETY: prctl with integer arguments only; it reads and writes no memory of ours.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    // Rust ignores SIGPIPE, and an ignored signal stays ignored across exec: give the command
    // the default back, as a shell does, so that `yes | head` in it ends as it should.
    // SAFETY: signal() with SIG_DFL installs no handler; it is async-signal-safe.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let errno = match execvp(&argv[0], argv) {
        Err(e) => e as i32,
        Ok(never) => match never {},
    };
    let _ = nix::unistd::write(&err, &errno.to_ne_bytes());
    // SAFETY: as above.
    unsafe { libc::_exit(127) }
}

impl Launched {
    /// Waits until the child has exec'd and stopped at its exec trap; fails (and reaps it) if
    /// the command could not be executed.
    pub fn wait_exec(mut self, program: &str) -> Result<AtExec> {
        let pid = Pid::from_raw(self.pid as i32);
        let mut buf = Vec::new();
        // The CLOEXEC pipe closes on a successful exec: EOF with no bytes means it ran.
        self.exec_error
            .read_to_end(&mut buf)
            .context("waiting for exec")?;
        if buf.len() >= 4 {
            let errno = i32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
            let _ = waitpid(pid, None);
            let reason = nix::errno::Errno::from_raw(errno);
            // As the shell and env(1): 127 when there is nothing to run, 126 otherwise.
            return Err(if reason == nix::errno::Errno::ENOENT {
                CommandError {
                    code: exit::NOT_FOUND,
                    message: format!("command not found: `{program}` (not in PATH and not a file)"),
                }
            } else {
                CommandError {
                    code: exit::NOT_EXECUTABLE,
                    message: format!("cannot execute `{program}`: {}", reason.desc()),
                }
            }
            .into());
        }
        loop {
            match waitpid(pid, None).context("waiting for the command's exec")? {
                WaitStatus::Stopped(_, Signal::SIGTRAP) => break,
                // A signal that arrived before the exec (a Ctrl-C): deliver it and wait on.
                WaitStatus::Stopped(_, signal) => {
                    ptrace::cont(pid, signal).context("resuming the launched command")?
                }
                WaitStatus::Exited(_, code) => bail!("`{program}` exited ({code}) before exec"),
                WaitStatus::Signaled(_, signal, _) => {
                    bail!("`{program}` was killed by {signal} before exec")
                }
                _ => continue,
            }
        }
        Ok(AtExec {
            pid: self.pid,
            faults_before_exec: faults_so_far(self.pid),
            resumed: false,
        })
    }
}

impl AtExec {
    /// Lets the command run, no longer ptraced (the exec SIGTRAP is suppressed).
    pub fn resume(mut self) -> Result<u32> {
        self.resumed = true;
        ptrace::detach(Pid::from_raw(self.pid as i32), None)
            .context("letting the launched command run")?;
        Ok(self.pid)
    }
}

impl Drop for AtExec {
    fn drop(&mut self) {
        if !self.resumed {
            let pid = Pid::from_raw(self.pid as i32);
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
        }
    }
}

/// Minor + major faults of `pid` so far, from `/proc/PID/stat`.
fn faults_so_far(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the comm's closing parenthesis: field 3 (state) is index 0, so field N is N - 3.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(field(10)? + field(12)?)
}

/// Waits for the launched command; returns its exit code (128 + signal when killed).
pub fn wait_exit(pid: u32) -> Result<i32> {
    loop {
        match waitpid(Pid::from_raw(pid as i32), None).context("waitpid")? {
            WaitStatus::Exited(_, code) => return Ok(code),
            WaitStatus::Signaled(_, signal, _) => return Ok(128 + signal as i32),
            _ => continue,
        }
    }
}

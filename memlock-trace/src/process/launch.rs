//! Launching a command so that it is traced from its very first instruction: the child is
//! forked, waits on a pipe until the loader has added its pid to the filter, then execs.

use std::{
    ffi::CString,
    fs::File,
    io::{Read as _, Write as _},
    os::fd::OwnedFd,
};

use anyhow::{Context as _, Result, bail};
use nix::{
    fcntl::OFlag,
    sys::wait::{WaitStatus, waitpid},
    unistd::{ForkResult, Pid, execvp, fork, pipe2},
};

use crate::{CommandError, exit};

/// A forked child held before `exec` until [`Launched::release`].
pub struct Launched {
    pub pid: u32,
    gate: File,
    exec_error: File,
}

/// Forks `argv`; call only while the process is single-threaded (before the tokio runtime).
pub fn spawn_held(argv: &[String]) -> Result<Launched> {
    if argv.is_empty() {
        bail!("no command given after `--`");
    }
    let cargs: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<_, _>>()
        .context("command arguments must not contain NUL bytes")?;
    let (gate_r, gate_w) = pipe2(OFlag::O_CLOEXEC).context("pipe")?;
    let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).context("pipe")?;
    // SAFETY: the child only calls async-signal-safe functions (read, execvp, write, _exit)
    // on memory prepared before the fork.
    match unsafe { fork() }.context("fork")? {
        ForkResult::Child => {
            drop(gate_w);
            drop(err_r);
            child_exec(gate_r, err_w, &cargs);
        }
        ForkResult::Parent { child } => {
            drop(gate_r);
            drop(err_w);
            Ok(Launched {
                pid: child.as_raw() as u32,
                gate: File::from(gate_w),
                exec_error: File::from(err_r),
            })
        }
    }
}

fn child_exec(gate: OwnedFd, err: OwnedFd, argv: &[CString]) -> ! {
    let mut byte = [0u8; 1];
    // EOF without the byte means the parent gave up: do not run the command untraced.
    if nix::unistd::read(&gate, &mut byte) != Ok(1) {
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
    /// Lets the child exec; fails (and reaps it) if the command could not be executed.
    pub fn release(mut self, program: &str) -> Result<u32> {
        self.gate
            .write_all(&[1])
            .context("releasing the launched command")?;
        drop(self.gate);
        let mut buf = Vec::new();
        // The CLOEXEC pipe closes on a successful exec: EOF with no bytes means it ran.
        self.exec_error
            .read_to_end(&mut buf)
            .context("waiting for exec")?;
        if buf.len() >= 4 {
            let errno = i32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
            let _ = waitpid(Pid::from_raw(self.pid as i32), None);
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
        Ok(self.pid)
    }
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

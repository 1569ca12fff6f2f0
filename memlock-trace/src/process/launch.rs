//! Launching a command so that it is traced from its first instruction, and only from its
//! `exec`: the forked child asks to be ptraced and execs; the kernel stops it at the exec
//! trap, before the new program runs a single instruction. Only then is its pid added to
//! the filter and the child let go, so nothing the launcher does between `fork` and `exec`
//! (comm `memlock-trace`, copy-on-write faults) is counted against the command.
//!
//! `--user USER` ([`RunAs`]): between fork and exec the child takes USER's groups, group and
//! user ids, and drops every capability (bounding set included), as `strace -u` runs a
//! command as its real user; the tracer keeps its own privileges.

use std::{
    ffi::{CString, OsStr, OsString},
    fs::File,
    io::Read as _,
    os::{fd::OwnedFd, unix::ffi::OsStrExt as _},
};

use anyhow::{Context as _, Result, bail};
use nix::{
    fcntl::OFlag,
    sys::{
        ptrace,
        signal::{Signal, kill},
        wait::{WaitStatus, waitpid},
    },
    unistd::{ForkResult, Gid, Pid, Uid, User, execvp, execvpe, fork, getgrouplist, pipe2},
};

use crate::{CommandError, UsageError, exit};

/// Who `--user` runs the command as: looked up before the fork (the password and group
/// databases are not async-signal-safe), applied in the child before exec.
#[derive(Clone, Debug)]
pub struct RunAs {
    /// As the password database has it (bytes: need not be UTF-8).
    pub name: OsString,
    pub uid: Uid,
    pub gid: Gid,
    /// USER's supplementary groups, as `initgroups(3)` would set them.
    pub groups: Vec<libc::gid_t>,
}

impl RunAs {
    /// USER by name (bytes, as the password database keeps it), or by a uid it knows.
    pub fn resolve(user: &OsStr) -> Result<Self> {
        let shown = crate::output::Outside::from(user);
        let uid = match user.to_str().map(str::parse::<u32>) {
            Some(Ok(uid)) => Some(Uid::from_raw(uid)),
            _ => uid_of_name(user).with_context(|| format!("looking up user `{shown}`"))?,
        };
        let found = match uid {
            Some(uid) => {
                User::from_uid(uid).with_context(|| format!("looking up user `{shown}`"))?
            }
            None => None,
        };
        let Some(found) = found else {
            return Err(UsageError(format!(
                "--user {shown}: no such user: give a name or uid that `getent passwd` lists"
            ))
            .into());
        };
        // The name as given (nix's `User::name` is lossy for a name that is not UTF-8), or
        // the database's for a uid.
        let name = match user.to_str().map(str::parse::<u32>) {
            Some(Ok(_)) => OsString::from(&found.name),
            _ => user.to_owned(),
        };
        let cname = CString::new(name.as_bytes()).context("a user name holding NUL")?;
        let groups = getgrouplist(&cname, found.gid).with_context(|| {
            format!(
                "reading the groups of user `{}`",
                crate::output::Outside::from(name.as_os_str())
            )
        })?;
        Ok(Self {
            name,
            uid: found.uid,
            gid: found.gid,
            groups: groups.into_iter().map(Gid::as_raw).collect(),
        })
    }
}

/// The uid of the user named `name` (`getpwnam_r(3)`, which takes bytes), `None` when the
/// password database has no such user.
fn uid_of_name(name: &OsStr) -> Result<Option<Uid>> {
    let Ok(cname) = CString::new(name.as_bytes()) else {
        return Ok(None);
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // SAFETY: an all-zero `passwd` is a valid value of a plain C struct of pointers and
        // integers; getpwnam_r fills it with pointers into `buf`, which we do not keep.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is live for the call and `buf.len()` is its length.
        let rc = unsafe {
            libc::getpwnam_r(
                cname.as_ptr(),
                &raw mut pwd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &raw mut result,
            )
        };
        match rc {
            0 if result.is_null() => return Ok(None),
            0 => return Ok(Some(Uid::from_raw(pwd.pw_uid))),
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 2, 0),
            e => return Err(std::io::Error::from_raw_os_error(e).into()),
        }
    }
}

/// What the child was doing when it failed, sent to the parent with the errno.
#[derive(Clone, Copy)]
#[repr(i32)]
enum Step {
    Exec = 0,
    SetGroups,
    SetGid,
    DropBounding,
    SetUid,
    ClearCapabilities,
}

impl Step {
    fn from_i32(n: i32) -> Self {
        [
            Step::Exec,
            Step::SetGroups,
            Step::SetGid,
            Step::DropBounding,
            Step::SetUid,
            Step::ClearCapabilities,
        ]
        .into_iter()
        .find(|s| *s as i32 == n)
        .unwrap_or(Step::Exec)
    }

    fn name(self) -> &'static str {
        match self {
            Step::Exec => "exec",
            Step::SetGroups => "setgroups",
            Step::SetGid => "setresgid",
            Step::DropBounding => "dropping the capability bounding set (PR_CAPBSET_DROP)",
            Step::SetUid => "setresuid",
            Step::ClearCapabilities => "capset",
        }
    }
}

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

/// Forks `argv` (as `run_as`, when given); call only while the process is single-threaded
/// (before the tokio runtime).
pub fn spawn<S: AsRef<OsStr>>(argv: &[S], run_as: Option<&RunAs>) -> Result<Launched> {
    spawn_with_env(argv, &[], run_as)
}

/// [`spawn`], with the `NAME=VALUE` entries of `env` set in the command's environment alone.
pub fn spawn_with_env<S: AsRef<OsStr>>(
    argv: &[S],
    env: &[OsString],
    run_as: Option<&RunAs>,
) -> Result<Launched> {
    if argv.is_empty() {
        bail!("no command given after `--`");
    }
    let cargs: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_ref().as_bytes()))
        .collect::<Result<_, _>>()
        .context("command arguments must not contain NUL bytes")?;
    let envp = command_env(env)?;
    let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).context("pipe")?;
    // SAFETY: the child only calls async-signal-safe functions (ptrace, prctl, setgroups,
    // setres[ug]id, capset, execvp, write, _exit) on memory prepared before the fork.
    match unsafe { fork() }.context("fork")? {
        ForkResult::Child => {
            drop(err_r);
            child_exec(err_w, &cargs, envp.as_deref(), run_as);
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

/// Our environment with the `NAME=VALUE` entries of `env` set (None: ours as it is), made
/// before the fork.
fn command_env(env: &[OsString]) -> Result<Option<Vec<CString>>> {
    if env.is_empty() {
        return Ok(None);
    }
    let name = |entry: &[u8]| {
        entry
            .split(|&b| b == b'=')
            .next()
            .unwrap_or_default()
            .to_vec()
    };
    let set: Vec<Vec<u8>> = env.iter().map(|e| name(e.as_bytes())).collect();
    std::env::vars_os()
        .map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat())
        .filter(|entry| !set.contains(&name(entry)))
        .chain(env.iter().map(|e| e.as_bytes().to_vec()))
        .map(CString::new)
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
        .context("environment entries must not contain NUL bytes")
}

fn child_exec(
    err: OwnedFd,
    argv: &[CString],
    envp: Option<&[CString]>,
    run_as: Option<&RunAs>,
) -> ! {
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
    let failed = |step: Step, errno: i32| -> ! {
        let mut report = [0u8; 8];
        report[..4].copy_from_slice(&(step as i32).to_ne_bytes());
        report[4..].copy_from_slice(&errno.to_ne_bytes());
        let _ = nix::unistd::write(&err, &report);
        // SAFETY: as above.
        unsafe { libc::_exit(127) }
    };
    if let Some(run_as) = run_as
        && let Err((step, errno)) = become_user(run_as)
    {
        failed(step, errno);
    }
    let exec = match envp {
        Some(envp) => execvpe(&argv[0], argv, envp),
        None => execvp(&argv[0], argv),
    };
    match exec {
        Err(e) => failed(Step::Exec, e as i32),
        Ok(never) => match never {},
    }
}

/// In the forked child: USER's groups, gid and uid, and no capability left in any set, nor
/// one to regain through a set-user-ID or file-capability program (the bounding set is
/// emptied while the child still may). The order matters: groups and gid need
/// CAP_SETGID, the bounding set CAP_SETPCAP, so the uid goes last (which clears the
/// permitted and effective sets); the inheritable set, which setuid keeps, is cleared after.
fn become_user(run_as: &RunAs) -> Result<(), (Step, i32)> {
    let errno = || nix::errno::Errno::last_raw();
    let groups = &run_as.groups;
    // SAFETY: a pointer and length of a live slice; setgroups only reads it.
    if unsafe { libc::setgroups(groups.len(), groups.as_ptr()) } != 0 {
        return Err((Step::SetGroups, errno()));
    }
    let gid = run_as.gid.as_raw();
    // SAFETY: integer arguments only.
    if unsafe { libc::setresgid(gid, gid, gid) } != 0 {
        return Err((Step::SetGid, errno()));
    }
    // Every capability number the kernel knows: PR_CAPBSET_DROP fails with EINVAL past the
    // last one (CAP_LAST_CAP).
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0 {
            match errno() {
                libc::EINVAL => break,
                e => return Err((Step::DropBounding, e)),
            }
        }
    }
    let uid = run_as.uid.as_raw();
    // SAFETY: integer arguments only.
    if unsafe { libc::setresuid(uid, uid, uid) } != 0 {
        return Err((Step::SetUid, errno()));
    }
    clear_capabilities().map_err(|e| (Step::ClearCapabilities, e))
}

/// capset(2) with every set empty (the raw system call: libc has no wrapper).
fn clear_capabilities() -> Result<(), i32> {
    /// `_LINUX_CAPABILITY_VERSION_3` (include/uapi/linux/capability.h): two 32-bit words.
    const VERSION_3: u32 = 0x2008_0522;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset reads the header and two data structs, all live for the call.
    let ret = unsafe { libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) };
    if ret == 0 {
        Ok(())
    } else {
        Err(nix::errno::Errno::last_raw())
    }
}

impl Launched {
    /// Waits until the child has exec'd and stopped at its exec trap; fails (and reaps it) if
    /// the command could not be executed.
    pub fn wait_exec(mut self, program: impl AsRef<OsStr>) -> Result<AtExec> {
        // Named in messages: escaped, as every name that can hold anything.
        let program = crate::output::Outside::from(program.as_ref());
        let pid = Pid::from_raw(self.pid as i32);
        let mut buf = Vec::new();
        // The CLOEXEC pipe closes on a successful exec: EOF with no bytes means it ran.
        self.exec_error
            .read_to_end(&mut buf)
            .context("waiting for exec")?;
        if buf.len() >= 8 {
            let step = Step::from_i32(i32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]));
            let errno = i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
            let _ = waitpid(pid, None);
            let reason = nix::errno::Errno::from_raw(errno);
            if !matches!(step, Step::Exec) {
                return Err(UsageError(format!(
                    "cannot run `{program}` as another user: {} failed: {}: --user needs \
                     root (or CAP_SETUID, CAP_SETGID and CAP_SETPCAP)",
                    step.name(),
                    reason.desc()
                ))
                .into());
            }
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

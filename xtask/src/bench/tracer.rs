//! A tracer (memlock-trace, bpftrace, perf) as a benchmark runs it: started, waited for
//! until attached, stopped by SIGINT, with what it wrote and the CPU time it used.

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::util::run as run_cmd;

/// A tracer running against the workload; its output collected until it stops.
pub(super) struct Attached {
    pub(super) child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
}

/// Reads `pipe` to its end, signalling `ready` when a line contains `marker`; sends the text.
fn collect(
    pipe: impl std::io::Read + Send + 'static,
    marker: Option<(&'static str, mpsc::Sender<()>)>,
    text_tx: mpsc::Sender<String>,
) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut text = String::new();
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            if let Some((marker, ready)) = &marker
                && line.contains(marker)
            {
                let _ = ready.send(());
            }
            text.push_str(&line);
            line.clear();
        }
        let _ = text_tx.send(text);
    });
}

/// Starts `cmd` and waits for the line that says it is attached (on stderr or stdout).
pub(super) fn attach(
    mut cmd: Command,
    marker: &'static str,
    marker_on_stderr: bool,
) -> Result<Attached> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (out_tx, out_rx) = mpsc::channel();
    let (err_tx, err_rx) = mpsc::channel();
    let stdout = child.stdout.take().context("stdout")?;
    let stderr = child.stderr.take().context("stderr")?;
    let (on_out, on_err) = if marker_on_stderr {
        (None, Some((marker, ready_tx)))
    } else {
        (Some((marker, ready_tx)), None)
    };
    collect(stdout, on_out, out_tx);
    collect(stderr, on_err, err_tx);
    let attached = Attached {
        child,
        stdout: out_rx,
        stderr: err_rx,
    };
    // A hang guard: an emulated guest verifies a session's programs for a minute or more.
    if ready_rx.recv_timeout(Duration::from_secs(300)).is_err() {
        let mut attached = attached;
        let _ = attached.child.kill();
        let _ = attached.child.wait();
        let err = attached
            .stderr
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_default();
        bail!("{cmd:?} did not attach: {}", err.trim());
    }
    Ok(attached)
}

impl Attached {
    /// SIGINT, then the stdout it wrote.
    pub(super) fn stop(self) -> Result<String> {
        self.stop_measured(false).map(|stopped| stopped.stdout)
    }

    /// SIGINT, then the stdout it wrote, how long it took to exit after the signal (its
    /// end-of-session work: a tracer's summary and profiles, perf's last buffers) and the CPU
    /// time it used over its whole life (wait4's rusage, user + system). `dies_by_sigint`: the
    /// program ends by re-raising the SIGINT it caught (perf record), which is then its
    /// success; any other program must exit 0.
    pub(super) fn stop_measured(self, dies_by_sigint: bool) -> Result<Stopped> {
        let pid = i32::try_from(self.child.id())?;
        let signalled = Instant::now();
        run_cmd(Command::new("kill").args(["-INT", &pid.to_string()]))?;
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 fills it and the status.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // Polled, not a blocking wait: bpftrace 0.17 once slept on through the SIGINT (in
        // epoll_wait, attached, 6 minutes, until a second one), so a tracer still running
        // after 30 s is sent it again.
        let mut resent = false;
        loop {
            // SAFETY: our own child, reaped here (the Child is not waited for afterwards).
            match unsafe { libc::wait4(pid, &raw mut status, libc::WNOHANG, &raw mut usage) } {
                0 => {}
                reaped if reaped == pid => break,
                _ => bail!(
                    "waiting for the tracer: {}",
                    std::io::Error::last_os_error()
                ),
            }
            if !resent && signalled.elapsed() > Duration::from_secs(30) {
                eprintln!("xtask bench: pid {pid} still running 30 s after SIGINT: sent again");
                run_cmd(Command::new("kill").args(["-INT", &pid.to_string()]))?;
                resent = true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let after_stop = signalled.elapsed();
        let out = self
            .stdout
            .recv_timeout(Duration::from_secs(60))
            .context("tracer stdout")?;
        let exited_0 = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        let by_sigint =
            dies_by_sigint && libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGINT;
        if !exited_0 && !by_sigint {
            let err = self
                .stderr
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or_default();
            bail!(
                "the tracer exited with wait status {status:#x}: {}",
                err.trim()
            );
        }
        Ok(Stopped {
            stdout: out,
            after_stop,
            cpu_ns: usage_cpu_ns(&usage),
        })
    }
}

/// User + system time of `getrusage(who)` (`RUSAGE_CHILDREN`, `RUSAGE_THREAD`), in ns.
pub(super) fn cpu_ns(who: i32) -> u64 {
    // SAFETY: an all-zero rusage is valid; getrusage fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid `who` and a pointer to a live rusage.
    unsafe { libc::getrusage(who, &raw mut usage) };
    usage_cpu_ns(&usage)
}

/// User + system time of a rusage, in ns.
fn usage_cpu_ns(usage: &libc::rusage) -> u64 {
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    ns(usage.ru_utime) + ns(usage.ru_stime)
}

/// A stopped tracer: what it wrote and what it cost.
pub(super) struct Stopped {
    pub(super) stdout: String,
    pub(super) after_stop: Duration,
    pub(super) cpu_ns: u64,
}

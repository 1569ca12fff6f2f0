//! The process a measured run measures: `memlock-trace workload faults`, driven line by line,
//! and where it (and the tracer's user space) may run.

use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// The fault workload, driven line by line (see memlock-trace's `workload/faults.rs`).
pub(super) struct Workload {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// Where the processes of a measured run run: pinned, the workload alone on one CPU and the
/// tracer's user space on another, so neither takes the other's CPU (or caches) mid-run and
/// the workload never migrates; or anywhere (the max-rate run uses every CPU).
#[derive(Clone, Copy)]
pub(super) enum Placement {
    Pinned { workload_cpu: usize },
    Anywhere,
}

impl Placement {
    /// The workload alone on the last of `cpus`, the tracer on CPU 0; anywhere on one CPU.
    pub(super) fn workload_alone(cpus: usize) -> Self {
        if cpus >= 2 {
            Placement::Pinned {
                workload_cpu: cpus - 1,
            }
        } else {
            Placement::Anywhere
        }
    }

    pub(super) fn command(self, program: &Path, tracer_side: bool) -> Command {
        match self {
            Placement::Pinned { workload_cpu } => {
                let cpu = if tracer_side { 0 } else { workload_cpu };
                let mut cmd = Command::new("taskset");
                cmd.args(["-c", &cpu.to_string()]).arg(program);
                cmd
            }
            Placement::Anywhere => Command::new(program),
        }
    }
}

impl Workload {
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(super) fn spawn(tracer: &Path, placement: Placement) -> Result<Self> {
        // taskset execs the program: the child's pid is the workload's.
        let mut child = placement
            .command(tracer, false)
            .args(["workload", "faults"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the fault workload")?;
        let stdin = child.stdin.take().context("stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if line != "ready\n" {
            bail!("the workload said {line:?}");
        }
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    /// Runs a command; returns its wall and CPU time in ns once the child is blocked again.
    pub(super) fn run(&mut self, command: &str) -> Result<(u64, u64)> {
        writeln!(self.stdin, "{command}")?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() != Some(&"ok") || words.len() < 6 {
            bail!("`{command}` failed in the workload: {line}");
        }
        self.wait_blocked()?;
        Ok((words[4].parse()?, words[5].parse()?))
    }

    /// Until the child sits in `read(0)` (x86_64 syscall 0, fd 0).
    fn wait_blocked(&self) -> Result<()> {
        let path = format!("/proc/{}/syscall", self.child.id());
        let deadline = Instant::now() + Duration::from_secs(30);
        while !fs::read_to_string(&path)?.starts_with("0 0x0 ") {
            if Instant::now() > deadline {
                bail!("the workload never blocked");
            }
            thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// minflt + majflt from /proc/PID/stat.
    pub(super) fn kernel_faults(&self) -> Result<u64> {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        let fields: Vec<&str> = stat[stat.rfind(')').context("stat")? + 2..]
            .split(' ')
            .collect();
        Ok(fields[7].parse::<u64>()? + fields[9].parse::<u64>()?)
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.stdin.write_all(b"exit\n");
        let _ = self.child.wait();
    }
}

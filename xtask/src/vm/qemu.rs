//! Booting the guest: qemu runs the kernel and initramfs with the serial console on its
//! stdout, which is logged and parsed line by line; a deadline kills a guest that hangs.

use std::{
    fs::{self, File},
    io::{self, BufRead, BufReader, Write},
    path::Path,
    process::{Command, Stdio},
    sync::mpsc::{self, RecvTimeoutError},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};

use super::{BEGIN_MARK, DONE_MARK, KERNEL_MARK, RESULT_MARK, VmOptions, VmTestResult};

/// What the guest reported on its console.
#[derive(Default)]
pub(super) struct Console {
    pub(super) kernel_release: Option<String>,
    /// From starting qemu to the kernel release line.
    pub(super) boot: Option<Duration>,
    /// Output of the test that has begun but not yet reported.
    running: Option<String>,
    pub(super) results: Vec<VmTestResult>,
    done: bool,
}

impl Console {
    fn feed(&mut self, line: &str, elapsed: Duration) {
        // A test's last line may lack a newline, so markers can follow other text.
        if let Some(at) = line.find(RESULT_MARK) {
            let mut fields = line[at + RESULT_MARK.len()..].split_whitespace();
            let (Some(name), Some(code)) = (fields.next(), fields.next()) else {
                return;
            };
            let mut output = self.running.take().unwrap_or_default();
            output += &line[..at];
            self.results.push(VmTestResult {
                name: name.to_owned(),
                exit_code: code.parse().unwrap_or(-1),
                output,
            });
        } else if line.contains(BEGIN_MARK) {
            self.running = Some(String::new());
        } else if let Some(at) = line.find(KERNEL_MARK) {
            self.kernel_release = Some(line[at + KERNEL_MARK.len()..].trim().to_owned());
            self.boot = Some(elapsed);
        } else if line.contains(DONE_MARK) {
            self.done = true;
        } else if let Some(output) = &mut self.running {
            *output += line;
            output.push('\n');
        }
    }
}

/// qemu's `-smp` and what the kernel command line adds: one vCPU, or `max_cpus` of which
/// the kernel brings one up (`maxcpus=1`), the others possible, never started (idle). Not
/// `-smp 1,maxcpus=N`: 6.12 counts qemu's hot-pluggable vCPUs as none ("Allowing 1
/// present CPUs plus 0 hotplug CPUs"), while `-smp 96` + `maxcpus=1` gives nr_cpu_ids 96
/// on 5.10 and 6.12 alike.
fn smp(max_cpus: Option<u32>) -> (String, &'static str) {
    match max_cpus {
        Some(n) if n > 1 => (n.to_string(), " maxcpus=1"),
        _ => ("1".to_string(), ""),
    }
}

/// Runs qemu to completion, logging the console to `console_log` while parsing it.
pub(super) fn boot(
    vmlinuz: &Path,
    initrd: &Path,
    opts: &VmOptions,
    console_log: &Path,
) -> Result<Console> {
    // Appending, so qemu's own stderr can share the file without clobbering console lines.
    let mut log = File::options()
        .create(true)
        .append(true)
        .open(console_log)
        .with_context(|| format!("opening {}", console_log.display()))?;
    log.set_len(0)?;
    let start = Instant::now();
    let smp = smp(opts.max_cpus);
    let arch = opts.kernel.arch;
    let mut qemu = Command::new(arch.qemu())
        // No -enable-kvm: nested KVM dies with an internal error on this machine kind.
        // One vCPU: under software emulation a second one made no test faster and doubled
        // the host CPU a guest takes (test:fault_cli alone on 6.12: 232 s and 5m14 of CPU
        // with two, 191 s and 2m49 with one), while three guests share the host's cores.
        // It also ends the guest Oopses seen when the kernel patched a jump label that the
        // other vCPU was running.
        // `--max-cpus N` keeps that one vCPU online and makes N possible, which is what
        // per-CPU maps are sized by (see `smp`).
        .args(arch.machine())
        .args(["-smp", &smp.0])
        .args(["-nographic", "-no-reboot"])
        // The guest needs no network; this also skips loading the NIC's option ROM.
        .args(["-nic", "none"])
        .args(["-m", &opts.memory_mib.to_string()])
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        // panic=-1 reboots at once on a panic, which -no-reboot turns into qemu exiting.
        .arg("-append")
        .arg(format!(
            "console={} panic=-1 quiet{}",
            arch.console(),
            smp.1
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log.try_clone()?)
        .spawn()
        .with_context(|| {
            format!(
                "cannot run `{}` (is {} installed?)",
                arch.qemu(),
                arch.qemu_package()
            )
        })?;
    let stdout = qemu.stdout.take().context("no stdout from qemu")?;

    // A reader thread, so the main thread can enforce the timeout.
    let (lines, received) = mpsc::channel();
    let reader = thread::spawn(move || -> io::Result<()> {
        let mut stdout = BufReader::new(stdout);
        let mut buf = Vec::new();
        while stdout.read_until(b'\n', &mut buf)? > 0 {
            log.write_all(&buf)?;
            let line = String::from_utf8_lossy(&buf)
                .trim_end_matches(['\r', '\n'])
                .to_owned();
            if lines.send(line).is_err() {
                break;
            }
            buf.clear();
        }
        Ok(())
    });

    let deadline = start + opts.timeout;
    let mut console = Console::default();
    let timed_out = loop {
        match received.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => console.feed(&line, start.elapsed()),
            Err(RecvTimeoutError::Timeout) => break true,
            Err(RecvTimeoutError::Disconnected) => break false,
        }
    };
    // Only needed after a timeout, harmless once qemu has exited.
    qemu.kill().context("killing qemu")?;
    qemu.wait().context("waiting for qemu")?;
    reader
        .join()
        .map_err(|_| anyhow!("console reader thread panicked"))?
        .with_context(|| format!("logging the console to {}", console_log.display()))?;

    if !console.done {
        let why = if timed_out {
            format!("guest timed out after {:?}", opts.timeout)
        } else {
            format!("guest stopped (panic or early poweroff) before {DONE_MARK}")
        };
        bail!(
            "{why}; last console lines ({}):\n{}",
            console_log.display(),
            tail(console_log, 30)
        );
    }
    Ok(console)
}

fn tail(path: &Path, count: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(count)..].join("\n")
        }
        Err(e) => format!("(cannot read it: {e})"),
    }
}

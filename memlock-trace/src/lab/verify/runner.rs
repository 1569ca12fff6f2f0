//! The parent's side: forks a scenario's subject, traces it, and at each checkpoint it
//! reports drains the ring buffer and checks the step.

use std::{
    collections::HashMap,
    fs::File,
    io::{BufRead as _, BufReader, Write as _},
    os::fd::OwnedFd,
};

use anyhow::{Context as _, Result};
use aya::maps::{MapData, RingBuf};
use nix::{
    fcntl::OFlag,
    sys::wait::{WaitStatus, waitpid},
    unistd::{ForkResult, fork, pipe2},
};

use super::{
    Message, StepResult,
    checks::check,
    subject::{Scenario, subject_main},
};
use crate::{
    event::{Event, decode},
    tracer::Tracer,
    vma::{Activity, Tracker},
};

pub(super) struct Runner {
    tracer: Tracer,
    ring: RingBuf<MapData>,
    tracker: Tracker,
    /// Per traced process, what the tracker completed since its last checkpoint.
    activity: HashMap<u32, Vec<Activity>>,
    shows_lf: bool,
    pub(super) results: Vec<StepResult>,
}

impl Runner {
    /// `shows_lf`: whether this kernel's smaps shows VM_LOCKONFAULT.
    pub(super) fn new(mut tracer: Tracer, shows_lf: bool) -> Result<Self> {
        let ring = tracer.take_events()?;
        Ok(Self {
            tracer,
            ring,
            tracker: Tracker::default(),
            activity: HashMap::new(),
            shows_lf,
            results: Vec::new(),
        })
    }

    pub(super) fn scenario(&mut self, name: &str, scenario: Scenario) -> Result<()> {
        let (msg_r, msg_w) = pipe2(OFlag::O_CLOEXEC).context("pipe")?;
        let (ack_r, ack_w) = pipe2(OFlag::O_CLOEXEC).context("pipe")?;
        // SAFETY: this process is single-threaded (verify runs no runtime), so the child may
        // allocate and run ordinary Rust code.
        match unsafe { fork() }.context("fork")? {
            ForkResult::Child => {
                drop(msg_r);
                drop(ack_w);
                let code = subject_main(name, scenario, msg_w, ack_r);
                // SAFETY: _exit ends the child at once: it skips the parent's destructors (the
                // tracer's fds belong to the parent) and runs no atexit handler twice.
                unsafe { libc::_exit(code) }
            }
            ForkResult::Parent { child } => {
                drop(msg_w);
                drop(ack_r);
                let pid = child.as_raw() as u32;
                let result = self.talk(name, pid, msg_r, ack_w);
                let status = waitpid(child, None).context("waitpid")?;
                let reported_failure = result?;
                // Exit code 1 is how a scenario ends after the failure it reported.
                let expected = if reported_failure { 1 } else { 0 };
                if !matches!(status, WaitStatus::Exited(_, code) if code == expected) {
                    self.failed(
                        name,
                        pid,
                        format!("the scenario's process ended with {status:?}"),
                    );
                }
                Ok(())
            }
        }
    }

    /// Serves the scenario's messages until it closes its end; whether it reported a failure.
    fn talk(&mut self, name: &str, pid: u32, msg: OwnedFd, ack: OwnedFd) -> Result<bool> {
        let mut reported_failure = false;
        let mut ack = File::from(ack);
        self.tracer.add_target(pid)?;
        // The subject starts only once it is traced.
        ack.write_all(&[1]).context("starting the scenario")?;
        for line in BufReader::new(File::from(msg)).lines() {
            let line = line.context("reading from the scenario")?;
            match serde_json::from_str::<Message>(&line)
                .with_context(|| format!("scenario {name} sent `{line}`"))?
            {
                Message::Trace { pid } => self.tracer.add_target(pid)?,
                Message::Check(cp) => {
                    self.drain();
                    let activity = self.activity.remove(&cp.pid).unwrap_or_default();
                    let result = check(&cp, &activity, self.shows_lf, self.tracer.vma.as_ref());
                    self.results.push(result);
                }
                Message::Failed { step, error } => {
                    reported_failure = true;
                    self.failed(&step, pid, error);
                }
            }
            ack.write_all(&[1]).context("resuming the scenario")?;
        }
        Ok(reported_failure)
    }

    fn failed(&mut self, step: &str, pid: u32, error: String) {
        self.results.push(StepResult {
            step: step.to_string(),
            action: String::new(),
            pid,
            tid: pid,
            expected: String::new(),
            traced: String::new(),
            proc: String::new(),
            ok: false,
            mismatches: vec![error],
            stores: 0,
            functions: Vec::new(),
            expected_layout: Vec::new(),
            traced_layout: Vec::new(),
            proc_layout: Vec::new(),
        });
    }

    /// Everything the subjects' calls submitted is in the ring by the time they report.
    fn drain(&mut self) {
        while let Some(item) = self.ring.next() {
            let activity = match decode(&item) {
                Ok(Event::Syscall(rec)) => self.tracker.syscall(&rec),
                Ok(Event::Vma(rec)) => self.tracker.record(rec),
                Ok(Event::Fault(_)) | Err(_) => None,
            };
            if let Some(a) = activity {
                self.activity.entry(a.tgid()).or_default().push(a);
            }
        }
    }
}

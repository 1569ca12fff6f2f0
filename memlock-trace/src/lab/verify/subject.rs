//! The subject's side: runs in the forked child, makes a scenario's calls on its regions and
//! hands each checkpoint to the parent, waiting until the parent has checked it.

use std::{
    fs::File,
    io::{Read as _, Write as _},
    os::fd::OwnedFd,
};

use anyhow::{Context as _, Result, bail};

use super::{Checkpoint, ExpectCalls, Message, PROBE_FLAG, Piece};
use crate::{lab::workload::Region, procfs::PAGE_SIZE};

pub(super) type Scenario = fn(&mut Subject) -> Result<()>;

pub(super) struct Subject {
    to_parent: File,
    from_parent: File,
}

/// The forked child's life: waits to be traced, runs the scenario; returns the exit code.
pub(super) fn subject_main(name: &str, scenario: Scenario, msg: OwnedFd, ack: OwnedFd) -> i32 {
    let mut subject = Subject {
        to_parent: File::from(msg),
        from_parent: File::from(ack),
    };
    // Wait until the parent has put us in the trace filter.
    if subject.wait().is_err() {
        return 126;
    }
    match scenario(&mut subject) {
        Ok(()) => 0,
        Err(error) => {
            let _ = subject.send(&Message::Failed {
                step: name.to_string(),
                error: format!("{error:#}"),
            });
            1
        }
    }
}

impl Subject {
    fn wait(&mut self) -> Result<()> {
        let mut byte = [0u8];
        self.from_parent
            .read_exact(&mut byte)
            .context("waiting for the verifier")
    }

    /// Sends one message and waits for the parent to let us go on.
    pub(super) fn send(&mut self, message: &Message) -> Result<()> {
        let mut line = serde_json::to_string(message)?;
        line.push('\n');
        self.to_parent
            .write_all(line.as_bytes())
            .context("talking to the verifier")?;
        self.wait()
    }

    /// Probes the region (see the module doc), then hands the checkpoint to the parent.
    pub(super) fn check(&mut self, region: &Region, cp: Checkpoint) -> Result<()> {
        probe_call(region.start(), region.len as u64)?;
        self.send(&Message::Check(Box::new(cp)))
    }

    /// Another handle on the same pipes, for a thread of the subject.
    pub(super) fn try_clone(&self) -> Result<Self> {
        Ok(Self {
            to_parent: self.to_parent.try_clone()?,
            from_parent: self.from_parent.try_clone()?,
        })
    }
}

fn probe_call(start: u64, len: u64) -> Result<()> {
    // SAFETY: mlock2 with an unknown flag fails with EINVAL before it looks at the range, so
    // no memory changes.
    let ret = unsafe { libc::syscall(libc::SYS_mlock2, start, len, PROBE_FLAG) };
    let errno = std::io::Error::last_os_error();
    if ret != -1 || errno.raw_os_error() != Some(libc::EINVAL) {
        bail!("the probe mlock2(.., {PROBE_FLAG:#x}) returned {ret} ({errno}), expected EINVAL");
    }
    Ok(())
}

/// What `verify` adds to a region: page addresses as numbers, and checkpoints over it.
impl Region {
    /// The address of page `page` (the end of the region for `page` = its length in pages).
    pub(super) fn at(&self, page: u64) -> u64 {
        self.start() + page * PAGE_SIZE
    }

    /// Writes one byte to each of these pages (of a region mapped writable).
    pub(super) fn touch(&self, pages: impl IntoIterator<Item = u64>) {
        for page in pages {
            // SAFETY: `page` asserts the byte is inside the region, which the scenarios touch
            // only where they mapped it writable; nothing else refers to this memory.
            unsafe { self.page(page as usize).write_volatile(1) };
        }
    }

    /// The expected layout from `(pages, perms, locked, onfault)` pieces, in order.
    pub(super) fn layout(&self, pieces: &[(u64, &str, bool, bool)]) -> Vec<Piece> {
        let mut at = self.start();
        pieces
            .iter()
            .map(|&(pages, perms, locked, onfault)| {
                let piece = Piece {
                    start: at,
                    end: at + pages * PAGE_SIZE,
                    perms: perms.into(),
                    locked,
                    onfault,
                };
                at = piece.end;
                piece
            })
            .collect()
    }

    /// A checkpoint over the region, seen from this thread, with the layout and `Locked:` it
    /// should have; the rest is set by the scenario.
    pub(super) fn checkpoint(
        &self,
        step: &str,
        action: &str,
        layout: &[(u64, &str, bool, bool)],
        locked_kb: u64,
    ) -> Checkpoint {
        Checkpoint {
            step: step.into(),
            action: action.into(),
            pid: std::process::id(),
            tid: nix::unistd::gettid().as_raw() as u32,
            window: self.window(),
            layout: self.layout(layout),
            locked_kb,
            rss_kb: None,
            thp_kb: None,
            calls: None,
            locked_vm: None,
            born_locked: None,
            pressure: None,
        }
    }
}

/// The expectations a scenario adds to a checkpoint beyond its layout and `Locked:`.
impl Checkpoint {
    /// smaps `Rss:` over the region, in kB.
    pub(super) fn with_rss(mut self, kb: u64) -> Self {
        self.rss_kb = Some(kb);
        self
    }

    /// What the calls since the last checkpoint should amount to.
    pub(super) fn with_calls(mut self, calls: ExpectCalls) -> Self {
        self.calls = Some(calls);
        self
    }
}

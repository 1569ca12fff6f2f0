//! The kernel's own per-task delay accounting (taskstats), read for the experiment's process
//! once it has exited and before it is reaped: its whole life's time waiting to free pages
//! (direct reclaim), in compaction, in swap-ins and in thrashing, for the tracer's causes to
//! be checked against.
//!
//! One generic-netlink request and its answer, made here with libc: the rust-netlink crates
//! would resolve the family, but know no taskstats either, so the reply would still be
//! parsed here.

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

/// Turned on from 5.14 with this sysctl (off by default); older kernels account from boot
/// unless booted with `nodelayacct`.
const SYSCTL: &str = "/proc/sys/kernel/task_delayacct";
/// The sysctl's value before an experiment turned it on, kept until it is put back: an
/// experiment killed first leaves it, and the next one puts that value back, not its own.
const MARK: &str = "/run/memlock-trace-pressure.delayacct";

/// Delay accounting on for as long as this lives; the sysctl put back on drop.
pub struct DelayAccounting {
    previous: Option<String>,
}

impl DelayAccounting {
    pub fn turn_on() -> Result<Self> {
        let now = match std::fs::read_to_string(SYSCTL) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Self { previous: None }),
            Err(e) => return Err(e).context(format!("reading {SYSCTL}")),
        };
        let previous = match std::fs::read_to_string(MARK) {
            Ok(left) => left,
            Err(_) => {
                std::fs::write(MARK, &now).with_context(|| format!("writing {MARK}"))?;
                now
            }
        };
        if previous.trim() != "1" {
            std::fs::write(SYSCTL, "1").with_context(|| format!("writing 1 to {SYSCTL}"))?;
        }
        Ok(Self {
            previous: Some(previous),
        })
    }
}

impl Drop for DelayAccounting {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            if previous.trim() != "1" {
                let _ = std::fs::write(SYSCTL, previous.trim());
            }
            let _ = std::fs::remove_file(MARK);
        }
    }
}

/// How many times a task waited for one thing, and for how long in all.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Delay {
    pub count: u64,
    pub ns: u64,
}

/// A task's delays, as `struct taskstats` gives them (`include/uapi/linux/taskstats.h`).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Delays {
    /// `struct taskstats`' version: 10 on 5.10, 11 (compaction) from 5.19.
    pub version: u16,
    /// Waits for block I/O other than swap-ins.
    pub blkio: Delay,
    /// Swap-ins: until 5.18 the swap-in's waits for I/O only, from 5.19 the whole read of a
    /// page from swap (zram's decompression included).
    pub swapin: Delay,
    /// Direct reclaim (`__perform_reclaim`); a memory cgroup's reclaim at its limit is not in it.
    pub freepages: Delay,
    /// Reading back a page of the workingset (a refault of a page recently evicted).
    pub thrashing: Delay,
    /// Direct compaction, from version 11; None before.
    pub compact: Option<Delay>,
}

/// Offsets in `struct taskstats` of each pair of counts and totals.
const BLKIO: usize = 32;
const SWAPIN: usize = 48;
const FREEPAGES: usize = 312;
const THRASHING: usize = 328;
const COMPACT: usize = 352;

impl Delays {
    fn parse(stats: &[u8]) -> Result<Self> {
        let u64_at = |at: usize| -> Option<u64> {
            Some(u64::from_ne_bytes(stats.get(at..at + 8)?.try_into().ok()?))
        };
        let delay = |at: usize| -> Option<Delay> {
            Some(Delay {
                count: u64_at(at)?,
                ns: u64_at(at + 8)?,
            })
        };
        let version = u16::from_ne_bytes(stats.get(..2).context("no version")?.try_into()?);
        let short = || format!("a taskstats of {} bytes (version {version})", stats.len());
        Ok(Self {
            version,
            blkio: delay(BLKIO).with_context(short)?,
            swapin: delay(SWAPIN).with_context(short)?,
            freepages: delay(FREEPAGES).with_context(short)?,
            thrashing: delay(THRASHING).with_context(short)?,
            compact: if version >= 11 { delay(COMPACT) } else { None },
        })
    }
}

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const TASKSTATS_CMD_GET: u8 = 1;
const TASKSTATS_CMD_ATTR_PID: u16 = 1;
const TASKSTATS_TYPE_STATS: u16 = 3;
const TASKSTATS_TYPE_AGGR_PID: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const NLA_F_MASK: u16 = 0x3fff;

/// The delays of task `tid`: a live task's so far, an exited one's (not yet reaped) for its
/// whole life. Needs CAP_NET_ADMIN.
pub fn of_task(tid: i32) -> Result<Delays> {
    let socket = Socket::open()?;
    let family = socket
        .request(
            GENL_ID_CTRL,
            CTRL_CMD_GETFAMILY,
            CTRL_ATTR_FAMILY_NAME,
            b"TASKSTATS\0",
        )
        .context("finding the TASKSTATS netlink family (a kernel without CONFIG_TASKSTATS?)")?;
    let id = attributes(&family)
        .find(|(kind, _)| *kind == CTRL_ATTR_FAMILY_ID)
        .and_then(|(_, v)| Some(u16::from_ne_bytes(v.get(..2)?.try_into().ok()?)))
        .context("the TASKSTATS family's reply has no id")?;
    let reply = socket
        .request(
            id,
            TASKSTATS_CMD_GET,
            TASKSTATS_CMD_ATTR_PID,
            &tid.to_ne_bytes(),
        )
        .with_context(|| format!("asking taskstats for task {tid}"))?;
    let (_, aggregate) = attributes(&reply)
        .find(|(kind, _)| *kind == TASKSTATS_TYPE_AGGR_PID)
        .context("taskstats answered without the task's statistics")?;
    let (_, stats) = attributes(aggregate)
        .find(|(kind, _)| *kind == TASKSTATS_TYPE_STATS)
        .context("taskstats answered without the task's statistics")?;
    Delays::parse(stats)
}

/// The (type, payload) netlink attributes packed in `bytes`.
fn attributes(mut bytes: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = u16::from_ne_bytes(bytes.get(..2)?.try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(bytes.get(2..4)?.try_into().ok()?) & NLA_F_MASK;
        let payload = bytes.get(4..len)?;
        bytes = bytes.get(len.next_multiple_of(4)..).unwrap_or_default();
        Some((kind, payload))
    })
}

struct Socket(OwnedFd);

impl Socket {
    fn open() -> Result<Self> {
        // SAFETY: plain socket(2); the descriptor is owned from here on.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::NETLINK_GENERIC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error()).context("opening a generic netlink socket");
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Sends one generic-netlink request with one attribute, and returns the attributes of
    /// its answer.
    fn request(&self, family: u16, command: u8, attribute: u16, value: &[u8]) -> Result<Vec<u8>> {
        let attr_len = 4 + value.len();
        let len = 16 + 4 + attr_len.next_multiple_of(4);
        let mut message = Vec::with_capacity(len);
        message.extend_from_slice(&(len as u32).to_ne_bytes());
        message.extend_from_slice(&family.to_ne_bytes());
        message.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
        message.extend_from_slice(&[0; 8]); // sequence and port: the kernel's to fill
        message.extend_from_slice(&[command, 1, 0, 0]); // genlmsghdr: command, version
        message.extend_from_slice(&(attr_len as u16).to_ne_bytes());
        message.extend_from_slice(&attribute.to_ne_bytes());
        message.extend_from_slice(value);
        message.resize(len, 0);
        // SAFETY: sends `message`, which lives across the call; the socket is unbound, so
        // the kernel binds it and answers to it.
        let sent = unsafe {
            libc::send(
                self.0.as_raw_fd(),
                message.as_ptr().cast(),
                message.len(),
                0,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error()).context("sending a netlink request");
        }
        let mut answer = vec![0u8; 8192];
        let got = loop {
            // SAFETY: receives into `answer`, of the length given.
            let got = unsafe {
                libc::recv(
                    self.0.as_raw_fd(),
                    answer.as_mut_ptr().cast(),
                    answer.len(),
                    0,
                )
            };
            if got >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                break got;
            }
        };
        if got < 0 {
            return Err(io::Error::last_os_error()).context("receiving a netlink answer");
        }
        answer.truncate(got as usize);
        let kind = u16::from_ne_bytes(
            answer
                .get(4..6)
                .context("a short netlink answer")?
                .try_into()?,
        );
        if kind == NLMSG_ERROR {
            let errno = i32::from_ne_bytes(
                answer
                    .get(16..20)
                    .context("a short netlink error")?
                    .try_into()?,
            );
            bail!(io::Error::from_raw_os_error(-errno));
        }
        let end = (u32::from_ne_bytes(answer[..4].try_into()?) as usize).min(answer.len());
        Ok(answer
            .get(20..end)
            .context("a short netlink answer")?
            .to_vec())
    }
}

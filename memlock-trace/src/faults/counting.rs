//! Count-only mode for specific targets on the tracepoint hook set: the kernel's own perf
//! counters, no eBPF per fault.
//!
//! Why: with only tracepoints and perf events available, every traced fault runs the perf
//! overflow path and a BPF program (~300 ns here, 15% of a first-touch fault). A counting
//! perf event on the target's threads costs an increment per fault instead. It counts the
//! very events the sampling path does (`PAGE_FAULTS_MIN/MAJ`, emitted by
//! `mm_account_fault()` for every completed fault with `regs`), per thread with `inherit` +
//! `inherit_thread`, so threads created later are counted and forked children are not (they
//! are other processes). Reading an event sums it with its inherited children, live or
//! exited. Populated pages and failures still come from the syscall and signal hooks.
//!
//! The same events carry the completion programs when they are bound to the targets'
//! threads ([`Completion`]): with `sample_period` 1 the program times every fault, with N
//! (`--latency-sample`) one in N, while the event still counts every fault, read as above.
//! With faults timed, a third event per thread, `PAGE_FAULTS` (counted at the top of
//! `do_user_addr_fault()`, before the fault is handled), runs the start program at period
//! 1: the start no longer needs the system-wide tracepoint whose program ran for every
//! fault on the machine.

use std::{
    collections::BTreeMap,
    fs::File,
    io::Read as _,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::{Context as _, Result};

/// `struct perf_event_attr` up to `PERF_ATTR_SIZE_VER7` (include/uapi/linux/perf_event.h).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved_2: u16,
    aux_sample_size: u32,
    reserved_3: u32,
    sig_data: u64,
}

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_PAGE_FAULTS: u64 = 2;
const PERF_COUNT_SW_PAGE_FAULTS_MIN: u64 = 5;
const PERF_COUNT_SW_PAGE_FAULTS_MAJ: u64 = 6;
const FLAG_INHERIT: u64 = 1 << 1;
/// Inherit into new threads only, not forked processes (Linux 5.13).
const FLAG_INHERIT_THREAD: u64 = 1 << 35;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
/// `PERF_EVENT_IOC_SET_BPF`: `_IOW('$', 8, __u32)`.
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;

/// The completion programs (minor, major) and the period they run at, for events on
/// target threads.
pub struct Completion {
    pub programs: [OwnedFd; 2],
    pub period: u64,
    /// The start program, run by a `PAGE_FAULTS` event (period 1) on each target thread;
    /// None when the starts come from the system-wide tracepoints.
    pub start: Option<OwnedFd>,
}

fn open_counter(tid: u32, config: u64, program: Option<(&OwnedFd, u64)>) -> std::io::Result<File> {
    let attr = PerfEventAttr {
        kind: PERF_TYPE_SOFTWARE,
        size: size_of::<PerfEventAttr>() as u32,
        config,
        // A sampling event runs its program at each overflow: every `period` faults.
        sample_period: program.map_or(0, |(_, period)| period),
        flags: FLAG_INHERIT | FLAG_INHERIT_THREAD,
        ..Default::default()
    };
    // SAFETY: a valid attr for the kernel to read; the returned fd is ours.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &raw const attr,
            tid as libc::pid_t,
            -1 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd owned by nobody else.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    if let Some((program, _)) = program {
        // Inherited events (new threads) take the parent event's program.
        // SAFETY: an ioctl on our perf fd with a valid program fd as its argument.
        let rc = unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                PERF_EVENT_IOC_SET_BPF as _,
                program.as_raw_fd(),
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(file)
}

fn read_counter(mut file: &File) -> u64 {
    let mut buf = [0u8; 8];
    match file.read_exact(&mut buf) {
        Ok(()) => u64::from_ne_bytes(buf),
        Err(_) => 0,
    }
}

/// Counting events on every thread of the target processes.
#[derive(Default)]
pub struct FaultCounters {
    /// tgid -> (minor, major) counters, one pair per thread present when it was added.
    processes: BTreeMap<u32, Vec<(File, File)>>,
    /// The start events, kept open beside the counters (never read).
    starts: Vec<File>,
    /// The programs the events run, if they carry the completion programs.
    completion: Option<Completion>,
}

impl FaultCounters {
    /// Events that also run the completion programs on the targets' threads.
    pub fn with_completion(completion: Completion) -> Self {
        Self {
            processes: BTreeMap::new(),
            starts: Vec::new(),
            completion: Some(completion),
        }
    }

    /// Starts counting the faults of every thread of `tgid`, and of the threads they create.
    pub fn add(&mut self, tgid: u32) -> Result<()> {
        let tasks = std::fs::read_dir(format!("/proc/{tgid}/task"))
            .with_context(|| format!("listing the threads of pid {tgid}"))?;
        let mut counters = Vec::new();
        for task in tasks.flatten() {
            let Some(tid) = task
                .file_name()
                .to_str()
                .and_then(|t| t.parse::<u32>().ok())
            else {
                continue;
            };
            let program = |i: usize| self.completion.as_ref().map(|c| (&c.programs[i], c.period));
            // The start first: a completion whose start was missed counts as unmatched,
            // a start whose completion was missed is overwritten.
            if let Some(start) = self.completion.as_ref().and_then(|c| c.start.as_ref()) {
                match open_counter(tid, PERF_COUNT_SW_PAGE_FAULTS, Some((start, 1))) {
                    Ok(file) => self.starts.push(file),
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!(
                                "perf_event_open(PAGE_FAULTS, start) on thread {tid} of pid {tgid}"
                            )
                        });
                    }
                }
            }
            match (
                open_counter(tid, PERF_COUNT_SW_PAGE_FAULTS_MIN, program(0)),
                open_counter(tid, PERF_COUNT_SW_PAGE_FAULTS_MAJ, program(1)),
            ) {
                (Ok(min), Ok(maj)) => counters.push((min, maj)),
                // The thread exited meanwhile: nothing of it left to count.
                (Err(e), _) | (_, Err(e)) if e.raw_os_error() == Some(libc::ESRCH) => {}
                (Err(e), _) | (_, Err(e)) => {
                    return Err(e).with_context(|| {
                        format!(
                            "perf_event_open(PAGE_FAULTS, counting) on thread {tid} of pid {tgid}"
                        )
                    });
                }
            }
        }
        // Every thread exited before its counters opened (a `-p` process that ends as the
        // tracer starts): it has nothing left to count, and the session ends with it.
        if !counters.is_empty() {
            self.processes.insert(tgid, counters);
        }
        Ok(())
    }

    /// (minor, major) faults taken through the exception, per process, since it was added.
    pub fn read(&self) -> BTreeMap<u32, (u64, u64)> {
        self.processes
            .iter()
            .map(|(&tgid, counters)| {
                let (mut min, mut maj) = (0, 0);
                for (min_file, maj_file) in counters {
                    min += read_counter(min_file);
                    maj += read_counter(maj_file);
                }
                (tgid, (min, maj))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_has_the_kernels_ver7_layout() {
        assert_eq!(size_of::<PerfEventAttr>(), 128);
        assert_eq!(std::mem::offset_of!(PerfEventAttr, flags), 40);
        assert_eq!(std::mem::offset_of!(PerfEventAttr, sig_data), 120);
    }
}

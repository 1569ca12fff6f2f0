//! The harness of `faults.rs`: the workload child driven command by command, and the
//! tracer's per-process summary and its differences over one window.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use memlock_trace::{
    faults::{self, FaultReport, FaultSummary},
    lab::workload::{PAGE_SIZE, faults::FILE_STRIDE},
    procfs::MappingCache,
    tracer::Tracer,
};

/// The workload child, driven line by line.
pub(super) struct Workload {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Workload {
    pub(super) fn spawn() -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_memlock-trace"))
            .args(["workload", "faults"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning `memlock-trace workload faults`");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("reading the workload's greeting");
        assert_eq!(line, "ready\n");
        Self {
            child,
            stdin,
            stdout,
        }
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a command; returns the address it used, once the child is blocked again.
    pub(super) fn run(&mut self, command: &str) -> usize {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .expect("writing a command");
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("reading the answer");
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            words.first(),
            Some(&"ok"),
            "`{command}` failed in the workload: {line}"
        );
        self.wait_blocked();
        usize::from_str_radix(words[3].trim_start_matches("0x"), 16).expect("address")
    }

    /// Waits until the child sits in `read(0, ...)`: the call's number (x86_64's 0, arm64's
    /// 63) with fd 0 as the first argument, in /proc/PID/syscall.
    pub(super) fn wait_blocked(&self) {
        let path = format!("/proc/{}/syscall", self.pid());
        let blocked = format!("{} 0x0 ", libc::SYS_read);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(&path).expect("reading /proc/PID/syscall");
            if text.starts_with(&blocked) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the workload never blocked: {text}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The kernel's own counters: /proc/PID/stat fields 10 (minflt) and 12 (majflt).
    pub(super) fn proc_faults(&self) -> (u64, u64) {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).expect("stat");
        // The comm may contain spaces: fields start after the last ')'.
        let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 2..]
            .split(' ')
            .collect();
        (
            fields[7].parse().expect("minflt"),
            fields[9].parse().expect("majflt"),
        )
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.stdin.write_all(b"exit\n");
        let _ = self.child.wait();
    }
}

pub(super) fn report(tracer: &Tracer) -> FaultReport {
    tracer
        .fault_report()
        .expect("reading the fault maps")
        .expect("faults traced")
}

/// One process's summary, with its faults attributed to the mappings in `mappings`.
pub(super) fn summary(
    tracer: &Tracer,
    report: &FaultReport,
    mappings: &mut MappingCache,
    pid: u32,
) -> FaultSummary {
    let hooks = tracer.fault_hooks.as_ref().expect("fault hooks");
    let all = faults::summarize(report, hooks, mappings, 50);
    // The latest process with the pid (one, unless the pid was reused).
    all.into_iter()
        .filter(|(k, _)| k.tgid == pid)
        .max_by_key(|(k, _)| k.start_ns)
        .map(|(_, (_, s))| s)
        .unwrap_or_default()
}

/// Differences of one window.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Delta {
    pub(super) minor: u64,
    pub(super) major: u64,
    pub(super) user: u64,
    pub(super) populated: u64,
    pub(super) populated_by: BTreeMap<&'static str, u64>,
    pub(super) failed: Option<u64>,
    pub(super) in_locked_vma: Option<u64>,
    pub(super) in_lockonfault_vma: Option<u64>,
    /// Faults timed, per latency class.
    pub(super) timed: BTreeMap<&'static str, u64>,
    pub(super) latency_unmatched: u64,
}

pub(super) fn delta(before: &FaultSummary, after: &FaultSummary) -> Delta {
    let sub = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| a - b);
    let mut populated_by = BTreeMap::new();
    for (call, n) in &after.populated_by {
        let d = n - before.populated_by.get(call).copied().unwrap_or(0);
        if d > 0 {
            populated_by.insert(*call, d);
        }
    }
    let mut timed = BTreeMap::new();
    for (class, l) in &after.latency_ns {
        let d = l.count - before.latency_ns.get(class).map_or(0, |b| b.count);
        if d > 0 {
            timed.insert(*class, d);
        }
    }
    Delta {
        minor: after.minor - before.minor,
        major: after.major - before.major,
        user: after.user - before.user,
        populated: after.populated - before.populated,
        populated_by,
        failed: sub(after.failed, before.failed),
        in_locked_vma: sub(after.in_locked_vma, before.in_locked_vma),
        in_lockonfault_vma: sub(after.in_lockonfault_vma, before.in_lockonfault_vma),
        timed,
        latency_unmatched: after.latency_unmatched - before.latency_unmatched,
    }
}

/// A sparse file whose pages `i * FILE_STRIDE` hold data (and so are in the page cache).
pub(super) fn sparse_file(pages: usize) -> PathBuf {
    use std::os::unix::fs::FileExt as _;
    // One file per call: the tests of this binary run in parallel threads of one process
    // unless `--test-threads=1` (as `cargo xtask test` runs them), and one test evicting or
    // removing another's file made its minor faults major.
    static FILES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = FILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("memlock-trace-faults-{}-{n}", std::process::id()));
    let file = std::fs::File::create(&path).expect("creating the test file");
    file.set_len((pages * FILE_STRIDE * PAGE_SIZE) as u64)
        .expect("sizing the test file");
    for i in 0..pages {
        file.write_at(&[7u8; PAGE_SIZE], (i * FILE_STRIDE * PAGE_SIZE) as u64)
            .expect("writing");
    }
    file.sync_all().expect("fsync");
    path
}

/// Drops the file's clean pages from the page cache, so reading them is a major fault.
pub(super) fn evict(path: &Path) {
    use std::os::fd::AsRawFd as _;
    let file = std::fs::File::open(path).expect("opening the test file");
    let ret = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(ret, 0, "posix_fadvise(DONTNEED)");
}

//! Runs on: host only: runs Debian's prometheus against a system-wide tracer, which the guest's
//! initramfs does not carry (the counts it scrapes: test:exact_calls and test:prometheus, in the
//! guests too)
//!
//! Packages: prometheus, python3
//!
//! The fleet node, end to end: the tracer system-wide (no `-p`, no command) behind a real
//! Debian `prometheus` scraping it every second, while a shell loop churns short processes
//! and a flood of mlock/munlock calls shares one CPU with the tracer, which runs
//! `SCHED_IDLE` there, so its ring buffer overflows. A known process, forked by a shell,
//! moved into a cgroup made here and exec'd as `fleetprobe`, makes exactly N mlock and N
//! munlock calls and exits: PromQL returns N and N under its name after exec and its cgroup,
//! the flood's series equal what it made, and the dropped records are counted.
//!
//! Host stage only: the guest's initramfs carries neither prometheus nor the churn's tools
//! (the exact kernel counts behind it: test:exact_calls, on every kernel).

mod common;
mod support;

use std::{
    io::{BufRead, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::require_privileges;
use support::{
    BIN, Tracer, cgroup2_mount, flood_args,
    prometheus::{Prometheus, scrape_job, served_target},
    summary, threads_of,
};

/// The known process's mlock calls (and as many munlocks): the figure issue 20 saw become 2.
const N: u64 = 100;
/// Pages each of its calls locks, then unlocks.
const PROBE_PAGES: u64 = 4;
const FLOOD_THREADS: u64 = 2;
/// Per flood thread: long enough on one shared CPU to outlast the probe.
const FLOOD_CALLS: u64 = 150_000;
const JOB: &str = "fleet";
const PYTHON: &str = "/usr/bin/python3";

/// The probe: ready once loaded, its calls on a line from stdin, then its own count of the
/// calls that succeeded. A script run through its `#!` line: the kernel names the process
/// after the script's file, as for any script a shell runs.
const PROBE_SCRIPT: &str = r#"#!/usr/bin/python3
import ctypes, mmap, sys
n, pages = int(sys.argv[1]), int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
for f in (libc.mlock, libc.munlock):
    f.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
size = pages * mmap.PAGESIZE
buf = mmap.mmap(-1, size)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
print("ready", flush=True)
sys.stdin.readline()
ok = [0, 0]
for _ in range(n):
    ok[0] += libc.mlock(addr, size) == 0
    ok[1] += libc.munlock(addr, size) == 0
print(ok[0], ok[1], flush=True)
"#;

/// The churn: short processes until told to stop (or 600 rounds), some exec'ing /bin/true,
/// every tenth round a python3; prints how many rounds it made.
const CHURN_SCRIPT: &str = r#"i=0
while [ ! -e "$1" ] && [ "$i" -lt 600 ]; do
  /bin/true
  (:)
  if [ $((i % 10)) -eq 0 ]; then /usr/bin/python3 -c pass; fi
  i=$((i + 1))
done
echo "$i""#;

/// `/memlock-trace-fleet-PID/{probe,flood}`, removed on drop (after their processes).
struct Cgroups {
    top: PathBuf,
}

impl Cgroups {
    fn new() -> Self {
        let top = cgroup2_mount().join(format!("memlock-trace-fleet-{}", std::process::id()));
        for leaf in ["probe", "flood"] {
            let dir = top.join(leaf);
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        }
        Self { top }
    }

    fn dir(&self, leaf: &str) -> PathBuf {
        self.top.join(leaf)
    }

    /// As `/proc/PID/cgroup` shows it (for a tracer in the root cgroup namespace).
    fn path(&self, leaf: &str) -> String {
        format!(
            "/{}/{leaf}",
            self.top.file_name().unwrap().to_string_lossy()
        )
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for leaf in ["probe", "flood"] {
            let _ = std::fs::remove_dir(self.top.join(leaf));
        }
        let _ = std::fs::remove_dir(&self.top);
    }
}

/// The test's scratch directory, removed when dropped (also after a failed assertion).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child killed and reaped when dropped (a failed assertion leaves nothing behind).
struct Reaped(Child);

impl Reaped {
    /// Starts `cmd` with its stdin and stdout piped: the test commands it and reads its
    /// answers.
    fn commanded(cmd: &mut Command) -> Self {
        Self(
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `sh -c 'move myself into CGROUP; exec PROGRAM ARGS'`: forked by a shell, named by its exec.
fn in_cgroup(cgroup: &Path, program: &str, args: &[impl AsRef<std::ffi::OsStr>]) -> Command {
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
        .arg(cgroup)
        .arg(program)
        .args(args);
    cmd
}

/// Every thread of `pid` onto `cpu`, and `SCHED_IDLE` if `idle` (else back to
/// `SCHED_OTHER` on every CPU in `all`). Threads made later inherit it from their creator.
fn schedule(pid: u32, cpu: usize, idle: bool, all: &libc::cpu_set_t) {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    for task in tasks.flatten() {
        let tid: i32 = task.file_name().to_string_lossy().parse().unwrap();
        // SAFETY: cpu_set_t is plain data; CPU_SET writes within it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        if idle {
            // SAFETY: as above; cpu < CPU_SETSIZE (it came from our own mask).
            unsafe { libc::CPU_SET(cpu, &mut set) };
        } else {
            set = *all;
        }
        let policy = if idle {
            libc::SCHED_IDLE
        } else {
            libc::SCHED_OTHER
        };
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: both calls read the structs they are given; a thread that just exited
        // makes them fail with ESRCH, which is fine.
        let (affinity, policy) = unsafe {
            (
                libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &set),
                libc::sched_setscheduler(tid, policy, &param),
            )
        };
        if (affinity != 0 || policy != 0) && Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
        {
            panic!(
                "scheduling thread {tid} of {pid}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Only `cpu`, for the flood (normal priority: it starves the idle tracer beside it).
fn pin(pid: u32, cpu: usize) {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let tid: i32 = task.file_name().to_string_lossy().parse().unwrap();
        // SAFETY: as in `schedule`.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: as in `schedule`.
        let ret = unsafe {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &set)
        };
        assert_eq!(ret, 0, "pinning thread {tid} of {pid} to CPU {cpu}");
    }
}

/// Polls `promql` until it returns `want` or 40 s pass; returns the last value.
fn poll(prometheus: &Prometheus, promql: &str, want: f64) -> f64 {
    poll_until(prometheus, promql, |got| got == want)
}

/// Polls `promql` until its value passes `done` or 40 s pass; returns the last value.
fn poll_until(prometheus: &Prometheus, promql: &str, done: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let got = prometheus.one(promql);
        if done(got) || Instant::now() > deadline {
            eprintln!("{promql} = {got}");
            return got;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Waits for a bundled workload and parses the JSON report it printed.
fn report_of(child: &mut Child) -> serde_json::Value {
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "the workload failed ({status}): {out}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The next line `what` wrote.
fn line_from(reader: &mut impl BufRead, what: &str) -> String {
    let mut line = String::new();
    let n = reader.read_line(&mut line).unwrap();
    assert!(n > 0, "{what}: the process closed its stdout");
    line.trim_end().to_string()
}

#[test]
fn promql_returns_what_a_known_process_did_beside_churn_and_a_starving_flood() {
    require_privileges();
    support::prometheus::require(support::prometheus::PROMETHEUS);
    assert!(
        Path::new(PYTHON).is_file(),
        "{PYTHON} is missing: `cargo xtask test` installs Debian's python3"
    );
    let started = Instant::now();
    let scratch = std::env::temp_dir().join(format!("memlock-trace-fleet-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let scratch = Scratch(scratch);
    let scratch = &scratch.0;
    let probe = scratch.join("fleetprobe");
    std::fs::write(&probe, PROBE_SCRIPT).unwrap();
    std::fs::set_permissions(&probe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    // CPUs this test may use: the flood and the tracer share the last one.
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
    let mut all: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(
        unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut all) },
        0
    );
    // SAFETY: CPU_ISSET reads within the set.
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &all) })
        .collect();
    assert!(
        cpus.len() >= 2,
        "this test needs 2 CPUs (one shared by the tracer and the flood): {cpus:?}"
    );
    let cpu = *cpus.last().unwrap();

    // System-wide: no -p, no command, as a fleet node runs it.
    let mut tracer = Tracer::spawn(&["--json", "--prometheus", "127.0.0.1:0"]);
    let target = served_target(&tracer.wait_for_stderr("serving Prometheus metrics on http://"));
    tracer.wait_for_stderr("memlock-trace: tracing");
    let prometheus = Prometheus::start(&scratch.join("prometheus"), &scrape_job(JOB, &target));
    let targets = prometheus.targets_after_scrapes(1);
    assert_eq!(
        targets[0]["health"],
        "up",
        "{targets:?}\n{}",
        prometheus.log()
    );

    // The cgroups appear while the tracer runs, as a container's would.
    let cgroups = Cgroups::new();
    let stop = scratch.join("stop-churn");
    let churn = Command::new("/bin/sh")
        .args(["-c", CHURN_SCRIPT, "churn"])
        .arg(&stop)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut churn = Reaped(churn);

    let mut probe_child = Reaped::commanded(&mut in_cgroup(
        &cgroups.dir("probe"),
        probe.to_str().unwrap(),
        &[&N.to_string(), &PROBE_PAGES.to_string()],
    ));
    let probe_pid = probe_child.0.id();
    let mut probe_out = BufReader::new(probe_child.0.stdout.take().unwrap());
    assert_eq!(line_from(&mut probe_out, "fleetprobe"), "ready");
    let comm = std::fs::read_to_string(format!("/proc/{probe_pid}/comm")).unwrap();
    assert_eq!(
        comm.trim_end(),
        "fleetprobe",
        "the kernel's name after the exec"
    );

    let mut flood = Reaped::commanded(&mut in_cgroup(
        &cgroups.dir("flood"),
        BIN,
        &flood_args(FLOOD_THREADS, FLOOD_CALLS, &["--munlock", "--wait-stdin"]),
    ));
    let flood_pid = flood.0.id();
    // Its threads wait at the start line: all of them exist once /proc lists them.
    threads_of(flood_pid, FLOOD_THREADS as usize + 1);
    pin(flood_pid, cpu);
    // The starvation: the tracer idle-class on the flood's CPU.
    schedule(tracer.pid() as u32, cpu, true, &all);
    let dropped_before = prometheus.one("sum(memlock_trace_dropped_events_total)");

    flood.0.stdin.take().unwrap().write_all(b"g").unwrap();
    // Let the flood fill the ring first, then the probe's calls.
    std::thread::sleep(Duration::from_millis(300));
    writeln!(probe_child.0.stdin.take().unwrap(), "go").unwrap();
    let probe_said = line_from(&mut probe_out, "fleetprobe");
    assert_eq!(
        probe_said,
        format!("{N} {N}"),
        "the probe's own count of its successful mlock and munlock calls"
    );
    assert!(probe_child.0.wait().unwrap().success());
    let flood_running = matches!(flood.0.try_wait(), Ok(None));
    let flood_out = report_of(&mut flood.0);
    assert!(
        flood_running,
        "the flood ended before the probe did: no starvation to speak of ({FLOOD_CALLS} calls \
         per thread took {} s)",
        flood_out["secs"]
    );
    std::fs::write(&stop, "").unwrap();
    let rounds = {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut churn.0.stdout.take().unwrap(), &mut out).unwrap();
        assert!(churn.0.wait().unwrap().success());
        out.trim().parse::<u64>().unwrap()
    };
    // The tracer back to normal, so the queries below do not wait on it.
    schedule(tracer.pid() as u32, cpu, false, &all);
    let flood_calls = flood_out["calls"].as_u64().unwrap();
    let flood_munlocks = flood_out["munlock_calls"].as_u64().unwrap();
    let flood_enomem = flood_out["enomem"].as_u64().unwrap();
    assert_eq!(flood_calls, FLOOD_THREADS * FLOOD_CALLS);

    // PromQL: the probe's series, by its name after exec and its cgroup.
    let probe_sel = format!(
        "job=\"{JOB}\",comm=\"fleetprobe\",cgroup=\"{}\"",
        cgroups.path("probe")
    );
    let calls =
        |sel: &str, call: &str| format!("memlock_trace_syscalls_total{{{sel},syscall=\"{call}\"}}");
    let mlocks = poll(&prometheus, &calls(&probe_sel, "mlock"), N as f64);
    let munlocks = poll(&prometheus, &calls(&probe_sel, "munlock"), N as f64);
    // Everything the probe's cgroup made, whatever the name: only fleetprobe's.
    let in_probe_cgroup = prometheus.query(&format!(
        "sum by (comm, syscall) (memlock_trace_syscalls_total{{job=\"{JOB}\",cgroup=\"{}\"}})",
        cgroups.path("probe")
    ));
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let locked = prometheus.one(&format!(
        "memlock_trace_syscall_locked_bytes_total{{{probe_sel},syscall=\"mlock\"}}"
    ));
    let unlocked = prometheus.one(&format!(
        "memlock_trace_syscall_unlocked_bytes_total{{{probe_sel},syscall=\"munlock\"}}"
    ));
    let probe_errors = prometheus.one(&format!(
        "sum(memlock_trace_syscall_errors_total{{{probe_sel}}})"
    ));

    // The flood's series, by its cgroup (its name is memlock-trace, as other tests' are).
    let flood_sel = format!("job=\"{JOB}\",cgroup=\"{}\"", cgroups.path("flood"));
    let flood_mlocks = poll(
        &prometheus,
        &format!("sum({})", calls(&flood_sel, "mlock")),
        flood_calls as f64,
    );
    let flood_munlocks_seen = poll(
        &prometheus,
        &format!("sum({})", calls(&flood_sel, "munlock")),
        flood_munlocks as f64,
    );
    let flood_errors = prometheus.one(&format!(
        "sum(memlock_trace_syscall_errors_total{{{flood_sel},syscall=\"mlock\",errno=\"ENOMEM\"}})"
    ));
    let dropped = poll_until(
        &prometheus,
        "sum(memlock_trace_dropped_events_total)",
        |d| d > dropped_before,
    );

    tracer.signal(libc::SIGINT);
    let done = tracer.finish();
    let summary_dropped = summary(&done.stdout)["dropped_events"].as_u64();
    eprintln!(
        "fleet: churn {rounds} rounds; probe pid {probe_pid}: mlock {mlocks}, munlock {munlocks}, \
         locked {locked} B, unlocked {unlocked} B, errors {probe_errors}; flood {flood_calls} + \
         {flood_munlocks} calls in {:.1} s: PromQL {flood_mlocks} + {flood_munlocks_seen}, ENOMEM \
         {flood_errors}; dropped records: PromQL {dropped_before} -> {dropped}, summary \
         {summary_dropped:?}; {:.1} s",
        flood_out["secs"].as_f64().unwrap_or(0.0),
        started.elapsed().as_secs_f64()
    );
    let figures = format!(
        "in the probe's cgroup: {in_probe_cgroup:?}\ntracer stderr:\n{}",
        done.stderr
    );
    assert_eq!(
        (mlocks, munlocks),
        (N as f64, N as f64),
        "fleetprobe's mlock and munlock series\n{figures}"
    );
    assert_eq!(
        in_probe_cgroup.len(),
        2,
        "one series per call in the probe's cgroup, all named fleetprobe\n{figures}"
    );
    let bytes = (N * PROBE_PAGES * page) as f64;
    assert_eq!(
        (locked, unlocked, probe_errors),
        (bytes, bytes, 0.0),
        "fleetprobe's locked and unlocked bytes and errors\n{figures}"
    );
    assert_eq!(
        (flood_mlocks, flood_munlocks_seen, flood_errors),
        (
            flood_calls as f64,
            flood_munlocks as f64,
            flood_enomem as f64
        ),
        "the flood's calls\n{figures}"
    );
    assert!(
        dropped > dropped_before,
        "the starved tracer dropped no records ({dropped_before} -> {dropped}): the \
         starvation was not real\n{figures}"
    );
    assert!(
        summary_dropped.is_some_and(|d| d as f64 >= dropped),
        "the summary's dropped records ({summary_dropped:?}) below PromQL's ({dropped})"
    );
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(90),
        "the test took {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

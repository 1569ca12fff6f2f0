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
#[path = "prometheus_fleet/cpus.rs"]
mod cpus;
#[path = "prometheus_fleet/series.rs"]
mod series;
mod support;

use std::{
    io::{BufRead, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use common::require_privileges;
use cpus::{pin, schedule, shared_cpu};
use series::{FloodSeries, ProbeSeries, flood_series, poll_until, probe_series};
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

/// The test's scratch directory with the probe script in it, as `fleetprobe`.
fn scratch_with_probe() -> Scratch {
    let scratch = std::env::temp_dir().join(format!("memlock-trace-fleet-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let scratch = Scratch(scratch);
    let probe = scratch.0.join("fleetprobe");
    std::fs::write(&probe, PROBE_SCRIPT).unwrap();
    std::fs::set_permissions(&probe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    scratch
}

/// The fleet node: the tracer system-wide (no -p, no command), and Prometheus scraping it,
/// its target up.
fn fleet_node(scratch: &Path) -> (Tracer, Prometheus) {
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
    (tracer, prometheus)
}

/// The probe, started in its cgroup and loaded (it said `ready`), named `fleetprobe` by the
/// kernel; the reader of its answers.
fn start_probe(cgroups: &Cgroups, probe: &Path) -> (Reaped, BufReader<ChildStdout>) {
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
    (probe_child, probe_out)
}

/// What the run left behind it: the probe's pid, the churn's rounds, the flood's own report
/// and the dropped records PromQL counted before the flood.
struct Run {
    probe_pid: u32,
    rounds: u64,
    flood: serde_json::Value,
    dropped_before: f64,
}

/// The churn, the probe's calls and the flood, the tracer starved on the flood's CPU while
/// they run; once all three have ended, the tracer is back to normal.
fn run_beside_churn_and_flood(
    tracer: &Tracer,
    prometheus: &Prometheus,
    cgroups: &Cgroups,
    scratch: &Path,
    (all, cpu): (libc::cpu_set_t, usize),
) -> Run {
    let stop = scratch.join("stop-churn");
    let churn = Command::new("/bin/sh")
        .args(["-c", CHURN_SCRIPT, "churn"])
        .arg(&stop)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut churn = Reaped(churn);
    let (mut probe_child, mut probe_out) = start_probe(cgroups, &scratch.join("fleetprobe"));
    let probe_pid = probe_child.0.id();

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
    Run {
        probe_pid,
        rounds,
        flood: flood_out,
        dropped_before,
    }
}

/// PromQL's figures against what the probe and the flood made; the dropped records counted,
/// by PromQL and (at least as many) by the summary.
fn assert_series(
    probe: &ProbeSeries,
    flood: &FloodSeries,
    (dropped_before, dropped, summary_dropped): (f64, f64, Option<u64>),
    tracer_stderr: &str,
) {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let figures = format!(
        "in the probe's cgroup: {:?}\ntracer stderr:\n{tracer_stderr}",
        probe.in_cgroup
    );
    assert_eq!(
        (probe.mlocks, probe.munlocks),
        (N as f64, N as f64),
        "fleetprobe's mlock and munlock series\n{figures}"
    );
    assert_eq!(
        probe.in_cgroup.len(),
        2,
        "one series per call in the probe's cgroup, all named fleetprobe\n{figures}"
    );
    let bytes = (N * PROBE_PAGES * page) as f64;
    assert_eq!(
        (probe.locked, probe.unlocked, probe.errors),
        (bytes, bytes, 0.0),
        "fleetprobe's locked and unlocked bytes and errors\n{figures}"
    );
    assert_eq!(
        (flood.mlocks_seen, flood.munlocks_seen, flood.errors),
        (
            flood.calls as f64,
            flood.munlocks as f64,
            flood.enomem as f64
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
    let scratch = scratch_with_probe();
    let scratch = &scratch.0;
    let cpus = shared_cpu();
    let (tracer, prometheus) = fleet_node(scratch);
    // The cgroups appear while the tracer runs, as a container's would.
    let cgroups = Cgroups::new();
    let run = run_beside_churn_and_flood(&tracer, &prometheus, &cgroups, scratch, cpus);

    let probe = probe_series(&prometheus, &cgroups);
    let flood = flood_series(&prometheus, &cgroups, &run.flood);
    let dropped_before = run.dropped_before;
    let dropped = poll_until(
        &prometheus,
        "sum(memlock_trace_dropped_events_total)",
        |d| d > dropped_before,
    );

    tracer.signal(libc::SIGINT);
    let done = tracer.finish();
    let summary_dropped = summary(&done.stdout)["dropped_events"].as_u64();
    eprintln!(
        "fleet: churn {} rounds; probe pid {}: mlock {}, munlock {}, locked {} B, unlocked {} B, \
         errors {}; flood {} + {} calls in {:.1} s: PromQL {} + {}, ENOMEM {}; dropped records: \
         PromQL {dropped_before} -> {dropped}, summary {summary_dropped:?}; {:.1} s",
        run.rounds,
        run.probe_pid,
        probe.mlocks,
        probe.munlocks,
        probe.locked,
        probe.unlocked,
        probe.errors,
        flood.calls,
        flood.munlocks,
        run.flood["secs"].as_f64().unwrap_or(0.0),
        flood.mlocks_seen,
        flood.munlocks_seen,
        flood.errors,
        started.elapsed().as_secs_f64()
    );
    assert_series(
        &probe,
        &flood,
        (dropped_before, dropped, summary_dropped),
        &done.stderr,
    );
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(90),
        "the test took {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

//! The fleet path with the real server: Debian's `prometheus` scrapes the tracer's
//! `/metrics` every second, and PromQL over its HTTP API returns exactly the mlock calls and
//! page faults a workload made (as the kernel itself counted them for the workload).
//!
//! Host stage only (`cargo xtask test` says so in the guest's table): the guest's initramfs
//! does not carry the server. `cargo xtask test` installs it when missing.

mod common;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, Stdio},
    sync::mpsc::{Receiver, channel},
    time::{Duration, Instant},
};

use common::require_privileges;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_memlock-trace");
const PROMETHEUS: &str = "/usr/bin/prometheus";
const JOB: &str = "memlock-trace";

/// A child process killed (and reaped) when dropped, with a scratch directory removed.
struct Server {
    child: Child,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child, which has not been reaped yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

/// Starts Prometheus on 127.0.0.1, scraping `target` every second, with its own data
/// directory; returns it with its base URL once it answers ready.
fn start_prometheus(target: &str) -> (Server, String) {
    assert!(
        Path::new(PROMETHEUS).is_file(),
        "{PROMETHEUS} is missing: `cargo xtask test` installs Debian's prometheus package \
         (or: apt-get install prometheus)"
    );
    let dir = std::env::temp_dir().join(format!("memlock-trace-prometheus-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n      - targets: [\"{target}\"]\n"
        ),
    )
    .unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new(PROMETHEUS)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={listen}"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {PROMETHEUS}: {e}"));
    let server = Server { child, dir };
    let url = format!("http://{listen}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = agent().get(format!("{url}/-/ready")).call()
            && r.status() == 200
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus not ready within 60 s:\n{}",
            prometheus_log(&server)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (server, url)
}

fn prometheus_log(server: &Server) -> String {
    std::fs::read_to_string(server.dir.join("prometheus.log")).unwrap_or_default()
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into()
}

/// The value of an instant PromQL query that returns at most one series (0 when none).
fn query(url: &str, promql: &str) -> f64 {
    let mut response = agent()
        .get(format!("{url}/api/v1/query"))
        .query("query", promql)
        .call()
        .unwrap_or_else(|e| panic!("GET /api/v1/query {promql}: {e}"));
    let body = response.body_mut().read_to_string().unwrap();
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(v["status"], "success", "{promql}: {body}");
    let result = v["data"]["result"].as_array().expect("a vector");
    assert!(
        result.len() <= 1,
        "{promql} returned several series: {body}"
    );
    result.first().map_or(0.0, |series| {
        series["value"][1].as_str().unwrap().parse().unwrap()
    })
}

/// Polls `promql` until it returns `want` (the tracer refreshes each second, Prometheus
/// scrapes each second); fails with the last value after 30 s.
fn wait_for(url: &str, promql: &str, want: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = query(url, promql);
        if got == want || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Polls `promql` until it returns the same value over 3 s (several scrapes of an idle
/// workload), and returns it.
fn settled(url: &str, promql: &str) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = (query(url, promql), Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = query(url, promql);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() >= Duration::from_secs(3) {
            return now;
        }
        assert!(Instant::now() < deadline, "{promql} never settled");
    }
}

/// The traced workload: `memlock-trace --prometheus 127.0.0.1:0 -- memlock-trace workload
/// faults`, commanded line by line.
struct Workload {
    tracer: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Workload {
    fn start() -> (Self, String) {
        let mut tracer = Command::new(BIN)
            .args([
                "--prometheus",
                "127.0.0.1:0",
                "--",
                BIN,
                "workload",
                "faults",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run memlock-trace");
        let (tx, lines) = channel::<String>();
        let out = tracer.stdout.take().unwrap();
        let out_tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = out_tx.send(line);
            }
        });
        let err = tracer.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("tracer: {line}");
                let _ = tx.send(format!("stderr: {line}"));
            }
        });
        let stdin = tracer.stdin.take().unwrap();
        let mut w = Self {
            tracer,
            stdin,
            lines,
        };
        let serving = w.wait_for("stderr: memlock-trace: serving Prometheus metrics on http://");
        let target = serving
            .rsplit("http://")
            .next()
            .unwrap()
            .trim_end_matches("/metrics")
            .to_string();
        w.wait_for("ready");
        (w, target)
    }

    fn wait_for(&mut self, prefix: &str) -> String {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("no `{prefix}` from the traced workload"));
            assert!(!line.starts_with("error"), "{line}");
            if line.starts_with(prefix) {
                return line;
            }
        }
    }

    /// Runs one command; returns the workload's own (minflt, majflt) after it.
    fn run(&mut self, command: &str) -> (u64, u64) {
        writeln!(self.stdin, "{command}").unwrap();
        let answer = self.wait_for("ok ");
        let mut words = answer.split_whitespace().skip(1);
        let mut next = || words.next().unwrap().parse::<u64>().unwrap();
        (next(), next())
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "exit");
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(self.tracer.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.tracer.kill();
        let _ = self.tracer.wait();
    }
}

#[test]
fn promql_sums_equal_the_calls_and_faults_made() {
    require_privileges();
    let (mut workload, target) = Workload::start();
    // Fault in the code of each path once, so the measured commands fault only their pages.
    workload.run("mlock 1");
    workload.run("touch 1");
    workload.run("noop");
    let (server, url) = start_prometheus(&target);
    let up = wait_for(&url, &format!("up{{job=\"{JOB}\"}}"), 1.0);
    assert_eq!(
        up,
        1.0,
        "the target is not up:\n{}",
        prometheus_log(&server)
    );

    let sel = format!("job=\"{JOB}\"");
    let faults = format!("sum(memlock_trace_page_faults_total{{{sel}}})");
    let user = format!("sum(memlock_trace_page_faults_total{{{sel},origin=\"user\"}})");
    let major = format!("sum(memlock_trace_page_faults_total{{{sel},class=\"major\"}})");
    let timed = format!(
        "sum(memlock_trace_page_fault_latency_seconds_count{{{sel},class=\"minor\",origin=\"user\"}})"
    );
    let before = (
        settled(&url, &faults),
        query(&url, &user),
        query(&url, &major),
        query(&url, &timed),
    );
    assert!(
        before.0 > 0.0,
        "no fault series before the measured commands"
    );

    // The measured commands: three mlocks of 64 fresh pages, two runs of 300 first touches.
    let (start_min, start_maj) = workload.run("noop");
    let mut mlocked = 0;
    let mut last = start_min;
    for _ in 0..3 {
        let (min, _) = workload.run("mlock 64");
        mlocked += min - last;
        last = min;
    }
    let mut touched = 0;
    for _ in 0..2 {
        let (min, _) = workload.run("touch 300");
        touched += min - last;
        last = min;
    }
    let (end_min, end_maj) = workload.run("noop");
    // The kernel's own count (getrusage in the workload) is the number made.
    assert_eq!((mlocked, touched), (192, 600));
    let made = (end_min + end_maj - start_min - start_maj) as f64;
    assert_eq!(made, 792.0, "faults outside the measured pages");

    // Exact sums from the server, each polled until it arrives (or 30 s).
    let calls = wait_for(
        &url,
        &format!("sum(memlock_trace_syscalls_total{{{sel},syscall=\"mlock\"}})"),
        4.0,
    );
    assert_eq!(calls, 4.0, "mlock calls: 1 warm-up + 3");
    // Bytes, in pages of this machine.
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
    let populated = wait_for(
        &url,
        &format!(
            "sum(memlock_trace_syscall_populated_bytes_total{{{sel},syscall=\"mlock\"}}) / {page}"
        ),
        193.0,
    );
    assert_eq!(
        populated, 193.0,
        "pages the mlock calls populated: 1 + 3 x 64"
    );
    let populated_by = wait_for(
        &url,
        &format!("sum(memlock_trace_page_faults_populated_total{{{sel},syscall=\"mlock\"}})"),
        193.0,
    );
    assert_eq!(populated_by, 193.0, "faults populated by mlock");
    let total = wait_for(&url, &faults, before.0 + made);
    assert_eq!(total - before.0, made, "all faults in the window");
    assert_eq!(query(&url, &user) - before.1, 600.0, "user faults");
    assert_eq!(query(&url, &major) - before.2, 0.0, "major faults");
    assert_eq!(
        query(&url, &timed) - before.3,
        600.0,
        "user minor faults timed in the latency histogram"
    );
    // A quantile from the histogram: a real latency, within its 256 ns .. 134 ms buckets.
    let p99 = query(
        &url,
        &format!(
            "histogram_quantile(0.99, sum by (le) (memlock_trace_page_fault_latency_seconds_bucket{{{sel},origin=\"user\"}}))"
        ),
    );
    assert!(p99 > 0.0 && p99 < 0.134, "p99 fault latency {p99} s");
    eprintln!(
        "PromQL: mlock calls {calls}, pages populated {populated} (by mlock {populated_by}), \
         faults {} -> {total} (+{made}), user +{}, timed +{}, p99 {:.1} us",
        before.0,
        query(&url, &user) - before.1,
        query(&url, &timed) - before.3,
        p99 * 1e6
    );
    // Nothing lost on the way.
    for lost in [
        "sum(memlock_trace_fault_health_total)",
        "sum(memlock_trace_dropped_events_total)",
    ] {
        assert_eq!(query(&url, lost), 0.0, "{lost}");
    }
    drop(server);
    drop(workload);
}

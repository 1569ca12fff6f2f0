//! Runs on: host only: the /metrics server's limits (connections, header size, timeouts, accept
//! errors) and formats are user space, the same on every kernel
//!
//! Packages: prometheus, python3-prometheus-client: promtool lints the text format; the Python
//! client's parser checks OpenMetrics.
//!
//! The `/metrics` server against clients that are slow, greedy or hostile: a flood of idle
//! connections past the tracer's descriptor limit, a 64 MiB request header, a client that
//! sends one byte a second. After each, scrapes succeed and the tracer's memory and threads
//! are what they were.

mod common;
#[path = "metrics_server/formats.rs"]
mod formats;
mod support;

use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use common::require_privileges;
use formats::{assert_families, assert_linters_pass};
use support::{Tracer, line_after, map_memory, settled, status_kb};

/// The server's timeout for a request head (memlock-trace's `metrics::server::TIMEOUT`).
const TIMEOUT: Duration = Duration::from_secs(10);
/// Its bound on connections served at once (`metrics::server::MAX_CONNECTIONS`).
const MAX_CONNECTIONS: usize = 64;

/// A tracer that serves /metrics and traces nothing (no process has this name).
fn start() -> (Tracer, SocketAddr) {
    let mut tracer = Tracer::spawn(&["--prometheus", "127.0.0.1:0", "--comm", "no-such-process"]);
    let addr = served_addr(&tracer.wait_for_stderr("serving Prometheus metrics on http://"));
    tracer.wait_for_stderr("tracing");
    (tracer, addr)
}

/// [`start`], and a first scrape that succeeded: the tracer as it was before a hostile client,
/// its pid to read its figures.
fn start_scraped() -> (Tracer, SocketAddr, i32) {
    let (tracer, addr) = start();
    let pid = tracer.pid();
    assert_scrapes(addr, "before");
    (tracer, addr, pid)
}

/// The address in the tracer's `serving Prometheus metrics on http://ADDR/metrics` line.
fn served_addr(line: &str) -> SocketAddr {
    line.rsplit("http://")
        .next()
        .and_then(|s| s.strip_suffix("/metrics"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
}

/// One GET /metrics on a fresh connection: the status line and the body.
fn scrape(addr: SocketAddr) -> std::io::Result<(String, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    Ok((
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    ))
}

fn assert_scrapes(addr: SocketAddr, when: &str) {
    let (status, body) = scrape(addr).unwrap_or_else(|e| panic!("scrape {when}: {e}"));
    assert_eq!(status, "HTTP/1.1 200 OK", "scrape {when}");
    assert!(
        body.contains("memlock_trace_dropped_events_total"),
        "scrape {when}:\n{body}"
    );
}

/// SIGTERM; the tracer exits 0 and never said that the server stopped.
fn stop(tracer: Tracer) {
    tracer.signal(libc::SIGTERM);
    let finished = tracer.finish();
    assert!(finished.status.success(), "{}", finished.stderr);
    assert!(
        !finished.stderr.contains("STOPPED SERVING"),
        "{}",
        finished.stderr
    );
}

fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn idle_connections_past_the_descriptor_limit_leave_it_serving() {
    require_privileges();
    let (tracer, addr, pid) = start_scraped();
    // Once the scrape's connection is closed: the server closes it after its response, and
    // a baseline that still counted it made 64 accepted connections read 63, so the wait for
    // 64 ran into the head timeout that closes them (held: 35, under load).
    let (fds, threads) = (settled(|| open_fds(pid)), status_kb(pid, "Threads:"));

    // 100 idle connections: the server takes MAX_CONNECTIONS, the rest wait in the backlog,
    // and no thread is started for any of them.
    let idle: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    // On a loaded machine the accepts take a while: wait for the bound, then check that it
    // holds (a server without one would pass 64 on its way to 100).
    let held = || open_fds(pid).saturating_sub(fds);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while held() < MAX_CONNECTIONS && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(held(), MAX_CONNECTIONS, "connections held by the tracer");
    assert_eq!(
        status_kb(pid, "Threads:"),
        threads,
        "threads with 100 idle connections"
    );
    drop(idle);
    std::thread::sleep(Duration::from_millis(500));
    assert_scrapes(addr, "after 100 idle connections closed");

    // Leave the tracer 8 descriptors, then open more idle connections than that: accept
    // fails with EMFILE, which is said once, and the server keeps trying.
    let in_use = open_fds(pid) as u64;
    let limit = libc::rlimit {
        rlim_cur: in_use + 8,
        rlim_max: in_use + 8,
    };
    // SAFETY: prlimit(2) on our child, with a valid rlimit and no old-value pointer.
    let set = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &limit, std::ptr::null_mut()) };
    assert_eq!(set, 0, "prlimit: {}", std::io::Error::last_os_error());
    let idle: Vec<TcpStream> = (0..40).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_secs(2));
    let err = tracer.stderr();
    assert_eq!(
        err.matches("cannot accept connections").count(),
        1,
        "one warning for the failing accepts:\n{err}"
    );
    assert!(err.contains("Too many open files"), "{err}");
    drop(idle);
    // The back-off is at most a second; the backlog's connections are served, then ours.
    let deadline = Instant::now() + Duration::from_secs(10);
    while scrape(addr).map(|(status, _)| status).unwrap_or_default() != "HTTP/1.1 200 OK" {
        assert!(Instant::now() < deadline, "no scrape succeeded within 10 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_scrapes(addr, "after the EMFILE flood");
    let err = tracer.stderr();
    assert!(err.contains("accepts connections again"), "{err}");
    assert!(!err.contains("STOPPED SERVING"), "{err}");
    stop(tracer);
}

#[test]
fn an_oversized_header_is_refused_without_growing_the_tracer() {
    require_privileges();
    let (tracer, addr, pid) = start_scraped();
    let (rss, peak) = (status_kb(pid, "VmRSS:"), status_kb(pid, "VmHWM:"));

    // 64 MiB of one header, sent until the server answers or closes.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nX-Big: ")
        .unwrap();
    let chunk = vec![b'a'; 64 * 1024];
    let mut sent = 0usize;
    while sent < 64 << 20 {
        match s.write(&chunk) {
            Ok(n) => sent += n,
            Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {
                break;
            }
            Err(e) => panic!("writing the header: {e}"),
        }
    }
    let mut answer = Vec::new();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    // hyper says 431 before closing; a reset may overtake the answer on the wire.
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 431"),
        "{answer}"
    );
    assert!(sent < 64 << 20, "the server read all 64 MiB");
    drop(s);
    assert_scrapes(addr, "after the 64 MiB header");
    let (rss_after, peak_after) = (status_kb(pid, "VmRSS:"), status_kb(pid, "VmHWM:"));
    eprintln!(
        "sent {} KiB of header before refusal; RSS {rss} -> {rss_after} kB, peak {peak} -> \
         {peak_after} kB",
        sent / 1024
    );
    assert!(
        rss_after < rss + 4096,
        "RSS {rss} -> {rss_after} kB (within 4 MiB)"
    );
    assert!(
        peak_after < peak.max(rss) + 4096,
        "peak RSS {peak} -> {peak_after} kB"
    );
    stop(tracer);
}

#[test]
fn a_slow_client_is_dropped_within_the_timeout() {
    require_privileges();
    let (tracer, addr) = start();
    // One byte a second, forever: the head never completes.
    let mut slow = TcpStream::connect(addr).unwrap();
    let idle = TcpStream::connect(addr).unwrap();
    let started = Instant::now();
    slow.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    let closed_after = loop {
        std::thread::sleep(Duration::from_secs(1));
        let sent = slow.write_all(b"X").and_then(|()| slow.flush());
        // A write after the server closed is answered with a reset: the next one fails.
        if sent.is_err() {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < TIMEOUT * 3,
            "still connected after {:?}",
            started.elapsed()
        );
        // Scrapes go on meanwhile.
        assert_scrapes(addr, "while a slow client is connected");
    };
    eprintln!("slow client dropped after {closed_after:?}");
    assert!(
        closed_after >= TIMEOUT - Duration::from_secs(1)
            && closed_after <= TIMEOUT + Duration::from_secs(4),
        "dropped after {closed_after:?}, timeout {TIMEOUT:?}"
    );
    // A connection that sends nothing is dropped too: read gives end of file.
    let mut idle = idle;
    idle.set_read_timeout(Some(TIMEOUT * 2)).unwrap();
    let mut buf = [0; 64];
    let read = idle.read(&mut buf);
    assert!(
        matches!(read, Ok(0)) || read.is_err() && started.elapsed() < TIMEOUT * 2,
        "idle connection: {read:?} after {:?}",
        started.elapsed()
    );
    stop(tracer);
}

/// GET /metrics with `accept` (none: no header), on a fresh connection: the content type
/// and the body.
fn scrape_as(addr: SocketAddr, accept: Option<&str>) -> (String, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: test\r\n{accept}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    (
        line_after(head, "content-type: ").to_string(),
        body.to_string(),
    )
}

/// A tracer serving /metrics for a workload that makes mlock calls, so the call families have
/// samples. The shell becomes a sleep that holds none of the tracer's pipes, killed at the end
/// (by [`kill_launched`]).
fn start_with_workload() -> (Tracer, SocketAddr) {
    let script = format!(
        "{} workload syscalls --report /dev/null; exec sleep 60 >/dev/null 2>&1",
        support::BIN
    );
    let mut tracer = Tracer::spawn(&[
        "--prometheus",
        "127.0.0.1:0",
        "--follow-children",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let addr = served_addr(&tracer.wait_for_stderr("serving Prometheus metrics on http://"));
    (tracer, addr)
}

/// The default format (0.0.4), scraped until it has the call series (from the drain) and the
/// map fill (from the first fault refresh).
fn scrape_populated_text(addr: SocketAddr) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (content_type, body) = scrape_as(addr, None);
        assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
        if body.contains("memlock_trace_syscall_locked_bytes_total{")
            && body.contains("memlock_trace_map_max_entries{map=\"fault_stats\"}")
        {
            return body;
        }
        assert!(Instant::now() < deadline, "no mlock series:\n{body}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// OpenMetrics, as Prometheus asks for it; 0.0.4 when asked for explicitly.
fn scrape_openmetrics(addr: SocketAddr) -> String {
    let (content_type, openmetrics) = scrape_as(
        addr,
        Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
    );
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let (_, explicit) = scrape_as(addr, Some("text/plain;version=0.0.4"));
    assert!(!explicit.contains("# EOF"), "{explicit}");
    openmetrics
}

/// The maps' series: the fault statistics map's fill within its capacity, and one memory
/// series per map the tracer `pid` holds, together what the kernel says they take.
fn assert_map_series(text: &str, pid: i32) {
    // The fault statistics map's fill, within its capacity (as sized at load: thousands).
    let gauge = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{map=\"fault_stats\"}} ")))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} of fault_stats:\n{text}"))
    };
    let (entries, capacity) = (
        gauge("memlock_trace_map_entries"),
        gauge("memlock_trace_map_max_entries"),
    );
    assert!(
        capacity >= 1024 && entries <= capacity,
        "fault_stats: {entries} of {capacity}"
    );
    // Every map's kernel memory, named in full (the kernel keeps 15 bytes of a name).
    let memory: Vec<u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("memlock_trace_map_memory_bytes{map=\""))
        .filter_map(|l| l.split_once("\"} "))
        .map(|(map, v)| {
            assert!(map != "populate_inflig", "a cut name: {map}");
            v.parse::<u64>().unwrap()
        })
        .collect();
    assert!(
        memory.len() > 10 && memory.iter().all(|&b| b > 0),
        "map memory series: {memory:?}\n{text}"
    );
    // One series per map the tracer holds, together what the kernel says they take: two maps
    // whose names share their first 15 bytes are two series, not one overwritten.
    let maps = map_memory(pid);
    assert_eq!(
        (memory.len(), memory.iter().sum::<u64>()),
        (maps.len(), maps.iter().map(|(_, b)| b).sum::<u64>()),
        "map memory series against the tracer's fdinfo {maps:?}\n{text}"
    );
    assert!(
        text.contains("memlock_trace_map_memory_bytes{map=\"populate_inflight\"} "),
        "{text}"
    );
}

/// The tracer's resident memory, as the kernel reports it (within a few MiB: it moves).
fn assert_resident_memory(text: &str, pid: i32) {
    let rss = text
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .and_then(|v| v.parse::<f64>().ok())
        .expect("process_resident_memory_bytes");
    let kernel = status_kb(pid, "VmRSS:") as f64 * 1024.0;
    assert!(
        (rss - kernel).abs() < 8.0 * 1024.0 * 1024.0,
        "process_resident_memory_bytes {rss} vs VmRSS {kernel}"
    );
}

/// Stops the tracer, then kills the sleep its launched shell became.
fn kill_launched(tracer: Tracer) {
    let launched: i32 = tracer
        .stderr()
        .split("`sh` (pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok())
        .expect("the launched shell's pid on stderr");
    tracer.signal(libc::SIGTERM);
    let _ = tracer.finish();
    // SAFETY: kill(2) of the sleep the test started (through the tracer).
    unsafe { libc::kill(launched, libc::SIGKILL) };
}

/// The text format 0.0.4 by default and OpenMetrics when asked: 0.0.4 passes
/// `promtool check metrics` (which reads 0.0.4 only), OpenMetrics the strict parser of the
/// Prometheus project's Python client; both carry a HELP for every family, the build info,
/// the tracer's own process series and bytes, not pages.
#[test]
fn both_formats_pass_the_linters() {
    require_privileges();
    support::prometheus::require(support::prometheus::PROMTOOL);
    let (tracer, addr) = start_with_workload();
    let text = scrape_populated_text(addr);
    let openmetrics = scrape_openmetrics(addr);
    assert_linters_pass(&text, &openmetrics);
    for (format, body) in [("0.0.4", &text), ("OpenMetrics", &openmetrics)] {
        assert_families(format, body);
    }
    assert!(
        text.contains("# TYPE process_cpu_seconds_total counter"),
        "{text}"
    );
    assert_map_series(&text, tracer.pid());
    assert_resident_memory(&text, tracer.pid());
    kill_launched(tracer);
}

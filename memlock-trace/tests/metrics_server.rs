//! The `/metrics` server against clients that are slow, greedy or hostile: a flood of idle
//! connections past the tracer's descriptor limit, a 64 MiB request header, a client that
//! sends one byte a second. After each, scrapes succeed and the tracer's memory and threads
//! are what they were.

mod common;
mod support;

use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use common::require_privileges;
use support::Tracer;

/// The server's timeout for a request head (memlock-trace's `metrics::server::TIMEOUT`).
const TIMEOUT: Duration = Duration::from_secs(10);
/// Its bound on connections served at once (`metrics::server::MAX_CONNECTIONS`).
const MAX_CONNECTIONS: usize = 64;

/// A tracer that serves /metrics and traces nothing (no process has this name).
fn start() -> (Tracer, SocketAddr) {
    let mut tracer = Tracer::spawn(&["--prometheus", "127.0.0.1:0", "--comm", "no-such-process"]);
    let line = tracer.wait_for_stderr("serving Prometheus metrics on http://");
    let addr = line
        .rsplit("http://")
        .next()
        .and_then(|s| s.strip_suffix("/metrics"))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    tracer.wait_for_stderr("tracing");
    (tracer, addr)
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

/// A field of /proc/PID/status, in its own unit (kB for memory).
fn status_field(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
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
    let (tracer, addr) = start();
    let pid = tracer.pid();
    assert_scrapes(addr, "before");
    let (fds, threads) = (open_fds(pid), status_field(pid, "Threads:"));

    // 100 idle connections: the server takes MAX_CONNECTIONS, the rest wait in the backlog,
    // and no thread is started for any of them.
    let idle: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let held = open_fds(pid) - fds;
    assert_eq!(held, MAX_CONNECTIONS, "connections held by the tracer");
    assert_eq!(
        status_field(pid, "Threads:"),
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
    let (tracer, addr) = start();
    let pid = tracer.pid();
    assert_scrapes(addr, "before");
    let (rss, peak) = (status_field(pid, "VmRSS:"), status_field(pid, "VmHWM:"));

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
    let (rss_after, peak_after) = (status_field(pid, "VmRSS:"), status_field(pid, "VmHWM:"));
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

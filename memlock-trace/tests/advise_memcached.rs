//! Runs on: host only: runs memcached a second time with the preload library and perf stat, which
//! the guest's initramfs does not carry (the fault figures advise reads: test:intervals and
//! test:faults, in the guests too)
//!
//! Packages: memcached, linux-perf
//!
//! `memlock-trace advise --apply` on Debian's memcached under a load this test drives: 60,000
//! sets of 1,000 bytes fill about 64 MiB of slab pages, which memcached takes from `malloc`
//! one 1 MiB block at a time as the sets arrive. glibc maps each block itself (its internal
//! `mmap`, out of the preload library's `mmap` hook), so the advice must name the blocks by
//! their size, and `--apply` populate them as `malloc` returns them.
//!
//! Before and after come from the kernel's own counts for the server, not only the tracer's:
//! `/proc/PID/stat` (every fault, the ones populated inside `madvise` too: the total stays)
//! and `perf stat -e page-faults` (the faults the program's code took: those go), both over
//! the load phase alone.
//!
//! `cargo xtask test` installs Debian's memcached and linux-perf when missing and builds the
//! preload library next to the tracer.

mod common;
mod support;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::TcpStream,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use common::require_privileges;
use support::{advise_apply, assert_contains, prometheus::free_port};

const MEMCACHED: &str = "/usr/bin/memcached";
const PERF: &str = "/usr/bin/perf";
const SETS: usize = 60_000;
const VALUE_BYTES: usize = 1_000;
/// memcached's slab page (its default `-I 1m`): the block it asks `malloc` for.
const SLAB_PAGE: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// One run's load phase as the kernel counted it for the server.
#[derive(Debug)]
struct LoadPhase {
    pid: u32,
    /// minflt + majflt from /proc/PID/stat, after less before.
    stat_faults: u64,
    /// `perf stat -e page-faults -p PID` over the phase.
    perf_faults: u64,
    items: u64,
}

/// Sends `stats` and reads its lines until END: name and value (an error: the server went
/// away meanwhile).
fn stats(conn: &mut BufReader<TcpStream>) -> std::io::Result<Vec<(String, String)>> {
    conn.get_mut().write_all(b"stats\r\n")?;
    let mut out = Vec::new();
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end();
        if line == "END" {
            return Ok(out);
        }
        let mut words = line.splitn(3, ' ');
        if let (Some("STAT"), Some(k), Some(v)) = (words.next(), words.next(), words.next()) {
            out.push((k.to_string(), v.to_string()));
        }
    }
}

fn stat(stats: &[(String, String)], key: &str) -> u64 {
    stats
        .iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in memcached's stats: {stats:?}"))
}

fn own_faults(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    // minflt and majflt: fields 10 and 12 of proc(5), 8 and 10 after the name.
    fields[7].parse::<u64>().unwrap() + fields[9].parse::<u64>().unwrap()
}

/// Stops the server when dropped, so that a failed load does not leave `advise` waiting.
struct Server(u32);

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the server this test drives; ESRCH if it is gone already.
        unsafe { libc::kill(self.0 as i32, libc::SIGTERM) };
    }
}

/// Waits for a server on `port` other than the one of the run before (`previous`: it may
/// still be listening as it shuts down), fills it, reads the kernel's counts around the
/// load, and stops it.
fn load_once(port: u16, previous: Option<u32>) -> LoadPhase {
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut conn, pid) = loop {
        assert!(
            Instant::now() < deadline,
            "no new memcached answered on {port} within 60 s"
        );
        let Ok(stream) = TcpStream::connect(("127.0.0.1", port)) else {
            thread::sleep(Duration::from_millis(20));
            continue;
        };
        let mut conn = BufReader::new(stream);
        match stats(&mut conn) {
            Ok(s) if Some(stat(&s, "pid") as u32) != previous => {
                break (conn, stat(&s, "pid") as u32);
            }
            _ => thread::sleep(Duration::from_millis(20)),
        }
    };
    let _server = Server(pid);
    let perf = Command::new(PERF)
        .args(["stat", "-x,", "-e", "page-faults", "-p", &pid.to_string()])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // perf prints nothing until it stops: give it time to open its counters.
    thread::sleep(Duration::from_millis(500));
    let before = own_faults(pid);
    let value = vec![b'x'; VALUE_BYTES];
    let mut batch = Vec::new();
    for i in 0..SETS {
        batch.extend_from_slice(format!("set k{i} 0 0 {VALUE_BYTES} noreply\r\n").as_bytes());
        batch.extend_from_slice(&value);
        batch.extend_from_slice(b"\r\n");
        if batch.len() > 64 << 10 {
            conn.get_mut().write_all(&batch).unwrap();
            batch.clear();
        }
    }
    conn.get_mut().write_all(&batch).unwrap();
    // Answered after every set before it.
    let items = stat(&stats(&mut conn).unwrap(), "curr_items");
    let stat_faults = own_faults(pid) - before;
    // SAFETY: kill(2) on the perf this test started.
    unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
    let out = perf.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    let perf_faults = text
        .lines()
        .find(|l| l.contains("page-faults"))
        .and_then(|l| l.split(',').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no page-faults count from perf stat: {text}"));
    LoadPhase {
        pid,
        stat_faults,
        perf_faults,
        items,
    }
}

#[test]
fn memcached_slabs_malloc_made_are_populated_as_malloc_returns_them() {
    require_privileges();
    for program in [MEMCACHED, PERF] {
        assert!(
            Path::new(program).is_file(),
            "{program} is missing: `cargo xtask test` installs Debian's memcached and \
             linux-perf packages (or: apt-get install memcached linux-perf)"
        );
    }
    let port = free_port();
    let driver = thread::spawn(move || {
        let first = load_once(port, None);
        [load_once(port, Some(first.pid)), first]
    });
    let port_arg = port.to_string();
    let report = advise_apply(&[
        MEMCACHED,
        "-U",
        "0",
        "-l",
        "127.0.0.1",
        "-m",
        "256",
        "-t",
        "2",
        "-u",
        "nobody",
        "-p",
        &port_arg,
    ]);
    let [after, before] = driver.join().expect("the load driver failed");
    eprintln!("load phase, before: {before:?}; after: {after:?}");
    assert_eq!(
        report["process"]["pid"], before.pid,
        "{}",
        report["process"]
    );
    for run in [&before, &after] {
        assert_eq!(run.items, SETS as u64, "{run:?}");
    }
    // The slabs: each set's item (key, header, value) in 1 MiB pages.
    let slab_pages = (SETS * VALUE_BYTES) as u64 / PAGE;
    let slab_rule = format!("alloc:{SLAB_PAGE}");
    let slabs = report["advice"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| {
            a["verdict"] == "do"
                && a["apply"]["preload"]
                    .as_str()
                    .is_some_and(|r| r.contains(&slab_rule))
        })
        .unwrap_or_else(|| panic!("no advice names malloc's {SLAB_PAGE}-byte blocks: {report}"));
    assert!(
        matches!(slabs["kind"].as_str(), Some("lock" | "populate")),
        "{slabs}"
    );
    assert_contains(&slabs["how"], "malloc blocks of 1 MiB", slabs);
    let apply = &report["apply"];
    let populated = apply["preload_log"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| {
            let l = l.as_str().unwrap();
            l.contains(" alloc ") && l.ends_with(&format!(" {} ok", SLAB_PAGE + PAGE))
        })
        .count() as u64;
    assert!(
        populated * SLAB_PAGE >= SETS as u64 * VALUE_BYTES as u64,
        "{populated} slab blocks populated for {SETS} items of {VALUE_BYTES} bytes: {apply}"
    );
    // The kernel's counts for the server over the load phase. Before: the program's code
    // took a fault per slab page.
    assert!(
        before.perf_faults >= slab_pages && before.stat_faults >= slab_pages,
        "before: {before:?} for {slab_pages} pages of values"
    );
    // After: its code took almost none (perf counts only faults the program took) ...
    assert!(
        after.perf_faults * 20 <= before.perf_faults,
        "after: perf counted {} faults in the load phase against {} before",
        after.perf_faults,
        before.perf_faults
    );
    // ... while /proc/PID/stat, which also counts the pages madvise populated, stays: the
    // faults moved into malloc's call, they did not go.
    assert!(
        after.stat_faults * 10 >= before.stat_faults * 9,
        "after: /proc/PID/stat counted {} faults in the load phase against {} before",
        after.stat_faults,
        before.stat_faults
    );
    let (b, a) = (
        &apply["before"]["after_startup"],
        &apply["after"]["after_startup"],
    );
    assert!(
        a["user"].as_u64().unwrap() * 20 <= b["user"].as_u64().unwrap(),
        "the tracer's faults taken by the program's code after start-up: {b} -> {a}"
    );
    assert!(
        a["populated"].as_u64().unwrap() >= slab_pages,
        "the tracer's populated pages after start-up: {a}"
    );
    assert_eq!(apply["helped"], true, "{apply}");
}

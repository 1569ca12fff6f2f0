//! Helpers for the production-use tests: running the CLI in the background, reading its
//! stderr as it comes, and listing the eBPF objects a process holds.

#![allow(dead_code, reason = "each test binary uses a different subset")]

pub mod exposition;
pub mod faults_workload;
pub mod memory_cgroup;
pub mod prometheus;
pub mod stacks;

use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader, Read as _},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_memlock-trace");

pub fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

/// The last `"summary"` line.
pub fn summary(stdout: &str) -> Value {
    json_lines(stdout)
        .into_iter()
        .rev()
        .find(|l| l["type"] == "summary")
        .unwrap_or_else(|| panic!("no summary line in:\n{stdout}"))
}

/// memlock-trace running in the background.
pub struct Tracer {
    pub child: Child,
    stderr: Arc<Mutex<String>>,
    stdout: Option<std::thread::JoinHandle<String>>,
}

pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Tracer {
    pub fn spawn(args: &[&str]) -> Self {
        Self::spawn_command(Command::new(BIN).args(args))
    }

    pub fn spawn_command(cmd: &mut Command) -> Self {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start memlock-trace");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let err = child.stderr.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let mut out = child.stdout.take().expect("piped");
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        Self {
            child,
            stderr,
            stdout: Some(stdout),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until stderr contains `needle` (the tracer prints "tracing ..." once attached).
    ///
    /// A hang guard, not a target: a debug build parsing the kernel's BTF and attaching a
    /// dozen trampolines in a software-emulated guest, beside other guests on a loaded 2-core
    /// machine, took over 30 s to start on 6.12.
    pub fn wait_for_stderr(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let err = self.stderr();
            if let Some(line) = err.lines().find(|l| l.contains(needle)) {
                return line.to_string();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("memlock-trace exited ({status}) before printing {needle:?}:\n{err}");
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} on stderr within 120 s:\n{err}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: plain kill(2) on our own child.
        assert_eq!(
            unsafe { libc::kill(self.pid(), signal) },
            0,
            "kill({}, {signal})",
            self.pid()
        );
    }

    /// Waits (at most 120 s) for the tracer to exit: a guard against a hang, not a measure
    /// of promptness (test:promptness asserts that). As the start's bound: an emulated guest
    /// beside four other stages once took past 60 s to write test:memory_limit's summary of
    /// 2,000 exited processes.
    pub fn finish(mut self) -> Finished {
        let deadline = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "memlock-trace did not exit within 120 s:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let stdout = self
            .stdout
            .take()
            .expect("once")
            .join()
            .expect("stdout reader");
        // Let the stderr reader see EOF.
        std::thread::sleep(Duration::from_millis(50));
        Finished {
            status,
            stdout,
            stderr: self.stderr(),
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The ids of the eBPF programs, maps and links a process holds file descriptors to,
/// from `/proc/PID/fdinfo` (`prog_id:`, `map_id:`, `link_id:` lines).
#[derive(Debug, Default, Clone)]
pub struct BpfIds {
    pub programs: BTreeSet<u32>,
    pub maps: BTreeSet<u32>,
    pub links: BTreeSet<u32>,
}

pub fn bpf_ids(pid: i32) -> BpfIds {
    let mut ids = BpfIds::default();
    for info in fdinfos(pid) {
        let id = |key: &str| fdinfo_field(&info, key).and_then(|v| u32::try_from(v).ok());
        if let Some(link) = id("link_id:") {
            // A link's fdinfo also names its program, which the program's own fd covers.
            ids.links.insert(link);
        } else if let Some(program) = id("prog_id:") {
            ids.programs.insert(program);
        }
        if let Some(map) = id("map_id:") {
            ids.maps.insert(map);
        }
    }
    ids
}

/// The fdinfo text of each file descriptor process `pid` holds (`/proc/PID/fdinfo`).
pub fn fdinfos(pid: i32) -> Vec<String> {
    let dir = format!("/proc/{pid}/fdinfo");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .filter_map(|entry| std::fs::read_to_string(entry.ok()?.path()).ok())
        .collect()
}

/// The number after `key` (`map_id:`, `memlock:`, `run_cnt:`...) in one fd's fdinfo text.
pub fn fdinfo_field(info: &str, key: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
}

/// Which of `ids` still exist in the kernel (by walking every loaded program, map and link).
pub fn still_loaded(ids: &BpfIds) -> BpfIds {
    let programs = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .filter(|id| ids.programs.contains(id))
        .collect();
    let maps = aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .map(|m| m.id())
        .filter(|id| ids.maps.contains(id))
        .collect();
    let links = aya::programs::loaded_links()
        .filter_map(Result::ok)
        .map(|l| l.id())
        .filter(|id| ids.links.contains(id))
        .collect();
    BpfIds {
        programs,
        maps,
        links,
    }
}

impl BpfIds {
    pub fn is_empty(&self) -> bool {
        self.programs.is_empty() && self.maps.is_empty() && self.links.is_empty()
    }
}

/// Polls until none of `ids` is loaded; the kernel frees programs and maps after an RCU
/// grace period, so "gone" may take a moment. Returns how long it took.
pub fn wait_all_unloaded(ids: &BpfIds) -> Duration {
    let start = Instant::now();
    loop {
        let left = still_loaded(ids);
        if left.is_empty() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still in the kernel 10 s after the tracer exited: {left:?} (of {ids:?})"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How many mlock-family calls of `syscall` the summary counts for `pid` (all its entries).
pub fn calls_of(summary: &Value, pid: u32, syscall: &str) -> u64 {
    summary["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["pid"] == pid)
        .map(|p| p["syscalls"][syscall]["count"].as_u64().unwrap_or(0))
        .sum()
}

/// The processes of a summary that made traced system calls (page faults add processes
/// that made none, such as a parent that only forks).
pub fn with_syscalls(summary: &Value) -> Vec<&Value> {
    summary["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["syscalls"].as_object().is_some_and(|m| !m.is_empty()))
        .collect()
}

/// A scratch directory of this test process, `memlock-trace-NAME-PID` in the temporary
/// directory (the pid keeps concurrent test binaries apart).
pub fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("memlock-trace-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A raw libc call's return code as a `Result` (0 is success, else `errno`), for the
/// `pre_exec` closures that drop privileges, where only such calls may run.
pub fn os_result(rc: libc::c_int) -> std::io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `memlock-trace workload NAME --report REPORT`: a bundled workload as the command to
/// trace, writing what it did (its own count of calls and faults) to REPORT.
pub fn workload<'a>(name: &'a str, report: &'a str) -> [&'a str; 5] {
    [BIN, "workload", name, "--report", report]
}

/// The arguments of `memlock-trace workload flood`: `threads` threads making `calls`
/// failing mlock calls each, then `extra` (`--munlock`, `--wait-stdin`, `--report PATH`).
pub fn flood_args(threads: u64, calls: u64, extra: &[&str]) -> Vec<String> {
    let counts = [threads, calls].map(|n| n.to_string());
    [
        "workload",
        "flood",
        "--threads",
        &counts[0],
        "--calls",
        &counts[1],
    ]
    .iter()
    .chain(extra)
    .map(|a| a.to_string())
    .collect()
}

/// `memlock-trace workload flood` started with [`flood_args`] `--wait-stdin`: its threads
/// wait at the start line until a byte arrives on its (piped) stdin; its report is dropped.
pub fn waiting_flood(threads: u64, calls: u64) -> Child {
    Command::new(BIN)
        .args(flood_args(threads, calls, &["--wait-stdin"]))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start the flood")
}

/// The thread ids of process `pid` once it has at least `n` threads (the main one too):
/// threads a process starts appear in `/proc/PID/task` a moment later.
pub fn threads_of(pid: u32, n: usize) -> Vec<u32> {
    let task = format!("/proc/{pid}/task");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let tids: Vec<u32> = std::fs::read_dir(&task)
            .unwrap_or_else(|e| panic!("{task}: {e}"))
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        if tids.len() >= n {
            return tids;
        }
        assert!(Instant::now() < deadline, "{pid}'s threads: {tids:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The pids of the children `memlock-trace workload children --report REPORT` started, in
/// order, from its report (which is then removed).
pub fn workload_children(report: &std::path::Path) -> Vec<u32> {
    let r: Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    std::fs::remove_file(report).ok();
    r["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap() as u32)
        .collect()
}

/// Asserts that the finished command `what` succeeded, its status, stdout and stderr in the
/// message; returns its stdout.
pub fn succeeded(what: &str, out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs `memlock-trace ARGS` to completion; it must succeed (its stderr is in the message).
pub fn run(args: &[&str]) -> std::process::Output {
    let out = Command::new(BIN)
        .args(args)
        .output()
        .expect("memlock-trace");
    succeeded(&format!("memlock-trace {args:?}"), &out);
    out
}

/// Runs `cmd` (`memlock-trace suite ... --out OUT_DIR`) to completion; it must succeed.
/// Returns the report it wrote, `OUT_DIR/report.json`.
pub fn suite_report(cmd: &mut Command, out_dir: &std::path::Path) -> Value {
    let out = cmd.output().expect("run memlock-trace suite");
    succeeded("suite", &out);
    serde_json::from_str(&std::fs::read_to_string(out_dir.join("report.json")).unwrap()).unwrap()
}

/// The cgroup2 mount: the unified hierarchy, also on hybrid hosts.
pub fn cgroup2_mount() -> std::path::PathBuf {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            if right.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            left.split_whitespace().nth(4).map(std::path::PathBuf::from)
        })
        .expect("this test needs a cgroup2 mount (cgroup v2, or the unified hierarchy)")
}

/// `read()` once it has stopped changing (two reads 200 ms apart agree, or 5 s gone): a
/// figure of another process read after it has gone quiet, not while it finishes what it
/// was doing (a connection being closed, a line written before the next read).
pub fn settled<T: PartialEq>(read: impl Fn() -> T) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut value = read();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = read();
        if now == value || std::time::Instant::now() > deadline {
            return now;
        }
        value = now;
    }
}

/// Runs `advise --apply --json -- COMMAND` and returns its report.
pub fn advise_apply(command: &[&str]) -> Value {
    advise_json(&["--apply"], command)
}

/// Runs `advise OPTIONS --json -- COMMAND`, asserts it succeeded, and returns its report.
pub fn advise_json(options: &[&str], command: &[&str]) -> Value {
    let out = Command::new(BIN)
        .arg("advise")
        .args(options)
        .args(["--json", "--"])
        .args(command)
        .output()
        .unwrap();
    let stdout = succeeded("advise", &out);
    let line = stdout
        .lines()
        .find(|l| l.contains("\"type\":\"advise\""))
        .unwrap_or_else(|| panic!("no advise line in: {stdout}"));
    serde_json::from_str(line).unwrap()
}

/// dist/'s systemd unit, which the DaemonSet and the limits tests keep in step with: built
/// into the test binaries, which the guests run without the source tree.
pub const UNIT: &str = include_str!("../../../dist/memlock-trace.service");

/// The value of each of the unit's `key=` lines, in order.
pub fn unit_values(key: &str) -> Vec<String> {
    let values: Vec<String> = UNIT
        .lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
        .collect();
    assert!(
        !values.is_empty(),
        "no {key}= in dist/memlock-trace.service"
    );
    values
}

/// A figure of `/proc/PID/status` in kB, such as `VmRSS:` or `RssAnon:`.
pub fn status_kb(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// The BPF maps process `pid` holds, from its fds' fdinfo: each map once (however many fds
/// refer to it) as (name, `memlock:` bytes, what the kernel charges for it), largest first.
/// Names are the kernel's, cut to 15 bytes.
pub fn map_memory(pid: i32) -> Vec<(String, u64)> {
    let mut bytes = std::collections::BTreeMap::new();
    for info in fdinfos(pid) {
        let field = |key: &str| fdinfo_field(&info, key);
        if let (Some(id), Some(memlock)) = (field("map_id:"), field("memlock:")) {
            bytes.insert(id as u32, memlock);
        }
    }
    let mut maps: Vec<(String, u64)> = aya::maps::loaded_maps()
        .filter_map(Result::ok)
        .filter_map(|m| {
            let memlock = *bytes.get(&m.id())?;
            Some((m.name_as_str().unwrap_or("?").to_string(), memlock))
        })
        .collect();
    maps.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    maps
}

/// Debian's python3, which the advise tests run: missing, the test fails saying how to get it.
pub const PYTHON: &str = "/usr/bin/python3";

pub fn require_python() {
    assert!(
        std::path::Path::new(PYTHON).is_file(),
        "{PYTHON} is missing (`cargo xtask test` installs Debian's python3 package, or: \
         apt-get install python3)"
    );
}

/// advise --apply's preload library, beside the tracer: missing, the test fails naming it.
pub fn require_preload() {
    let preload = std::path::Path::new(BIN).with_file_name("libmemlock_preload.so");
    assert!(
        preload.is_file(),
        "{} is missing: `cargo xtask test` builds it (or: cargo build -p memlock-preload)",
        preload.display()
    );
}

/// A new directory `memlock-trace-NAME-PID` in the temporary directory, with `mode`.
pub fn scratch_dir(name: &str, mode: u32) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = std::env::temp_dir().join(format!("memlock-trace-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    dir
}

/// The header of the syscall table in a text summary; its page columns name their unit.
pub fn syscall_table_header(text: &str) -> &str {
    let header = text
        .lines()
        .find(|l| l.trim_start().starts_with("syscall "))
        .unwrap_or_else(|| panic!("no syscall table:\n{text}"));
    assert!(
        header.contains("populated pages") && header.contains("locked pages"),
        "{header:?}"
    );
    header
}

//! Runs on: host, 5.10, 6.1: the fault family's output on top of its hooks (their counts against
//! getrusage on 5.10 and 6.12: test:faults), with --stacks on 5.10's raw syscall dispatchers and
//! 6.1's trampolines, which 6.12 shares
//!
//! Page faults through the `memlock-trace` binary: the JSON summary's `faults` object and
//! `fault_hooks`, sampled `--events`, the text summary, and a traced pid that exits mid-run;
//! `--stacks` in `fault_cli/stacks.rs`.

mod common;
#[path = "fault_cli/events.rs"]
mod events;
#[path = "fault_cli/stacks.rs"]
mod stacks;
mod support;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Command, Stdio},
    time::Duration,
};

use common::require_privileges;
use serde_json::Value;
use support::{faults_workload, process_of};

const BIN: &str = env!("CARGO_BIN_EXE_memlock-trace");

/// The tracer's JSON lines (the launched workload shares its stdout: skip its answers).
fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

/// Runs `memlock-trace ARGS -- memlock-trace workload faults` with `commands` on its stdin,
/// one at a time: each is sent once the previous one was answered (the workload answers on
/// the stdout it shares with the tracer), so none runs before the tracer is ready, however
/// slow the machine. `sleep` is not a workload command: it keeps the workload alive 300 ms.
/// The tracer loads its programs: the test needs the privileges to.
fn traced_workload(args: &[&str], commands: &str) -> std::process::Output {
    require_privileges();
    let mut child = faults_workload::spawn_traced(Command::new(BIN).args(args));
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("tracer stdout");
            let _ = lines_tx.send(line.clone());
            all.extend_from_slice(line.as_bytes());
            all.push(b'\n');
        }
        all
    });
    // On a timeout or an early end, the tracer's stderr says why: kill it and show it.
    let wait_for = |child: &mut std::process::Child, prefix: &str| loop {
        let line = match lines_rx.recv_timeout(Duration::from_secs(300)) {
            Ok(line) => line,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let mut stderr = String::new();
                let _ =
                    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr);
                panic!("no `{prefix}` from the workload ({e}); tracer stderr:\n{stderr}");
            }
        };
        assert!(!line.starts_with("error"), "{line}");
        if line.starts_with(prefix) {
            break;
        }
    };
    wait_for(&mut child, "ready");
    let mut stdin = child.stdin.take().unwrap();
    for line in commands.lines() {
        if line == "sleep" {
            std::thread::sleep(Duration::from_millis(300));
            continue;
        }
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        if line != "exit" {
            wait_for(&mut child, "ok ");
        }
    }
    drop(stdin);
    let status = child.wait().expect("memlock-trace");
    let mut stderr = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr);
    assert!(status.success(), "exit {status:?}\nstderr: {stderr}");
    std::process::Output {
        status,
        stdout: reader.join().unwrap(),
        stderr: stderr.into_bytes(),
    }
}

#[test]
fn json_summary_has_faults_and_sampled_events() {
    let out = traced_workload(
        &["--json", "--events", "--sample", "10"],
        // The workload lives on after onfault (sleep), so its mappings are read meanwhile.
        "touch 2000\nmlock 300\nonfault 100\nsleep\nsleep\nsleep\nsleep\nsleep\nexit",
    );
    let lines = json_lines(&out.stdout);
    let summary = lines.last().expect("a summary line");
    assert_eq!(summary["type"], "summary");

    let hooks = &summary["fault_hooks"];
    assert!(
        ["fentry", "kprobe", "tracepoint"].contains(&hooks["hook_set"].as_str().unwrap()),
        "{hooks}"
    );
    assert!(!hooks["hooks"].as_array().unwrap().is_empty());

    let processes = summary["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "only the launched command");
    let f = &processes[0]["faults"];
    let n = |key: &str| {
        f[key]
            .as_u64()
            .unwrap_or_else(|| panic!("faults.{key}: {f}"))
    };
    // The workload's own steps, plus its start-up: at least these.
    assert!(n("user") >= 2000, "{f}");
    assert!(n("populated") >= 300, "{f}");
    assert!(f["populated_by"]["mlock"].as_u64().unwrap() >= 300, "{f}");
    assert_eq!(n("minor") + n("major"), n("user") + n("populated"), "{f}");
    for key in ["retried", "failed", "in_locked_vma"] {
        assert!(
            f.get(key).is_some(),
            "faults.{key} present (null when unobservable): {f}"
        );
    }
    let minor = &f["latency_ns"]["minor"];
    assert!(minor["count"].as_u64().unwrap() >= 2000, "{minor}");
    let p = |k: &str| minor[k].as_u64().unwrap();
    assert!(
        0 < p("p50") && p("p50") <= p("p90") && p("p90") <= p("p99"),
        "{minor}"
    );
    assert!(p("p99") <= p("p99_9") && p("p99_9") <= p("max"), "{minor}");
    let by_mapping = f["by_mapping"].as_array().unwrap();
    for m in by_mapping {
        assert!(
            m["mapping"].is_string() && m["faults"].as_u64().unwrap() > 0,
            "{m}"
        );
    }
    // The lock-on-fault region is still mapped: attributed, and locked.
    assert!(
        by_mapping.iter().any(|m| m["mapping"] == "anonymous"
            && m["faults"].as_u64().unwrap() >= 100
            && m["locked"] == true),
        "{f}"
    );

    // --sample 10: about one fault in ten streamed, never more than the faults counted.
    let events: Vec<&Value> = lines.iter().filter(|l| l["type"] == "fault").collect();
    let streamed: u64 = events.iter().map(|e| e["pages"].as_u64().unwrap()).sum();
    let total = n("minor") + n("major");
    assert!(!events.is_empty());
    assert!(streamed <= total, "{streamed} streamed of {total}");
    let health = &summary["fault_health"];
    assert_eq!(health["events_dropped"], 0, "{health}");
    assert_eq!(health["stats_evicted"], 0, "{health}");
    for e in &events {
        assert!(
            ["minor", "major", "failed"].contains(&e["kind"].as_str().unwrap()),
            "{e}"
        );
        assert!(e["address"].as_str().unwrap().starts_with("0x"), "{e}");
    }
}

#[test]
fn text_summary_names_the_hooks_and_the_faults() {
    let out = traced_workload(&["--per-thread"], "touch 500\nexit");
    let text = String::from_utf8_lossy(&out.stdout);
    // The hook set is named once, on stderr at start, not in every summary.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("memlock-trace: faults: "), "{stderr}");
    assert!(!text.contains("page faults traced with"), "{text}");
    assert!(text.contains("page faults:"), "{text}");
    assert!(text.contains("latency"), "{text}");
    assert!(
        text.contains("thread "),
        "--per-thread lists threads: {text}"
    );
}

/// `--hist`: per process and per thread, a log2 histogram per fault class whose rows add up
/// to the faults the class's latency row counts (the same kernel buckets).
#[test]
fn fault_hist_counts_each_class() {
    let out = traced_workload(
        &["--hist", "--per-thread", "--fault-hooks", "tracepoint"],
        "touch 500\nmlock 64\nexit",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // `latency  faults p50 ...` rows: class -> faults timed, in order (process, then thread).
    let mut timed: Vec<(String, u64)> = Vec::new();
    let mut hist: Vec<(String, u64)> = Vec::new();
    let mut in_latency = false;
    let mut current: Option<String> = None;
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first() == Some(&"latency") && fields.get(1) == Some(&"faults") {
            in_latency = true;
            continue;
        }
        if in_latency && fields.len() == 7 && fields[1].parse::<u64>().is_ok() {
            timed.push((fields[0].to_string(), fields[1].parse().unwrap()));
            continue;
        }
        in_latency = false;
        if line.trim_end().ends_with(" fault latency") {
            current = Some(fields[0].to_string());
            hist.push((fields[0].to_string(), 0));
            continue;
        }
        if let (Some(_), Some((_, rest))) = (&current, line.split_once(" : "))
            && line.contains(" -> ")
        {
            hist.last_mut().unwrap().1 += rest
                .split_whitespace()
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap();
            continue;
        }
        if !line.contains("usecs") {
            current = None;
        }
    }
    assert!(!timed.is_empty(), "{text}");
    assert_eq!(
        hist, timed,
        "a histogram per class, counting its faults:\n{text}"
    );
    // The process's row, then the thread's: the 500 pages touched are timed in both.
    let minor: Vec<u64> = timed
        .iter()
        .filter(|(c, _)| c == "minor")
        .map(|(_, n)| *n)
        .collect();
    assert_eq!(minor.len(), 2, "{text}");
    assert!(minor[0] >= 500 && minor[0] == minor[1], "{minor:?}");
    assert!(text.contains("  thread "), "{text}");
}

/// On the tracepoint set the latency rows count the timed faults only, and say so where the
/// header counts more (the pages mlock populated are not timed there); the `user` row, minor
/// and major together when nothing populated was timed, is not repeated as a row or a third
/// histogram (issue 47 point 7).
#[test]
fn latency_rows_say_what_they_count_and_user_is_not_repeated() {
    let out = traced_workload(
        &["--hist", "--fault-hooks", "tracepoint"],
        "touch 500\nmlock 64\nexit",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("(latency rows count timed faults only: "),
        "no note for the untimed populated faults:\n{text}"
    );
    assert!(
        text.contains(" populated by the kernel are counted, not timed: the clock starts at the page-fault exception"),
        "{text}"
    );
    let user_rows = text
        .lines()
        .filter(|l| l.trim_start().starts_with("user ") && !l.contains("page faults"))
        .count();
    assert_eq!(user_rows, 0, "a user row repeating minor + major:\n{text}");
    assert!(!text.contains("user fault latency"), "{text}");
    assert!(text.contains("minor fault latency"), "{text}");
}

/// `-p PID` of a process that exits mid-run: the tracer stops with it and still reports
/// the faults it took up to its exit.
#[test]
fn traced_pid_that_exits_is_summarised_up_to_its_exit() {
    require_privileges();
    let mut workload = faults_workload::spawn();
    let pid = workload.id();
    let mut answers = BufReader::new(workload.stdout.take().unwrap());
    let mut line = String::new();
    answers.read_line(&mut line).unwrap();
    let mut tracer = Command::new(BIN)
        .args(["--json", "-p", &pid.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tracer");
    // Wait until it is attached.
    let mut stderr = BufReader::new(tracer.stderr.take().unwrap());
    loop {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "tracer exited early"
        );
        if line.contains("tracing pid") {
            break;
        }
    }
    let mut stdin = workload.stdin.take().unwrap();
    stdin.write_all(b"touch 700\n").unwrap();
    line.clear();
    answers.read_line(&mut line).unwrap();
    assert!(line.starts_with("ok "), "{line}");
    stdin.write_all(b"exit\n").unwrap();
    workload.wait().unwrap();

    let out = tracer.wait_with_output().expect("tracer output");
    assert!(out.status.success(), "{:?}", out.status);
    let lines = json_lines(&out.stdout);
    let summary = lines.last().unwrap();
    let process = process_of(summary, pid);
    assert!(
        process["faults"]["user"].as_u64().unwrap() >= 700,
        "{process}"
    );
}

/// The tracer's stderr for `args` on `true`, which the kernel's refusal of the hooks must
/// stop at start with the tracer's own exit code.
fn refused_at_start(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .args(["--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    stderr
}

/// `--latency-sample 8` on the tracepoint set: the counts come from the completion events
/// themselves (exact), one fault in 8 of each event is timed (a start not seen counts as
/// unmatched instead), and the JSON and text say it is sampled and how many were timed.
#[test]
fn sampled_latency_is_said_and_times_one_fault_in_n() {
    require_privileges();
    let args = ["--latency-sample", "8", "--fault-hooks", "tracepoint"];
    let btf = memlock_trace::probe::KernelBtf::load().expect("kernel BTF");
    if btf
        .field_offset("perf_event_attr", "inherit_thread")
        .is_err()
    {
        // Before 5.13 (Debian 11's 5.10) the tracepoint set cannot sample: the tracer says
        // why at start, and `probe` names the field the kernel lacks.
        let need = memlock_trace::faults::plan::SAMPLING_NEEDS_INHERIT_THREAD;
        let stderr = refused_at_start(&args);
        assert!(
            stderr.contains(&format!(
                "--fault-hooks tracepoint: the kernel refused it: {need}"
            )),
            "{stderr}"
        );
        let probe = Command::new(BIN).arg("probe").output().unwrap();
        let text = String::from_utf8_lossy(&probe.stdout);
        let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            words.contains(&format!("tracepoint set here: {need}")),
            "{text}"
        );
        return;
    }
    let out = traced_workload(&[&args[..], &["--json"]].concat(), "touch 4000\nexit");
    let lines = json_lines(&out.stdout);
    let summary = lines.last().expect("a summary line");
    let hooks = &summary["fault_hooks"];
    assert_eq!(hooks["latency_sample"], 8, "{hooks}");
    assert!(
        hooks["hooks"].as_array().unwrap().iter().any(|h| h
            .as_str()
            .unwrap()
            .contains("on each target thread (period 8)")),
        "{hooks}"
    );
    let f = &summary["processes"][0]["faults"];
    let user = f["user"].as_u64().unwrap();
    assert!(user >= 4000, "{f}");
    let timed = f["latency_sample"]["timed"].as_u64().unwrap();
    assert_eq!(f["latency_sample"]["every"], 8, "{f}");
    assert_eq!(
        timed,
        f["latency_ns"]["user"]["count"].as_u64().unwrap(),
        "{f}"
    );
    // Each of the two events (minor, major) samples floor(its count / 8) faults.
    let sampled = timed + f["latency_unmatched"].as_u64().unwrap();
    assert!(
        sampled + 1 >= user / 8 && sampled <= user / 8,
        "{sampled} sampled of {user}: {f}"
    );
    assert!(timed >= 4000 / 8 - 2, "{f}");

    let out = traced_workload(&args, "touch 500\nexit");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("latency sampled (1 in 8 faults timed: "),
        "{text}"
    );
}

/// `--latency-sample 8` on fentry/kprobe, the sets production kernels allow: the programs
/// see and count every fault and read the clock for one in 8 of each thread's faults,
/// populated ones included, with `--per-thread` too (which the tracepoint set refuses); the
/// JSON and text say so. On a kernel that allows neither (the host here), forcing fentry
/// must fail with the kernel's reason: the guests run the sampling itself.
#[test]
fn sampled_latency_on_fentry_or_kprobe_counts_every_fault_and_times_one_in_n() {
    require_privileges();
    let caps = memlock_trace::probe::capabilities().expect("probing the kernel's capabilities");
    let usable = |name: &str| caps.iter().any(|c| c.name == name && c.usable);
    let Some(set) = ["fentry", "kprobe"].into_iter().find(|s| usable(s)) else {
        let stderr = refused_at_start(&["--latency-sample", "8", "--fault-hooks", "fentry"]);
        assert!(
            stderr.contains("--fault-hooks fentry: the kernel refused it"),
            "{stderr}"
        );
        eprintln!(
            "\n*** kernel {} allows neither fentry nor kprobes (probe): their sampling is \
             tested in the qemu guests\n",
            memlock_trace::probe::kernel_release()
        );
        return;
    };
    let args = [
        "--latency-sample",
        "8",
        "--fault-hooks",
        set,
        "--per-thread",
        "--json",
    ];
    let out = traced_workload(&args, "touch 4000\nmlock 400\nexit");
    let lines = json_lines(&out.stdout);
    let summary = lines.last().expect("a summary line");
    let hooks = &summary["fault_hooks"];
    assert_eq!(hooks["hook_set"], set, "{hooks}");
    assert_eq!(hooks["latency_sample"], 8, "{hooks}");
    let process = &summary["processes"][0];
    let f = &process["faults"];
    let (user, populated) = (
        f["user"].as_u64().unwrap(),
        f["populated"].as_u64().unwrap(),
    );
    assert!(user >= 4000 && populated >= 400, "{f}");
    let count = |class: &str| f["latency_ns"][class]["count"].as_u64().unwrap_or(0);
    let timed = f["latency_sample"]["timed"].as_u64().unwrap();
    assert_eq!(f["latency_sample"]["every"], 8, "{f}");
    assert_eq!(timed, count("minor") + count("major"), "{f}");
    assert_eq!(timed, count("user") + count("populated"), "{f}");
    // One thread, one countdown through all its faults: every 8th of them, whatever the
    // countdown's random first phase; none lost.
    let faults = user + populated;
    assert!(
        (faults / 8..=faults.div_ceil(8)).contains(&timed),
        "{timed} timed of {faults}: {f}"
    );
    assert!(count("populated") >= 400 / 8 - 1, "{f}");
    assert_eq!(f["latency_unmatched"], 0, "{f}");
    let threads = f["threads"].as_array().expect("per-thread statistics");
    assert_eq!(threads.len(), 1, "{f}");
    assert_eq!(threads[0]["latency_sample"]["timed"], timed, "{f}");

    let out = traced_workload(&args[..4], "touch 500\nexit");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("latency sampled (1 in 8 faults timed: "),
        "{text}"
    );
}

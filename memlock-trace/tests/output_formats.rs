//! Runs on: host only: output formats (--hist rows, units, -T, -o, -q/-v, man page, completions);
//! the counts behind them: test:syscalls, test:intervals, test:fault_cli, in the guests too
//!
//! What users of libbpf-tools and bpftrace expect (issue 15): `--hist`, one unit per column
//! and `-m`/`-u`, `-T` and `time_ns`, `-o FILE`, `-q`/`-v`, and the man page and
//! completions (intervals and `-t TID`: `intervals.rs`). Each run loads the real programs and
//! checks exact figures.

mod common;
#[path = "output_formats/man_page.rs"]
mod man_page;
mod support;
#[path = "output_formats/text.rs"]
mod text;

use std::{
    collections::BTreeMap,
    process::{Command, Output},
    time::{SystemTime, UNIX_EPOCH},
};

use common::require_privileges;
use serde_json::Value;
use support::{BIN, flood_args, json_lines, run, scratch, syscall_table_header};
use text::{check_hooks_on_stderr_once, check_units, histograms};

fn realtime_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// `memlock-trace ARGS -- memlock-trace workload syscalls`: the tracer's output and the
/// calls the workload says it made, by name.
fn traced_syscalls(args: &[&str]) -> (Output, BTreeMap<String, u64>) {
    let dir = scratch("output-formats-syscalls");
    let report = dir.join("calls.json");
    let report_arg = report.to_str().unwrap();
    let mut all = args.to_vec();
    all.extend(["--", BIN, "workload", "syscalls", "--report", report_arg]);
    let out = run(&all);
    let calls: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let mut made = BTreeMap::new();
    for c in calls {
        *made
            .entry(c["syscall"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    std::fs::remove_dir_all(&dir).ok();
    (out, made)
}

#[test]
fn hist_counts_every_call_in_log2_rows() {
    require_privileges();
    // One run checks the histograms, the auto units and where the hook detail goes.
    let (out, made) = traced_syscalls(&["--hist"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let hists = histograms(&text);
    assert!(
        text.contains("     usecs               : count    distribution"),
        "libbpf-tools' header:\n{text}"
    );
    for (name, calls) in &made {
        let rows = hists
            .get(&format!("{name} latency"))
            .unwrap_or_else(|| panic!("no {name} histogram in:\n{text}"));
        let total: u64 = rows.iter().map(|r| r.2).sum();
        assert_eq!(total, *calls, "{name}: the histogram counts every call");
        // Rows are libbpf-tools' slots: 0 -> 1, 2 -> 3, 4 -> 7, ...
        for (i, &(low, high, _)) in rows.iter().enumerate() {
            let want_low = if i == 0 { 0 } else { 1 << i };
            assert_eq!((low, high), (want_low, (2 << i) - 1), "{name} row {i}");
        }
    }
    let calls_hists = hists.keys().filter(|t| !t.ends_with(" fault latency"));
    assert_eq!(calls_hists.count(), made.len(), "one per call: {hists:?}");
    assert!(
        hists.contains_key("minor fault latency"),
        "faults too: {hists:?}"
    );
    check_units(&text, made.len(), None);
    check_hooks_on_stderr_once(&out);

    // -m: the same rows in msecs, and every latency column in ms.
    let (out, made) = traced_syscalls(&["--hist", "-m", "--fault-hooks", "off"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("     msecs "), "{text}");
    let hists = histograms(&text);
    let total: u64 = hists.values().flatten().map(|r| r.2).sum();
    assert_eq!(total, made.values().sum::<u64>(), "{text}");
    check_units(&text, made.len(), Some("ms"));
}

#[test]
fn per_thread_hist_splits_the_calls_by_thread() {
    require_privileges();
    // Two threads, each making 7 failing mlock calls; the main thread makes none.
    let flood = flood_args(2, 7, &[]);
    let mut args = vec!["--hist", "--per-thread", "--fault-hooks", "off", "--", BIN];
    args.extend(flood.iter().map(String::as_str));
    let out = run(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    let thread_blocks: Vec<&str> = text.split("\n  thread ").skip(1).collect();
    assert_eq!(thread_blocks.len(), 2, "two threads made calls:\n{text}");
    let pid_line = text.lines().find(|l| l.starts_with("pid ")).unwrap();
    let pid = pid_line.split_whitespace().nth(1).unwrap();
    for block in &thread_blocks {
        let tid = block.split_whitespace().next().unwrap();
        assert_ne!(tid, pid, "the main thread made no call:\n{text}");
        let hists = histograms(block);
        let rows = &hists["mlock latency"];
        assert_eq!(hists.len(), 1, "{block}");
        assert_eq!(rows.iter().map(|r| r.2).sum::<u64>(), 7, "{block}");
    }
    // The process's own histogram holds both threads' calls.
    let process = histograms(text.split("\n  thread ").next().unwrap());
    assert_eq!(
        process["mlock latency"].iter().map(|r| r.2).sum::<u64>(),
        14
    );
}

#[test]
fn every_json_record_has_a_realtime_stamp() {
    require_privileges();
    let before = realtime_ns();
    let (out, _) = traced_syscalls(&["--json", "--events", "--interval", "0.05"]);
    let after = realtime_ns();
    let lines = json_lines(&String::from_utf8_lossy(&out.stdout));
    let mut kinds = BTreeMap::new();
    for line in &lines {
        let t = line["time_ns"]
            .as_u64()
            .unwrap_or_else(|| panic!("no time_ns: {line}"));
        assert!(
            before <= t && t <= after,
            "{before} <= {t} <= {after}: {line}"
        );
        *kinds
            .entry(line["type"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    for kind in ["syscall", "fault", "vma_call", "vma_summary", "summary"] {
        assert!(kinds.contains_key(kind), "no {kind} record: {kinds:?}");
    }
    // The summary covers the session; the intervals tile it without gaps.
    let summary = lines.last().unwrap();
    let window = |l: &Value| {
        (
            l["window"]["start_ns"].as_u64().unwrap(),
            l["window"]["end_ns"].as_u64().unwrap(),
        )
    };
    let (start, end) = window(summary);
    assert!(before <= start && start < end && end <= after);
    assert_eq!(end, summary["time_ns"].as_u64().unwrap());
    let intervals: Vec<(u64, u64)> = lines
        .iter()
        .filter(|l| l["type"] == "interval")
        .map(window)
        .collect();
    for pair in intervals.windows(2) {
        assert_eq!(pair[0].1, pair[1].0, "contiguous windows: {intervals:?}");
    }
    for &(s, e) in &intervals {
        assert!(
            start <= s && s < e && e <= end,
            "inside the session: {intervals:?}"
        );
    }
}

#[test]
fn timestamp_flag_stamps_every_event_line() {
    require_privileges();
    let before = chrono::Local::now() - chrono::Duration::seconds(1);
    let (out, made) = traced_syscalls(&["-T", "-u", "--events=syscalls", "--fault-hooks", "off"]);
    let after = chrono::Local::now() + chrono::Duration::seconds(1);
    let text = String::from_utf8_lossy(&out.stdout);
    let day = before.date_naive();
    let mut calls = 0;
    for line in text.lines().take_while(|l| !l.starts_with("pid ")) {
        let stamp = &line[..12];
        let time = chrono::NaiveTime::parse_from_str(stamp, "%H:%M:%S%.3f")
            .unwrap_or_else(|e| panic!("{stamp:?} ({e}) in {line:?}"));
        let at = day
            .and_time(time)
            .and_local_timezone(chrono::Local)
            .unwrap();
        assert!(before <= at && at <= after, "{before} <= {at} <= {after}");
        if line.contains(") = ") && line.contains("populated") {
            calls += 1;
        }
    }
    assert_eq!(
        calls,
        made.values().sum::<u64>(),
        "one stamped line per call:\n{text}"
    );
    check_units(&text, made.len(), Some("us"));
}

/// Page counts say so in their headers: the syscall table's populated and locked columns
/// are pages (as the event lines' `populated 8 pages`), beside KiB and MiB elsewhere.
#[test]
fn page_columns_name_their_unit() {
    require_privileges();
    let (out, made) = traced_syscalls(&["--fault-hooks", "off"]);
    let text = String::from_utf8_lossy(&out.stdout);
    syscall_table_header(&text);
    check_units(&text, made.len(), None);
}

/// `--events=calls` is one line per call, as strace and perf trace print; the VMA lines
/// come with `--events=calls,vma` (or `--events=syscalls`, `--events`) (issue 47 point 13).
#[test]
fn events_calls_is_one_line_per_call_and_vma_adds_the_vma_lines() {
    require_privileges();
    let (out, made) = traced_syscalls(&["--events=calls", "--fault-hooks", "off"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let events: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("pid "))
        .collect();
    assert!(
        !events.iter().any(|l| l.contains("VMAs around range")),
        "a VMA line under --events=calls:\n{text}"
    );
    assert_eq!(
        events.iter().filter(|l| l.contains(") = ")).count() as u64,
        made.values().sum::<u64>(),
        "one line per call:\n{text}"
    );
    for events in ["--events=calls,vma", "--events=syscalls"] {
        let (out, _) = traced_syscalls(&[events, "--fault-hooks", "off"]);
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("VMAs around range"), "{events}: {text}");
    }
}

/// The VMA stores of calls outside the mlock family, as strace writes those calls: munmap
/// with its two arguments, the task's name in the comm column and in the JSON record.
#[test]
fn vma_store_lines_name_the_task_and_the_calls_own_arguments() {
    require_privileges();
    let (out, _) = traced_syscalls(&["--events", "--all-vma-changes", "--fault-hooks", "off"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let stores: Vec<&str> = text.lines().filter(|l| l.contains(": ma_write ")).collect();
    let munmaps: Vec<&str> = stores
        .iter()
        .copied()
        .filter(|l| l.contains(" munmap("))
        .collect();
    assert!(!munmaps.is_empty(), "no munmap store:\n{text}");
    for line in &munmaps {
        let args = line.split(" munmap(").nth(1).unwrap();
        let args = &args[..args.find(')').unwrap()];
        assert_eq!(args.split(", ").count(), 2, "munmap(addr, len): {line}");
    }
    for line in &stores {
        // `PID/TID COMM CALL: ma_write ...`
        assert_eq!(
            line.split_whitespace().nth(1),
            Some("memlock-trace"),
            "the comm column: {line}"
        );
    }

    let (out, _) = traced_syscalls(&[
        "--json",
        "--events",
        "--all-vma-changes",
        "--fault-hooks",
        "off",
    ]);
    let lines = json_lines(&String::from_utf8_lossy(&out.stdout));
    let stores: Vec<&Value> = lines.iter().filter(|l| l["type"] == "vma_store").collect();
    assert!(!stores.is_empty(), "no vma_store record");
    for store in stores {
        assert_eq!(store["comm"], "memlock-trace", "{store}");
        if let Some(call) = store["syscall"]
            .as_str()
            .filter(|c| c.starts_with("munmap("))
        {
            assert_eq!(call.matches(", ").count(), 1, "{store}");
        }
    }
}

#[test]
fn output_file_leaves_the_command_its_stdout() {
    require_privileges();
    let dir = scratch("output-formats-output");
    let file = dir.join("trace.json");
    // Without --report, the workload prints its own calls as JSON on its stdout.
    let out = run(&[
        "--json",
        "--events",
        "-o",
        file.to_str().unwrap(),
        "--",
        BIN,
        "workload",
        "syscalls",
    ]);
    let printed = String::from_utf8_lossy(&out.stdout);
    let calls: Vec<Value> = serde_json::from_str(&printed)
        .unwrap_or_else(|e| panic!("stdout is the command's own, untouched ({e}):\n{printed}"));
    let written = std::fs::read_to_string(&file).unwrap();
    let lines = json_lines(&written);
    let events: Vec<&Value> = lines.iter().filter(|l| l["type"] == "syscall").collect();
    assert_eq!(events.len(), calls.len(), "{written}");
    for (event, call) in events.iter().zip(&calls) {
        assert_eq!(event["syscall"], call["syscall"]);
    }
    assert_eq!(lines.last().unwrap()["type"], "summary");

    // Text too, with -q: nothing at all on stderr.
    let text_file = dir.join("trace.txt");
    let out = run(&[
        "-q",
        "-o",
        text_file.to_str().unwrap(),
        "--",
        BIN,
        "workload",
        "syscalls",
    ]);
    let printed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let text = std::fs::read_to_string(&text_file).unwrap();
    assert!(
        text.contains("dropped events: 0") && text.contains("mlockall"),
        "{text}"
    );
    assert_eq!(printed.len(), calls.len());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "", "-q");

    // An unwritable path is a usage error before anything is loaded.
    let out = Command::new(BIN)
        .args(["-o", "/nonexistent-dir/x.json", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot write /nonexistent-dir/x.json"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn verbose_prints_the_hook_detail_once_on_stderr() {
    require_privileges();
    // The default and -q are checked with the histogram and -o runs.
    let (verbose, _) = traced_syscalls(&["-v"]);
    let stdout = String::from_utf8_lossy(&verbose.stdout);
    assert!(!stdout.contains("refused"), "{stdout}");
    let verbose = String::from_utf8_lossy(&verbose.stderr);
    assert_eq!(
        verbose
            .matches("memlock-trace: page faults traced with ")
            .count(),
        1,
        "{verbose}"
    );
    // That block is the fault family's line with -v: the hook set is not said twice.
    assert_eq!(
        verbose.matches("memlock-trace: faults: ").count(),
        0,
        "{verbose}"
    );
    let probe = run(&["probe", "--json"]);
    let probe: Value = serde_json::from_slice(&probe.stdout).unwrap();
    if probe["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["name"] == "fentry" && c["usable"] == false)
    {
        assert!(verbose.contains("  fentry refused:"), "{verbose}");
        assert!(
            verbose.contains("run `memlock-trace probe` to see which hooks"),
            "every line of the reason: {verbose}"
        );
    }
}

//! Runs on: host only: usage errors, output-path and I/O errors, exit codes are decided in user
//! space, the same on every kernel
//!
//! Errors a script can trust (issue 12): no panics on numbers out of range, output paths
//! checked before any work, every I/O error naming its path, a computed result never lost,
//! and exit codes as `timeout(1)`/`env(1)` use them: the tool's own failure 125, a command
//! that cannot be executed 126, not found 127, otherwise the command's status.

mod common;
mod support;

use std::{
    io::{BufRead as _, BufReader},
    os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use common::require_privileges;
use support::BIN;

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(BIN).args(args).output().unwrap();
    (
        status.code(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// Exit 2 with one line on stderr, `memlock-trace: error: ...` naming `needle`, and no panic.
fn assert_usage_error(args: &[&str], needle: &str) -> String {
    let (code, _, err) = run(args);
    assert_eq!(code, Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(err.starts_with("memlock-trace: error: "), "{args:?}: {err}");
    assert!(
        err.contains(needle),
        "{args:?} does not name {needle:?}: {err}"
    );
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    err
}

#[test]
fn numbers_out_of_range_are_one_line_usage_errors() {
    for (args, flag) in [
        (&["--duration", "2e19"][..], "--duration"),
        (&["--interval", "1e300"], "--interval"),
        (&["-d", "inf"], "--duration"),
        (&["-i", "NaN"], "--interval"),
        (&["1e300"], "INTERVAL"),
        (&["1", "99999999999999999999999"], "COUNT"),
        (&["--max-targets", "4294967295"], "--max-targets"),
        (&["--max-processes", "4294967295"], "--max-processes"),
        (&["--sample", "0"], "--sample"),
        (
            &["--top-mappings", "99999999999999999999"],
            "--top-mappings",
        ),
        (
            &["scenario", "first-touch", "--seconds", "1e300"],
            "--seconds",
        ),
        (
            &["scenario", "thread-stack", "--stack-mib", "0"],
            "--stack-mib",
        ),
        (
            &["scenario", "thread-create", "--processes", "1,0"],
            "--processes",
        ),
        (
            &["workload", "flood", "--threads", "4294967295"],
            "--threads",
        ),
        (&["suite", "--runs", "0"], "--runs"),
    ] {
        let err = assert_usage_error(args, flag);
        let value = args.last().unwrap().rsplit(',').next().unwrap();
        assert!(err.contains(value), "{args:?}: {err}");
    }
    // The accepted range is named.
    let err = assert_usage_error(&["--max-targets", "4294967295"], "from 1 to 4194304");
    assert!(!err.contains("RLIMIT_MEMLOCK"), "{err}");
    assert_usage_error(&["--duration", "2e19"], "at most 1000000000");
}

#[test]
fn a_negative_number_is_a_value_out_of_range_not_an_option() {
    for (args, flag, range) in [
        (&["-d", "-1"][..], "--duration", "greater than 0"),
        (&["--duration", "-0.5"], "--duration", "greater than 0"),
        (&["-i", "-2"], "--interval", "greater than 0"),
        (&["-p", "-1"], "--pid", "from 1 to 4194304"),
        (&["--top-mappings", "-3"], "--top-mappings", "from 0 to"),
        (&["--sample", "-1"], "--sample", "from 1 to"),
    ] {
        let err = assert_usage_error(args, flag);
        assert!(err.contains(range), "{args:?} names no range: {err}");
        assert!(!err.contains("unknown option"), "{args:?}: {err}");
    }
}

#[test]
fn the_parsers_own_errors_are_the_tools_one_line() {
    // clap's errors other than unknown options and bad values: a conflict, a missing
    // requirement, a value not among the choices, a missing value.
    for (args, needle) in [
        (&["-t", "1", "-p", "1"][..], "cannot be used with"),
        (&["-m", "-u"], "cannot be used with"),
        (&["--stack-sample", "8"], "--stacks"),
        (&["--events=bogus"], "bogus"),
        (&["--fault-hooks", "nope"], "nope"),
        (&["--duration"], "--duration"),
        (&["--user", "nobody"], "COMMAND"),
    ] {
        let err = assert_usage_error(args, needle);
        assert!(!err.contains("Usage:"), "{args:?}: {err}");
    }
}

#[test]
fn an_unknown_option_gets_a_tip_that_holds_here() {
    for (args, unknown) in [
        (&["-X"][..], "-X"),
        (&["probe", "-T"], "-T"),
        (&["--jsn", "--", "true"], "--jsn"),
    ] {
        let err = assert_usage_error(args, &format!("unknown option `{unknown}`"));
        // `--` starts the command to trace: clap's "use '-- -X'" would launch `-X`.
        assert!(
            !err.contains("as a value") && err.contains("--help"),
            "{err}"
        );
    }
    assert_usage_error(&["--jsn"], "did you mean `--json`");
}

#[test]
fn output_paths_are_checked_before_any_work() {
    let bad = "/nonexistent/dir/x.json";
    // thread-create measures for 10 s per process count: a late check would take that long
    // (the margin leaves room for an emulated guest's slow start).
    let start = Instant::now();
    assert_usage_error(
        &[
            "scenario",
            "thread-create",
            "--processes",
            "1",
            "--seconds",
            "10",
            "--report",
            bad,
        ],
        &format!("cannot write {bad}: No such file or directory"),
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert_usage_error(&["workload", "syscalls", "-o", bad], bad);
    assert_usage_error(
        &[
            "suite",
            "--tiny",
            "--scenario",
            "first-touch",
            "--out",
            "/dev/null/report",
        ],
        "/dev/null/report",
    );
}

#[test]
fn verify_checks_its_output_path_first() {
    require_privileges();
    let bad = "/nonexistent/dir/v.json";
    let start = Instant::now();
    assert_usage_error(&["verify", "-o", bad], bad);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// `/dev/full` may be missing in a minimal guest: then `-o` would just create a file.
fn dev_full() -> Option<&'static str> {
    let full = std::fs::metadata("/dev/full").is_ok_and(|m| m.file_type().is_char_device());
    if !full {
        eprintln!("no /dev/full here: the full-disk checks are skipped");
    }
    full.then_some("/dev/full")
}

#[test]
fn a_full_disk_is_named_and_the_result_is_printed_instead() {
    let Some(full) = dev_full() else { return };
    let (code, out, err) = run(&[
        "scenario",
        "first-touch",
        "--touch-mib",
        "1",
        "--runs",
        "1",
        "-o",
        full,
    ]);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("cannot write /dev/full: "), "{err}");
    assert!(err.contains("printed on standard output instead"), "{err}");
    let result: serde_json::Value = serde_json::from_str(out.trim()).expect("the result");
    assert!(result["variants"]["lazy"].is_object(), "{result}");
}

#[test]
fn a_full_disk_ends_a_session_with_125_and_keeps_its_summary() {
    require_privileges();
    let Some(full) = dev_full() else { return };
    let (code, out, err) = run(&["-q", "-o", full, "--", "sh", "-c", "exit 3"]);
    assert_eq!(code, Some(125), "not the command's 3: {err}");
    assert!(err.contains("cannot write /dev/full: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        out.contains("dropped events: 0"),
        "the summary is lost: {out}"
    );
}

#[test]
fn a_closed_pipe_ends_the_tracer_quietly() {
    require_privileges();
    // Keeps making calls for a while, so that events keep coming after `head` has gone.
    let script = format!("for i in $(seq 40); do {BIN} workload syscalls >/dev/null; done");
    let mut tracer = Command::new(BIN)
        .args(["-q", "--json", "--events", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(tracer.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with('{'), "{line}");
    // The reader is dropped here: the pipe is closed, as `| head -1` does.
    let out = tracer.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked") && !err.contains("error"), "{err}");
    assert_eq!(out.status.code(), Some(141), "{err}");
}

#[test]
fn exit_codes_tell_the_tool_from_the_command() {
    require_privileges();
    let (code, _, err) = run(&["-q", "--", "/nonexistent/memlock-trace-no-such-command"]);
    assert_eq!(code, Some(127), "{err}");
    assert!(err.contains("command not found"), "{err}");

    let dir = support::scratch("errors");
    let script = dir.join("not-executable");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, _, err) = run(&["-q", "--", script.to_str().unwrap()]);
    assert_eq!(code, Some(126), "{err}");
    assert!(err.contains("cannot execute"), "{err}");
    std::fs::remove_dir_all(&dir).ok();

    let (code, _, err) = run(&["-q", "--", "sh", "-c", "exit 3"]);
    assert_eq!(code, Some(3), "{err}");
    let (code, _, err) = run(&["-q", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(code, Some(128 + 15), "{err}");
}

#[test]
fn a_duration_stops_the_launched_command_as_timeout_does() {
    require_privileges();
    let start = Instant::now();
    let (code, out, err) = run(&["-d", "1", "--", "sleep", "30"]);
    // timeout(1): SIGTERM to the command at the end of the duration, then 124.
    assert_eq!(code, Some(124), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    let said: Vec<&str> = err.lines().filter(|l| l.contains("SIGTERM")).collect();
    assert_eq!(said.len(), 1, "one line says so: {err}");
    let pid: u32 = said[0]
        .split("(pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("the line names the command's pid: {err}"));
    assert!(said[0].contains("`sleep`"), "{err}");
    // Waited for, so reaped: the pid is gone, not an orphan still sleeping.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        !stat.contains("(sleep)"),
        "`sleep` (pid {pid}) is still running: {stat}"
    );
    assert!(out.contains("dropped events: 0"), "the summary: {out}");

    // A command that exits within the duration keeps its own status.
    let (code, _, err) = run(&["-q", "-d", "30", "--", "sh", "-c", "exit 3"]);
    assert_eq!(code, Some(3), "{err}");
}

#[test]
fn a_launched_command_dies_of_sigpipe_as_from_a_shell() {
    require_privileges();
    // With SIGPIPE left ignored (Rust's own setting), `yes` complains of EPIPE instead.
    let (code, _, err) = run(&["-q", "--", "sh", "-c", "yes | head -1 >/dev/null"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("Broken pipe"), "{err}");
}

//! Runs on: host only: a command named and given arguments in bytes is launched in user space, the
//! same on every kernel; the guests' programs are busybox applets, chosen by their name (launched
//! commands traced: test:targets, in a guest too)
//!
//! A command's name and arguments are bytes, as the kernel takes them (issue 30, item 4):
//! `memlock-trace -- "$(printf 's\377')" 0.3`, a copy of `sleep` whose name is not UTF-8,
//! runs as strace and perf run it, and so does a program given an argument that is not
//! UTF-8. The name is shown escaped (`s\xff`) in text, and as JSON gives every name that is
//! not UTF-8 (each such byte U+FFFD).

mod common;
mod support;

use std::{
    ffi::OsString,
    os::unix::ffi::OsStringExt as _,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use common::require_privileges;
use support::{BIN, process_of, summary};

/// The program's name: `s` and the byte 0xff, never UTF-8.
const NAME: &[u8] = b"s\xff";
const NAME_SHOWN: &str = "s\\xff";
/// [`NAME`] in JSON.
const NAME_JSON: &str = "s\u{fffd}";
/// The exit status the shell copy gives when its argument arrived byte for byte.
const ARGUMENT_ARRIVED: i32 = 7;

/// A fresh directory holding a copy of `program` (found in PATH) named [`NAME`].
fn copy_named(program: &str, dir: &Path) -> PathBuf {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let from = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no `{program}` in PATH"));
    let to = dir.join(OsString::from_vec(NAME.to_vec()));
    std::fs::copy(&from, &to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    to
}

fn tempdir(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("memlock-trace-bytes-{what}-{}", std::process::id()))
}

/// `(pid N` in the tracing note on stderr: the launched command's pid.
fn launched_pid(stderr: &str) -> u32 {
    stderr
        .split("(pid ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no `(pid N)` note:\n{stderr}"))
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_copy_of_sleep_named_s_xff_runs_traced_and_is_shown_escaped() {
    require_privileges();
    let dir = tempdir("sleep");
    let sleep = copy_named("sleep", &dir);
    // As the issue ran it: text output, the command's exit status the tracer's.
    let out = Command::new(BIN)
        .arg("--")
        .arg(&sleep)
        .arg("0.3")
        .output()
        .expect("memlock-trace");
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let pid = launched_pid(&stderr);
    // The tracing note and the summary's process row name it escaped; no raw 0xff byte
    // (shown above as U+FFFD) anywhere.
    let note = stderr.lines().find(|l| l.contains("(pid ")).unwrap();
    assert!(
        note.contains(&format!("{NAME_SHOWN}` (pid {pid}")),
        "{note}"
    );
    assert!(
        stdout.contains(&format!("{pid}")) && stdout.contains(NAME_SHOWN),
        "the summary names pid {pid} as {NAME_SHOWN}:\n{stdout}"
    );
    for (what, output) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        assert!(
            std::str::from_utf8(output).is_ok(),
            "{what} holds a raw byte that is not UTF-8:\n{}",
            String::from_utf8_lossy(output)
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_argument_that_is_not_utf8_reaches_the_program_byte_for_byte() {
    require_privileges();
    let dir = tempdir("sh");
    let shell = copy_named("dash", &dir);
    // The copy exits 7 only when its argument is exactly `a` and the byte 0xff.
    let script = format!(
        "[ \"$1\" = \"$(printf 'a\\377')\" ] && exit {ARGUMENT_ARRIVED}; echo \"got: $1\"; exit 1"
    );
    let out = Command::new(BIN)
        .args(["--json", "--"])
        .arg(&shell)
        .args(["-c", &script, "sh"])
        .arg(OsString::from_vec(b"a\xff".to_vec()))
        .output()
        .expect("memlock-trace");
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(ARGUMENT_ARRIVED),
        "the command's exit status is the tracer's:\n{stdout}\n{stderr}"
    );
    let pid = launched_pid(&stderr);
    let note = stderr.lines().find(|l| l.contains("(pid ")).unwrap();
    assert!(
        note.contains(&format!("{NAME_SHOWN}` (pid {pid}")),
        "{note}"
    );
    let s = summary(&stdout);
    let traced = process_of(&s, pid);
    // JSON keeps the value the way it does for every comm that is not UTF-8.
    assert_eq!(traced["comm"], NAME_JSON, "{traced}");
    let faults = &traced["faults"];
    assert!(
        faults["minor"].as_u64().unwrap_or(0) > 0,
        "the program's own faults are traced: {traced}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

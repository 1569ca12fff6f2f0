//! Runs on: host only: compiles a C program with gcc and renames a symbol with objcopy, which the
//! guest's initramfs does not carry; the escaping is user space (the figures behind the rows:
//! test:fault_cli and test:syscalls, in the guests too)
//!
//! Packages: gcc, binutils
//!
//! Names a traced program controls, chosen as an attacker would (`tests/hostile/hostile.c`,
//! compiled now): its comm and a thread's name hold ESC, BEL and a newline, as do a mapped
//! file's name, a memfd's name and (renamed with objcopy) the function that makes its mlock
//! calls, a 423-byte symbol; another mapped file's name is not UTF-8. Every text output
//! (event lines, the summary's process, thread, mapping and stack rows, call sites,
//! `--hist`, `-i` intervals, `-o` files, the notes on stderr) must show them escaped, with
//! no raw control byte and no line of the attacker's; JSON must keep them exactly; and the
//! file whose name is not UTF-8 must not cost the process its other mappings (libc).

mod common;
mod support;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use common::require_privileges;
use serde_json::Value;
use support::{BIN, process_of, summary};

const COMM: &str = "e\x1b]0;X\x07\nFAKE";
const COMM_SHOWN: &str = "e\\x1b]0;X\\x07\\nFAKE";
const THREAD: &str = "t\x1b[2J\nFAKE";
const THREAD_SHOWN: &str = "t\\x1b[2J\\nFAKE";
/// The kernel shows a newline in a path as `\012` in /proc/PID/maps (seq_file_path); the
/// rest of the bytes as they are.
const FILE_IN_MAPS: &str = "map\x1b]0;PWNED\x07\\012FAKE file";
const FILE_SHOWN: &str = "map\\x1b]0;PWNED\\x07\\\\012FAKE file";
const MEMFD_IN_MAPS: &str = "/memfd:memfd\x1b[2J\\012FAKE memfd (deleted)";
const MEMFD_SHOWN: &str = "/memfd:memfd\\x1b[2J\\\\012FAKE memfd (deleted)";
const BAD_UTF8_JSON: &str = "bad\u{fffd}\u{fffd} name";
const BAD_UTF8_SHOWN: &str = "bad\\xff\\xfe name";
const SYMBOL_HEAD: &str = "evil\x1b[31m\nFAKE symbol ";
const SYMBOL_LS: usize = 400;
/// Calls (one per mapping: file, non-UTF-8 file, memfd, the thread's anonymous one) and
/// pages each.
const CALLS: u64 = 4;
const PAGES: u64 = 4;

fn symbol() -> String {
    format!("{SYMBOL_HEAD}{}", "L".repeat(SYMBOL_LS))
}

/// `hostile.c` built in `dir`, its mlock function renamed to [`symbol`].
fn build(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile/hostile.c");
    let plain = dir.join("hostile.plain");
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd.output().unwrap_or_else(|e| {
            panic!("{what}: {e}: this test compiles a C program (apt-get install gcc binutils)")
        });
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(
        Command::new("cc")
            .args(["-O1", "-fno-omit-frame-pointer", "-pthread", "-o"])
            .arg(&plain)
            .arg(&source),
        "cc hostile.c",
    );
    let program = dir.join("hostile");
    run(
        Command::new("objcopy")
            .arg(format!("--redefine-sym=hostile_symbol={}", symbol()))
            .arg(&plain)
            .arg(&program),
        "objcopy --redefine-sym",
    );
    program
}

struct Run {
    stdout: String,
    stderr: String,
    /// The tracer's output file with `-o`.
    file: Option<String>,
    pid: u32,
}

/// The options under which a summary shows every place a name appears: per thread, every
/// call's stack, the top 50 mappings.
const EVERY_NAME: [&str; 6] = [
    "--per-thread",
    "--stacks",
    "--stack-sample",
    "1",
    "--top-mappings",
    "50",
];

/// `memlock-trace ARGS -- hostile DIR` in a fresh directory.
fn trace(args: &[&str], output_file: bool) -> Run {
    require_privileges();
    let dir = tempdir();
    let program = build(&dir);
    let files = dir.join("files");
    std::fs::create_dir(&files).unwrap();
    let out_path = dir.join("out.txt");
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    if output_file {
        cmd.arg("-o").arg(&out_path);
    }
    let out = cmd
        .arg("--")
        .arg(&program)
        .arg(&files)
        .output()
        .expect("memlock-trace");
    // Lossy: a raw byte that is not UTF-8 would show as U+FFFD, caught below too.
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{args:?}: {:?}\n{stderr}", out.status);
    let pid = stderr
        .split("(pid ")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no `(pid N)` note:\n{stderr}"));
    let file = output_file
        .then(|| String::from_utf8(std::fs::read(&out_path).unwrap()).expect("-o text is UTF-8"));
    std::fs::remove_dir_all(&dir).unwrap();
    Run {
        stdout,
        stderr,
        file,
        pid,
    }
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "memlock-trace-hostile-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    // The program runs as root: nothing here needs to be reachable by others.
    dir
}

/// No control byte but the newline, no replacement character (a raw byte that was not
/// UTF-8), and no line that the traced program wrote (every forged line starts `FAKE`).
fn assert_clean(what: &str, text: &str) {
    for (n, line) in text.lines().enumerate() {
        assert!(
            !line.chars().any(|c| c.is_control() || c == '\u{fffd}'),
            "{what} line {}: a raw control byte: {line:?}",
            n + 1
        );
        assert!(
            !line.trim_start().starts_with("FAKE"),
            "{what} line {}: a forged line: {line:?}\n{text}",
            n + 1
        );
    }
}

fn symbol_shown() -> String {
    let symbol = symbol();
    let cut = &symbol.as_bytes()[..memlock_trace::output::MAX_SHOWN];
    let head = SYMBOL_HEAD.replace('\x1b', "\\x1b").replace('\n', "\\n");
    let ls = cut.len() - SYMBOL_HEAD.len();
    format!(
        "{head}{}...[+{} bytes]",
        "L".repeat(ls),
        symbol.len() - cut.len()
    )
}

#[test]
fn text_summary_rows_show_every_name_escaped() {
    let run = trace(&[&EVERY_NAME[..], &["--hist"]].concat(), false);
    assert_clean("stdout", &run.stdout);
    assert_clean("stderr", &run.stderr);
    let text = &run.stdout;
    let must = |needle: &str| assert!(text.contains(needle), "no {needle:?} in:\n{text}");
    must(&format!("pid {} ({COMM_SHOWN})\n", run.pid));
    must(&format!("  thread {} ({COMM_SHOWN})\n", run.pid));
    must(&format!(" ({THREAD_SHOWN})\n"));
    must(FILE_SHOWN);
    must(MEMFD_SHOWN);
    must(BAD_UTF8_SHOWN);
    // The other mappings are still named: a name that is not UTF-8 costs nothing else.
    must("libc.so.6 0x");
    // The symbol, cut at 256 bytes with the marker, in the fault stacks and call sites.
    let symbol = symbol_shown();
    assert!(
        text.matches(&symbol).count() >= 2,
        "{symbol:?} not in both the fault stacks and the call sites:\n{text}"
    );
}

#[test]
fn event_lines_and_intervals_show_every_name_escaped() {
    let run = trace(
        &["--events", "-T", "-i", "0.1", "--per-thread", "--hist"],
        true,
    );
    assert_clean("stdout", &run.stdout);
    assert_clean("stderr", &run.stderr);
    let file = run.file.expect("-o");
    assert_clean("-o file", &file);
    // Syscall and fault event lines carry the comm, padded as the column is.
    let events: Vec<&str> = file
        .lines()
        .filter(|l| l.contains(&format!("{}/", run.pid)))
        .collect();
    let mlocks = events.iter().filter(|l| l.contains(" mlock(")).count() as u64;
    assert!(mlocks >= CALLS, "{CALLS} mlock lines in:\n{file}");
    assert!(
        events
            .iter()
            .any(|l| l.contains(&format!(" {COMM_SHOWN}")) && l.contains(" fault ")),
        "no fault event line naming {COMM_SHOWN:?}:\n{file}"
    );
    assert!(
        events
            .iter()
            .any(|l| l.contains(&format!(" {THREAD_SHOWN}"))),
        "no event line naming the thread {THREAD_SHOWN:?}:\n{file}"
    );
    assert!(
        file.contains(&format!("pid {} ({COMM_SHOWN})\n", run.pid)),
        "{file}"
    );
}

/// (name, faults) of each row of the process's mapping table.
fn mappings(process: &Value) -> Vec<(&str, u64)> {
    process["faults"]["by_mapping"]
        .as_array()
        .expect("by_mapping")
        .iter()
        .map(|m| {
            (
                m["mapping"].as_str().unwrap(),
                m["faults"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn json_keeps_every_name_exactly() {
    let run = trace(&[&["--json"][..], &EVERY_NAME].concat(), false);
    assert_clean("stderr", &run.stderr);
    let s = summary(&run.stdout);
    let process = process_of(&s, run.pid);
    assert_eq!(process["comm"], COMM);
    // Traced exactly, whatever the names.
    assert_eq!(process["syscalls"]["mlock"]["count"], CALLS);
    assert_eq!(process["syscalls"]["mlock"]["pages_locked"], CALLS * PAGES);
    let threads = process["faults"]["threads"].as_array().expect("threads");
    assert!(threads.iter().any(|t| t["comm"] == THREAD), "{threads:?}");
    // Each hostile mapping is a row of its own, named exactly, with the pages touched.
    let maps = mappings(process);
    for name in [FILE_IN_MAPS, BAD_UTF8_JSON] {
        let row = maps
            .iter()
            .find(|(m, _)| m.ends_with(&format!("/files/{name}")));
        assert_eq!(row.map(|r| r.1), Some(PAGES), "{name:?} in {maps:?}");
    }
    let memfd = maps.iter().find(|(m, _)| *m == MEMFD_IN_MAPS);
    assert_eq!(memfd.map(|r| r.1), Some(PAGES), "{maps:?}");
    assert!(
        maps.iter().any(|(m, _)| m.ends_with("/libc.so.6")),
        "libc not named beside a file whose name is not UTF-8: {maps:?}"
    );
    let symbol = symbol();
    let frames = |list: &Value| -> usize {
        list.as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["frames"].as_array().unwrap())
            .filter(|f| f["symbol"] == symbol.as_str())
            .count()
    };
    assert!(
        frames(&process["faults"]["stacks"]) >= 1,
        "{}",
        process["faults"]["stacks"]
    );
    assert!(
        frames(&process["call_sites"]) >= 2,
        "{}",
        process["call_sites"]
    );
}

//! `--stacks` runs on a C program built as distributions build (no frame pointers), shared
//! by test:stacks (beside perf and gdb, on the host) and test:unwind_tables (on every
//! architecture's kernel, a cross-built program in the arm64 guest, which has no compiler).

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

use serde_json::Value;

pub use super::scratch;
use super::{BIN, compile_c, json_lines, succeeded};

const LOCK_CHAIN: &str = include_str!("../stacks/lock_chain.c");
const TOUCH_PAGES: &str = include_str!("../stacks/touch_pages.c");
/// Names a prebuilt `lock_chain` (`cargo xtask test` cross-compiles it for the arm64 guest).
pub const PREBUILT_LOCK_CHAIN: &str = "MEMLOCK_TRACE_LOCK_CHAIN";

/// `lock_chain.c` compiled without frame pointers, with DWARF for file:line, in `dir`: a
/// copy of the prebuilt one [`PREBUILT_LOCK_CHAIN`] names, else compiled here by gcc.
pub fn build_lock_chain(dir: &Path) -> PathBuf {
    let bin = dir.join("lock_chain");
    if let Some(prebuilt) = std::env::var_os(PREBUILT_LOCK_CHAIN) {
        std::fs::copy(&prebuilt, &bin)
            .unwrap_or_else(|e| panic!("{PREBUILT_LOCK_CHAIN}={prebuilt:?}: {e}"));
        return bin;
    }
    compile_c(dir, "lock_chain", LOCK_CHAIN, LOCK_CHAIN_FLAGS)
}

/// How `lock_chain.c` is compiled: as distributions build, with DWARF for file:line.
const LOCK_CHAIN_FLAGS: &[&str] = &["-O2", "-fomit-frame-pointer", "-g"];

/// `touch_pages.c` compiled as [`build_lock_chain`] compiles, in `dir`.
pub fn build_touch_pages(dir: &Path) -> PathBuf {
    compile_c(dir, "touch_pages", TOUCH_PAGES, LOCK_CHAIN_FLAGS)
}

/// `perf record` of every page fault (`-c 1`) of `command` into `data`, its stacks by
/// `call_graph` (`-g`, or `--call-graph dwarf`): the command line the tests compare with.
pub fn perf_record_faults<'a>(
    call_graph: &[&'a str],
    data: &'a str,
    command: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec!["perf", "record", "-q", "-e", "page-faults", "-c", "1"];
    args.extend(call_graph);
    // perf's default buffer lost samples on a slow CI machine (it kept 948 of a script's
    // 1,024 touches): a buffer that holds every sample of the run (~10,400 of ~12 KiB with
    // DWARF stacks) loses none, however late perf writes them out.
    args.extend(["-m", "128M", "-o", data, "--"]);
    args.extend(command);
    args
}

/// The stdout of a `perf` command, which must run and succeed (`what` names it otherwise).
pub fn run_perf(what: &str, perf: &mut Command) -> String {
    let out = perf
        .output()
        .unwrap_or_else(|e| panic!("perf: {e} (`cargo xtask test` installs Debian's linux-perf)"));
    succeeded(what, &out)
}

/// The output of `perf script ARGS -i DATA`: the samples `perf record` wrote to `data`.
pub fn perf_script(args: &[&str], data: &Path) -> String {
    let mut perf = Command::new("perf");
    run_perf(
        "perf script",
        perf.arg("script").args(args).arg("-i").arg(data),
    )
}

/// The text summary, the folded file and the command's stdout of `memlock-trace --stacks
/// --folded FILE -- command` (its summary to a file in `dir`), which exits 0.
pub fn traced_text_and_folded(dir: &Path, command: &[&str]) -> (String, String, String) {
    let (summary, folded) = (dir.join("summary.txt"), dir.join("stacks.folded"));
    let out = Command::new(BIN)
        .args(["--stacks", "-o"])
        .arg(&summary)
        .arg("--folded")
        .arg(&folded)
        .arg("--")
        .args(command)
        .output()
        .expect("memlock-trace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let read = |path: &Path| {
        std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{stderr}", path.display()))
    };
    (
        read(&summary),
        read(&folded),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A figure as the text summary writes it (`40960`, or `40,960`).
pub fn figure(word: &str) -> Option<u64> {
    word.replace(',', "").parse().ok()
}

/// The stack tables of a text summary: each stack's figure (on its innermost frame's line)
/// and its frames' names, innermost first.
pub fn stack_tables(text: &str) -> Vec<(u64, Vec<String>)> {
    let mut stacks: Vec<(u64, Vec<String>)> = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.contains("user call stack (innermost first") {
            in_table = true;
            continue;
        }
        // The table's lines are indented past the process's (`  `) own lines.
        in_table &= line.starts_with("    ");
        let mut words = line.split_whitespace();
        match (in_table, words.next(), words.next()) {
            (true, Some(first), Some(frame)) if figure(first).is_some() => {
                stacks.extend(figure(first).map(|n| (n, vec![frame.to_string()])));
            }
            (true, Some(frame), _) => {
                if let Some((_, frames)) = stacks.last_mut() {
                    frames.push(frame.to_string());
                }
            }
            _ => {}
        }
    }
    stacks
}

/// The summary of `memlock-trace --json --stacks [extra] -- command`, which exits 0.
pub fn traced(extra: &[&str], command: &[&str]) -> Value {
    traced_exiting(extra, command, 0)
}

/// The same for a command whose exit code (the tracer's own) is `code`. The lines go to a
/// file: the command's own output stays on stdout.
pub fn traced_exiting(extra: &[&str], command: &[&str], code: i32) -> Value {
    static RUNS: AtomicU32 = AtomicU32::new(0);
    let lines =
        scratch("stacks-trace").join(format!("{}.json", RUNS.fetch_add(1, Ordering::Relaxed)));
    let out = Command::new(BIN)
        .args(["--json", "--stacks", "-o"])
        .arg(&lines)
        .args(extra)
        .arg("--")
        .args(command)
        .output()
        .expect("memlock-trace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    let text = std::fs::read_to_string(&lines).unwrap_or_default();
    std::fs::remove_file(&lines).ok();
    json_lines(&text)
        .pop()
        .unwrap_or_else(|| panic!("no summary:\n{text}\n{stderr}"))
}

/// The frames of the one mlock call site of the one traced process, as (symbol, module).
pub fn mlock_call_site(summary: &Value) -> Vec<(String, String)> {
    frames(&call_site(summary, "mlock")["frames"])
}

/// The one call site of `syscall` among the traced processes.
pub fn call_site<'a>(summary: &'a Value, syscall: &str) -> &'a Value {
    let processes = summary["processes"].as_array().unwrap();
    let sites: Vec<&Value> = processes
        .iter()
        .filter_map(|p| p["call_sites"].as_array())
        .flatten()
        .filter(|s| s["syscall"] == syscall)
        .collect();
    assert_eq!(sites.len(), 1, "one {syscall} call site: {summary}");
    assert_eq!(sites[0]["calls"], 1, "{summary}");
    sites[0]
}

pub fn frames(frames: &Value) -> Vec<(String, String)> {
    frames
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            // Never a frame outside an executable mapping (a data word read as an address).
            let module = f["module"]
                .as_str()
                .unwrap_or_else(|| panic!("a frame in no executable mapping: {f}"));
            (
                f["symbol"].as_str().unwrap().to_string(),
                module.to_string(),
            )
        })
        .collect()
}

/// The lock_chain program at `bin`, traced: its mlock call site reads libc's mlock <- lock_b
/// <- lock_a <- main, those three in `bin`, with no frame-pointer walk. The frames' names,
/// innermost first.
pub fn lock_chain_call_site(bin: &str) -> Vec<String> {
    let summary = traced(&[], &[bin]);
    let ours = mlock_call_site(&summary);
    let names: Vec<String> = ours.iter().map(|(s, _)| s.clone()).collect();
    assert!(
        names.first().is_some_and(|n| n.ends_with("mlock")),
        "innermost: libc's mlock: {ours:#?}"
    );
    assert_eq!(
        names.get(1..4),
        Some(&["lock_b", "lock_a", "main"].map(String::from)[..]),
        "{ours:#?}"
    );
    for (_, module) in &ours[1..4] {
        assert_eq!(module, bin, "{ours:#?}");
    }
    // (A sampled fault's stack may be cut, and counted: one at `_start`, or in crt code
    // without unwind tables whose frame pointer holds the data word.)
    let unwinding = &summary["call_site_health"]["unwinding"];
    assert_eq!(unwinding["frame_pointer_walks"], 0, "{unwinding}");
    names
}

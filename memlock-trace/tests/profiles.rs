//! Runs on: host only: compiles a C program with gcc and compares with perf, go tool pprof and
//! node's perf map, which the guests do not carry (the kernel side of --stacks: test:fault_cli, in
//! the guests too)
//!
//! Packages: gcc, linux-perf, golang-go, nodejs
//!
//! `--folded`, `--flamegraph` and `--pprof` checked against the established tools on the same
//! run: a C program built with frame pointers, faulting pages in from two known functions,
//! runs under `perf record -e page-faults -c 1 -g` while memlock-trace traces perf and its
//! child with every fault's stack kept. perf's samples, collapsed by inferno's port of
//! stackcollapse-perf.pl, give the same folded lines for those functions, with the very
//! counts the program's own getrusage gives; the flame graph parses as SVG (quick-xml) with
//! those frames and counts; `go tool pprof` (Debian's golang-go) reads the profile with the
//! sample types faults and bytes and the same stacks. Node's JIT frames are named from the
//! perf map it writes (`--perf-basic-prof`), even when it deleted the map before exiting.
//!
//! `cargo xtask test` installs gcc, Debian's linux-perf, golang-go and nodejs when missing.
//! The C program is compiled on the machine that runs the test, so this binary runs on the
//! host.

mod common;
mod support;
#[path = "profiles/tools.rs"]
mod tools;

use std::{
    collections::BTreeMap,
    io::Read as _,
    path::{Path, PathBuf},
    process::Command,
};

use common::require_privileges;
use serde_json::Value;
use support::{BIN, compile_c, json_lines, scratch, stacks::perf_record_faults, succeeded};
use tools::{from_frame, go_pprof, parse_folded, perf_collapsed, pprof_traces, svg_titles};

const TOUCH_TWO: &str = include_str!("profiles/touch_two.c");
const GROW_JS: &str = include_str!("profiles/grow.js");
const NODE: &str = "/usr/bin/node";

/// `touch_two.c` compiled with frame pointers (and -O0, so that leaf functions keep theirs:
/// Debian's gcc leaves them out of leaves at -O2).
fn build_touch_two(dir: &Path) -> PathBuf {
    compile_c(
        dir,
        "touch_two",
        TOUCH_TWO,
        &["-O0", "-g", "-fno-omit-frame-pointer"],
    )
}

/// The profile files of one traced run, with its summary, stdout and stderr.
struct Traced {
    summary: Value,
    stdout: String,
    stderr: String,
    folded: String,
    svg: PathBuf,
    pprof: PathBuf,
}

/// `memlock-trace --json --stacks --stack-sample 1 --folded --flamegraph --pprof [extra] --
/// command` in `dir`, which exits 0.
fn traced(dir: &Path, extra: &[&str], command: &[&str]) -> Traced {
    let (json, folded) = (dir.join("trace.json"), dir.join("stacks.folded"));
    let (svg, pprof) = (dir.join("faults.svg"), dir.join("faults.pb.gz"));
    let out = Command::new(BIN)
        // node writes its V8 logs to the working directory.
        .current_dir(dir)
        .args(["--json", "--stacks", "--stack-sample", "1", "-o"])
        .arg(&json)
        .arg("--folded")
        .arg(&folded)
        .arg("--flamegraph")
        .arg(&svg)
        .arg("--pprof")
        .arg(&pprof)
        .args(extra)
        .arg("--")
        .args(command)
        .output()
        .expect("memlock-trace");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let text = std::fs::read_to_string(&json).unwrap();
    Traced {
        summary: json_lines(&text)
            .pop()
            .unwrap_or_else(|| panic!("no summary:\n{text}\n{stderr}")),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        folded: std::fs::read_to_string(&folded).unwrap(),
        stderr,
        svg,
        pprof,
    }
}

/// The C program under perf, both tools on the same run: the folded lines of its two
/// touching functions equal perf's, collapsed by inferno, and their counts are the program's
/// own getrusage figures; the folded counts of the process sum to the faults the tracer
/// reports for it; the flame graph and the pprof profile hold the same stacks and counts.
#[test]
fn c_program_folded_lines_equal_perfs_collapsed_stacks() {
    require_privileges();
    let dir = scratch("profiles-c");
    let bin = build_touch_two(&dir);
    let data = dir.join("perf.data");
    let run = traced(
        &dir,
        &["--stacks-top", "1000000", "--follow-children"],
        &perf_record_faults(&["-g"], data.to_str().unwrap(), &[bin.to_str().unwrap()]),
    );
    // The program's own count of each function's faults.
    assert!(
        run.stdout.contains("touch_small 256 touch_large 512"),
        "getrusage in the program: {}",
        run.stdout
    );
    let ours = parse_folded(&run.folded);
    check_folded_lines_against_perf(&run, &ours, &perf_collapsed(&data));
    check_every_fault_folded_once(&run, &ours);
    check_flamegraph_frames(&run);
    check_pprof_stacks(&run);
    std::fs::remove_dir_all(&dir).ok();
}

/// The folded lines of touch_two's two touching functions equal perf's collapsed ones,
/// with the counts of the program's getrusage; ours go on past libc to `_start`.
fn check_folded_lines_against_perf(
    run: &Traced,
    ours: &BTreeMap<String, u64>,
    perf: &BTreeMap<String, u64>,
) {
    assert!(
        perf.keys().any(|k| k.starts_with("touch_two;")),
        "perf recorded no fault of touch_two: {perf:?}"
    );
    for (leaf, pages) in [("touch_small", 256), ("touch_large", 512)] {
        let theirs = from_frame(perf, "touch_two", "__libc_start_call_main", leaf);
        let mine = from_frame(ours, "touch_two", "__libc_start_call_main", leaf);
        let expected = format!("__libc_start_call_main;main;{leaf} {pages}");
        assert_eq!(
            theirs,
            std::slice::from_ref(&expected),
            "perf's, collapsed: {perf:#?}"
        );
        // A miss names what the session could not keep (stacks dropped, frames with no
        // module): CI once lost every frame of the program's own binary under load.
        assert_eq!(
            mine,
            [expected],
            "ours: {}\nhealth: {}\nfault_health: {}\n{}",
            run.folded,
            run.summary["health"],
            run.summary["fault_health"],
            run.stderr
        );
        // perf's frame-pointer walk ends in libc, built without them; ours go on to _start
        // by libc's unwind tables.
        let full: Vec<&String> = ours
            .keys()
            .filter(|k| k.starts_with("touch_two;") && k.ends_with(&format!(";{leaf}")))
            .collect();
        assert_eq!(
            full,
            [&format!(
                "touch_two;_start;__libc_start_main_impl;__libc_start_call_main;main;{leaf}"
            )]
        );
    }
}

/// Every fault of the process, as the tracer counted it, is in the folded lines once.
fn check_every_fault_folded_once(run: &Traced, ours: &BTreeMap<String, u64>) {
    let process = run.summary["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["comm"] == "touch_two")
        .unwrap_or_else(|| panic!("touch_two in {}", run.summary));
    let faults =
        process["faults"]["minor"].as_u64().unwrap() + process["faults"]["major"].as_u64().unwrap();
    let folded_sum: u64 = ours
        .iter()
        .filter(|(k, _)| k.starts_with("touch_two;"))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(folded_sum, faults, "{}", run.folded);
    assert_eq!(run.summary["fault_health"]["stacks_dropped"], 0);
    assert!(run.stderr.contains("fault stacks folded"), "{}", run.stderr);
}

/// The flame graph: SVG with every frame of those stacks, counted in pages.
fn check_flamegraph_frames(run: &Traced) {
    let titles = svg_titles(&run.svg);
    for needle in [
        "touch_small (256 pages,",
        "touch_large (512 pages,",
        "main (",
        "touch_two (",
    ] {
        assert!(
            titles.iter().any(|t| t.starts_with(needle)),
            "{needle} in no title: {titles:#?}"
        );
    }
}

/// pprof: the sample types, and the same stacks in faults and in bytes.
fn check_pprof_stacks(run: &Traced) {
    let raw = go_pprof(&["-raw"], &run.pprof);
    assert!(
        raw.lines()
            .any(|l| l.trim() == "faults/count[dflt] bytes/bytes"),
        "{raw}"
    );
    let expected_stack = |leaf: &str| {
        [
            leaf,
            "main",
            "__libc_start_call_main",
            "__libc_start_main_impl",
            "_start",
        ]
        .map(String::from)
        .to_vec()
    };
    let by_faults = pprof_traces(&go_pprof(&["-traces"], &run.pprof), "touch_two");
    let by_bytes = pprof_traces(
        &go_pprof(&["-traces", "-sample_index=bytes"], &run.pprof),
        "touch_two",
    );
    for (leaf, faults, bytes) in [("touch_small", "256", "1MB"), ("touch_large", "512", "2MB")] {
        for (traces, value) in [(&by_faults, faults), (&by_bytes, bytes)] {
            let found: Vec<&String> = traces
                .iter()
                .filter(|(_, stack)| stack[0] == leaf)
                .map(|(v, stack)| {
                    assert_eq!(*stack, expected_stack(leaf));
                    v
                })
                .collect();
            assert_eq!(found, [value], "{leaf}: {traces:#?}");
        }
    }
}

/// The perf map node writes, for the folded lines of `grow.js`: touchAll's 1,024 faults
/// named from it, above grow.
fn node_touch_all(dir: &Path, script_arg: &[&str]) -> Traced {
    assert!(
        Path::new(NODE).is_file(),
        "{NODE} is missing (`cargo xtask test` installs nodejs)"
    );
    let script = dir.join("grow.js");
    std::fs::write(&script, GROW_JS).unwrap();
    let mut command = vec![
        NODE,
        "--perf-basic-prof",
        // Interpreted functions (grow) get a code object of their own, named in the map.
        "--interpreted-frames-native-stack",
        script.to_str().unwrap(),
    ];
    command.extend(script_arg);
    traced(dir, &["--stacks-top", "1000000"], &command)
}

/// Node with `--perf-basic-prof`: touchAll, called from grow, named from the perf map with
/// its 1,024 faults (every 8 KiB of an 8 MiB buffer), down to node's main, though the script deleted its map before exiting (it was read while
/// node ran); the flame graph shows it with that count.
#[test]
fn node_jit_frames_are_named_from_its_perf_map() {
    require_privileges();
    let dir = scratch("profiles-node");
    let run = node_touch_all(&dir, &["delete-map"]);
    let ours = parse_folded(&run.folded);
    // touchAll's stores fault in V8's store builtins it calls, which the walk gets past.
    let touch_all: Vec<(&String, &u64)> = ours
        .iter()
        .filter(|(stack, _)| {
            let frames: Vec<&str> = stack.split(';').collect();
            frames
                .windows(2)
                .any(|w| w[0].starts_with("JS:~grow ") && w[1].starts_with("JS:~touchAll "))
        })
        .collect();
    assert!(
        !touch_all.is_empty(),
        "no grow;touchAll line: {}",
        run.folded
    );
    let faults: u64 = touch_all.iter().map(|(_, n)| **n).sum();
    assert_eq!(faults, 1024, "{touch_all:#?}");
    for (stack, _) in &touch_all {
        // Down to the root: node's main tail-calls node::Start.
        assert!(
            stack.starts_with("node;_start;") && stack.contains(";node::Start(int, char**);"),
            "cut before node::Start: {stack}"
        );
    }
    assert!(!run.stderr.contains("wrote no perf map"), "{}", run.stderr);
    let titles = svg_titles(&run.svg);
    assert!(
        titles
            .iter()
            .any(|t| t.starts_with("JS:~touchAll ") && t.contains("(1,024 pages,")),
        "{titles:#?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Node without `--perf-basic-prof` wrote no map: the session says so, naming the process
/// (which lingers, see grow.js: a process gone before its code was seen is not reported).
#[test]
fn a_missing_perf_map_is_reported() {
    require_privileges();
    let dir = scratch("profiles-node-nomap");
    let script = dir.join("grow.js");
    std::fs::write(&script, GROW_JS).unwrap();
    let run = traced(&dir, &[], &[NODE, script.to_str().unwrap(), "linger"]);
    assert!(
        run.stderr
            .contains("ran generated code and wrote no perf map (/tmp/perf-"),
        "{}",
        run.stderr
    );
    let mut gz = Vec::new();
    std::fs::File::open(&run.pprof)
        .unwrap()
        .read_to_end(&mut gz)
        .unwrap();
    assert_eq!(&gz[..2], [0x1f, 0x8b], "gzip");
    std::fs::remove_dir_all(&dir).ok();
}

/// A profile file implies `--stacks`, as `perf script report flamegraph` works from the
/// call graphs it needs: `--flamegraph FILE` alone draws the kept stacks.
#[test]
fn a_flamegraph_alone_keeps_the_stacks_it_draws() {
    require_privileges();
    let dir = scratch("profiles-implied");
    let svg = dir.join("faults.svg");
    let out = Command::new(BIN)
        .args(["--stack-sample", "1", "--flamegraph"])
        .arg(&svg)
        .args(["--", BIN, "workload", "syscalls", "--report", "/dev/null"])
        .output()
        .expect("memlock-trace");
    let text = succeeded("--flamegraph without --stacks", &out);
    assert!(
        text.contains("user call site (innermost first)"),
        "the stacks were kept: {text}"
    );
    let titles = svg_titles(&svg);
    assert!(
        titles.iter().any(|t| t.starts_with("memlock-trace")),
        "the workload's stacks are drawn: {titles:?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

//! Runs on: host, 5.10, 6.1: the mapping a fault hit: 5.10 walks the rbtree, 6.1 calls bpf_find_vma
//! as 6.12 does
//!
//! Packages: python3
//!
//! Every fault in a named mapping, however short-lived the mapping or the process: the
//! mapping is resolved in the kernel at the fault (issue 22 item 3), so a region mapped,
//! touched and unmapped between two reads of /proc/PID/smaps, and a process that exits
//! before the first, are still named; pages populated inside a call are charged to the
//! mapping they went into. And a failed mlock on an unmapped range says so (item 4).
//!
//! Third-party programs: Debian's python3 (`cargo xtask test` installs it) and /bin/true.

mod common;
mod support;

use std::{
    path::Path,
    process::Command,
    sync::atomic::{AtomicUsize, Ordering},
};

use common::require_privileges;
use serde_json::Value;
use support::{BIN, json_lines};

const PYTHON: &str = "/usr/bin/python3";
const TRUE: &str = "/bin/true";
/// The scripts an argument names, written where the run's files go: (argument, file, text).
const SCRIPTS: [(&str, &str, &str); 2] = [
    (
        "SCRIPT",
        "mmap_touch.py",
        include_str!("third_party/mmap_touch.py"),
    ),
    (
        "GROW_SCRIPT",
        "grow_vma.py",
        include_str!("third_party/grow_vma.py"),
    ),
];

/// Rows asked for: more than any of these programs has, so the rows are every fault.
const TOP: &str = "500";

/// Runs `memlock-trace --json --events -o FILE -- PROGRAM ARGS`: the JSON lines, and the
/// program's own stdout.
fn traced(program: &str, args: &[&str]) -> (Vec<Value>, String) {
    traced_with(&[], program, args)
}

/// [`traced`] with more of the tracer's options (theirs `--top-mappings`, if they have one).
fn traced_with(options: &[&str], program: &str, args: &[&str]) -> (Vec<Value>, String) {
    assert!(
        Path::new(program).is_file(),
        "{program} is missing (`cargo xtask test` installs Debian's python3; or apt-get \
         install python3)"
    );
    // One directory per run: tests running side by side may trace the same program.
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "memlock-trace-mappings-{}-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed),
        Path::new(program).file_name().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace.json");
    let mut command = Command::new(BIN);
    command.args(options);
    if !options.contains(&"--top-mappings") {
        command.args(["--top-mappings", TOP]);
    }
    command
        .args(["--json", "--events=syscalls", "-o"])
        .arg(&trace)
        .arg("--")
        .arg(program);
    for arg in args {
        if let Some((_, name, text)) = SCRIPTS.iter().find(|(named, ..)| named == arg) {
            let script = dir.join(name);
            std::fs::write(&script, text).unwrap();
            command.arg(script);
        } else {
            command.arg(arg);
        }
    }
    let out = command.output().expect("memlock-trace");
    assert!(
        out.status.success(),
        "{:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = json_lines(&std::fs::read_to_string(&trace).unwrap());
    std::fs::remove_dir_all(&dir).ok();
    (lines, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs python3 on one of [`SCRIPTS`] under [`traced`]: the JSON lines, the account the
/// script printed, and its faults ([`faults_of`]).
fn traced_script(script: &str) -> (Vec<Value>, Value, Value) {
    let (lines, stdout) = traced(PYTHON, &[script]);
    let own = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("python's account: {e}: {stdout:?}"));
    let f = faults_of(&lines);
    (lines, own, f)
}

/// The faults object of the one process of the summary (the program itself).
fn faults_of(lines: &[Value]) -> Value {
    let summary = lines.iter().rev().find(|l| l["type"] == "summary").unwrap();
    let processes = summary["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "{summary}");
    processes[0]["faults"].clone()
}

fn hex(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16).unwrap()
}

/// Every fault is in a row, and rows no mapping names hold under 1% of them.
fn assert_every_fault_named(f: &Value) -> &Vec<Value> {
    let rows = f["by_mapping"].as_array().unwrap();
    assert!(rows.len() < TOP.parse().unwrap(), "rows truncated: {f}");
    let total = f["minor"].as_u64().unwrap() + f["major"].as_u64().unwrap();
    let in_rows: u64 = rows.iter().map(|r| r["faults"].as_u64().unwrap()).sum();
    assert_eq!(
        in_rows, total,
        "faults and populated pages sum per mapping: {f:#}"
    );
    let unnamed: u64 = rows
        .iter()
        .filter(|r| r["mapping"] == "unknown" || r["mapping"] == "unmapped")
        .map(|r| r["faults"].as_u64().unwrap())
        .sum();
    assert!(
        unnamed * 100 < total,
        "{unnamed} of {total} faults in no named mapping: {f:#}"
    );
    rows
}

/// The faults of the bundled thread-stack workload: `threads` threads with 2 MiB stacks of
/// which each uses 256 KiB.
#[cfg(feature = "lab")]
fn traced_thread_stack(options: &[&str], threads: usize) -> Value {
    let threads = threads.to_string();
    let (lines, _) = traced_with(
        options,
        BIN,
        &[
            "scenario",
            "thread-stack",
            "--variant",
            "off",
            "--threads",
            &threads,
            "--stack-mib",
            "2",
            "--stack-used-kib",
            "256",
        ],
    );
    faults_of(&lines)
}

/// The row whose range holds `addr`.
fn row_holding(rows: &[Value], addr: u64) -> &Value {
    rows.iter()
        .find(|r| {
            r["end"].as_str() != Some("") && hex(&r["start"]) <= addr && addr < hex(&r["end"])
        })
        .unwrap_or_else(|| panic!("no row holds {addr:#x}: {rows:#?}"))
}

#[test]
fn short_lived_python_mappings_are_named_and_populated_pages_charged_to_theirs() {
    require_privileges();
    let (lines, own, f) = traced_script("SCRIPT");
    let rows = assert_every_fault_named(&f);

    // Each region was mapped, touched and unmapped in well under 40 ms: named from the
    // kernel at the fault, with every page it touched (regions at one address are one row).
    let pages = own["touched_pages"].as_u64().unwrap();
    for addr in own["touched"].as_array().unwrap() {
        let addr = addr.as_u64().unwrap();
        let same = own["touched"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a.as_u64() == Some(addr))
            .count() as u64;
        let row = row_holding(rows, addr);
        assert_eq!(row["mapping"], "anonymous", "{row}");
        assert_eq!(row["named_by"], "fault", "{row}");
        assert!(row["faults"].as_u64().unwrap() >= same * pages, "{row}");
    }

    // mmap(MAP_POPULATE): its pages charged to its mapping, not left out.
    let populated = own["populated_pages"].as_u64().unwrap();
    assert!(
        f["populated_by"]["mmap"].as_u64().unwrap() >= populated,
        "{f:#}"
    );
    let row = row_holding(rows, own["populated"].as_u64().unwrap());
    assert!(row["faults"].as_u64().unwrap() >= populated, "{row}");

    // python3's own file mappings are named with their paths.
    assert!(
        rows.iter().any(|r| r["mapping"]
            .as_str()
            .unwrap()
            .starts_with("/usr/bin/python3")),
        "{rows:#?}"
    );

    // mlock(0x10000, 4096): ENOMEM because nothing is mapped there, not the limit.
    assert_eq!(
        (own["mlock_ret"].as_i64(), own["mlock_errno"].as_i64()),
        (Some(-1), Some(12))
    );
    let mlock = lines
        .iter()
        .find(|l| l["type"] == "syscall" && l["syscall"] == "mlock")
        .unwrap_or_else(|| panic!("no mlock event"));
    assert_eq!(mlock["errno"], "ENOMEM", "{mlock}");
    assert_eq!(mlock["failed_check"], "unmapped", "{mlock}");
    assert_eq!(mlock["range_mapped"], false, "{mlock}");
    assert_eq!(mlock["first_unmapped"], 0x10000, "{mlock}");
}

#[test]
fn every_fault_of_bin_true_is_in_a_named_mapping() {
    require_privileges();
    let (lines, _) = traced(TRUE, &[]);
    let f = faults_of(&lines);
    let rows = assert_every_fault_named(&f);
    // It exits long before any smaps read: the kernel named them all.
    assert!(
        rows.iter()
            .all(|r| r["named_by"] == "fault" || r["named_by"] == "call"),
        "{rows:#?}"
    );
    // Its own file (busybox, in the guests), by the name the kernel keeps (`d_name`: the
    // process is gone before smaps could give the path), with its identity; its stack.
    let program = std::fs::canonicalize(TRUE).unwrap();
    let name = program.file_name().unwrap().to_str().unwrap();
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&program).unwrap());
    let own = rows
        .iter()
        .find(|r| r["mapping"] == name || r["mapping"] == program.to_str().unwrap())
        .unwrap_or_else(|| panic!("no {name} row: {rows:#?}"));
    assert_eq!(own["file"]["inode"], inode, "{own}");
    assert!(
        rows.iter().any(|r| r["mapping"] == "[stack]"),
        "no [stack] row: {rows:#?}"
    );
}

#[test]
fn a_failed_mlock_on_an_unmapped_range_says_so_in_text() {
    require_privileges();
    let out = Command::new(BIN)
        .args(["-q", "--events=syscalls", "--fault-hooks", "off", "--"])
        .args([PYTHON, "-c"])
        .arg(
            "import ctypes; l = ctypes.CDLL(None); \
             l.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]; l.mlock(0x10000, 4096)",
        )
        .output()
        .expect("memlock-trace");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    // Root has CAP_IPC_LOCK: the limit is named as the one that does not apply.
    let want = "mlock(0x10000, 4096) = -1 ENOMEM: range not mapped at 0x10000: CAP_IPC_LOCK, so \
                no limit applies (RLIMIT_MEMLOCK ";
    assert!(text.contains(want), "no {want:?} in:\n{text}");
    assert!(
        text.contains("  mlock ENOMEM (last): range not mapped at 0x10000: "),
        "{text}"
    );
}

/// A thread's stack is told from other anonymous memory at the fault (the `stack` flag: the
/// faulting thread's stack pointer was inside the VMA), which `advise` needs for threads that
/// come and go before /proc shows their stacks: the bundled thread-stack workload with one
/// thread of a 2 MiB stack using 256 KiB has exactly one anonymous row flagged, of that
/// size and those pages (and glibc's thread descriptor at its top), beside the main
/// `[stack]`; no other row is.
#[cfg(feature = "lab")]
#[test]
fn a_threads_stack_is_told_apart_at_the_fault() {
    require_privileges();
    let f = traced_thread_stack(&[], 1);
    let rows = assert_every_fault_named(&f);
    let stacks: Vec<&Value> = rows.iter().filter(|r| r["stack"] == true).collect();
    let names: Vec<&str> = stacks
        .iter()
        .map(|r| r["mapping"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{stacks:#?}");
    assert!(names.contains(&"[stack]"), "{stacks:#?}");
    let thread = stacks.iter().find(|r| r["mapping"] == "anonymous").unwrap();
    assert_eq!(
        hex(&thread["end"]) - hex(&thread["start"]),
        2 << 20,
        "{thread}"
    );
    let used_pages = 256 / 4;
    let faults = thread["faults"].as_u64().unwrap();
    assert!(
        (used_pages..=used_pages + 4).contains(&faults),
        "{faults} faults on a stack that used {used_pages} pages: {thread}"
    );
}

/// Threads created at once keep the mmap lock busy (each stack's `mmap` and `mprotect`,
/// each thread's signal stack and malloc arena) while the threads before them touch their
/// stacks. When the tracepoint set looked faults up with `bpf_find_vma` (which only tries
/// the lock), whole stacks failed: 6 to 21 of 32 named, up to 62% of the faults `unknown`,
/// until their pages waited for a later lookup; now it walks the tree without the lock.
/// Every stack is one named row, told as a stack, after the process has exited. Also with
/// `--latency-sample`, whose lookups run at the fault's start, before the kernel grows the
/// main stack (once: none told as a stack, the main stack's growth `unknown`).
#[cfg(feature = "lab")]
#[test]
fn threads_created_at_once_have_every_stack_named() {
    require_privileges();
    let threads = 32;
    for options in [&[][..], &["--latency-sample", "4"]] {
        let f = traced_thread_stack(options, threads);
        let rows = assert_every_fault_named(&f);
        let used_pages = 256 / 4;
        // 2 MiB, or a little more: the kernel merges a stack with an adjacent anonymous
        // mapping of the same protection (another thread's 12 KiB signal stack, mapped
        // read-write before its guard page is made; seen under load: 2,060 KiB).
        let stack_size = (2 << 20)..(2 << 20) + (64 << 10);
        let stacks: Vec<&Value> = rows
            .iter()
            .filter(|r| {
                r["mapping"] == "anonymous"
                    && r["end"] != ""
                    && stack_size.contains(&(hex(&r["end"]) - hex(&r["start"])))
                    && r["faults"].as_u64().unwrap() >= used_pages
            })
            .collect();
        assert_eq!(stacks.len(), threads, "{options:?}: {rows:#?}");
        assert!(
            stacks.iter().all(|r| r["stack"] == true),
            "{options:?}: a thread's stack not told as one: {stacks:#?}"
        );
    }
}

/// Issue 47 point 1: the hooks key a VMA by its start at the fault, so one VMA grown
/// downwards in ten 1 MiB steps (each mapped just below it and merged into it, as
/// memcached's slab VMA grows) was ten rows sharing an end, and a region touched and then
/// mlocked in part was two overlapping rows (one before the mlock, one after). Each is one
/// row, exactly the range `/proc/PID/maps` showed for it, with exactly the faults the
/// script made there (pages touched, and pages mlock populated); the mlocked one partly
/// locked.
#[test]
fn a_vma_met_under_several_starts_is_one_row_at_its_widest() {
    require_privileges();
    let (_, own, f) = traced_script("GROW_SCRIPT");
    let rows = assert_every_fault_named(&f);
    for (region, vmas) in [("grown", 1), ("locked", 2)] {
        let (start, end) = (
            own[region][0].as_u64().unwrap(),
            own[region][1].as_u64().unwrap(),
        );
        // What /proc/self/maps showed at the end: the region, in `vmas` VMAs.
        let seen = own[format!("{region}_vmas")].as_array().unwrap();
        assert_eq!(seen.len(), vmas, "{region}: {own}");
        assert_eq!(
            (seen[0][0].as_u64(), seen[vmas - 1][1].as_u64()),
            (Some(start), Some(end)),
            "{region}: {own}"
        );
        let overlapping: Vec<&Value> = rows
            .iter()
            .filter(|r| r["end"] != "" && hex(&r["start"]) < end && start < hex(&r["end"]))
            .collect();
        assert_eq!(overlapping.len(), 1, "{region}: {overlapping:#?}");
        let row = overlapping[0];
        assert_eq!(
            (hex(&row["start"]), hex(&row["end"])),
            (start, end),
            "{region}: {row}"
        );
        assert_eq!(
            row["faults"],
            own[format!("{region}_faults")],
            "{region}: {row}"
        );
        assert_eq!(row["mapping"], "anonymous", "{region}: {row}");
        let partly = region == "locked";
        assert_eq!(
            (&row["locked"], &row["partly_locked"]),
            (&Value::Bool(partly), &Value::Bool(partly)),
            "{region}: {row}"
        );
    }
}

/// `--top-mappings N` says what it left out: in JSON the count of rows and faults, in text a
/// line under the table; the rows shown and those left out hold every fault.
#[test]
fn the_rows_top_mappings_left_out_are_counted() {
    require_privileges();
    let (lines, _) = traced_with(&["--top-mappings", "2"], TRUE, &[]);
    let f = faults_of(&lines);
    let rows = f["by_mapping"].as_array().unwrap();
    let left_out = &f["by_mapping_left_out"];
    assert_eq!(rows.len(), 2, "{f:#}");
    assert!(left_out["mappings"].as_u64().unwrap() > 0, "{f:#}");
    let shown: u64 = rows.iter().map(|r| r["faults"].as_u64().unwrap()).sum();
    assert_eq!(
        shown + left_out["faults"].as_u64().unwrap(),
        f["minor"].as_u64().unwrap() + f["major"].as_u64().unwrap(),
        "{f:#}"
    );

    let out = Command::new(BIN)
        .args(["-q", "--top-mappings", "2", "--", TRUE])
        .output()
        .expect("memlock-trace");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let number = |word: &str| word.trim_end_matches(',').parse::<u64>().ok();
    // `page faults: 70 minor, 0 major = ...`
    let header: Vec<&str> = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("page faults: "))
        .unwrap_or_else(|| panic!("no page faults line: {text}"))
        .split_whitespace()
        .collect();
    let total = number(header[0]).unwrap() + number(header[2]).unwrap();
    // The rows under `faults  major  locked  mapping`, then `... 5 more mappings, ...`.
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("faults  major  locked"))
        .skip(1)
        .collect();
    let column = |i: usize| -> u64 {
        table
            .iter()
            .take(2)
            .map(|l| number(l.split_whitespace().nth(i).unwrap()).unwrap())
            .sum()
    };
    let (shown, shown_majors) = (column(0), column(1));
    let more: Vec<&str> = table[2]
        .trim()
        .strip_prefix("... ")
        .unwrap_or_else(|| panic!("no left-out line: {text}"))
        .split_whitespace()
        .collect();
    assert!(number(more[0]).unwrap() > 0, "{text}");
    // `N faults, M major` (the majors of the rows left out).
    assert_eq!(
        (more[1], more[2], more[4], more[6], more[7]),
        ("more", "mappings,", "faults,", "major", "(--top-mappings"),
        "{text}"
    );
    assert_eq!(shown + number(more[3]).unwrap(), total, "{text}");
    // The major column and the left-out majors add up to the header's major faults.
    assert_eq!(
        shown_majors + number(more[5]).unwrap(),
        number(header[2]).unwrap(),
        "{text}"
    );
}

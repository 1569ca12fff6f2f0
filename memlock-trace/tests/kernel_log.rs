//! Runs on: host, 6.1: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! `-v`: the eBPF programs' own diagnostics reach stderr through aya-log, named by program,
//! for the events the kernel counts (a full target map here, deterministic), and without
//! `-v` the log code is not even in the loaded programs (the verifier removed it). Every
//! kernel the tests run on (the host, and the 5.10, 6.1 and 6.12 guests) must load every
//! program with its diagnostics: a refusal fails the tests.

mod common;
mod support;

use std::{collections::BTreeMap, process::Command};

use common::require_privileges;
use support::{BIN, Tracer, bpf_ids, summary, workload_children};

/// `memlock-trace ARGS --json --follow-children --max-targets 3 -- memlock-trace workload
/// children --count 4 --calls 1`: room for the command and its first 2 children, so the
/// kernel cannot follow the other 2 (both logged whatever their CPUs: a record is written
/// for the 1st, 2nd, 4th, ... occurrence on each CPU). Returns (children, summary, stderr).
fn full_target_map(args: &[&str]) -> (Vec<u32>, serde_json::Value, String) {
    let report = std::env::temp_dir().join(format!(
        "memlock-trace-kernel-log-{}-{}.json",
        std::process::id(),
        args.len()
    ));
    let out = Command::new(BIN)
        .args(args)
        .args(["--json", "--follow-children", "--max-targets", "3", "--"])
        .args([BIN, "workload", "children", "--count", "4", "--calls", "1"])
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (
        workload_children(&report),
        summary(&String::from_utf8_lossy(&out.stdout)),
        stderr,
    )
}

/// Every kernel this runs on must load every program with its diagnostics: no refusal for
/// complexity (E2BIG, which the tracer reports as the error `DIAGNOSTICS_REFUSED`). A hook
/// set lost or changed by them is caught by comparing the programs loaded without and with
/// `-v` ([`without_verbose_the_log_code_is_not_loaded`]).
fn assert_diagnostics_loaded(stderr: &str) {
    assert!(
        !stderr.contains(memlock_trace::session::DIAGNOSTICS_REFUSED)
            && !stderr.contains("(os error 7)"),
        "the programs with -v's diagnostics were refused:\n{stderr}"
    );
}

fn kernel_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("memlock-trace: kernel: "))
        .collect()
}

/// The lines among `lines` that `keep` holds for.
fn lines_where<'a>(lines: &[&'a str], keep: impl Fn(&str) -> bool) -> Vec<&'a str> {
    lines.iter().copied().filter(|l| keep(l)).collect()
}

#[test]
fn verbose_names_the_program_and_the_full_map_for_each_child_not_followed() {
    require_privileges();
    let (children, s, stderr) = full_target_map(&["-v"]);
    assert_diagnostics_loaded(&stderr);
    assert_eq!(s["health"]["processes"]["children_not_followed"], 2);
    let lines = kernel_lines(&stderr);
    let parent = s["processes"][0]["pid"].as_u64();
    let not_followed = lines_where(&lines, |l| {
        l.contains("process_fork: warning: map TARGET_TGIDS full")
    });
    // Each of the last 2 children, by pid, with its parent.
    assert_eq!(not_followed.len(), 2, "{stderr}");
    for child in &children[2..] {
        assert!(
            not_followed
                .iter()
                .any(|l| l.contains(&format!("child {child} of "))),
            "no line for child {child} (parent {parent:?}):\n{stderr}"
        );
    }
    // The targets that left the set: the command and the 2 children followed.
    let left = lines_where(&lines, |l| {
        l.starts_with("memlock-trace: kernel: process_exit: pid ")
    });
    assert_eq!(left.len(), 3, "{stderr}");
    for child in &children[..2] {
        assert!(
            left.iter()
                .any(|l| l.contains(&format!("pid {child} left the target set"))),
            "{stderr}"
        );
    }
    assert_eq!(lines.len(), 5, "nothing else was logged:\n{stderr}");
}

/// A failed kernel read is named by its field: with the syscall programs' `mm` pointer made
/// unreadable (`--test-unreadable-mm`), each program that read through it writes a record,
/// which the loader turns into the names of the `mm_struct` fields (`diag::FIELDS`).
#[test]
fn verbose_names_the_fields_a_program_could_not_read() {
    require_privileges();
    let out = Command::new(BIN)
        .args([
            "-v",
            "--test-unreadable-mm",
            "--",
            BIN,
            "workload",
            "syscalls",
        ])
        .args(["--report", "/dev/null"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_diagnostics_loaded(&stderr);
    let failed = |program: &str| -> Vec<&str> {
        kernel_lines(&stderr)
            .into_iter()
            .filter(|l| {
                l.starts_with(&format!("memlock-trace: kernel: {program}"))
                    && l.contains(": warning: kernel read failed, reported as 0 or unknown: ")
            })
            .collect()
    };
    // `program` warned of failed reads, each naming `fields` and not `unread`.
    let assert_failed_reads = |program: &str, fields: &str, unread: &str| {
        let lines = failed(program);
        assert!(!lines.is_empty(), "{stderr}");
        for line in &lines {
            assert!(line.contains(fields) && !line.contains(unread), "{line}");
        }
    };
    // At entry: the counters and the limits (total_vm); the fields not read through mm are
    // not named. A count of faults is a user address (read fails) or 0 (NULL struct).
    assert_failed_reads(
        "sys_enter_m",
        "mm_struct.locked_vm, mm_struct.map_count, mm_struct.total_vm (",
        "task_struct",
    );
    // At exit: the counters.
    assert_failed_reads(
        "sys_exit_mlock_family",
        "mm_struct.locked_vm, mm_struct.map_count (",
        "total_vm",
    );
}

#[test]
fn without_verbose_the_kernel_says_nothing_but_still_counts() {
    require_privileges();
    let (_, s, stderr) = full_target_map(&[]);
    assert_eq!(s["health"]["processes"]["children_not_followed"], 2);
    assert_eq!(kernel_lines(&stderr), Vec::<&str>::new(), "{stderr}");
}

/// Translated size and instructions the verifier processed (where the kernel says, 5.16+)
/// of each program a running tracer holds, by name.
fn loaded_sizes(args: &[&str]) -> (BTreeMap<String, (u32, Option<u32>)>, String) {
    let mut cmd_args = args.to_vec();
    cmd_args.extend(["--", "sleep", "10"]);
    let mut tracer = Tracer::spawn(&cmd_args);
    // Loading takes minutes in an emulated guest on a loaded machine: wait up to 300 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while !tracer.stderr().contains("memlock-trace: tracing ") {
        if let Ok(Some(status)) = tracer.child.try_wait() {
            panic!("memlock-trace exited ({status}):\n{}", tracer.stderr());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not tracing within 300 s:\n{}",
            tracer.stderr()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let ids = bpf_ids(tracer.pid());
    let sizes: BTreeMap<String, (u32, Option<u32>)> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| ids.programs.contains(&p.id()))
        .map(|p| {
            (
                p.name_as_str().unwrap_or("?").to_string(),
                (
                    p.size_translated().expect("root sees translated sizes"),
                    p.verified_instruction_count(),
                ),
            )
        })
        .collect();
    tracer.signal(libc::SIGINT);
    let done = tracer.finish();
    assert!(done.status.success(), "{}", done.stderr);
    (sizes, done.stderr)
}

#[test]
fn without_verbose_the_log_code_is_not_loaded() {
    require_privileges();
    // --follow-children: process_fork too.
    let quiet = loaded_sizes(&["--follow-children"]).0;
    let (verbose, stderr) = loaded_sizes(&["-v", "--follow-children"]);
    assert_diagnostics_loaded(&stderr);
    let count = |n: Option<u32>| n.map_or("?".to_string(), |n| n.to_string());
    eprintln!("translated bytes and verified instructions, without -v / with -v:");
    for (name, (size, insns)) in &quiet {
        let (v_size, v_insns) = verbose[name];
        eprintln!(
            "  {name:<16} {size:>6} {v_size:>6}   {:>7} {:>7}",
            count(*insns),
            count(v_insns)
        );
    }
    assert_eq!(
        quiet.keys().collect::<Vec<_>>(),
        verbose.keys().collect::<Vec<_>>(),
        "-v loads the same programs"
    );
    for (name, &(size, _)) in &quiet {
        assert!(
            size <= verbose[name].0,
            "{name}: {size} > {}",
            verbose[name].0
        );
    }
    // Programs with diagnostics: the code is there with -v only (the kernel keeps 15 bytes
    // of a program's name; the syscall dispatchers are `syscall_enter_find_vma` where the
    // kernel has `bpf_find_vma`, else `syscall_enter`, and the program on the calls' events,
    // where fentry is refused, `syscall_enter_event`).
    for prefix in [
        "syscall_enter",
        "syscall_exit",
        "process_fork",
        "process_exit",
    ] {
        let mut loaded: Vec<&String> = quiet.keys().filter(|n| n.starts_with(prefix)).collect();
        if loaded.is_empty() && prefix.starts_with("syscall_") {
            // Where fentry is allowed the handlers run from one program per call instead
            // (`sys_mlock_enter`, `sys_mlock_exit_`...): mlock's stands for them.
            let per_call = prefix.replace("syscall_", "sys_mlock_");
            loaded = quiet.keys().filter(|n| n.starts_with(&per_call)).collect();
        }
        assert_eq!(loaded.len(), 1, "{prefix}: {loaded:?}");
        let name = loaded[0].as_str();
        assert!(
            quiet[name].0 < verbose[name].0,
            "{name}: {} without -v, {} with",
            quiet[name].0,
            verbose[name].0
        );
    }
}

//! `-v`: the eBPF programs' own diagnostics reach stderr through aya-log, named by program,
//! for the events the kernel counts (a full target map here, deterministic), and without
//! `-v` the log code is not even in the loaded programs (the verifier removed it).

mod common;
mod support;

use std::{collections::BTreeMap, process::Command};

use common::require_privileges;
use support::{BIN, Tracer, bpf_ids, summary};

/// `memlock-trace ARGS --json --follow-children --max-targets 3 -- memlock-trace workload
/// children --count 4 --calls 1`: room for the command and its first 2 children, so the
/// kernel cannot follow the other 2 (both logged whatever their CPUs: a record is written
/// for the 1st, 2nd, 4th, ... occurrence on each CPU). Returns (children, summary, stderr).
fn full_target_map(args: &[&str]) -> (Vec<u64>, serde_json::Value, String) {
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
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    std::fs::remove_file(&report).ok();
    let children = r["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    (
        children,
        summary(&String::from_utf8_lossy(&out.stdout)),
        stderr,
    )
}

/// Where the kernel's verifier refuses the programs with their diagnostics (Debian 12's 6.1
/// gives up on `sys_enter_mlock2` at its 1M-instruction limit), `-v` must say so loudly, name
/// the program, and trace without them: that is what is checked there, nothing is skipped.
fn diagnostics_refused(stderr: &str) -> bool {
    let refused = stderr.contains(memlock_trace::session::DIAGNOSTICS_REFUSED);
    if refused {
        assert!(stderr.contains("the kernel refused"), "{stderr}");
        assert!(kernel_lines(stderr).is_empty(), "{stderr}");
        eprintln!("this kernel refuses the -v diagnostics, as the tracer said:\n{stderr}");
    }
    refused
}

fn kernel_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("memlock-trace: kernel: "))
        .collect()
}

#[test]
fn verbose_names_the_program_and_the_full_map_for_each_child_not_followed() {
    require_privileges();
    let (children, s, stderr) = full_target_map(&["-v"]);
    assert_eq!(s["health"]["processes"]["children_not_followed"], 2);
    if diagnostics_refused(&stderr) {
        return;
    }
    let lines = kernel_lines(&stderr);
    let parent = s["processes"][0]["pid"].as_u64();
    let not_followed: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.contains("process_fork: warning: map TARGET_TGIDS full"))
        .collect();
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
    let left: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("memlock-trace: kernel: process_exit: pid "))
        .collect();
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

#[test]
fn without_verbose_the_kernel_says_nothing_but_still_counts() {
    require_privileges();
    let (_, s, stderr) = full_target_map(&[]);
    assert_eq!(s["health"]["processes"]["children_not_followed"], 2);
    assert_eq!(kernel_lines(&stderr), Vec::<&str>::new(), "{stderr}");
}

/// Translated size of each program a running tracer holds, by name.
fn loaded_sizes(args: &[&str]) -> (BTreeMap<String, u32>, String) {
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
    let sizes: BTreeMap<String, u32> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| ids.programs.contains(&p.id()))
        .map(|p| {
            (
                p.name_as_str().unwrap_or("?").to_string(),
                p.size_translated().expect("root sees translated sizes"),
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
    let quiet = loaded_sizes(&[]).0;
    let (verbose, stderr) = loaded_sizes(&["-v"]);
    if diagnostics_refused(&stderr) {
        assert_eq!(
            quiet, verbose,
            "without its diagnostics, -v loads the same programs"
        );
        return;
    }
    eprintln!("translated bytes without -v / with -v:");
    for (name, size) in &quiet {
        eprintln!("  {name:<28} {size:>6} {:>6}", verbose[name]);
    }
    assert_eq!(
        quiet.keys().collect::<Vec<_>>(),
        verbose.keys().collect::<Vec<_>>()
    );
    for (name, &size) in &quiet {
        assert!(size <= verbose[name], "{name}: {size} > {}", verbose[name]);
    }
    // Programs with diagnostics: the code is there with -v only (the kernel keeps 15 bytes
    // of a program's name).
    for name in ["sys_enter_mlock", "sys_exit_mlock_", "process_exit"] {
        assert!(
            quiet[name] < verbose[name],
            "{name}: {} without -v, {} with",
            quiet[name],
            verbose[name]
        );
    }
}

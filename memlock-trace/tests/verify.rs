//! Runs on: host, 5.10, 6.1, 6.12, arm64
//!
//! `memlock-trace verify` for real: loads the programs into the running kernel, runs every
//! scenario in child processes and fails on any step where the expectation, the tracer and
//! /proc disagree. Needs root (CAP_BPF + CAP_PERFMON); the same binary runs on the host and
//! in the qemu guest, so both the tp_btf and the fentry hook sets are exercised.
#![cfg(feature = "lab")]

use std::io::Read as _;

use memlock_trace::{lab::verify, probe};

/// Every step the suite must report, in order.
const STEPS: [&str; 18] = [
    "mlock-middle",
    "mlock-adjacent",
    "munlock-all",
    "mlock-across-prot-exec",
    "mlock2-onfault",
    "onfault-touch",
    "mlockall-future-mmap",
    "munlockall",
    "mmap-after-munlockall",
    "mlock-before-fork",
    "fork-child",
    "thread-shares-lock",
    "thp-mlock-cut",
    "thp-munlock",
    // Under memory pressure, with swap and a memory cgroup the step sets up and puts back.
    "pressure-locked",
    "pressure-unlocked",
    "munlock-under-limit",
    "pressure-after-munlock",
];

fn require_root() {
    // SAFETY: plain getter.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "this test loads eBPF programs and needs root (or CAP_BPF+CAP_PERFMON); it is not \
         skipped: run it with sudo (euid is {euid}, kernel {})",
        probe::kernel_release()
    );
}

#[test]
fn every_step_agrees_with_the_tracer_and_proc() {
    require_root();
    let report = verify::run_suite().unwrap_or_else(|e| panic!("verify could not run: {e:#}"));
    let table = verify::table(&report);
    println!("{table}");
    // It fits a terminal; the three views in full are in `verify --json`.
    for line in table.lines() {
        assert!(
            line.chars().count() <= 100,
            "{} columns: {line}",
            line.len()
        );
    }
    let steps: Vec<&str> = report.steps.iter().map(|s| s.step.as_str()).collect();
    assert_eq!(steps, STEPS, "{table}");
    assert_eq!((report.passed, report.failed), (STEPS.len(), 0), "{table}");
    // The exact figures behind the first step: one 16-page VMA became 4 + 8 locked + 4 pages.
    let first = &report.steps[0];
    let pages: Vec<(u64, bool)> = first
        .traced_layout
        .iter()
        .map(|p| ((p.end - p.start) / 4096, p.locked))
        .collect();
    assert_eq!(pages, [(4, false), (8, true), (4, false)], "{table}");
    assert_eq!(first.traced_layout, first.proc_layout, "{table}");
    // Whichever hook set this kernel allows, the report names it; where fentry loads, the
    // kernel's own split function is seen splitting.
    let btf = probe::KernelBtf::load().expect("the kernel's BTF");
    if btf.field_offset("mm_struct", "mm_mt").is_err() {
        // Before 6.1 (5.10): no maple tree, so the snapshots walk the rbtree and no store is
        // traced; the steps above agreed all the same.
        assert!(
            report.hooks.contains("bounded walk of mm->mm_rb"),
            "{}",
            report.hooks
        );
        assert_eq!(first.stores, 0, "{table}");
        if !btf.has_enum_member("bpf_func_id", "BPF_FUNC_get_func_arg") {
            // The function programs read their arguments with it (5.17).
            assert!(
                report.hooks.contains("no bpf_get_func_arg"),
                "{}",
                report.hooks
            );
            assert!(first.functions.is_empty(), "{table}");
        }
        return;
    }
    assert!(
        report.hooks.contains("tp_btf maple_tree:ma_write"),
        "{}",
        report.hooks
    );
    let fentry = probe::capabilities()
        .expect("probing the kernel")
        .into_iter()
        .find(|c| c.name == "fentry")
        .is_some_and(|c| c.usable);
    if fentry {
        assert!(report.hooks.starts_with("fentry+fexit"), "{}", report.hooks);
        assert!(
            first.functions.iter().any(|f| f.ends_with("split_vma")),
            "no split function entered for {}: {:?}\n{table}",
            first.step,
            first.functions
        );
    } else {
        assert!(report.hooks.contains("fentry refused"), "{}", report.hooks);
        // Without fentry, the two splits show as stores: the two split-off pieces, and where
        // splits go through `__vma_adjust` (before 6.3: Debian 12's 6.1, on arm64 here) one
        // more, of the original VMA's new bounds.
        let stores = if btf.has_function("__vma_adjust") {
            3
        } else {
            2
        };
        assert_eq!(first.stores, stores, "{table}");
    }
}

#[test]
fn without_privileges_verify_names_the_missing_capabilities() {
    require_root();
    let (mut read, write) = std::io::pipe().expect("pipe");
    // SAFETY: the child only drops privileges, runs verify's privilege check and writes the
    // error to the pipe before _exit.
    match unsafe { libc::fork() } {
        -1 => panic!("fork: {}", std::io::Error::last_os_error()),
        0 => {
            drop(read);
            let message = if unsafe { libc::setresuid(65534, 65534, 65534) } != 0 {
                format!("setresuid: {}", std::io::Error::last_os_error())
            } else {
                match verify::run(false, None) {
                    Ok(code) => format!("verify ran unprivileged and returned {code}"),
                    Err(e) => format!("{e:#}"),
                }
            };
            let mut write = write;
            let _ = std::io::Write::write_all(&mut write, message.as_bytes());
            unsafe { libc::_exit(0) }
        }
        child => {
            drop(write);
            let mut message = String::new();
            read.read_to_string(&mut message)
                .expect("reading the child's error");
            let mut status = 0;
            unsafe { libc::waitpid(child, &mut status, 0) };
            assert!(
                // CAP_DAC_READ_SEARCH is named too where tracefs is mode 0700.
                message
                    .contains("missing capabilities CAP_BPF, CAP_PERFMON and CAP_DAC_READ_SEARCH")
                    || message.contains("missing capabilities CAP_BPF and CAP_PERFMON"),
                "{message}"
            );
            assert!(
                message.starts_with("verify needs to load eBPF programs"),
                "{message}"
            );
        }
    }
}

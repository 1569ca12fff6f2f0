//! Runs on: host, 6.1, arm64: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! The whole suite at tiny sizes, tracer attached: every scenario must produce its numbers
//! and every tracer-versus-workload consistency check must hold.
#![cfg(feature = "lab")]

mod common;
mod support;

use std::process::Command;

use common::require_privileges;
use support::{BIN, suite_report};

#[test]
fn every_scenario_runs_and_the_tracer_agrees_with_the_workload() {
    require_privileges();
    let out_dir = std::env::temp_dir().join(format!("memlock-trace-suite-{}", std::process::id()));
    let mut cmd = Command::new(BIN);
    cmd.args(["suite", "--tiny", "--out"]).arg(&out_dir);
    // vm-memory boots qemu; inside the test VM there is no qemu to nest, and the host stage
    // runs it. Said out loud, not skipped silently.
    let in_vm = std::env::var_os("MEMLOCK_TRACE_IN_VM").is_some();
    // The emulated arm64 guest has time for a few: `cargo xtask test` names them.
    let chosen = std::env::var("MEMLOCK_TRACE_SCENARIOS").ok();
    let expected: Vec<&str> = memlock_trace::lab::workload::scenario::Scenario::ALL
        .iter()
        .map(|s| s.name())
        .filter(|&name| !(in_vm && name == "vm-memory"))
        .filter(|name| {
            chosen
                .as_ref()
                .is_none_or(|c| c.split(',').any(|n| n == *name))
        })
        .collect();
    if let Some(chosen) = &chosen {
        eprintln!("NOTE: MEMLOCK_TRACE_SCENARIOS={chosen}: only {expected:?}");
        assert!(
            !expected.is_empty(),
            "MEMLOCK_TRACE_SCENARIOS names no scenario"
        );
    }
    if in_vm {
        eprintln!(
            "NOTE: inside the test VM: running every scenario but vm-memory (no nested qemu) and \
             without the advice section (advise --apply needs the preload library, which the \
             guest does not carry); the host stage runs both (test:seed_advice)"
        );
        cmd.arg("--no-advice");
    }
    if in_vm || chosen.is_some() {
        for name in &expected {
            cmd.args(["--scenario", name]);
        }
    }
    let report = suite_report(&mut cmd, &out_dir);
    let scenarios = report["scenarios"].as_array().unwrap();
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(names, expected);
    for s in scenarios {
        let name = s["scenario"].as_str().unwrap();
        assert!(
            s["workload"].as_object().is_some_and(|w| !w.is_empty()),
            "{name} produced no numbers"
        );
        assert!(
            !s["tracer"].as_array().unwrap().is_empty() || name == "malloc-vs-mmap",
            "{name}: the tracer saw none of its processes"
        );
        let verdicts = s["verdicts"].as_array().unwrap();
        assert!(!verdicts.is_empty(), "{name} has no verdicts");
        for v in verdicts {
            assert_ne!(v["verdict"], "INCONSISTENT", "{name}: {v}");
        }
    }
    assert_eq!(report["health"]["dropped_events"], 0);
    if expected.contains(&"thread-create") {
        assert!(
            std::fs::read_to_string(out_dir.join("report.md"))
                .unwrap()
                .contains("![thread-create](thread-create.svg)")
        );
    }
    std::fs::remove_dir_all(&out_dir).ok();
}

//! Runs on: host only: JSON shape (schema, time_ns, stack frame keys) is user space; the stacks and
//! verify behind it: test:fault_cli and test:verify, in the guests too
//!
//! Every JSON line carries the schema version the README documents.

mod common;
mod support;

use std::process::Command;

use common::require_privileges;
use support::{BIN, json_lines, succeeded, workload};

#[test]
fn every_json_line_has_the_schema_version() {
    require_privileges();
    let out = Command::new(BIN)
        .args(["--json", "--events", "--stacks", "--interval", "0.05", "--"])
        .args(workload("syscalls", "/dev/null"))
        .output()
        .unwrap();
    let lines = json_lines(&succeeded("memlock-trace --json --events", &out));
    let kinds: std::collections::BTreeSet<&str> =
        lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert!(
        kinds.contains("syscall") && kinds.contains("summary"),
        "{kinds:?}"
    );
    for line in &lines {
        assert_eq!(line["schema"], memlock_trace::output::JSON_SCHEMA, "{line}");
        // CLOCK_REALTIME ns: after 2020, before 2100.
        let t = line["time_ns"].as_u64().unwrap_or_else(|| panic!("{line}"));
        assert!(
            (1_577_836_800_000_000_000..4_102_444_800_000_000_000).contains(&t),
            "{line}"
        );
    }
    assert_eq!(
        memlock_trace::output::JSON_SCHEMA,
        1,
        "the README documents schema 1"
    );

    // --stacks: each process's "faults" has "stacks", each {"faults", "frames": [...]}, and
    // "fault_health" the stack losses (README, JSON output).
    let summary = lines.iter().rev().find(|l| l["type"] == "summary").unwrap();
    let health = &summary["fault_health"];
    assert!(
        health["stacks_dropped"].is_u64() && health["stacks_evicted"].is_u64(),
        "{health}"
    );
    let process = &summary["processes"][0];
    let stacks = process["faults"]["stacks"]
        .as_array()
        .unwrap_or_else(|| panic!("{process}"));
    assert!(!stacks.is_empty(), "the workload faults: {process}");
    for stack in stacks {
        assert!(stack["faults"].as_u64().unwrap() > 0, "{stack}");
        let frames = stack["frames"].as_array().unwrap();
        assert!(!frames.is_empty(), "{stack}");
        for frame in frames {
            let keys: Vec<&str> = frame
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            assert_eq!(
                keys,
                [
                    "addr", "build_id", "file", "inlined", "line", "module", "offset", "resolved",
                    "symbol"
                ],
                "{frame}"
            );
            assert!(frame["addr"].as_str().unwrap().starts_with("0x"), "{frame}");
            assert!(
                frame["symbol"].is_string()
                    && frame["resolved"].is_boolean()
                    && frame["inlined"].is_boolean(),
                "{frame}"
            );
            assert!(
                frame["module"].is_string() || frame["module"].is_null(),
                "{frame}"
            );
            assert!(frame["line"].is_u64() || frame["line"].is_null(), "{frame}");
        }
    }

    let probe = Command::new(BIN)
        .args(["probe", "--json"])
        .output()
        .unwrap();
    let probe: serde_json::Value = serde_json::from_slice(&probe.stdout).unwrap();
    assert_eq!(
        (probe["type"].as_str(), probe["schema"].as_u64()),
        (Some("probe"), Some(1))
    );
    assert!(probe["time_ns"].is_u64(), "{probe}");
}

/// `--json` is a flag in every subcommand, `-o` says where: `verify` writes one JSON line.
#[test]
fn verify_json_is_a_flag_and_output_a_file() {
    require_privileges();
    let file =
        std::env::temp_dir().join(format!("memlock-trace-verify-{}.json", std::process::id()));
    let out = Command::new(BIN)
        .args(["verify", "--json", "-o"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let text = std::fs::read_to_string(&file).unwrap();
    let lines = json_lines(&text);
    assert_eq!(lines.len(), 1, "{text}");
    let report = &lines[0];
    assert_eq!(
        (report["type"].as_str(), report["schema"].as_u64()),
        (Some("verify"), Some(1))
    );
    assert!(
        report["time_ns"].is_u64() && report["failed"] == 0,
        "{report}"
    );
    let steps = report["steps"].as_array().unwrap();
    assert_eq!(report["passed"].as_u64(), Some(steps.len() as u64));
    std::fs::remove_file(&file).ok();
}

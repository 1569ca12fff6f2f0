//! Every JSON line carries the schema version the README documents.

mod common;
mod support;

use std::process::Command;

use common::require_privileges;
use support::{BIN, json_lines};

#[test]
fn every_json_line_has_the_schema_version() {
    require_privileges();
    let out = Command::new(BIN)
        .args(["--json", "--events", "--interval", "0.05", "--", BIN, "workload", "syscalls", "--report", "/dev/null"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = json_lines(&String::from_utf8_lossy(&out.stdout));
    let kinds: std::collections::BTreeSet<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert!(kinds.contains("syscall") && kinds.contains("summary"), "{kinds:?}");
    for line in &lines {
        assert_eq!(line["schema"], memlock_trace::render::JSON_SCHEMA, "{line}");
    }
    assert_eq!(memlock_trace::render::JSON_SCHEMA, 1, "the README documents schema 1");

    let probe = Command::new(BIN).args(["probe", "--json"]).output().unwrap();
    let probe: serde_json::Value = serde_json::from_slice(&probe.stdout).unwrap();
    assert_eq!((probe["type"].as_str(), probe["schema"].as_u64()), (Some("probe"), Some(1)));
}

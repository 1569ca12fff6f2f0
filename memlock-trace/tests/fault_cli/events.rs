//! `--events` fault lines through the binary: each says the mapping its address hit and the
//! instruction pointer with its module and offset, as `perf script` prints `ip sym+off (dso)`
//! (issue 47 point 13).

use serde_json::Value;

use super::{BIN, json_lines, traced_workload};

/// Every fault of `onfault 100` (an `MLOCK_ONFAULT` anonymous mapping, kept mapped, touched
/// by the workload's own code) is streamed (`--sample 1`): each of the 100 names the
/// anonymous mapping and an instruction pointer in the workload's binary, in text and JSON.
/// The lines said `fault minor 0x7f14695cdb70 2.0us cpu 0`, nothing more.
#[test]
fn fault_events_name_the_mapping_and_the_instruction_pointer() {
    let commands = "touch 1\nonfault 100\nsleep\nsleep\nexit";
    let out = traced_workload(&["--events", "--sample", "1"], commands);
    let text = String::from_utf8_lossy(&out.stdout);
    let in_binary = format!(" ({BIN}+0x");
    let placed = text
        .lines()
        .filter(|l| l.contains(" fault minor 0x") && l.contains(" in anonymous  ip 0x"))
        .filter(|l| l.contains(&in_binary))
        .count();
    assert!(placed >= 100, "{placed} placed fault lines:\n{text}");

    let out = traced_workload(&["--json", "--events", "--sample", "1"], commands);
    let lines = json_lines(&out.stdout);
    let events: Vec<&Value> = lines.iter().filter(|l| l["type"] == "fault").collect();
    let placed = events
        .iter()
        .filter(|l| l["mapping"] == "anonymous" && l["ip_module"] == BIN)
        .filter(|l| {
            let hex = |v: &Value| u64::from_str_radix(v.as_str()?.strip_prefix("0x")?, 16).ok();
            hex(&l["ip"]).is_some_and(|ip| ip > 0) && hex(&l["ip_offset"]).is_some()
        })
        .count();
    assert!(placed >= 100, "{placed} placed fault events: {events:#?}");
}

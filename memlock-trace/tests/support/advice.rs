//! The advice an `advise --json` report gives on the test programs' tables, shared
//! anonymous mappings (`/dev/zero`): included by `#[path]` in the advise binaries that
//! read it, beside `support`.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use serde_json::Value;

/// The report's advice on `/dev/zero` mappings, in its order.
pub fn on_dev_zero(report: &Value) -> impl Iterator<Item = &Value> {
    report["advice"].as_array().unwrap().iter().filter(|a| {
        a["mapping"]
            .as_str()
            .is_some_and(|m| m.starts_with("/dev/zero"))
    })
}

/// The first of `advice` (the report's on one table) that `matches`, which there must be:
/// `what` names it in the failure, beside all of `report`'s advice.
pub fn find<'a>(
    advice: &[&'a Value],
    report: &Value,
    what: &str,
    matches: impl Fn(&Value) -> bool,
) -> &'a Value {
    advice
        .iter()
        .copied()
        .find(|a| matches(a))
        .unwrap_or_else(|| panic!("no {what} advice on the table: {}", report["advice"]))
}

/// The report's first advice of `kind` (`over-limit`, `faulted-once`, ...), which there must be.
pub fn of_kind<'a>(report: &'a Value, kind: &str) -> &'a Value {
    report["advice"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} advice: {report}"))
}

//! The advice an `advise --json` report gives on the test programs' tables, shared
//! anonymous mappings (`/dev/zero`): included by `#[path]` in the advise binaries that
//! read it, beside `support`.

use serde_json::Value;

/// The report's advice on `/dev/zero` mappings, in its order.
pub fn on_dev_zero(report: &Value) -> impl Iterator<Item = &Value> {
    report["advice"].as_array().unwrap().iter().filter(|a| {
        a["mapping"]
            .as_str()
            .is_some_and(|m| m.starts_with("/dev/zero"))
    })
}

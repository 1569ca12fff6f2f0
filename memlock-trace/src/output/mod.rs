//! What every hook family's text and JSON output shares: the JSON schema version and the
//! units. Each family renders its own records and summary with these; the session puts
//! them together.

/// Version of the JSON lines (`"schema"` in every line). Adding a field keeps it; renaming,
/// removing or retyping one bumps it. Documented in the README.
pub const JSON_SCHEMA: u32 = 1;

/// `us` with one decimal below 10 ms, then ms.
pub fn duration(ns: u64) -> String {
    if ns < 10_000_000 {
        format!("{:.1}us", ns as f64 / 1e3)
    } else {
        format!("{:.1}ms", ns as f64 / 1e6)
    }
}

/// A count the hook set may not observe: `n/a` when it cannot.
pub fn or_na(v: Option<u64>) -> String {
    v.map_or_else(|| "n/a".into(), |v| v.to_string())
}

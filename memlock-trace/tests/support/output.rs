//! Reading the tracer's output back: its JSON lines, the summary and the text tables.

use serde_json::Value;

pub fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

/// The last `"summary"` line.
pub fn summary(stdout: &str) -> Value {
    json_lines(stdout)
        .into_iter()
        .rev()
        .find(|l| l["type"] == "summary")
        .unwrap_or_else(|| panic!("no summary line in:\n{stdout}"))
}

/// The summary's entry of process `pid` (the first, where it has several).
pub fn process_of<P>(summary: &Value, pid: P) -> &Value
where
    Value: PartialEq<P>,
    P: std::fmt::Display,
{
    summary["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not traced: {summary}"))
}

/// Panics unless the JSON string `text` holds `part`, showing `context` (what holds `text`).
#[track_caller]
pub fn assert_contains(text: &Value, part: &str, context: impl std::fmt::Display) {
    let s = text
        .as_str()
        .unwrap_or_else(|| panic!("not a string: {text}: {context}"));
    assert!(s.contains(part), "{part:?} not in {text}: {context}");
}

/// The rest of `text`'s first line that starts with `prefix`, which there must be.
#[track_caller]
pub fn line_after<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line starting {prefix:?} in:\n{text}"))
}

/// `text`'s first line that holds `part`, which there must be.
#[track_caller]
pub fn line_with<'a>(text: &'a str, part: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(part))
        .unwrap_or_else(|| panic!("no line with {part:?} in:\n{text}"))
}

/// How many mlock-family calls of `syscall` the summary counts for `pid` (all its entries).
pub fn calls_of(summary: &Value, pid: u32, syscall: &str) -> u64 {
    summary["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["pid"] == pid)
        .map(|p| p["syscalls"][syscall]["count"].as_u64().unwrap_or(0))
        .sum()
}

/// The processes of a summary that made traced system calls (page faults add processes
/// that made none, such as a parent that only forks).
pub fn with_syscalls(summary: &Value) -> Vec<&Value> {
    summary["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["syscalls"].as_object().is_some_and(|m| !m.is_empty()))
        .collect()
}

/// The header of the syscall table in a text summary; its page columns name their unit.
pub fn syscall_table_header(text: &str) -> &str {
    let header = text
        .lines()
        .find(|l| l.trim_start().starts_with("syscall "))
        .unwrap_or_else(|| panic!("no syscall table:\n{text}"));
    assert!(
        header.contains("populated pages") && header.contains("locked pages"),
        "{header:?}"
    );
    header
}

//! VMA activity as JSON: the `--events --json` lines and the per-process split/merge
//! summary, the same records [`super::render`] writes as text.

use std::collections::BTreeMap;

use memlock_trace_common::vma::{StoreEvent, VmaRange, WholeTotals};
use serde_json::json;

use super::{
    calls::{syscall_only, syscall_str},
    diff::ChangeCounts,
    hooks::VmaHooks,
    render::{flags_str, function_str, store_func},
    tracker::Activity,
};
use crate::event::{comm_of, errno_name};

fn range_json(v: &VmaRange) -> serde_json::Value {
    json!({"start": v.start, "end": v.end, "flags": v.flags, "perms": flags_str(v.flags)})
}

/// One JSON line for `--events --json`.
pub fn activity_json(a: &Activity, hooks: Option<&VmaHooks>) -> serde_json::Value {
    match a {
        Activity::Call(c) => {
            let r = &c.syscall.raw;
            json!({
                "type": "vma_call",
                "schema": crate::output::JSON_SCHEMA,
                "pid": r.tgid,
                "tid": r.tid,
                "comm": c.syscall.name(),
                "syscall": c.syscall.syscall.name(),
                "args": c.syscall.syscall.describe(r.args),
                "ret": r.ret,
                "errno": errno_name(r.ret),
                "map_count_before": r.map_count_before,
                "map_count_after": r.map_count_after,
                "before": c.before.iter().map(range_json).collect::<Vec<_>>(),
                "after": c.after.iter().map(range_json).collect::<Vec<_>>(),
                "incomplete": c.incomplete,
                "changes": c.changes,
                "whole": c.whole.as_ref().map(|[b, a]| json!({"before": whole_json(b), "after": whole_json(a)})),
                "counts": c.counts(),
                "stores": c.stores.iter().map(store_json).collect::<Vec<_>>(),
                "functions": c.functions.iter().map(|f| function_str(f, hooks)).collect::<Vec<_>>(),
            })
        }
        Activity::Store(s) => store_json(s),
        Activity::Func(f) => json!({
            "type": "vma_function",
            "schema": crate::output::JSON_SCHEMA,
            "pid": f.tgid,
            "tid": f.tid,
            "syscall": syscall_only(f.nr),
            "call": function_str(f, hooks),
        }),
    }
}

fn whole_json(t: &WholeTotals) -> serde_json::Value {
    json!({"vmas": t.vmas, "locked_vmas": t.locked_vmas, "locked_bytes": t.locked_bytes,
        "onfault_bytes": t.onfault_bytes})
}

fn store_json(s: &StoreEvent) -> serde_json::Value {
    json!({
        "type": "vma_store",
        "schema": crate::output::JSON_SCHEMA,
        "pid": s.tgid,
        "tid": s.tid,
        "comm": comm_of(&s.comm),
        "syscall": syscall_str(s.nr, s.args),
        "start": s.index,
        "end": s.last.wrapping_add(1),
        "vma": if s.vma == 0 { serde_json::Value::Null } else { range_json(&s.range) },
        "function": store_func(s),
    })
}

/// `{"type":"vma_summary","processes":[{"pid":..,"changes":{..}}]}`, printed before the summary.
/// `evicted`: processes whose changes the bounded table dropped (`--max-processes`).
pub fn summary_json(counts: &BTreeMap<u32, ChangeCounts>, evicted: u64) -> serde_json::Value {
    let processes: Vec<_> = counts
        .iter()
        .map(|(pid, c)| json!({"pid": pid, "changes": c}))
        .collect();
    json!({
        "type": "vma_summary",
        "schema": crate::output::JSON_SCHEMA,
        "processes": processes,
        "processes_evicted": evicted,
    })
}

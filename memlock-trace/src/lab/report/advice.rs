//! The advice section: for each seed scenario, whether `advise` drew the reference's
//! conclusion, and whether `--apply` moved the workload's own figures the way the
//! reference says. A disagreement is reported as one, never bent into agreement.

use serde_json::Value;

use super::Verdict;
use crate::lab::{seeds::AdviceRun, workload::scenario::Scenario};

/// Of the faults before, the share that may remain after for "--apply removed them".
const REMAINING_AT_MOST: f64 = 0.1;
/// Advice entries listed in the report's cell (a thread per stack can make hundreds).
const LISTED: usize = 6;

fn verdict(claim: &str, published: &str, measured: String, agrees: bool, why: String) -> Verdict {
    Verdict {
        claim: claim.into(),
        published: published.into(),
        measured,
        verdict: if agrees { "agrees" } else { "disagrees" },
        why,
    }
}

fn u(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_f64().map(|f| f as u64))
        .unwrap_or(0)
}

/// The advice entries with this verdict (`do`, `cannot-help`, `do-not`).
fn entries<'a>(advise: &'a Value, which: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    advise["advice"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(move |a| a["verdict"] == which)
}

/// `kind mapping (bytes)` for each advice entry, for the report.
fn listed(advise: &Value) -> String {
    let all: Vec<String> = advise["advice"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let on = a["mapping"]
                .as_str()
                .map(|m| {
                    format!(
                        " {} ({})",
                        crate::output::escape(m.as_bytes()),
                        crate::syscalls::why::size(u(&a["pinned_bytes"]))
                    )
                })
                .unwrap_or_default();
            format!(
                "{}: {}{on}",
                a["verdict"].as_str().unwrap_or("?"),
                a["kind"].as_str().unwrap_or("?")
            )
        })
        .collect();
    match all.len() {
        0 => "no advice".into(),
        n if n > LISTED => format!("{}; and {} more", all[..LISTED].join("; "), n - LISTED),
        _ => all.join("; "),
    }
}

/// advise's own one-line verdict on the second run.
fn apply_said(advise: &Value) -> String {
    advise["apply"]["verdict"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// The verdicts of one advised seed.
pub fn assess(run: &AdviceRun) -> Vec<Verdict> {
    let name = run.case.scenario.name();
    if let Some(error) = &run.error {
        return vec![Verdict {
            claim: format!("advise --apply on {name} ({})", run.case.variant),
            published: String::new(),
            measured: String::new(),
            verdict: "not checked",
            why: format!("advise failed: {error}"),
        }];
    }
    let (before, after) = (run.workload.first(), run.workload.get(1));
    match run.case.scenario {
        Scenario::FirstTouch => first_touch(run, before, after),
        Scenario::MallocVsMmap => malloc_vs_mmap(run, before, after),
        Scenario::ThreadStack => thread_stack(run, before, after),
        Scenario::DynamicAlloc => dynamic_alloc(run, before, after),
        _ => Vec::new(),
    }
}

/// The `do` lock/populate entry covering an anonymous mapping of at least `bytes`.
fn lock_advice(advise: &Value, bytes: u64) -> Option<&Value> {
    entries(advise, "do").find(|a| {
        matches!(a["kind"].as_str(), Some("lock" | "populate")) && u(&a["pinned_bytes"]) >= bytes
    })
}

/// The faults the workload counted itself in `key` (a number or a `{minflt}` object),
/// before and after, and whether at most [`REMAINING_AT_MOST`] of them remained.
fn moved(before: Option<&Value>, after: Option<&Value>, key: &str) -> (String, bool) {
    let get = |v: &Value| {
        let x = &v[key];
        if x.is_object() { u(&x["minflt"]) } else { u(x) }
    };
    match (before, after) {
        (Some(b), Some(a)) => {
            let (b, a) = (get(b), get(a));
            (
                format!("{key} (the workload's getrusage) {b} -> {a}"),
                b > 0 && (a as f64) <= REMAINING_AT_MOST * b as f64,
            )
        }
        (Some(b), None) => (format!("{key} {}; no second run", get(b)), false),
        _ => ("no measurements".into(), false),
    }
}

/// The verdict on whether advise named the seed's region for locking or populating: `named`
/// is the entry it gave (see [`lock_advice`]), `names` words it, `none` says none covers it.
fn region_named(
    claim: &str,
    published: &str,
    advise: &Value,
    named: Option<&Value>,
    names: impl FnOnce(&Value) -> String,
    none: String,
) -> Verdict {
    verdict(
        claim,
        published,
        listed(advise),
        named.is_some(),
        named.map_or(none, names),
    )
}

fn first_touch(run: &AdviceRun, before: Option<&Value>, after: Option<&Value>) -> Vec<Verdict> {
    let a = &run.advise;
    let pages = before.map_or(0, |b| u(&b["pages"]));
    let bytes = pages * crate::procfs::PAGE_SIZE;
    let named = lock_advice(a, bytes);
    let (figures, removed) = moved(before, after, "touch_faults_per_run");
    let call = |v: Option<&Value>| v.map_or(0, |v| u(&v["call_faults_per_run"]));
    vec![
        region_named(
            "advice: lock or populate the lazily touched region",
            "001: lazy first touch 68.6 ns/page in the timed loop; after mlock 8.3 ns/page, the faults paid in the call",
            a,
            named,
            |n| {
                format!(
                    "advise names the {} region ({} pages) and would remove {} faults after start-up",
                    n["kind"].as_str().unwrap_or(""),
                    pages,
                    u(&n["faults_removed"])
                )
            },
            format!("no lock/populate advice covers the {pages}-page region"),
        ),
        verdict(
            "--apply moves the first-touch faults out of the timed loop",
            "001: zero user faults in the touch loop after mlock/MAP_POPULATE",
            format!(
                "{figures}; faults inside the mmap/mlock call {} -> {}",
                call(before),
                call(after)
            ),
            removed,
            apply_said(a),
        ),
    ]
}

fn malloc_vs_mmap(run: &AdviceRun, before: Option<&Value>, after: Option<&Value>) -> Vec<Verdict> {
    let a = &run.advise;
    let bytes = before.map_or(0, |b| u(&b["bytes"]));
    let named = lock_advice(a, bytes);
    let (figures, removed) = moved(before, after, "write_faults");
    vec![
        region_named(
            "advice: lock or populate malloc's region up front",
            "002: malloc pays its faults in the timed writes (~942k us), MAP_LOCKED in mmap (~156k us)",
            a,
            named,
            |n| {
                format!(
                    "advise names the {} region ({} bytes asked of malloc)",
                    n["kind"].as_str().unwrap_or(""),
                    bytes
                )
            },
            format!("no lock/populate advice covers the {bytes}-byte block"),
        ),
        verdict(
            "--apply moves the faults out of the timed writes",
            "002: MAP_LOCKED memory takes no faults in the timed loop",
            figures,
            removed,
            apply_said(a),
        ),
    ]
}

/// Whether an entry to do recommends `mlockall` with `MCL_FUTURE` (without `MCL_ONFAULT`,
/// which does not populate new stacks), in its words or in what `--apply` would set.
fn recommends_future(advise: &Value) -> bool {
    let said = entries(advise, "do").any(|a| {
        let how = a["how"].as_str().unwrap_or("");
        how.contains("mlockall(MCL_FUTURE)") || how.contains("mlockall(MCL_CURRENT | MCL_FUTURE)")
    });
    let applied = advise["apply"]["environment"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|kv| {
            kv[0] == "MEMLOCK_PRELOAD_MLOCKALL"
                && kv[1]
                    .as_str()
                    .and_then(|f| f.parse::<u64>().ok())
                    .is_some_and(|f| f & libc::MCL_FUTURE as u64 != 0)
        });
    said || applied
}

fn thread_stack(run: &AdviceRun, before: Option<&Value>, after: Option<&Value>) -> Vec<Verdict> {
    let a = &run.advise;
    let warned = entries(a, "cannot-help").any(|x| x["kind"] == "thread-stacks");
    let future = recommends_future(a);
    let threads = before.map_or(0, |b| u(&b["threads"]));
    let stack = before.map_or(0, |b| u(&b["stack_kib"]) * 1024);
    // Locking or populating a thread's stack mapping pins it whole: table 4's cost again.
    let whole_stacks = entries(a, "do")
        .filter(|x| {
            matches!(x["kind"].as_str(), Some("lock" | "populate"))
                && u(&x["pinned_bytes"]) == stack
        })
        .count();
    let per_thread = |v: Option<&Value>| v.map(|v| v["faults_per_thread"].as_f64().unwrap_or(0.0));
    let (measured, not_worse) = match (per_thread(before), per_thread(after)) {
        (Some(b), Some(x)) => (
            format!("faults per thread {b:.0} -> {x:.0} (the workload's getrusage)"),
            x <= b * 1.1,
        ),
        (Some(b), None) => (
            format!("faults per thread {b:.0}; nothing applied, the program ran once"),
            true,
        ),
        _ => ("no measurements".into(), false),
    };
    vec![
        verdict(
            "advice: do not mlockall(MCL_FUTURE) a program that creates threads",
            "000 table 4: 2000 threads, 10 MB stacks, 1 MB used: 2000 ms locked against 200 ms",
            listed(a),
            warned && !future && whole_stacks == 0,
            format!(
                "{threads} threads; {}; {}; {}",
                if warned {
                    "advise warns that MCL_FUTURE populates and locks every new stack whole"
                } else {
                    "advise gives no thread-stack warning"
                },
                if future {
                    "yet an entry to do recommends mlockall(MCL_FUTURE)"
                } else {
                    "no entry recommends mlockall(MCL_FUTURE)"
                },
                if whole_stacks > 0 {
                    format!(
                        "but {whole_stacks} entries lock or populate a whole {} KiB thread stack \
                         of which {} KiB is used",
                        stack / 1024,
                        before.map_or(0, |b| u(&b["used_kib"]))
                    )
                } else {
                    "no entry pins a whole thread stack".into()
                }
            ),
        ),
        verdict(
            "--apply does not make thread creation fault more",
            "000 table 4: locking populates the whole stack, not the used part",
            measured,
            not_worse,
            apply_said(a),
        ),
    ]
}

fn dynamic_alloc(run: &AdviceRun, before: Option<&Value>, after: Option<&Value>) -> Vec<Verdict> {
    let a = &run.advise;
    let bytes = before.map_or(0, |b| u(&b["bytes"]));
    let rounds = before.map_or(0, |b| u(&b["rounds"]));
    let tunable = entries(a, "do").find(|x| {
        x["kind"] == "allocator"
            && x["apply"]["tunable"]
                .as_str()
                .is_some_and(|t| t.contains("glibc.malloc"))
    });
    let locks = lock_advice(a, bytes).is_some();
    let faults = |v: Option<&Value>| v.map(|v| u(&v["faults"]["minflt"]));
    let (measured, cut) = match (faults(before), faults(after)) {
        (Some(b), Some(x)) => (
            format!("faults over {rounds} rounds (the workload's getrusage) {b} -> {x}"),
            // Kept by the allocator, only the first round faults: at most half remain for
            // any run of 2 or more rounds.
            rounds >= 2 && b > 0 && x * 2 <= b,
        ),
        (Some(b), None) => (format!("faults {b}; no second run"), false),
        _ => ("no measurements".into(), false),
    };
    vec![
        verdict(
            "advice: locking cannot help allocator churn; glibc's tunables can",
            "000 table 6: 20 GB under MCL_FUTURE took 5,020,288 faults against 20,263: locking moves allocation faults, never removes them",
            listed(a),
            tunable.is_some() && !locks,
            match (tunable, locks) {
                (Some(t), false) => format!(
                    "advise says locking cannot help and sets {}",
                    t["apply"]["tunable"].as_str().unwrap_or("")
                ),
                (Some(_), true) => {
                    "advise names the tunable but also advises locking the block".into()
                }
                (None, _) => "advise does not name the allocator's setting".into(),
            },
        ),
        verdict(
            "--apply with the tunables cuts the refaults",
            "glibc serves the block from the heap and keeps it: only the first round faults",
            measured,
            cut,
            apply_said(a),
        ),
    ]
}

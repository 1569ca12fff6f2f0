//! The suite's report: for each scenario the workload's own figures, the tracer's, the
//! references' published ones, a verdict on each published claim, and consistency checks
//! between what the tracer saw and what the workload did (these must hold).
//!
//! `assess` turns each scenario's figures into verdicts (`thp_split` those of the huge-page
//! experiment, `threads` those of the thread ones), `charts` draws them, and [`write`]
//! puts it all in `report.md` and `report.json`.

mod advice;
mod assess;
mod charts;
mod pressure;
mod shape;
mod thp_split;
mod threads;

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::Result;
use serde::Serialize;
use serde_json::{Value, json};

use super::{seeds::AdviceRun, workload::scenario::Scenario};
use crate::output::write_private;

#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub claim: String,
    pub published: String,
    pub measured: String,
    /// `agrees` / `partly agrees` / `disagrees` (`not checked`) for a published claim; `consistent` / `INCONSISTENT` for a
    /// tracer-versus-workload check.
    pub verdict: &'static str,
    pub why: String,
}

pub struct Written {
    pub markdown: PathBuf,
    /// Per scenario (and per advised seed, `NAME advice`), its verdicts.
    pub verdicts: Vec<(String, Vec<Verdict>)>,
    pub inconsistent: usize,
}

/// A call's errors by errno (`{"ENOMEM": 2}`) in words: `0`, or `ENOMEM 2, EPERM 1`.
fn errors(by_errno: &Value) -> String {
    let named: Vec<String> = by_errno
        .as_object()
        .into_iter()
        .flatten()
        .map(|(errno, n)| format!("{errno} {n}"))
        .collect();
    if named.is_empty() {
        "0".into()
    } else {
        named.join(", ")
    }
}

/// A verdict on a published claim.
fn claim(claim: &str, published: &str, measured: String, agrees: bool, why: &str) -> Verdict {
    Verdict {
        claim: claim.into(),
        published: published.into(),
        measured,
        verdict: if agrees { "agrees" } else { "disagrees" },
        why: why.into(),
    }
}

/// A verdict on a tracer-versus-workload check.
fn check(what: &str, expected: String, traced: String, ok: bool) -> Verdict {
    Verdict {
        claim: what.into(),
        published: String::new(),
        measured: format!("workload {expected}, tracer {traced}"),
        verdict: if ok { "consistent" } else { "INCONSISTENT" },
        why: String::new(),
    }
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// One scenario's outcome: its own measurements and the tracer's view of its processes.
pub struct ScenarioRun {
    pub scenario: Scenario,
    pub secs: f64,
    pub own: Value,
    /// The tracer's summary of each of the scenario's processes, by pid then start: a pid
    /// the kernel reused within the scenario is two processes.
    pub traced: Vec<Value>,
    /// The tracer's per-call events of the scenario's processes.
    pub events: Vec<Value>,
    /// The VMA changes of each of their mlock-family calls (`vma_call` lines).
    pub vma_calls: Vec<Value>,
}

impl ScenarioRun {
    fn variant(&self, name: &str) -> &Value {
        &self.own["variants"][name]
    }

    fn pid_of(&self, variant: &str) -> Option<u32> {
        self.variant(variant)["pids"][0].as_u64().map(|p| p as u32)
    }

    /// The tracer's summary of process `pid`: the last started, should the scenario have
    /// had two of that pid.
    fn process(&self, pid: Option<u32>) -> Option<&Value> {
        let pid = u64::from(pid?);
        self.traced.iter().rfind(|p| p["pid"].as_u64() == Some(pid))
    }

    /// The tracer's summary of `syscall` for `pid` (Null when it made none).
    fn traced(&self, pid: Option<u32>, syscall: &str) -> Value {
        self.process(pid)
            .map_or(Value::Null, |p| p["syscalls"][syscall].clone())
    }

    /// The tracer's page-fault summary of `pid` (Null when fault tracing was off).
    fn faults(&self, pid: Option<u32>) -> Value {
        self.process(pid)
            .map_or(Value::Null, |p| p["faults"].clone())
    }

    /// Pages the kernel populated for `pid` inside `syscall` calls, as the tracer counted them.
    fn populated_by(&self, pid: Option<u32>, syscall: &str) -> u64 {
        self.faults(pid)["populated_by"][syscall]
            .as_u64()
            .unwrap_or(0)
    }

    fn traced_count(&self, pid: Option<u32>, syscall: &str) -> u64 {
        self.traced(pid, syscall)["count"].as_u64().unwrap_or(0)
    }
}

/// Writes `report.md` (with the charts beside it) and `report.json` into `dir`.
pub fn write(
    dir: &Path,
    runs: &[ScenarioRun],
    advised: &[AdviceRun],
    health: &Value,
    tiny: bool,
) -> Result<Written> {
    let mut md = String::new();
    let _ = writeln!(md, "# memlock-trace: the reference experiments, traced\n");
    let _ = writeln!(
        md,
        "Kernel {}; {}. Published figures come from other hardware and years: a reproduction agrees when the direction and rough ratio agree at every point, and partly agrees (naming the points that do not) when only some do. Tracer health: {health}.\n",
        crate::probe::kernel_release(),
        if tiny {
            "**tiny sizes** (a consistency check, not a measurement)"
        } else {
            "default sizes"
        }
    );
    let mut verdicts = Vec::new();
    let mut json_runs = Vec::new();
    let mut inconsistent = 0;
    for run in runs {
        let v = assess::assess(run);
        inconsistent += v.iter().filter(|x| x.verdict == "INCONSISTENT").count();
        scenario_section(&mut md, dir, run, &v)?;
        json_runs.push(json!({ "scenario": run.scenario.name(), "secs": run.secs, "workload": run.own, "tracer": run.traced, "events": run.events, "vma_calls": run.vma_calls, "verdicts": v }));
        verdicts.push((run.scenario.name().to_string(), v));
    }
    let json_advice = advice_section(&mut md, advised, &mut verdicts);
    if let Some(chart) = charts::fault_latency_chart(dir, runs)? {
        let _ = writeln!(md, "## Page fault latency\n\n![fault latency]({chart})\n");
    }
    if let Some(chart) = charts::latency_chart(dir, runs)? {
        let _ = writeln!(
            md,
            "## mlock-family call latency, all scenarios\n\n![latency]({chart})\n"
        );
    }
    let markdown = dir.join("report.md");
    write_private(&markdown, md.as_bytes(), "suite -o")?;
    let json_path = dir.join("report.json");
    write_private(
        &json_path,
        serde_json::to_string_pretty(
            &json!({ "kernel": crate::probe::kernel_release(), "tiny": tiny, "health": health, "scenarios": json_runs, "advice": json_advice }),
        )?
        .as_bytes(),
        "suite -o",
    )?;
    Ok(Written {
        markdown,
        verdicts,
        inconsistent,
    })
}

/// One scenario's section: its chart, its verdicts, the tracer's tables of its processes and
/// the workload's own measurements.
fn scenario_section(md: &mut String, dir: &Path, run: &ScenarioRun, v: &[Verdict]) -> Result<()> {
    let _ = writeln!(md, "## {} ({:.1} s)\n", run.scenario.name(), run.secs);
    if let Some(chart) = charts::scenario_chart(dir, run)? {
        let _ = writeln!(md, "![{}]({chart})\n", run.scenario.name());
    }
    verdict_table(md, v);
    syscall_table(md, run);
    fault_table(md, run);
    let _ = writeln!(
        md,
        "\n<details><summary>the workload's own measurements</summary>\n\n```json\n{}\n```\n</details>\n",
        serde_json::to_string_pretty(&run.own)?
    );
    Ok(())
}

fn verdict_table(md: &mut String, v: &[Verdict]) {
    let _ = writeln!(
        md,
        "| claim | published | this machine | verdict | why |\n|---|---|---|---|---|"
    );
    for x in v {
        let _ = writeln!(
            md,
            "| {} | {} | {} | **{}** | {} |",
            x.claim, x.published, x.measured, x.verdict, x.why
        );
    }
}

/// The tracer's figures for each mlock-family call of each of the scenario's processes.
fn syscall_table(md: &mut String, run: &ScenarioRun) {
    let _ = writeln!(md, "\nTracer, per process of this scenario:\n");
    let _ = writeln!(
        md,
        "| pid | comm | syscall | calls | errors | p50 | max | populated | locked |\n|---|---|---|---|---|---|---|---|---|"
    );
    for p in &run.traced {
        let pid = &p["pid"];
        for (name, s) in p["syscalls"].as_object().into_iter().flatten() {
            let _ = writeln!(
                md,
                "| {pid} | {} | {name} | {} | {} | {} | {} | {} | {} |",
                p["comm"].as_str().unwrap_or(""),
                s["count"],
                errors(&s["errors"]),
                crate::output::duration(s["latency_ns"]["p50"].as_u64().unwrap_or(0)),
                crate::output::duration(s["latency_ns"]["max"].as_u64().unwrap_or(0)),
                s["pages_populated"],
                s["pages_locked"]
            );
        }
    }
}

/// The page faults of each of the scenario's processes, where the tracer counted them.
fn fault_table(md: &mut String, run: &ScenarioRun) {
    let faulted: Vec<&Value> = run
        .traced
        .iter()
        .filter(|p| p["faults"].is_object())
        .collect();
    if faulted.is_empty() {
        return;
    }
    let _ = writeln!(md, "\nPage faults, per process of this scenario:\n");
    let _ = writeln!(
        md,
        "| pid | minor | major | user | populated | populated by | minor p50 | minor p99 |\n|---|---|---|---|---|---|---|---|"
    );
    for p in faulted {
        let pid = &p["pid"];
        let fl = &p["faults"];
        let lat =
            |q: &str| crate::output::duration(fl["latency_ns"]["minor"][q].as_u64().unwrap_or(0));
        let _ = writeln!(
            md,
            "| {pid} | {} | {} | {} | {} | {} | {} | {} |",
            fl["minor"],
            fl["major"],
            fl["user"],
            fl["populated"],
            fl["populated_by"],
            lat("p50"),
            lat("p99")
        );
    }
}

/// The advice section: each advised seed's verdicts (added to `verdicts`); returns them for
/// `report.json`.
fn advice_section(
    md: &mut String,
    advised: &[AdviceRun],
    verdicts: &mut Vec<(String, Vec<Verdict>)>,
) -> Vec<Value> {
    let mut json_advice = Vec::new();
    if advised.is_empty() {
        return json_advice;
    }
    let _ = writeln!(
        md,
        "## Advice, checked against the references

`memlock-trace advise --apply --json` on one variant of each scenario whose reference concludes something about locking: does the advice draw that conclusion, and does applying it move the workload's own figures the way the reference says? Each advise report is `advice-NAME.json` beside this file.
"
    );
    for run in advised {
        let v = advice::assess(run);
        let name = run.case.scenario.name();
        let _ = writeln!(
            md,
            "### {name} ({:.1} s)

`memlock-trace advise --apply -- {}`
",
            run.secs, run.command
        );
        verdict_table(md, &v);
        let _ = writeln!(md);
        json_advice.push(json!({ "scenario": name, "variant": run.case.variant, "secs": run.secs, "command": run.command, "workload": run.workload, "error": run.error, "verdicts": v }));
        verdicts.push((format!("{name} advice"), v));
    }
    json_advice
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn errors_are_named_or_none() {
        assert_eq!(super::errors(&json!({})), "0");
        assert_eq!(
            super::errors(&json!({"ENOMEM": 2, "EPERM": 1})),
            "ENOMEM 2, EPERM 1"
        );
    }
}

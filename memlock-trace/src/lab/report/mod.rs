//! The suite's report: for each scenario the workload's own figures, the tracer's, the
//! references' published ones, a verdict on each published claim, and consistency checks
//! between what the tracer saw and what the workload did (these must hold).

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::Result;
use serde::Serialize;
use serde_json::{Value, json};

use super::{suite::ScenarioRun, workload::scenario::Scenario};

mod charts;

#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub claim: String,
    pub published: String,
    pub measured: String,
    /// `agrees` / `disagrees` for a published claim; `consistent` / `INCONSISTENT` for a
    /// tracer-versus-workload check.
    pub verdict: &'static str,
    pub why: String,
}

pub struct Written {
    pub markdown: PathBuf,
    pub verdicts: Vec<(&'static str, Vec<Verdict>)>,
    pub inconsistent: usize,
}

fn claim(claim: &str, published: &str, measured: String, agrees: bool, why: &str) -> Verdict {
    Verdict {
        claim: claim.into(),
        published: published.into(),
        measured,
        verdict: if agrees { "agrees" } else { "disagrees" },
        why: why.into(),
    }
}

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

impl ScenarioRun {
    fn variant(&self, name: &str) -> &Value {
        &self.own["variants"][name]
    }

    fn pid_of(&self, variant: &str) -> Option<u32> {
        self.variant(variant)["pids"][0].as_u64().map(|p| p as u32)
    }

    /// The tracer's summary of `syscall` for `pid` (Null when it made none).
    fn traced(&self, pid: Option<u32>, syscall: &str) -> Value {
        pid.and_then(|p| self.traced.get(&p))
            .map_or(Value::Null, |p| p["syscalls"][syscall].clone())
    }

    /// The tracer's page-fault summary of `pid` (Null when fault tracing was off).
    fn faults(&self, pid: Option<u32>) -> Value {
        pid.and_then(|p| self.traced.get(&p))
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

fn assess(run: &ScenarioRun) -> Vec<Verdict> {
    let mut v = Vec::new();
    match run.scenario {
        Scenario::FirstTouch => {
            let (lazy, mlock, pop) = (
                run.variant("lazy"),
                run.variant("mlock"),
                run.variant("populate"),
            );
            let ratio = f(&mlock["touch_ns_per_page"]) / f(&lazy["touch_ns_per_page"]);
            v.push(claim(
                "touching a page after mlock is far cheaper than a lazy first touch",
                "8.3 vs 68.6 ns/page (0.12x)",
                format!(
                    "{:.1} vs {:.1} ns/page ({ratio:.2}x)",
                    f(&mlock["touch_ns_per_page"]),
                    f(&lazy["touch_ns_per_page"])
                ),
                ratio < 0.5,
                "the lazy touch takes a page fault per page; after mlock the pages are present",
            ));
            let ratio = f(&mlock["call_ns_per_page"]) / f(&lazy["touch_ns_per_page"]);
            v.push(claim("mlock costs about what the lazy touches cost (it faults the same pages in)", "50 vs 68.6 ns/page (0.73x)", format!("{:.0} vs {:.0} ns/page ({ratio:.2}x)", f(&mlock["call_ns_per_page"]), f(&lazy["touch_ns_per_page"])), (0.3..3.0).contains(&ratio), "absolute costs differ: a fault costs ~1.5 us on this virtual machine, 68 ns on the reference's hardware"));
            let ratio = f(&mlock["steady_ns_per_line"]) / f(&lazy["steady_ns_per_line"]);
            v.push(claim(
                "steady-state reads cost the same with or without mlock",
                "0.59 vs 0.66 ns/line (0.89x)",
                format!(
                    "{:.2} vs {:.2} ns/line ({ratio:.2}x)",
                    f(&mlock["steady_ns_per_line"]),
                    f(&lazy["steady_ns_per_line"])
                ),
                (0.7..1.4).contains(&ratio),
                "mlock changes residency, not the cost of a cached access",
            ));
            let pages = lazy["pages"].as_u64().unwrap_or(0)
                * lazy["runs"].as_array().map_or(0, Vec::len) as u64;
            let traced = run.traced(run.pid_of("mlock"), "mlock")["pages_populated"]
                .as_u64()
                .unwrap_or(0);
            v.push(check(
                "pages populated inside mlock = pages mlocked",
                pages.to_string(),
                traced.to_string(),
                traced == pages,
            ));
            let calls = run.traced_count(run.pid_of("lazy"), "mlock")
                + run.traced_count(run.pid_of("populate"), "mlock");
            v.push(check(
                "no mlock calls in the lazy and MAP_POPULATE runs",
                "0".into(),
                calls.to_string(),
                calls == 0,
            ));
            let user = run.faults(run.pid_of("lazy"))["user"].as_u64().unwrap_or(0);
            v.push(check(
                "lazy: at least one user fault per page touched",
                format!(">= {pages}"),
                user.to_string(),
                user >= pages,
            ));
            let by_mmap = run.populated_by(run.pid_of("populate"), "mmap");
            v.push(check(
                "MAP_POPULATE: every page populated inside mmap",
                format!(">= {pages}"),
                by_mmap.to_string(),
                by_mmap >= pages,
            ));
            let by_mlock = run.populated_by(run.pid_of("mlock"), "mlock");
            v.push(check(
                "mlock: the fault family counts the same pages populated inside mlock",
                pages.to_string(),
                by_mlock.to_string(),
                by_mlock == pages,
            ));
            let _ = pop;
        }
        Scenario::ThreadCreate => {
            let results = run.own["results"].as_array().cloned().unwrap_or_default();
            let rate = |mode: &str, p: u64| {
                results
                    .iter()
                    .find(|r| r["mode"] == mode && r["processes"] == p)
                    .map_or(0.0, |r| f(&r["threads_per_sec"]))
            };
            let procs: Vec<u64> = results
                .iter()
                .filter(|r| r["mode"] == "off")
                .filter_map(|r| r["processes"].as_u64())
                .collect();
            let a: Vec<f64> = procs
                .iter()
                .map(|&p| rate("current", p) / rate("off", p))
                .collect();
            let b: Vec<f64> = procs
                .iter()
                .map(|&p| rate("future", p) / rate("off", p))
                .collect();
            let fmt = |r: &[f64]| {
                procs
                    .iter()
                    .zip(r)
                    .map(|(p, x)| format!("P={p}: {x:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            v.push(claim(
                "MCL_CURRENT does not slow thread creation (ratio to off ~1)",
                "0.99, 1.01, 1.00, 1.03 for P=1,2,4,8",
                fmt(&a),
                a.iter().all(|x| (0.75..1.33).contains(x)),
                "MCL_CURRENT locks what exists; new stacks are not locked",
            ));
            let falls = b.len() >= 2 && b.last() < b.first() && b.last().is_some_and(|&x| x < 0.95);
            v.push(claim("MCL_FUTURE slows thread creation more as processes are added", "0.97, 0.89, 0.61, 0.35 for P=1,2,4,8", fmt(&b), falls, "every new stack mapping is populated and locked at once; with glibc's stack cache most threads reuse a stack, so the cost grows with contention on the mm and the two cores here rather than per thread"));
            let workers = results
                .iter()
                .filter(|r| r["mode"] != "off")
                .map(|r| r["workers"].as_u64().unwrap_or(0))
                .sum::<u64>();
            let traced: u64 = run
                .traced
                .values()
                .map(|p| p["syscalls"]["mlockall"]["count"].as_u64().unwrap_or(0))
                .sum();
            v.push(check(
                "one mlockall per MCL_CURRENT/MCL_FUTURE worker",
                workers.to_string(),
                traced.to_string(),
                traced == workers,
            ));
        }
        Scenario::ThreadStack => {
            let (off, fut) = (run.variant("off"), run.variant("future"));
            let stack_pages = f(&fut["stack_kib"]) / 4.0;
            let ratio = f(&fut["faults_per_thread"]) / f(&off["faults_per_thread"]).max(1.0);
            let expected = f(&fut["stack_kib"]) / f(&fut["used_kib"]);
            v.push(claim("under mlockall the whole stack is faulted in per thread, without it only the used part", "10 MB vs 1 MB per thread (10x)", format!("{:.0} vs {:.0} faults per thread ({ratio:.1}x; stack/used = {expected:.0}x)", f(&fut["faults_per_thread"]), f(&off["faults_per_thread"])), ratio > expected / 2.0 && ratio < expected * 2.0, "the stack mapping is populated when it is mapped writable under MCL_FUTURE"));
            let t = f(&fut["create_and_touch_ms"]) / f(&off["create_and_touch_ms"]).max(1e-9);
            v.push(claim(
                "creating the threads takes about 10x longer under mlockall",
                "2000 ms vs 200 ms for 2000 threads",
                format!(
                    "{:.0} ms vs {:.0} ms for {} threads ({t:.1}x)",
                    f(&fut["create_and_touch_ms"]),
                    f(&off["create_and_touch_ms"]),
                    fut["threads"]
                ),
                t > 2.0,
                "",
            ));
            v.push(check(
                "under MCL_FUTURE each thread faults at least its whole stack",
                format!(">= {stack_pages:.0} pages/thread"),
                format!("{:.0}", f(&fut["faults_per_thread"])),
                f(&fut["faults_per_thread"]) >= stack_pages,
            ));
            let populated = run.faults(run.pid_of("future"))["populated"]
                .as_u64()
                .unwrap_or(0) as f64;
            let threads = f(&fut["threads"]);
            v.push(check(
                "under MCL_FUTURE the kernel populated each thread's whole stack",
                format!(">= {:.0} pages", threads * stack_pages),
                format!("{populated:.0}"),
                populated >= threads * stack_pages,
            ));
            let locked = run.traced(run.pid_of("future"), "mlockall")["pages_locked"]
                .as_i64()
                .unwrap_or(0);
            v.push(check(
                "the MCL_FUTURE run's mlockall locked pages",
                "> 0".into(),
                locked.to_string(),
                locked > 0,
            ));
        }
        Scenario::DynamicAlloc => {
            let (off, fut) = (run.variant("off"), run.variant("future"));
            let (fo, ff) = (f(&off["faults"]["minflt"]), f(&fut["faults"]["minflt"]));
            let pages = f(&fut["pages"]);
            v.push(claim("MCL_FUTURE turns a large allocation into one fault per page", "5,020,288 vs 20,263 faults for 20 GB (248x)", format!("{ff:.0} vs {fo:.0} faults for {} MiB ({:.0}x; {pages:.0} pages)", f(&fut["bytes"]) / 1048576.0, ff / fo.max(1.0)), ff >= pages * 0.95 && ff / fo.max(1.0) > 50.0, "under MCL_FUTURE the kernel populates the new mapping inside mmap, on the task's behalf"));
            let traced = run.traced_count(run.pid_of("future"), "mlockall");
            v.push(check(
                "the MCL_FUTURE run made one mlockall",
                "1".into(),
                traced.to_string(),
                traced == 1,
            ));
            let populated = run.faults(run.pid_of("future"))["populated"]
                .as_u64()
                .unwrap_or(0);
            v.push(check("under MCL_FUTURE the kernel populated the allocation itself (populated, not user, faults)", format!(">= {pages:.0}"), populated.to_string(), populated as f64 >= pages));
        }
        Scenario::VmaSplit => {
            let steps = run.own["steps"].as_array().cloned().unwrap_or_default();
            v.push(claim("mlock splits a VMA around the locked range and merges equal-flag neighbours; different flags never merge", "figure 2", steps.iter().map(|s| format!("{}: {} VMAs", s["step"].as_str().unwrap_or(""), s["vmas"])).collect::<Vec<_>>().join("; "), run.own["all_as_expected"] == true, "/proc/self/smaps after each step"));
            // VMA count changes /proc shows for the steps caused by one mlock-family call.
            let vmas: Vec<i64> = steps
                .iter()
                .map(|s| s["vmas"].as_i64().unwrap_or(0))
                .collect();
            let proc_deltas: Vec<i64> = [(0, 1), (1, 2), (2, 3), (4, 5)]
                .iter()
                .map(|&(a, b)| {
                    vmas.get(b).copied().unwrap_or(0) - vmas.get(a).copied().unwrap_or(0)
                })
                .collect();
            let traced: Vec<i64> = run
                .events
                .iter()
                .map(|e| {
                    e["map_count_after"].as_i64().unwrap_or(0)
                        - e["map_count_before"].as_i64().unwrap_or(0)
                })
                .collect();
            let traced_attributable: Vec<i64> = traced.iter().take(4).copied().collect();
            v.push(check(
                "VMA count change of each mlock/munlock (tracer's map_count) = /proc's",
                format!("{proc_deltas:?}"),
                format!("{traced_attributable:?}"),
                traced_attributable == proc_deltas,
            ));
        }
        Scenario::ForkInherit => {
            let o = &run.own;
            let ok = o["child"]["vm_locked"] == false
                && o["child"]["locked_kib"] == 0
                && o["thread"]["locked_kib"] == o["parent"]["locked_kib"]
                && o["thread"]["vm_locked"] == true;
            v.push(claim(
                "a forked child does not inherit VM_LOCKED; a thread shares it",
                "section 1",
                format!(
                    "parent {} KiB locked, thread {} KiB, child {} KiB (VmFlags lo: {})",
                    o["parent"]["locked_kib"],
                    o["thread"]["locked_kib"],
                    o["child"]["locked_kib"],
                    o["child"]["vm_locked"]
                ),
                ok,
                "fork clears VM_LOCKED in the child's copy of each VMA; threads share the mm",
            ));
            let pids: Vec<u32> = o["pids"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p.as_u64())
                .map(|p| p as u32)
                .collect();
            let parent = run.traced_count(pids.first().copied(), "mlock");
            let child = run.traced_count(pids.get(1).copied(), "mlock");
            v.push(check(
                "one mlock in the parent, none in the child",
                "1 / 0".into(),
                format!("{parent} / {child}"),
                parent == 1 && child == 0,
            ));
        }
        Scenario::MallocVsMmap => {
            let (m, l) = (run.variant("malloc"), run.variant("mmap-locked"));
            let w = f(&l["write_us"]) / f(&m["write_us"]);
            v.push(claim("random writes are much faster in mmap(MAP_LOCKED) memory than in fresh malloc memory", "156k vs 942k us (0.17x)", format!("{:.0} vs {:.0} us ({w:.2}x)", f(&l["write_us"]), f(&m["write_us"])), w < 0.7, "malloc's writes take the page faults; MAP_LOCKED took them all inside mmap"));
            let r = f(&l["read_us"]) / f(&m["read_us"]);
            v.push(claim(
                "random reads cost about the same",
                "223k vs 264k us (0.84x)",
                format!(
                    "{:.0} vs {:.0} us ({r:.2}x)",
                    f(&l["read_us"]),
                    f(&m["read_us"])
                ),
                (0.5..1.5).contains(&r),
                "by then both regions are resident",
            ));
            let runs = m["runs"].as_array().map_or(0, Vec::len) as f64;
            let malloc_user = run.faults(run.pid_of("malloc"))["user"]
                .as_u64()
                .unwrap_or(0) as f64;
            let locked_mmap = run.populated_by(run.pid_of("mmap-locked"), "mmap") as f64;
            v.push(check("malloc: the write loops' faults are user faults; MAP_LOCKED: populated inside mmap", format!("malloc >= {:.0} user, mmap-locked >= {:.0} in mmap", f(&m["write_faults"]) * runs, f(&l["alloc_faults"]) * runs * 0.99), format!("{malloc_user:.0} user, {locked_mmap:.0} in mmap"), malloc_user >= f(&m["write_faults"]) * runs && locked_mmap >= f(&l["alloc_faults"]) * runs * 0.99));
            v.push(claim("the malloc run pays its page faults inside the timed loop, MAP_LOCKED pays them in mmap", "implied by the timings", format!("malloc: {:.0} faults while writing; MAP_LOCKED: {:.0} in mmap, {:.0} while writing", f(&m["write_faults"]), f(&l["alloc_faults"]), f(&l["write_faults"])), f(&m["write_faults"]) > 0.0 && f(&l["write_faults"]) == 0.0 && f(&l["alloc_faults"]) > 0.0, "getrusage around each phase"));
        }
        Scenario::MemlockLimit => {
            let calls = run.own["calls"].as_array().cloned().unwrap_or_default();
            let failed: Vec<String> = calls
                .iter()
                .filter(|c| c["result"] != "0")
                .map(|c| {
                    format!(
                        "{} -> {}",
                        c["what"].as_str().unwrap_or(""),
                        c["result"].as_str().unwrap_or("")
                    )
                })
                .collect();
            let over = calls
                .iter()
                .filter(|c| {
                    c["what"].as_str().is_some_and(|w| {
                        w.contains("limit")
                            && !w.contains("half")
                            && !w.contains("RLIMIT_MEMLOCK 0")
                    })
                })
                .all(|c| c["result"] == "ENOMEM");
            let zero = calls.iter().any(|c| {
                c["what"]
                    .as_str()
                    .is_some_and(|w| w.contains("RLIMIT_MEMLOCK 0"))
                    && c["result"] == "EPERM"
            });
            v.push(claim(
                "an unprivileged process cannot lock beyond RLIMIT_MEMLOCK: the calls fail",
                "ENOMEM / EPERM",
                failed.join("; "),
                over && zero,
                "over the limit: ENOMEM; with a zero limit and no CAP_IPC_LOCK: EPERM",
            ));
            let pid = run.own["pids"][0].as_u64().map(|p| p as u32);
            for syscall in ["mlock", "mlock2", "mlockall"] {
                let mut expected = std::collections::BTreeMap::<String, u64>::new();
                for c in calls
                    .iter()
                    .filter(|c| c["syscall"] == syscall && c["result"] != "0")
                {
                    *expected
                        .entry(c["result"].as_str().unwrap_or("").to_string())
                        .or_default() += 1;
                }
                let traced: std::collections::BTreeMap<String, u64> =
                    run.traced(pid, syscall)["errors"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                                .collect()
                        })
                        .unwrap_or_default();
                v.push(check(
                    &format!("{syscall} errors by errno"),
                    format!("{expected:?}"),
                    format!("{traced:?}"),
                    traced == expected,
                ));
            }
        }
        Scenario::VmMemory => {
            let (off, on) = (run.variant("mem-lock-off"), run.variant("mem-lock-on"));
            let ratio = f(&on["rss_max_kib"]) / f(&off["rss_max_kib"]).max(1.0);
            let guest_kib = f(&on["guest_mib"]) * 1024.0;
            v.push(claim("with mem-lock=on the guest's whole RAM is resident; off, only what it touches", "10 GB vs 900 MB resident for a 10 GB guest (11x)", format!("{:.0} vs {:.0} MiB resident for a {:.0} MiB guest ({ratio:.1}x)", f(&on["rss_max_kib"]) / 1024.0, f(&off["rss_max_kib"]) / 1024.0, f(&on["guest_mib"])), f(&on["rss_max_kib"]) >= guest_kib && ratio > 1.5, "qemu calls mlockall(MCL_CURRENT|MCL_FUTURE); off, a small guest that boots and idles touches much of its RAM anyway, so the ratio is smaller than for a 10 GB guest"));
            let traced_on = run.traced(run.pid_of("mem-lock-on"), "mlockall");
            let traced_off = run.traced_count(run.pid_of("mem-lock-off"), "mlockall");
            v.push(check(
                "qemu with mem-lock=on calls mlockall once, off never",
                "1 / 0".into(),
                format!(
                    "{} / {traced_off} (locked {} pages)",
                    traced_on["count"], traced_on["pages_locked"]
                ),
                traced_on["count"] == 1 && traced_off == 0,
            ));
        }
    }
    v
}

fn draw(dir: &Path, run: &ScenarioRun) -> Result<Option<String>> {
    let file = format!("{}.svg", run.scenario.name());
    let path = dir.join(&file);
    let bar = |name: &str, v: &Value| (name.to_string(), f(v));
    match run.scenario {
        Scenario::FirstTouch => {
            let (l, m, p) = (
                run.variant("lazy"),
                run.variant("mlock"),
                run.variant("populate"),
            );
            charts::bars(
                &path,
                "first touch: ns per 4 KiB page",
                "ns/page",
                &[
                    bar("lazy touch", &l["touch_ns_per_page"]),
                    bar("mlock call", &m["call_ns_per_page"]),
                    bar("touch, mlocked", &m["touch_ns_per_page"]),
                    bar("populate mmap", &p["call_ns_per_page"]),
                    bar("touch, populated", &p["touch_ns_per_page"]),
                ],
            )?;
        }
        Scenario::ThreadCreate => {
            let results = run.own["results"].as_array().cloned().unwrap_or_default();
            let series: Vec<(String, Vec<(f64, f64)>)> = crate::lab::workload::thread_create::MODES
                .iter()
                .map(|mode| {
                    (
                        format!("mlock={mode}"),
                        results
                            .iter()
                            .filter(|r| r["mode"] == *mode)
                            .map(|r| (f(&r["processes"]), f(&r["threads_per_sec"])))
                            .collect(),
                    )
                })
                .collect();
            charts::lines(
                &path,
                "thread creation rate (paper figure 3)",
                "processes",
                "threads/s",
                &series,
            )?;
        }
        Scenario::ThreadStack => {
            charts::bars(
                &path,
                "faults per thread",
                "faults",
                &[
                    bar("no mlock", &run.variant("off")["faults_per_thread"]),
                    bar("MCL_FUTURE", &run.variant("future")["faults_per_thread"]),
                ],
            )?;
        }
        Scenario::DynamicAlloc => {
            charts::bars(
                &path,
                "page faults of one large malloc (paper figure 4)",
                "faults",
                &[
                    bar("mlock=off", &run.variant("off")["faults"]["minflt"]),
                    bar("MCL_FUTURE", &run.variant("future")["faults"]["minflt"]),
                ],
            )?;
        }
        Scenario::MallocVsMmap => {
            let (m, l) = (run.variant("malloc"), run.variant("mmap-locked"));
            charts::bars(
                &path,
                "1M random accesses to 28-byte records",
                "us",
                &[
                    bar("malloc write", &m["write_us"]),
                    bar("MAP_LOCKED write", &l["write_us"]),
                    bar("malloc read", &m["read_us"]),
                    bar("MAP_LOCKED read", &l["read_us"]),
                ],
            )?;
        }
        Scenario::VmMemory => {
            charts::bars(
                &path,
                "qemu resident memory (MiB)",
                "MiB",
                &[
                    (
                        "mem-lock=off".into(),
                        f(&run.variant("mem-lock-off")["rss_max_kib"]) / 1024.0,
                    ),
                    (
                        "mem-lock=on".into(),
                        f(&run.variant("mem-lock-on")["rss_max_kib"]) / 1024.0,
                    ),
                ],
            )?;
        }
        Scenario::VmaSplit | Scenario::ForkInherit | Scenario::MemlockLimit => return Ok(None),
    }
    Ok(Some(file))
}

/// Minor-fault latency percentiles of the lazy first touch and the malloc run, as the fault
/// family measured them in the kernel.
fn fault_latency_chart(dir: &Path, runs: &[ScenarioRun]) -> Result<Option<String>> {
    let mut bars = Vec::new();
    for (scenario, variant) in [
        (Scenario::FirstTouch, "lazy"),
        (Scenario::MallocVsMmap, "malloc"),
    ] {
        let Some(run) = runs.iter().find(|r| r.scenario == scenario) else {
            continue;
        };
        let lat = &run.faults(run.pid_of(variant))["latency_ns"]["minor"];
        for q in ["p50", "p90", "p99", "p99_9"] {
            if let Some(ns) = lat[q].as_f64() {
                bars.push((format!("{variant} {q}"), ns / 1000.0));
            }
        }
    }
    if bars.is_empty() {
        return Ok(None);
    }
    let file = "fault-latency.svg".to_string();
    charts::bars(
        &dir.join(&file),
        "minor page fault latency (us)",
        "us",
        &bars,
    )?;
    Ok(Some(file))
}

/// Latency distribution of every traced mlock-family call in the suite, in log2 buckets.
fn latency_chart(dir: &Path, runs: &[ScenarioRun]) -> Result<Option<String>> {
    let mut buckets = [0u64; 32];
    for e in runs.iter().flat_map(|r| &r.events) {
        let ns = e["latency_ns"].as_u64().unwrap_or(1).max(1);
        buckets[(63 - ns.leading_zeros() as usize).min(31)] += 1;
    }
    let (Some(lo), Some(hi)) = (
        buckets.iter().position(|&b| b > 0),
        buckets.iter().rposition(|&b| b > 0),
    ) else {
        return Ok(None);
    };
    let bars: Vec<(String, f64)> = (lo..=hi)
        .map(|i| (crate::output::duration(1 << i), buckets[i] as f64))
        .collect();
    let file = "syscall-latency.svg".to_string();
    charts::bars(
        &dir.join(&file),
        "mlock-family call latency (calls per log2 bucket)",
        "calls",
        &bars,
    )?;
    Ok(Some(file))
}

pub fn write(dir: &Path, runs: &[ScenarioRun], health: &Value, tiny: bool) -> Result<Written> {
    let mut md = String::new();
    let _ = writeln!(md, "# memlock-trace: the reference experiments, traced\n");
    let _ = writeln!(
        md,
        "Kernel {}; {}. Published figures come from other hardware and years: a reproduction agrees when the direction and rough ratio agree. Tracer health: {health}.\n",
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
        let v = assess(run);
        inconsistent += v.iter().filter(|x| x.verdict == "INCONSISTENT").count();
        let _ = writeln!(md, "## {} ({:.1} s)\n", run.scenario.name(), run.secs);
        if let Some(chart) = draw(dir, run)? {
            let _ = writeln!(md, "![{}]({chart})\n", run.scenario.name());
        }
        let _ = writeln!(
            md,
            "| claim | published | this machine | verdict | why |\n|---|---|---|---|---|"
        );
        for x in &v {
            let _ = writeln!(
                md,
                "| {} | {} | {} | **{}** | {} |",
                x.claim, x.published, x.measured, x.verdict, x.why
            );
        }
        let _ = writeln!(md, "\nTracer, per process of this scenario:\n");
        let _ = writeln!(
            md,
            "| pid | comm | syscall | calls | errors | p50 | max | populated | locked |\n|---|---|---|---|---|---|---|---|---|"
        );
        for (pid, p) in &run.traced {
            for (name, s) in p["syscalls"].as_object().into_iter().flatten() {
                let _ = writeln!(
                    md,
                    "| {pid} | {} | {name} | {} | {} | {} | {} | {} | {} |",
                    p["comm"].as_str().unwrap_or(""),
                    s["count"],
                    s["errors"],
                    crate::output::duration(s["latency_ns"]["p50"].as_u64().unwrap_or(0)),
                    crate::output::duration(s["latency_ns"]["max"].as_u64().unwrap_or(0)),
                    s["pages_populated"],
                    s["pages_locked"]
                );
            }
        }
        let faulted: Vec<(&u32, &Value)> = run
            .traced
            .iter()
            .filter(|(_, p)| p["faults"].is_object())
            .collect();
        if !faulted.is_empty() {
            let _ = writeln!(md, "\nPage faults, per process of this scenario:\n");
            let _ = writeln!(
                md,
                "| pid | minor | major | user | populated | populated by | minor p50 | minor p99 |\n|---|---|---|---|---|---|---|---|"
            );
            for (pid, p) in faulted {
                let fl = &p["faults"];
                let lat = |q: &str| {
                    crate::output::duration(fl["latency_ns"]["minor"][q].as_u64().unwrap_or(0))
                };
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
        let _ = writeln!(
            md,
            "\n<details><summary>the workload's own measurements</summary>\n\n```json\n{}\n```\n</details>\n",
            serde_json::to_string_pretty(&run.own)?
        );
        json_runs.push(json!({ "scenario": run.scenario.name(), "secs": run.secs, "workload": run.own, "tracer": run.traced, "events": run.events, "verdicts": v }));
        verdicts.push((run.scenario.name(), v));
    }
    if let Some(chart) = fault_latency_chart(dir, runs)? {
        let _ = writeln!(md, "## Page fault latency\n\n![fault latency]({chart})\n");
    }
    if let Some(chart) = latency_chart(dir, runs)? {
        let _ = writeln!(
            md,
            "## mlock-family call latency, all scenarios\n\n![latency]({chart})\n"
        );
    }
    let markdown = dir.join("report.md");
    std::fs::write(&markdown, md)?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(
            &json!({ "kernel": crate::probe::kernel_release(), "tiny": tiny, "health": health, "scenarios": json_runs }),
        )?,
    )?;
    Ok(Written {
        markdown,
        verdicts,
        inconsistent,
    })
}

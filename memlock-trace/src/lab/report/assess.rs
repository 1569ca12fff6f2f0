//! Verdicts: each scenario's published claims against this machine's figures, and the
//! consistency checks between what the tracer saw and what the workload did.

use super::{ScenarioRun, Verdict, check, claim, f};
use crate::lab::workload::scenario::Scenario;

/// Each published claim of `run`'s scenario, and the tracer-versus-workload checks.
pub(super) fn assess(run: &ScenarioRun) -> Vec<Verdict> {
    let mut v = Vec::new();
    match run.scenario {
        Scenario::FirstTouch => first_touch(run, &mut v),
        Scenario::ThreadCreate => super::threads::thread_create(run, &mut v),
        Scenario::ThreadStack => super::threads::thread_stack(run, &mut v),
        Scenario::DynamicAlloc => dynamic_alloc(run, &mut v),
        Scenario::VmaSplit => vma_split(run, &mut v),
        Scenario::ThpSplit => super::thp_split::assess(run, &mut v),
        Scenario::ForkInherit => fork_inherit(run, &mut v),
        Scenario::MallocVsMmap => malloc_vs_mmap(run, &mut v),
        Scenario::MemlockLimit => memlock_limit(run, &mut v),
        Scenario::VmMemory => vm_memory(run, &mut v),
        Scenario::MemoryPressure => super::pressure::assess(run, &mut v),
    }
    v
}

/// `a` against `b` and their ratio, in words with `decimals` places for the two figures:
/// `8.3 vs 68.6 ns/page (0.12x)`.
fn versus(a: f64, b: f64, decimals: usize, unit: &str) -> (f64, String) {
    let ratio = a / b;
    (
        ratio,
        format!("{a:.decimals$} vs {b:.decimals$} {unit} ({ratio:.2}x)"),
    )
}

fn first_touch(run: &ScenarioRun, v: &mut Vec<Verdict>) {
    let (lazy, mlock, pop) = (
        run.variant("lazy"),
        run.variant("mlock"),
        run.variant("populate"),
    );
    let lazy_touch = f(&lazy["touch_ns_per_page"]);
    let (ratio, measured) = versus(f(&mlock["touch_ns_per_page"]), lazy_touch, 1, "ns/page");
    v.push(claim(
        "touching a page after mlock is far cheaper than a lazy first touch",
        "8.3 vs 68.6 ns/page (0.12x)",
        measured,
        ratio < 0.5,
        "the lazy touch takes a page fault per page; after mlock the pages are present",
    ));
    let (ratio, measured) = versus(f(&mlock["call_ns_per_page"]), lazy_touch, 0, "ns/page");
    v.push(claim(
        "mlock costs about what the lazy touches cost (it faults the same pages in)",
        "50 vs 68.6 ns/page (0.73x)",
        measured,
        (0.3..3.0).contains(&ratio),
        "absolute costs differ: a fault costs ~1.5 us on this virtual machine, 68 ns on the \
         reference's hardware",
    ));
    let (ratio, measured) = versus(
        f(&mlock["steady_ns_per_line"]),
        f(&mlock["steady_unlocked_ns_per_line"]),
        2,
        "ns/line",
    );
    v.push(claim(
        "steady-state reads cost the same with or without mlock",
        "0.59 vs 0.66 ns/line (0.89x)",
        measured,
        (0.7..1.4).contains(&ratio),
        "mlock changes residency, not the cost of a cached access (one process reads a \
         locked and an unlocked region in turn, the fastest of 8 passes each)",
    ));
    let pages =
        lazy["pages"].as_u64().unwrap_or(0) * lazy["runs"].as_array().map_or(0, Vec::len) as u64;
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

fn dynamic_alloc(run: &ScenarioRun, v: &mut Vec<Verdict>) {
    let (off, fut) = (run.variant("off"), run.variant("future"));
    let (fo, ff) = (f(&off["faults"]["minflt"]), f(&fut["faults"]["minflt"]));
    let pages = f(&fut["pages"]);
    v.push(claim(
        "MCL_FUTURE turns a large allocation into one fault per page",
        "5,020,288 vs 20,263 faults for 20 GB (248x)",
        format!(
            "{ff:.0} vs {fo:.0} faults for {} MiB ({:.0}x; {pages:.0} pages)",
            f(&fut["bytes"]) / 1048576.0,
            ff / fo.max(1.0)
        ),
        ff >= pages * 0.95 && ff / fo.max(1.0) > 50.0,
        "under MCL_FUTURE the kernel populates the new mapping inside mmap, on the task's behalf",
    ));
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
    v.push(check(
        "under MCL_FUTURE the kernel populated the allocation itself (populated, not user, faults)",
        format!(">= {pages:.0}"),
        populated.to_string(),
        populated as f64 >= pages,
    ));
}

fn vma_split(run: &ScenarioRun, v: &mut Vec<Verdict>) {
    let steps = run.own["steps"].as_array().cloned().unwrap_or_default();
    v.push(claim("mlock splits a VMA around the locked range and merges equal-flag neighbours; different flags never merge", "figure 2", steps.iter().map(|s| format!("{}: {} VMAs", s["step"].as_str().unwrap_or(""), s["vmas"])).collect::<Vec<_>>().join("; "), run.own["all_as_expected"] == true, "/proc/self/smaps after each step"));
    // VMA count changes /proc shows for the steps caused by one mlock-family call.
    let vmas: Vec<i64> = steps
        .iter()
        .map(|s| s["vmas"].as_i64().unwrap_or(0))
        .collect();
    let proc_deltas: Vec<i64> = [(0, 1), (1, 2), (2, 3), (4, 5)]
        .iter()
        .map(|&(a, b)| vmas.get(b).copied().unwrap_or(0) - vmas.get(a).copied().unwrap_or(0))
        .collect();
    let traced: Vec<i64> = run
        .events
        .iter()
        .map(|e| {
            e["map_count_after"].as_i64().unwrap_or(0) - e["map_count_before"].as_i64().unwrap_or(0)
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

fn fork_inherit(run: &ScenarioRun, v: &mut Vec<Verdict>) {
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

fn malloc_vs_mmap(run: &ScenarioRun, v: &mut Vec<Verdict>) {
    let (m, l) = (run.variant("malloc"), run.variant("mmap-locked"));
    let (w, measured) = versus(f(&l["write_us"]), f(&m["write_us"]), 0, "us");
    v.push(claim(
        "random writes are much faster in mmap(MAP_LOCKED) memory than in fresh malloc memory",
        "156k vs 942k us (0.17x)",
        measured,
        w < 0.7,
        "malloc's writes take the page faults; MAP_LOCKED took them all inside mmap",
    ));
    let (r, measured) = versus(f(&l["read_us"]), f(&m["read_us"]), 0, "us");
    v.push(claim(
        "random reads cost about the same",
        "223k vs 264k us (0.84x)",
        measured,
        (0.5..1.5).contains(&r),
        "by then both regions are resident",
    ));
    let runs = m["runs"].as_array().map_or(0, Vec::len) as f64;
    let malloc_user = run.faults(run.pid_of("malloc"))["user"]
        .as_u64()
        .unwrap_or(0) as f64;
    let locked_mmap = run.populated_by(run.pid_of("mmap-locked"), "mmap") as f64;
    v.push(check(
        "malloc: the write loops' faults are user faults; MAP_LOCKED: populated inside mmap",
        format!(
            "malloc >= {:.0} user, mmap-locked >= {:.0} in mmap",
            f(&m["write_faults"]) * runs,
            f(&l["alloc_faults"]) * runs * 0.99
        ),
        format!("{malloc_user:.0} user, {locked_mmap:.0} in mmap"),
        malloc_user >= f(&m["write_faults"]) * runs
            && locked_mmap >= f(&l["alloc_faults"]) * runs * 0.99,
    ));
    let (malloc_writing, locked_in_mmap, locked_writing) = (
        f(&m["write_faults"]),
        f(&l["alloc_faults"]),
        f(&l["write_faults"]),
    );
    v.push(claim(
        "the malloc run pays its page faults inside the timed loop, MAP_LOCKED pays them in mmap",
        "implied by the timings",
        format!(
            "malloc: {malloc_writing:.0} faults while writing; MAP_LOCKED: {locked_in_mmap:.0} \
             in mmap, {locked_writing:.0} while writing"
        ),
        malloc_writing > 0.0 && locked_writing == 0.0 && locked_in_mmap > 0.0,
        "getrusage around each phase",
    ));
}

fn memlock_limit(run: &ScenarioRun, v: &mut Vec<Verdict>) {
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
                w.contains("limit") && !w.contains("half") && !w.contains("RLIMIT_MEMLOCK 0")
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
        let traced: std::collections::BTreeMap<String, u64> = run.traced(pid, syscall)["errors"]
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

fn vm_memory(run: &ScenarioRun, v: &mut Vec<Verdict>) {
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

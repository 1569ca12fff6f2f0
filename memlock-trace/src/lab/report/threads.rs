//! Verdicts of the thread experiments: how fast threads are created under mlockall (the
//! paper's figure 3), and how much of each new thread's stack is faulted in.

use super::{ScenarioRun, Verdict, check, claim, f, shape};

pub(super) fn thread_create(run: &ScenarioRun, v: &mut Vec<Verdict>) {
    let results = run.own["results"].as_array().cloned().unwrap_or_default();
    let rate = |mode: &str, p: u64| {
        results
            .iter()
            .find(|r| r["mode"] == mode && r["processes"] == p)
            .map_or(0.0, |r| f(&r["threads_per_sec"]))
    };
    // Points with more processes than CPUs measure time-slicing too: shown, not checked.
    let (fits, over): (Vec<_>, Vec<_>) = results
        .iter()
        .filter(|r| r["mode"] == "off")
        .filter_map(|r| Some((r["processes"].as_u64()?, r["oversubscribed"] == true)))
        .partition(|&(_, oversubscribed)| !oversubscribed);
    let ratios = |mode: &str, procs: &[(u64, bool)]| -> Vec<(u64, f64)> {
        procs
            .iter()
            .map(|&(p, _)| (p, rate(mode, p) / rate("off", p)))
            .collect()
    };
    let cpus = run.own["cpus"].as_u64().unwrap_or(0);
    let fmt = |mode: &str| {
        let mut s = ratios(mode, &fits)
            .iter()
            .map(|(p, x)| format!("P={p}: {x:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        for (p, x) in ratios(mode, &over) {
            s.push_str(&format!("; P={p}: {x:.2} (oversubscribed: {cpus} CPUs)"));
        }
        s
    };
    let over_note = if over.is_empty() {
        String::new()
    } else {
        " The oversubscribed point is shown, not checked: its processes take turns on the CPUs."
            .to_string()
    };
    let (verdict, words) = shape::verdict(&shape::within(0.75..1.33, &ratios("current", &fits)));
    v.push(Verdict {
        claim: "MCL_CURRENT does not slow thread creation (ratio to off ~1)".into(),
        published: "0.99, 1.01, 1.00, 1.03 for P=1,2,4,8".into(),
        measured: fmt("current"),
        verdict,
        why: format!(
            "{words}. MCL_CURRENT locks what exists; new stacks are not locked.{over_note}"
        ),
    });
    let (verdict, words) = shape::verdict(&shape::steps_like(
        &[0.97, 0.89, 0.61, 0.35],
        &ratios("future", &fits),
    ));
    v.push(Verdict {
        claim: "MCL_FUTURE slows thread creation more as processes are added".into(),
        published: "0.97, 0.89, 0.61, 0.35 for P=1,2,4,8".into(),
        measured: fmt("future"),
        verdict,
        why: format!(
            "{words}. Every new stack mapping is populated and locked at once; with glibc's \
             stack cache most threads reuse a stack, so the cost grows with contention on the \
             mm rather than per thread.{over_note}"
        ),
    });
    let workers = results
        .iter()
        .filter(|r| r["mode"] != "off")
        .map(|r| r["workers"].as_u64().unwrap_or(0))
        .sum::<u64>();
    let traced: u64 = run
        .traced
        .iter()
        .map(|p| p["syscalls"]["mlockall"]["count"].as_u64().unwrap_or(0))
        .sum();
    v.push(check(
        "one mlockall per MCL_CURRENT/MCL_FUTURE worker",
        workers.to_string(),
        traced.to_string(),
        traced == workers,
    ));
}

pub(super) fn thread_stack(run: &ScenarioRun, v: &mut Vec<Verdict>) {
    let (off, fut) = (run.variant("off"), run.variant("future"));
    let stack_pages = f(&fut["stack_kib"]) / 4.0;
    let ratio = f(&fut["faults_per_thread"]) / f(&off["faults_per_thread"]).max(1.0);
    let expected = f(&fut["stack_kib"]) / f(&fut["used_kib"]);
    v.push(claim(
        "under mlockall the whole stack is faulted in per thread, without it only the used part",
        "10 MB vs 1 MB per thread (10x)",
        format!(
            "{:.0} vs {:.0} faults per thread ({ratio:.1}x; stack/used = {expected:.0}x)",
            f(&fut["faults_per_thread"]),
            f(&off["faults_per_thread"])
        ),
        ratio > expected / 2.0 && ratio < expected * 2.0,
        "the stack mapping is populated when it is mapped writable under MCL_FUTURE",
    ));
    let (fut_ms, off_ms) = (
        f(&fut["create_and_touch_ms"]),
        f(&off["create_and_touch_ms"]),
    );
    let t = fut_ms / off_ms.max(1e-9);
    v.push(claim(
        "creating the threads takes about 10x longer under mlockall",
        "2000 ms vs 200 ms for 2000 threads",
        format!(
            "{fut_ms:.0} ms vs {off_ms:.0} ms for {} threads ({t:.1}x)",
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::lab::workload::scenario::Scenario;

    /// thread-create's results with MCL_FUTURE / off ratios `future` at `procs`, on 2 CPUs.
    fn run(procs: &[(u64, f64)]) -> ScenarioRun {
        let mut results = Vec::new();
        for &(p, ratio) in procs {
            for (mode, rate) in [
                ("off", 1000.0),
                ("current", 1000.0),
                ("future", 1000.0 * ratio),
            ] {
                results.push(
                    json!({"mode": mode, "processes": p, "oversubscribed": p > 2,
                    "workers": p, "threads_per_sec": rate}),
                );
            }
        }
        ScenarioRun {
            scenario: Scenario::ThreadCreate,
            secs: 1.0,
            own: json!({"cpus": 2, "results": results}),
            traced: Default::default(),
            events: Vec::new(),
            vma_calls: Vec::new(),
        }
    }

    fn future_claim(run: &ScenarioRun) -> Verdict {
        let mut v = Vec::new();
        thread_create(run, &mut v);
        v.into_iter()
            .find(|v| v.claim.starts_with("MCL_FUTURE"))
            .expect("the MCL_FUTURE claim")
    }

    #[test]
    fn the_oversubscribed_point_is_shown_but_not_checked() {
        // The figures: on 2 CPUs, P=4 is the oversubscribed point.
        let v = future_claim(&run(&[(1, 0.77), (2, 0.43), (4, 0.59)]));
        assert_eq!(v.verdict, "agrees", "{}", v.why);
        assert_eq!(
            v.measured,
            "P=1: 0.77, P=2: 0.43; P=4: 0.59 (oversubscribed: 2 CPUs)"
        );
        assert!(
            v.why.starts_with("falls from 0.77 at P=1 to 0.43 at P=2."),
            "{}",
            v.why
        );
        assert!(v.why.contains("shown, not checked"), "{}", v.why);
    }

    #[test]
    fn a_rise_within_the_cores_is_partly_agreeing() {
        let mut r = run(&[(1, 0.77), (2, 0.43), (4, 0.59)]);
        r.own["cpus"] = json!(4);
        for x in r.own["results"].as_array_mut().unwrap() {
            x["oversubscribed"] = json!(false);
        }
        let v = future_claim(&r);
        assert_eq!(v.verdict, "partly agrees");
        assert!(
            v.why.contains("but rises from 0.43 at P=2 to 0.59 at P=4"),
            "{}",
            v.why
        );
    }
}

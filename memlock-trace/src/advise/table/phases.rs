//! The start-up window and each phase's faults and time: what the intervals counted, the
//! tail after the last interval, and how each fault's time is weighed.

use std::collections::BTreeMap;

use super::{Phase, Startup, StartupHow};
use crate::advise::observe::{Faults, Interval, Latency, Run, Window};

/// The start-up window: --startup SECS; for a launched command, up to the end of the
/// interval the last executable file mapping appeared in; else none.
pub(super) fn startup(run: &Run, startup_flag: Option<f64>, t0: u64) -> Startup {
    match (startup_flag, run.launched, run.samples.last_exec_mapping_ns) {
        (Some(secs), _, _) => Startup {
            secs,
            how: StartupHow::Flag,
        },
        (None, true, Some(last)) => {
            let end = run
                .intervals
                .iter()
                .map(|i| i.window.end_ns)
                .find(|&end| end >= last)
                .unwrap_or(last);
            Startup {
                secs: end.saturating_sub(t0) as f64 / 1e9,
                how: StartupHow::Detected,
            }
        }
        _ => Startup {
            secs: 0.0,
            how: StartupHow::None,
        },
    }
}

/// How fault time was measured: each fault timed, or scaled from a sample.
pub(super) fn time_basis(run: &Run) -> String {
    let latency = &run.session.latency_ns;
    let sampled = latency
        .get("minor")
        .zip(latency.get("major"))
        .map(|(a, b)| a.count + b.count);
    let timed = sampled.unwrap_or_else(|| latency.values().map(|l| l.count).max().unwrap_or(0));
    let faults = run.session.minor + run.session.major;
    if timed == 0 {
        "not timed".to_string()
    } else if timed + timed / 20 >= faults {
        "each fault timed".to_string()
    } else {
        format!("{timed} of {faults} faults timed; the rest scaled from their mean")
    }
}
/// What happened after the last interval line (the command exited mid-interval): the
/// session's counts and latency totals less the intervals'. Its mapping rows are the
/// session's own (whole-run) counts, from which the caller takes away what the intervals
/// had.
pub(super) fn tail(run: &Run) -> Option<Interval> {
    // A command shorter than one interval has only the summary.
    let last = run
        .intervals
        .last()
        .map_or(run.session_window.start_ns, |i| i.window.end_ns);
    let s = &run.session;
    let sum = |f: fn(&Faults) -> u64| run.intervals.iter().map(|i| f(&i.faults)).sum::<u64>();
    let mut latency_ns = BTreeMap::new();
    for (class, l) in &s.latency_ns {
        let (mut total, mut count) = (l.total, l.count);
        for i in &run.intervals {
            if let Some(x) = i.faults.latency_ns.get(class) {
                total = total.saturating_sub(x.total);
                count = count.saturating_sub(x.count);
            }
        }
        latency_ns.insert(class.clone(), Latency { count, total, ..*l });
    }
    let faults = Faults {
        minor: s.minor.saturating_sub(sum(|f| f.minor)),
        major: s.major.saturating_sub(sum(|f| f.major)),
        user: s.user.saturating_sub(sum(|f| f.user)),
        populated: s.populated.saturating_sub(sum(|f| f.populated)),
        latency_ns,
        by_mapping: s.by_mapping.clone(),
    };
    Some(Interval {
        window: Window {
            start_ns: last,
            end_ns: run.session_window.end_ns.max(last),
        },
        faults,
    })
}

/// The mean latency of the timed faults of `classes`, ns (0 when none was timed).
pub(super) fn mean_ns(f: &Faults, classes: &[&str]) -> f64 {
    let (total, count) = classes
        .iter()
        .filter_map(|c| f.latency_ns.get(*c))
        .fold((0u64, 0u64), |(t, n), l| (t + l.total, n + l.count));
    if count == 0 {
        0.0
    } else {
        total as f64 / count as f64
    }
}

/// The share of an interval's faults whose time the hooks measured: all of them, or, on the
/// tracepoint hook set (which times no page the kernel populates inside a call: that time
/// is the call's), those the program's code took. A mapping's faults are not split by class,
/// so its time is its faults x the mean latency x this share.
pub(super) fn timed_share(f: &Faults) -> f64 {
    let populated_timed = f.latency_ns.get("populated").is_some_and(|l| l.count > 0);
    let all = f.user + f.populated;
    if populated_timed || f.populated == 0 || all == 0 {
        1.0
    } else {
        f.user as f64 / all as f64
    }
}

pub(super) fn add_phase(phase: &mut Phase, f: &Faults) {
    phase.minor += f.minor;
    phase.major += f.major;
    phase.user += f.user;
    phase.populated += f.populated;
    let user_ns = f.user as f64 * mean_ns(f, &["user"]);
    phase.user_fault_ns += user_ns as u64;
    // Pages populated untimed add nothing: their time is in the call that populated them.
    phase.fault_ns += (user_ns + f.populated as f64 * mean_ns(f, &["populated"])) as u64;
}

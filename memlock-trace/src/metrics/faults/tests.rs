//! The fault series as a scrape reads them.

use memlock_trace_common::faults::bucket_of;

use super::*;
use crate::{faults::HookSet, metrics::Metrics};

fn hooks() -> FaultHooks {
    FaultHooks {
        hook_set: HookSet::Tracepoint,
        hooks: Vec::new(),
        refused: Vec::new(),
        latency: true,
        plan: crate::faults::plan::FaultPlan::Completions {
            start: crate::faults::plan::FaultStart::Tracepoints,
            on: crate::faults::plan::EventScope::EveryCpu,
            period: 1,
        },
        unobserved: vec![Unobservable::Retried, Unobservable::InLockedVma],
        latency_sample: 1,
        completion_programs: None,
        start_program: None,
        causes: None,
    }
}

fn key(tgid: u32) -> ProcessKey {
    ProcessKey {
        tgid,
        _pad: 0,
        start_ns: 1,
    }
}

/// `user_minor` faults of 3 us each, `mlock` pages populated.
fn process(user_minor: u64, mlock: u64) -> ProcessFaults {
    let mut p = ProcessFaults::default();
    p.stats.name = "kernel-comm".as_bytes().into();
    p.stats.counts[stat::USER_MINOR] = user_minor;
    p.stats.counts[stat::POPULATED_MINOR] = mlock;
    p.stats.populated_by[populate::MLOCK] = mlock;
    let mut hist = [0u64; HIST_BUCKETS];
    hist[bucket_of(3_000)] = user_minor;
    p.hists
        .insert(class::USER_MINOR, Buckets::from_dense(&hist));
    p
}

#[test]
fn running_totals_become_counters_and_histograms() {
    let m = Metrics::new(false, crate::metrics::DEFAULT_MAX_NAMES);
    let health = FaultHealth::default();
    let comm = |_: &ProcessKey| (Some("db".to_string()), String::new());
    m.faults.update(
        BTreeMap::from([(key(7), process(10, 4))]),
        &hooks(),
        &health,
        comm,
    );
    // Pid 7 grows to 25; pid 8 (same comm) appears; then 7's entry is evicted and
    // re-created with 3: every fault counts once.
    m.faults.update(
        BTreeMap::from([(key(7), process(25, 4)), (key(8), process(5, 0))]),
        &hooks(),
        &health,
        comm,
    );
    m.faults.update(
        BTreeMap::from([(key(7), process(3, 0))]),
        &hooks(),
        &health,
        comm,
    );
    let text = m.encode();
    let has = |line: &str| assert!(text.contains(line), "{line}\n{text}");
    has("memlock_trace_page_faults_total{comm=\"db\",class=\"minor\",origin=\"user\"} 33\n");
    has("memlock_trace_page_faults_total{comm=\"db\",class=\"minor\",origin=\"populated\"} 4\n");
    has("memlock_trace_page_faults_populated_total{comm=\"db\",syscall=\"mlock\"} 4\n");
    // Faults, as getrusage counts them (a transparent huge page is one), not pages.
    has("# HELP memlock_trace_page_faults_populated Faults the kernel took populating");
    // Not observable with these hooks: no series. Observed and zero: none yet either.
    assert!(!text.contains("page_faults_retried_total{"), "{text}");
    assert!(!text.contains("page_faults_failed_total{"), "{text}");
    has(
        "memlock_trace_page_fault_latency_seconds_count{comm=\"db\",class=\"minor\",origin=\"user\"} 33\n",
    );
    // 3 us lies between 2.048 us and 4.096 us.
    has(
        "memlock_trace_page_fault_latency_seconds_bucket{le=\"0.000002048\",comm=\"db\",class=\"minor\",origin=\"user\"} 0\n",
    );
    has(
        "memlock_trace_page_fault_latency_seconds_bucket{le=\"0.000004096\",comm=\"db\",class=\"minor\",origin=\"user\"} 33\n",
    );
    has(
        "memlock_trace_page_fault_latency_seconds_bucket{le=\"+Inf\",comm=\"db\",class=\"minor\",origin=\"user\"} 33\n",
    );
    has("memlock_trace_fault_health_total{kind=\"stats_evicted\"} 0\n");
}

/// Counted as pid 7 with start 0, then under the start a hook learned: 25 faults, not
/// 10 + 25.
#[test]
fn a_start_learned_between_refreshes_is_the_same_process() {
    let m = Metrics::new(false, crate::metrics::DEFAULT_MAX_NAMES);
    let health = FaultHealth::default();
    let comm = |_: &ProcessKey| (Some("db".to_string()), String::new());
    let unstarted = ProcessKey {
        start_ns: 0,
        ..key(7)
    };
    for (key, faults) in [(unstarted, 10), (key(7), 25)] {
        let processes = BTreeMap::from([(key, process(faults, 0))]);
        m.faults.update(processes, &hooks(), &health, comm);
    }
    let text = m.encode();
    assert!(
        text.contains(
            "memlock_trace_page_faults_total{comm=\"db\",class=\"minor\",origin=\"user\"} 25\n"
        ),
        "{text}"
    );
}

#[test]
fn kernel_comm_when_the_process_is_gone() {
    let m = Metrics::new(true, crate::metrics::DEFAULT_MAX_NAMES);
    m.faults.update(
        BTreeMap::from([(key(9), process(2, 0))]),
        &hooks(),
        &FaultHealth {
            events_dropped: 6,
            ..FaultHealth::default()
        },
        |_| (None, String::new()),
    );
    let text = m.encode();
    assert!(
        text.contains("memlock_trace_page_faults_total{comm=\"kernel-comm\",pid=\"9\",class=\"minor\",origin=\"user\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains("memlock_trace_fault_health_total{kind=\"events_dropped\"} 6\n"),
        "{text}"
    );
}

/// Issue 43: a timed major fault's kind is a series of its own, beside the major class; it
/// grows by the kind's new faults only.
#[test]
fn major_faults_by_kind_are_histograms_by_kind() {
    let m = Metrics::new(false, crate::metrics::DEFAULT_MAX_NAMES);
    let comm = |_: &ProcessKey| (Some("db".to_string()), String::new());
    let with_majors = |anon: u64, file: u64| {
        let mut p = process(1, 0);
        p.stats.counts[stat::USER_MAJOR] = anon + file;
        for (class, n, ns) in [
            (class::USER_MAJOR, anon + file, 40_000),
            (class::MAJOR_ANON_SWAP_IN, anon, 40_000),
            (class::MAJOR_FILE_READ, file, 40_000),
        ] {
            let mut hist = [0u64; HIST_BUCKETS];
            hist[bucket_of(ns)] = n;
            p.hists.insert(class, Buckets::from_dense(&hist));
        }
        p
    };
    let health = FaultHealth::default();
    for (anon, file) in [(6, 1), (10, 1)] {
        m.faults.update(
            BTreeMap::from([(key(7), with_majors(anon, file))]),
            &hooks(),
            &health,
            comm,
        );
    }
    let text = m.encode();
    let has = |line: &str| assert!(text.contains(line), "{line}\n{text}");
    has(
        "memlock_trace_page_fault_major_kind_latency_seconds_count{comm=\"db\",kind=\"anon_swap_in\"} 10\n",
    );
    has(
        "memlock_trace_page_fault_major_kind_latency_seconds_count{comm=\"db\",kind=\"file_read\"} 1\n",
    );
    has(
        "memlock_trace_page_fault_latency_seconds_count{comm=\"db\",class=\"major\",origin=\"user\"} 11\n",
    );
    assert!(!text.contains("kind=\"shmem_swap_in\""), "{text}");
}

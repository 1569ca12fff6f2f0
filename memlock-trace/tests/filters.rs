//! Runs on: host, 6.1: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! Who gets traced: threads started after attach, `--comm`, `--cgroup`, `--follow-children`,
//! and what happens when the target map or the per-process table is full.
#![cfg(feature = "lab")]

mod common;
mod support;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use aya::maps::{MapData, RingBuf};
use common::{drain_syscalls, gettid, require_privileges};
use memlock_trace::{
    event::Syscall,
    lab::workload::Region,
    process::{Cgroup, Filters, Targets, launch},
    tracer::{Options, Tracer},
};
use support::{BIN, calls_of, summary, workload_children};

fn mlock_pages(n: usize) {
    let region = Region::anonymous(1, libc::PROT_READ | libc::PROT_WRITE, 0).unwrap();
    for _ in 0..n {
        assert_eq!(unsafe { libc::mlock(region.addr.cast(), region.len) }, 0);
    }
}

#[test]
fn threads_started_after_attach_are_traced() {
    require_privileges();
    let mut tracer = Tracer::load(&Targets::Tgids(vec![std::process::id()])).expect("load");
    let mut ring = tracer.take_events().expect("ring");
    // The thread does not exist yet when the filter is set: the tgid filter covers it.
    let tid = std::thread::spawn(|| {
        mlock_pages(3);
        gettid()
    })
    .join()
    .unwrap();
    let from_thread: Vec<_> = drain_syscalls(&mut ring)
        .into_iter()
        .filter(|r| r.raw.tid == tid)
        .collect();
    assert_eq!(
        from_thread.len(),
        3,
        "3 mlock calls from a thread started after attach"
    );
    assert!(
        from_thread
            .iter()
            .all(|r| r.syscall == Syscall::Mlock && r.raw.tgid == std::process::id())
    );
}

/// The tracer loaded for every process but `filters`' choice, and its ring of events (to
/// drain while the tracer is kept).
fn traced_with(filters: Filters) -> (Tracer, RingBuf<MapData>) {
    let mut tracer = Tracer::load_with(
        &Targets::All,
        &Options {
            filters,
            ..Options::default()
        },
    )
    .expect("load");
    let ring = tracer.take_events().expect("ring");
    (tracer, ring)
}

/// Runs `memlock-trace workload syscalls` (9 calls), held at its exec until
/// `before_release` ran.
fn run_workload(before_release: impl FnOnce(u32)) -> u32 {
    let argv: Vec<String> = [BIN, "workload", "syscalls", "--report", "/dev/null"]
        .map(String::from)
        .to_vec();
    let held = launch::spawn(&argv, None)
        .expect("fork workload")
        .wait_exec(BIN)
        .expect("exec workload");
    let pid = held.pid;
    before_release(pid);
    held.resume().expect("resume workload");
    assert_eq!(launch::wait_exit(pid).unwrap(), 0);
    pid
}

const WORKLOAD_CALLS: usize = 9;

#[test]
fn comm_filter_matches_the_process_name_even_in_renamed_threads() {
    require_privileges();
    let own_comm = std::fs::read_to_string("/proc/self/comm")
        .unwrap()
        .trim()
        .to_string();
    let mut filters = Filters::default();
    filters.set_comm(&own_comm, &mut |n| panic!("{n}")).unwrap();
    let (_tracer, mut ring) = traced_with(filters);

    let tid = std::thread::spawn(|| {
        // The thread's own comm differs; the process's (its group leader's) matches.
        unsafe { libc::prctl(libc::PR_SET_NAME, c"renamed-worker".as_ptr()) };
        mlock_pages(3);
        gettid()
    })
    .join()
    .unwrap();
    let other = run_workload(|_| {});
    let events = drain_syscalls(&mut ring);
    assert_eq!(
        events.iter().filter(|r| r.raw.tid == tid).count(),
        3,
        "renamed thread of `{own_comm}`"
    );
    assert_eq!(
        events.iter().filter(|r| r.raw.tgid == other).count(),
        0,
        "a `memlock-trace` process"
    );

    // And the other way round.
    let mut filters = Filters::default();
    filters
        .set_comm("memlock-trace", &mut |n| panic!("{n}"))
        .unwrap();
    let (_tracer, mut ring) = traced_with(filters);
    mlock_pages(2);
    let other = run_workload(|_| {});
    let events = drain_syscalls(&mut ring);
    assert_eq!(
        events.iter().filter(|r| r.raw.tgid == other).count(),
        WORKLOAD_CALLS
    );
    assert_eq!(
        events
            .iter()
            .filter(|r| r.raw.tgid == std::process::id())
            .count(),
        0
    );
}

/// A cgroup v2 directory for the test, removed on drop.
struct TestCgroup {
    dirs: Vec<PathBuf>,
    mounted: Option<PathBuf>,
}

impl TestCgroup {
    /// `<cgroup2>/memlock-trace-test-PID/inner`: returns the outer one and the inner one.
    fn create() -> (Self, PathBuf, PathBuf) {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let existing = info.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(point))
        });
        let (root, mounted) = match existing {
            Some(root) => (root, None),
            None => {
                // The VM guest has no cgroup2 mounted: mount one for the test.
                let root = std::env::temp_dir()
                    .join(format!("memlock-trace-cgroup2-{}", std::process::id()));
                std::fs::create_dir_all(&root).unwrap();
                nix::mount::mount(
                    Some("cgroup2"),
                    &root,
                    Some("cgroup2"),
                    nix::mount::MsFlags::empty(),
                    None::<&str>,
                )
                .expect("mount cgroup2");
                (root.clone(), Some(root))
            }
        };
        let outer = root.join(format!("memlock-trace-test-{}", std::process::id()));
        let inner = outer.join("inner");
        std::fs::create_dir_all(&inner)
            .unwrap_or_else(|e| panic!("mkdir {}: {e}", inner.display()));
        (
            Self {
                dirs: vec![inner.clone(), outer.clone()],
                mounted,
            },
            outer,
            inner,
        )
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
        if let Some(root) = &self.mounted {
            let _ = nix::mount::umount(root);
            let _ = std::fs::remove_dir(root);
        }
    }
}

#[test]
fn cgroup_filter_covers_the_cgroup_and_its_descendants() {
    require_privileges();
    let (_guard, outer, inner) = TestCgroup::create();
    let cgroup = Cgroup::resolve(&outer).expect("resolve the test cgroup");
    assert_eq!(
        cgroup.id,
        std::fs::metadata(&outer)
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap(),
        "on 64-bit kernels the cgroup id is the directory's inode number"
    );
    let filters = Filters {
        cgroup: Some(cgroup),
        ..Default::default()
    };
    let (_tracer, mut ring) = traced_with(filters);

    let move_into = |dir: &Path| {
        let dir = dir.to_path_buf();
        move |pid: u32| {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string()).expect("move into cgroup")
        }
    };
    let in_outer = run_workload(move_into(&outer));
    let in_inner = run_workload(move_into(&inner));
    let outside = run_workload(|_| {});
    mlock_pages(1);

    let events = drain_syscalls(&mut ring);
    assert_eq!(
        events.iter().filter(|r| r.raw.tgid == in_outer).count(),
        WORKLOAD_CALLS,
        "in the cgroup"
    );
    assert_eq!(
        events.iter().filter(|r| r.raw.tgid == in_inner).count(),
        WORKLOAD_CALLS,
        "in a child cgroup"
    );
    assert_eq!(
        events.iter().filter(|r| r.raw.tgid == outside).count(),
        0,
        "outside"
    );
    assert_eq!(
        events
            .iter()
            .filter(|r| r.raw.tgid == std::process::id())
            .count(),
        0,
        "the test itself"
    );
}

/// `memlock-trace --json ARGS -- memlock-trace workload children --count N --calls K`.
fn children_run(tracer_args: &[&str], count: u32, calls: u32) -> (serde_json::Value, Vec<u32>) {
    // Tests run in parallel under plain `cargo test`: one report file per call.
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let report = std::env::temp_dir().join(format!(
        "memlock-trace-children-{}-{run}.json",
        std::process::id()
    ));
    let out = Command::new(BIN)
        .arg("--json")
        .args(tracer_args)
        .args([
            "--",
            BIN,
            "workload",
            "children",
            "--count",
            &count.to_string(),
            "--calls",
            &calls.to_string(),
            "--report",
        ])
        .arg(&report)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let children = workload_children(&report);
    (summary(&String::from_utf8_lossy(&out.stdout)), children)
}

/// Pids of the processes that made traced calls.
fn pids(summary: &serde_json::Value) -> Vec<u32> {
    support::with_syscalls(summary)
        .iter()
        .map(|p| p["pid"].as_u64().unwrap() as u32)
        .collect()
}

/// The summary's counters of the process table (`health.processes`): each named one is as
/// expected.
fn assert_process_health(s: &serde_json::Value, expected: &[(&str, u64)]) {
    for &(counter, n) in expected {
        assert_eq!(s["health"]["processes"][counter], n, "{counter}");
    }
}

#[test]
fn follow_children_traces_each_child_from_its_start() {
    require_privileges();
    let (s, children) = children_run(&["--follow-children"], 5, 2);
    assert_eq!(
        pids(&s),
        children,
        "every child, nothing else (the parent makes no calls)"
    );
    for &child in &children {
        assert_eq!(calls_of(&s, child, "mlock"), 2, "child {child}");
    }
    assert_process_health(
        &s,
        &[("children_followed", 5), ("children_not_followed", 0)],
    );

    let (s, _) = children_run(&[], 5, 2);
    assert_eq!(
        pids(&s),
        Vec::<u32>::new(),
        "without --follow-children only the command itself"
    );
    assert_process_health(&s, &[("children_followed", 0)]);
}

#[test]
fn full_target_map_counts_the_children_it_could_not_follow() {
    require_privileges();
    // Room for 3 tgids: the command and its first 2 children (all 5 exist at once).
    let (s, children) = children_run(&["--follow-children", "--max-targets", "3"], 5, 1);
    assert_process_health(
        &s,
        &[("children_followed", 2), ("children_not_followed", 3)],
    );
    assert_eq!(pids(&s), children[..2], "the first two children forked");
}

#[test]
fn full_process_table_evicts_and_counts() {
    require_privileges();
    let (s, children) = children_run(&["--follow-children", "--max-processes", "2"], 5, 1);
    assert_process_health(&s, &[("evicted_processes", 3), ("children_followed", 5)]);
    // The summary lists the two most active processes (the parent, busiest with its faults,
    // among them) and folds the others by name, their calls kept in the totals.
    assert_eq!(s["processes"].as_array().unwrap().len(), 2, "{s}");
    let kept = pids(&s);
    assert!(
        kept.iter().all(|p| children.contains(p)),
        "{kept:?} of {children:?}"
    );
    let listed: u64 = support::with_syscalls(&s)
        .iter()
        .map(|p| p["syscalls"]["mlock"]["count"].as_u64().unwrap_or(0))
        .sum();
    let folded: u64 = s["folded"]["names"]
        .as_array()
        .unwrap_or_else(|| panic!("nothing folded: {s}"))
        .iter()
        .map(|n| n["calls"]["mlock"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        listed + folded,
        5,
        "every child's one call, listed or folded: {s}"
    );
    assert_eq!(s["folded"]["processes"], 4, "{}", s["folded"]);
}

#[test]
fn bad_filters_are_clear_usage_errors() {
    require_privileges();
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Each refused with usage's exit code 2 and a message that says why.
    let usage_errors: [(&[&str], &str); 5] = [
        (
            &["--cgroup", "/no/such/cgroup"],
            "no cgroup at `/no/such/cgroup`",
        ),
        (&["--cgroup", "/proc"], "not on a cgroup v2 filesystem"),
        (&["--comm", ""], "--comm needs a non-empty"),
        (&["--follow-children"], "--follow-children needs"),
        (&["--prometheus", "nowhere"], "is not a listen address"),
    ];
    for (args, says) in usage_errors {
        let (code, err) = run(&[args, &["--duration", "1"]].concat());
        assert_eq!(
            (code, err.contains(says)),
            (Some(2), true),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }

    // Too long a comm: traced with the kernel's 15 bytes, and said so.
    let (code, err) = run(&["--comm", "a-very-long-process-name", "--duration", "0.2"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("keeps only the first 15") && err.contains("`a-very-long-pro`"),
        "{err}"
    );
}

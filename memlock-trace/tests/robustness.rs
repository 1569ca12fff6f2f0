//! Runs on: host, 6.12: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! Stopping and overload: SIGINT/SIGTERM print the summary and leave nothing in the kernel;
//! SIGKILL leaves nothing either (every program, map and link is held by a file
//! descriptor, which the kernel closes). A ring-buffer overflow: see `exact_calls.rs`.

mod common;
mod support;

use std::{os::unix::process::ExitStatusExt as _, process::Command};

use common::require_privileges;
use support::{BpfIds, Tracer, bpf_ids, summary, wait_all_unloaded};

/// Traces a sleeping process with every hook kind attached (tracepoints and tp_btf),
/// notes the eBPF objects the tracer holds, then sends `signal`.
fn stop_with(signal: i32) -> (support::Finished, support::BpfIds) {
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = sleeper.id().to_string();
    let mut tracer = Tracer::spawn(&["--json", "--follow-children", "-p", &pid]);
    tracer.wait_for_stderr("memlock-trace: tracing");
    let ids = bpf_ids(tracer.pid());
    // At least: 5 sys_enter programs, 1 shared sys_exit, fork and exit (8 programs), each
    // attachment (10 syscall tracepoints, 2 tp_btf) a link; other hook families add more.
    // What matters below is that every one of them is gone afterwards.
    // Before 5.15 (no BPF_LINK_TYPE_PERF_EVENT) a tracepoint attachment is a perf event fd
    // rather than a link: then only the 2 tp_btf attachments are.
    let perf_links = memlock_trace::probe::KernelBtf::load()
        .expect("kernel BTF")
        .has_enum_member("bpf_link_type", "BPF_LINK_TYPE_PERF_EVENT");
    assert!(ids.programs.len() >= 8, "{ids:?}");
    assert!(
        ids.links.len() >= if perf_links { 12 } else { 2 },
        "{ids:?}"
    );
    assert!(ids.maps.len() >= 5, "{ids:?}");
    tracer.signal(signal);
    let done = tracer.finish();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    (done, ids)
}

#[test]
fn sigint_prints_the_summary_and_unloads_everything() {
    require_privileges();
    let (done, ids) = stop_with(libc::SIGINT);
    assert_eq!(done.status.code(), Some(0), "{}", done.stderr);
    assert!(done.stderr.contains("stopped by SIGINT"), "{}", done.stderr);
    assert_eq!(summary(&done.stdout)["schema"], 1);
    wait_unloaded_and_say("SIGINT", &ids);
}

#[test]
fn sigterm_prints_the_summary_and_unloads_everything() {
    require_privileges();
    let (done, ids) = stop_with(libc::SIGTERM);
    assert_eq!(done.status.code(), Some(0), "{}", done.stderr);
    assert!(
        done.stderr.contains("stopped by SIGTERM"),
        "{}",
        done.stderr
    );
    summary(&done.stdout);
    wait_all_unloaded(&ids);
}

#[test]
fn sigkill_leaves_no_program_map_or_link_behind() {
    require_privileges();
    let (done, ids) = stop_with(libc::SIGKILL);
    assert_eq!(done.status.signal(), Some(libc::SIGKILL));
    assert!(done.stdout.is_empty(), "killed: no summary");
    // Nothing pinned, nothing held elsewhere: closing the fds releases everything.
    wait_unloaded_and_say("SIGKILL", &ids);
}

/// Waits until every one of `ids` is gone from the kernel, and says how long that took
/// after the tracer's exit (`stopped_by`).
fn wait_unloaded_and_say(stopped_by: &str, ids: &BpfIds) {
    let took = wait_all_unloaded(ids);
    eprintln!(
        "{stopped_by}: {} programs, {} links, {} maps gone {took:?} after exit",
        ids.programs.len(),
        ids.links.len(),
        ids.maps.len()
    );
}

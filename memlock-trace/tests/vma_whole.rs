//! Runs on: host, 5.10, 6.1, 6.12, arm64
//!
//! Issue 12 item 3: `mlockall` and `munlockall` change VMAs too. The bytes that gained and
//! lost VM_LOCKED in them (a walk of every VMA at entry and exit) are counted in the event,
//! the per-process VMA summary and its JSON, and equal the change of `locked_vm`: mlock_fixup
//! adds to `locked_vm` exactly the pages of each VMA whose VM_LOCKED it sets, and never sets
//! it on the VMAs it skips ([vvar], [vdso], VM_IO/VM_PFNMAP, hugetlb), which stay out of both.
//!
//! Runs in the guests too: 6.1 walks the maple tree like the host, 5.10 the `vm_next` list.

#![cfg(feature = "lab")]

mod common;
mod support;

use common::require_privileges;
use serde_json::Value;
use support::{json_lines, run, scratch, workload};

const PAGE: u64 = 4096;

#[test]
fn mlockall_and_munlockall_count_the_bytes_locked_vm_counts() {
    require_privileges();
    let dir = scratch("vma-whole");
    let report = dir.join("calls.json");
    let out = run(&[
        &["--json", "--events", "--"][..],
        &workload("syscalls", report.to_str().unwrap()),
    ]
    .concat());
    std::fs::remove_dir_all(&dir).ok();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines = json_lines(&stdout);
    let find = |kind: &str, name: &str| -> &Value {
        lines
            .iter()
            .find(|l| l["type"] == kind && l["syscall"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}:\n{stdout}"))
    };
    let locked_vm = |l: &Value| {
        l["locked_vm_after"].as_i64().unwrap() - l["locked_vm_before"].as_i64().unwrap()
    };
    let (mlockall, munlockall) = (find("syscall", "mlockall"), find("syscall", "munlockall"));
    let (vma_lock, vma_unlock) = (find("vma_call", "mlockall"), find("vma_call", "munlockall"));
    let pid = mlockall["pid"].as_u64().unwrap();
    let summary = lines
        .iter()
        .find(|l| l["type"] == "vma_summary")
        .and_then(|s| s["processes"].as_array())
        .and_then(|p| p.iter().find(|p| p["pid"] == pid))
        .unwrap_or_else(|| panic!("no vma_summary for {pid}:\n{stdout}"));
    let stderr = String::from_utf8_lossy(&out.stderr);

    assert_eq!(summary["changes"]["unmeasured_calls"], 0, "{summary}");
    let gained = locked_vm(mlockall);
    assert!(gained > 0, "{mlockall}");
    assert_eq!(
        vma_lock["counts"]["locked_bytes"].as_i64().unwrap(),
        gained * PAGE as i64,
        "mlockall: VM_LOCKED set on exactly the pages locked_vm gained\n{vma_lock}\n{mlockall}\n{stderr}"
    );
    assert_eq!(vma_lock["counts"]["unlocked_bytes"], 0, "{vma_lock}");
    let whole = &vma_lock["whole"];
    assert_eq!(
        whole["after"]["locked_bytes"].as_u64().unwrap(),
        mlockall["locked_vm_after"].as_u64().unwrap() * PAGE,
        "every VM_LOCKED byte after mlockall is in locked_vm: {whole}"
    );
    // MCL_CURRENT leaves no VMA unlocked but the special ones mlock_fixup skips.
    let skipped =
        whole["after"]["vmas"].as_u64().unwrap() - whole["after"]["locked_vmas"].as_u64().unwrap();
    assert!(
        (1..=4).contains(&skipped),
        "[vvar], [vdso] and the like: {whole}"
    );

    let lost = -locked_vm(munlockall);
    assert_eq!(munlockall["locked_vm_after"], 0, "{munlockall}");
    assert_eq!(
        vma_unlock["counts"]["unlocked_bytes"].as_i64().unwrap(),
        lost * PAGE as i64,
        "munlockall: VM_LOCKED cleared on exactly the pages locked_vm lost\n{vma_unlock}"
    );
    assert_eq!(vma_unlock["counts"]["locked_bytes"], 0, "{vma_unlock}");
    assert_eq!(
        vma_unlock["whole"]["after"]["locked_bytes"], 0,
        "{vma_unlock}"
    );

    eprintln!(
        "mlockall: locked_vm +{gained} pages, VM_LOCKED set on {} B; munlockall: locked_vm \
         -{lost} pages, VM_LOCKED cleared on {} B; whole after mlockall {whole}",
        vma_lock["counts"]["locked_bytes"], vma_unlock["counts"]["unlocked_bytes"]
    );
    // The summary adds them to the ranged calls' figures: net zero, as the workload ends
    // with nothing locked.
    let changes = &summary["changes"];
    assert_eq!(changes["unmeasured_calls"], 0, "{changes}");
    assert_eq!(
        changes["locked_bytes"], changes["unlocked_bytes"],
        "{changes}"
    );
    assert!(
        changes["locked_bytes"].as_i64().unwrap() >= gained * PAGE as i64,
        "{changes}"
    );
}

/// The per-process VMA counts are bounded by `--max-processes` as the call statistics are:
/// a system-wide session kept one for every process that ever locked memory. Three children
/// each set VM_LOCKED on one page with one mlock; one is listed, two are counted as evicted.
#[test]
fn vma_counts_past_max_processes_are_counted_as_evicted() {
    require_privileges();
    let out = run(&[
        &["--json", "--follow-children", "--max-processes", "1", "--"][..],
        &workload("children", "/dev/null"),
        &["--count", "3", "--calls", "1"],
    ]
    .concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = json_lines(&stdout)
        .into_iter()
        .find(|l| l["type"] == "vma_summary")
        .unwrap_or_else(|| panic!("no vma_summary:\n{stdout}"));
    let listed = summary["processes"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{summary}");
    assert_eq!(listed[0]["changes"]["locked_bytes"], PAGE, "{summary}");
    assert_eq!(summary["processes_evicted"], 2, "{summary}");
}

//! `--stacks` on code without frame pointers, on the architecture the tracer was built
//! for: the C program's mlock call site unwinds to main from the modules' unwind tables
//! alone (framehop's x86_64 or aarch64 unwinder), with no frame-pointer walk. test:stacks
//! checks the same program frame for frame against perf on the host; this test also runs
//! in the arm64 guest, which has neither perf nor a compiler: `cargo xtask test`
//! cross-compiles the program for it and names it in `MEMLOCK_TRACE_LOCK_CHAIN`.

mod common;
mod support;

use common::require_privileges;
use support::stacks::{build_lock_chain, mlock_call_site, scratch, traced};

#[test]
fn c_program_without_frame_pointers_unwinds_to_main() {
    require_privileges();
    let dir = scratch("unwind-tables");
    let bin = build_lock_chain(&dir);
    let bin = bin.to_str().unwrap();
    let summary = traced(&[], &[bin]);
    std::fs::remove_dir_all(&dir).ok();
    let ours = mlock_call_site(&summary);
    let names: Vec<&str> = ours.iter().map(|(s, _)| s.as_str()).collect();
    assert!(
        names.first().is_some_and(|n| n.ends_with("mlock")),
        "innermost: libc's mlock: {ours:#?}"
    );
    assert_eq!(
        names.get(1..4),
        Some(&["lock_b", "lock_a", "main"][..]),
        "{ours:#?}"
    );
    for (_, module) in &ours[1..4] {
        assert_eq!(module, bin, "{ours:#?}");
    }
    let unwinding = &summary["call_site_health"]["unwinding"];
    assert_eq!(unwinding["frame_pointer_walks"], 0, "{unwinding}");
    eprintln!(
        "{} ({}): {names:?}",
        memlock_trace::arch::NAME,
        memlock_trace::probe::kernel_release()
    );
}

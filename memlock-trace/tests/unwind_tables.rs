//! Runs on: host, 5.10, 6.1, 6.12, arm64
//!
//! `--stacks` on code without frame pointers, on the architecture the tracer was built
//! for: the C program's mlock call site unwinds to main from the modules' unwind tables
//! alone (framehop's x86_64 or aarch64 unwinder), with no frame-pointer walk. test:stacks
//! checks the same program frame for frame against perf on the host; this test also runs
//! in the arm64 guest, which has neither perf nor a compiler: `cargo xtask test`
//! cross-compiles the program for it and names it in `MEMLOCK_TRACE_LOCK_CHAIN`.

mod common;
mod support;

use common::require_privileges;
use support::stacks::{build_lock_chain, lock_chain_call_site, scratch};

#[test]
fn c_program_without_frame_pointers_unwinds_to_main() {
    require_privileges();
    let dir = scratch("unwind-tables");
    let bin = build_lock_chain(&dir);
    let names = lock_chain_call_site(bin.to_str().unwrap());
    std::fs::remove_dir_all(&dir).ok();
    eprintln!(
        "{} ({}): {names:?}",
        memlock_trace::arch::NAME,
        memlock_trace::probe::kernel_release()
    );
}

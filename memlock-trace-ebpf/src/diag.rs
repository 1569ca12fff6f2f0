//! The programs' own diagnostics, for `-v`: a kernel read that failed and which field, a
//! map that was full and which, a record dropped, a target that left the set. They go
//! through aya-log's ring buffer (`AYA_LOGS`) to the loader, which prints them named by
//! program (the record's `target`).
//!
//! Every call site is on a path that is already a failure or a rare event (off the per-fault
//! path), and tests [`wanted`] first: a read-only global the loader sets only with `-v`
//! (as it sets aya-log's own `AYA_LOG_LEVEL`), so without it the verifier proves the whole
//! block unreachable and removes it, rate check included.

use aya_ebpf::Global;

/// Non-zero with `-v` (`names::DIAG`).
#[unsafe(no_mangle)]
static DIAG: Global<u8> = Global::new(0);

/// Whether a diagnostic is written for an occurrence whose count was `before`.
#[inline(always)]
pub fn wanted(before: u64) -> bool {
    DIAG.load() != 0 && worth_logging(before)
}

/// Whether an occurrence is worth a record: the 1st, 2nd, 4th, 8th, ... on this CPU
/// (`before` is the count before this one), so a storm of losses writes a few records per
/// CPU with the running count, not one per loss.
#[inline(always)]
fn worth_logging(before: u64) -> bool {
    let n = before.wrapping_add(1);
    n & n.wrapping_sub(1) == 0
}

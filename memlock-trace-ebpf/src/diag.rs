//! The programs' own diagnostics, for `-v`: a kernel read that failed and which field, a
//! map that was full and which, a record dropped, a target that left the set. They go
//! through aya-log's ring buffer (`AYA_LOGS`) to the loader, which prints them named by
//! program (the record's `target`).
//!
//! Every call site is on a path that is already a failure or a rare event (off the per-fault
//! path), and tests [`DIAG`] first: a read-only global the loader sets only with `-v`
//! (as it sets aya-log's own `AYA_LOG_LEVEL`), so without it the verifier proves the whole
//! block unreachable and removes it, rate check included.
//!
//! Failed kernel reads are not logged where they happen: a program reads up to a dozen
//! fields, and a log record on each failure path multiplied the paths the verifier walks
//! (6.1 gave up on `sys_enter_mlock` at its 1M-instruction limit). A failure only sets the
//! field's bit in the program's per-CPU [`ReadFailures`] slot, a map value whose contents the
//! verifier does not track, so the paths after it stay alike and are pruned; the program
//! writes one record at its end ([`report_reads`]) and the loader names the fields
//! (`memlock_trace_common::diag::FIELDS`).

use aya_ebpf::{Global, macros::map, maps::PerCpuArray};
use memlock_trace_common::diag::{ReadFailures, program};

/// Non-zero with `-v` (`names::DIAG`).
#[unsafe(no_mangle)]
static DIAG: Global<u8> = Global::new(0);

/// Each program's failed reads since its last record, per CPU (`diag::READ_FAILURES`).
#[map]
static DIAG_READ_FAILURES: PerCpuArray<ReadFailures> =
    PerCpuArray::with_max_entries(program::COUNT, 0);

/// A program that reads named kernel fields: its [`DIAG_READ_FAILURES`] slot (one of
/// `diag::program`) and its name, the record's target.
#[derive(Clone, Copy)]
pub struct Prog {
    pub slot: u32,
    pub name: &'static str,
}

/// Whether a diagnostic is written for an occurrence whose count was `before`.
#[inline(always)]
pub fn wanted(before: u64) -> bool {
    enabled() && worth_logging(before)
}

#[inline(always)]
fn enabled() -> bool {
    DIAG.load() != 0
}

/// With `-v`, notes that `prog` could not read `field` (a bit of `diag::field`): its read
/// failed, or `null_base`, the struct holding it was NULL. Nothing is logged here.
#[inline(always)]
pub fn read_failed(prog: Prog, field: u32, null_base: bool) {
    if !enabled() {
        return;
    }
    if let Some(slot) = DIAG_READ_FAILURES.get_ptr_mut(prog.slot) {
        let bit = 1u64 << field;
        // SAFETY: the map returned a valid pointer to this CPU's own slot, and a program runs
        // to completion on one CPU, so plain read-modify-writes are race-free.
        unsafe {
            if null_base {
                (*slot).null_base |= bit;
            } else {
                (*slot).failed |= bit;
            }
            (*slot).pending = 1;
        }
    }
}

/// At the end of a run of `prog` that read named fields: with `-v`, if any read failed, one
/// record naming the fields that failed since the last one, for the 1st, 2nd, 4th, ... run
/// with a failure on this CPU (see [`worth_logging`]).
#[inline(always)]
pub fn report_reads(prog: Prog) {
    if !enabled() {
        return;
    }
    let Some(slot) = DIAG_READ_FAILURES.get_ptr_mut(prog.slot) else {
        return;
    };
    // SAFETY: as in `read_failed`.
    let state = unsafe { &mut *slot };
    if state.pending == 0 {
        return;
    }
    state.pending = 0;
    let before = state.runs;
    state.runs = before + 1;
    if !worth_logging(before) {
        return;
    }
    let (failed, null_base) = (state.failed, state.null_base);
    state.failed = 0;
    state.null_base = 0;
    // The text up to the first number is `diag::RECORD_PREFIX`, which the loader decodes.
    aya_log_ebpf::warn!(
        &(),
        target: prog.name,
        "kernel reads failed: fields {:x}, NULL base {:x} ({} runs with a failure on this CPU)",
        failed,
        null_base,
        before + 1
    );
}

/// Whether an occurrence is worth a record: the 1st, 2nd, 4th, 8th, ... on this CPU
/// (`before` is the count before this one), so a storm of losses writes a few records per
/// CPU with the running count, not one per loss.
#[inline(always)]
fn worth_logging(before: u64) -> bool {
    let n = before.wrapping_add(1);
    n & n.wrapping_sub(1) == 0
}

//! Helpers for the production-use tests: running the CLI in the background, reading its
//! stderr as it comes, and listing the eBPF objects a process holds.

#![allow(dead_code, reason = "each test binary uses a different subset")]

pub mod exposition;
pub mod faults_workload;
pub mod memory_cgroup;
pub mod prometheus;
pub mod stacks;

// What every test binary reaches as `support::NAME`, kept in modules by concern.
mod bpf;
mod commands;
mod deadline;
mod host;
mod output;
mod tracer;
mod unit;
mod workloads;

#[allow(unused_imports, reason = "each test binary uses a different subset")]
pub use {
    bpf::{BpfIds, bpf_ids, fdinfo_field, fdinfos, map_memory, still_loaded, wait_all_unloaded},
    commands::{
        PYTHON, advise_apply, advise_json, compile_c, require_preload, require_python, run,
        succeeded, suite_report,
    },
    deadline::poll_within,
    host::{cgroup2_mount, os_result, scratch, scratch_dir, scratch_program, settled, status_kb},
    output::{
        assert_contains, calls_of, json_lines, line_after, line_with, process_of, summary,
        syscall_table_header, with_syscalls,
    },
    tracer::{Finished, Tracer},
    unit::{UNIT, unit_values},
    workloads::{flood_args, threads_of, waiting_flood, workload, workload_children},
};

pub const BIN: &str = env!("CARGO_BIN_EXE_memlock-trace");

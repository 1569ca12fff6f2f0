//! memlock-trace: what mlock, mlockall and page faults really do, seen from the kernel.
//!
//! The layout follows the hook families, with shared layers below them and the session on
//! top. Families never import each other.
//!
//! - Shared layers: [`btf`] reads the kernel's types and offsets; [`probe`] asks the
//!   kernel what it offers; [`object`] loads the eBPF
//!   object and gives every family one attach signature; [`event`] decodes ring-buffer
//!   records; [`process`] holds the target set, filters and the per-process table;
//!   [`kernel_log`] prints the programs' own diagnostics (`-v`); [`procfs`] parses
//!   `/proc/PID/smaps`; [`symbolize`] makes user call stacks readable;
//!   [`latency`] and [`output`] are shared by every family's figures and rendering;
//!   [`values`] checks every number on the command line, the tracer's and the lab's.
//! - Hook families, each owning its attach, read-back and summary: [`syscalls`], [`faults`],
//!   [`vma`].
//! - On top: [`tracer`] attaches the families; [`session`] runs the event loop and prints
//!   the summary; [`metrics`] serves Prometheus; [`cli`] is the one clap definition.
//! - [`advise`]: `memlock-trace advise`, built from a traced run's results (the tracer does
//!   not know it); its preload library is the `memlock-preload` crate.
//! - [`lab`] (cargo feature `lab`, on by default): the bundled workloads, `verify`, `suite`
//!   and its report. The tracer does not know it.
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod advise;
pub mod arch;
pub mod btf;
pub mod buckets;
pub mod cli;
mod detach;
pub mod event;
pub mod faults;
pub mod kernel_log;
pub mod latency;
pub mod map_batch;
pub mod metrics;
pub mod object;
pub mod output;
pub mod per_cpu;
pub mod probe;
pub mod process;
pub mod procfs;
pub mod profile;
pub mod session;
pub mod symbolize;
pub mod syscalls;
pub mod tracer;
pub mod unwind;
pub mod values;
pub mod vma;

#[cfg(feature = "lab")]
pub mod lab;

/// The exit codes of the tool's own outcomes, as `timeout(1)` and `env(1)` use them, so a
/// script can tell them from a launched command's status (which is passed through).
pub mod exit {
    /// What the user asked for is wrong (clap's usage errors, a bad path or pid).
    pub const USAGE: u8 = 2;
    /// `--duration` (or `INTERVAL COUNT`) ended while the launched command ran: it was sent
    /// SIGTERM and waited for, and this is the status, as timeout(1)'s.
    pub const TIMED_OUT: u8 = 124;
    /// The tool itself failed: loading, reading, writing its output.
    pub const FAILURE: u8 = 125;
    /// The command to trace was found but could not be executed.
    pub const NOT_EXECUTABLE: u8 = 126;
    /// The command to trace was not found.
    pub const NOT_FOUND: u8 = 127;
    /// The output was a pipe that closed (`| head`): 128 + SIGPIPE, as a tool killed by it.
    pub const CLOSED_PIPE: u8 = 141;
}

/// The command to trace could not be run: `code` is 126 (not executable) or 127 (not found).
#[derive(Debug)]
pub struct CommandError {
    pub code: u8,
    pub message: String,
}

impl std::fmt::Display for CommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CommandError {}

/// An error in what the user asked for (exit code 2), as opposed to a failure while tracing.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

//! memlock-trace: what mlock, mlockall and page faults really do, seen from the kernel.
//!
//! One module per concern: [`probe`] asks the kernel what it offers, [`tracer`] loads and
//! attaches the programs, [`decode`] turns ring-buffer records into events, [`aggregate`]
//! keeps per-process statistics, [`render`] prints them, [`session`] runs the event loop,
//! [`launch`] starts traced commands, [`workload`] holds the bundled workloads, [`vma`]
//! explains VMA events and [`verify`] checks them against /proc.

pub mod aggregate;
pub mod charts;
pub mod cli;
pub mod cli_production;
pub mod decode;
pub mod fault_counting;
pub mod faults;
pub mod filter;
pub mod launch;
pub mod mappings;
pub mod metrics;
pub mod probe;
pub mod processes;
pub mod production;
pub mod render;
pub mod report;
pub mod session;
pub mod stacks;
pub mod suite;
pub mod syscall;
pub mod tracer;
pub mod verify;
pub mod vma;
pub mod workload;

/// An error in what the user asked for (exit code 2), as opposed to a failure while tracing.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

//! `memlock-trace workload faults`, the child that takes known faults on command, started
//! with pipes for the tests that drive it line by line: alone, or as the command a tracer
//! runs.

use std::process::{Child, Command, Stdio};

use super::BIN;

/// `memlock-trace workload faults`, its stdin and stdout (its answers) piped.
pub fn spawn() -> Child {
    Command::new(BIN)
        .args(["workload", "faults"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("workload")
}

/// `TRACER -- memlock-trace workload faults`, `tracer` being memlock-trace with its
/// options: stdin, stdout (the tracer's and the workload's answers) and stderr piped.
pub fn spawn_traced(tracer: &mut Command) -> Child {
    tracer
        .args(["--", BIN, "workload", "faults"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run memlock-trace")
}

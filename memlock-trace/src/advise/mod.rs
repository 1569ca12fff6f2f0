//! `memlock-trace advise`: should this memory be locked, what would it cost, what did it buy.
//!
//! Built on the tracer's results, never inside it: [`observe`] runs a traced session of this
//! same binary (its documented JSON interval lines) while [`sample`] reads the target's
//! smaps, limits and fault counters; [`table`] puts the two together per mapping, split at
//! the start-up window; [`rules`] draws the advice, weighed against the limits and the
//! memory cgroup's room ([`room`]); [`apply`] runs the command again with
//! the advice applied (the `memlock-preload` library, or the allocator's environment) and
//! compares; [`render`] writes it as text or JSON.

mod apply;
mod observe;
mod render;
mod room;
mod rules;
mod sample;
mod table;
#[cfg(test)]
mod tests;
/// How advise writes its figures (public: the tests compare its text with them).
pub mod units;

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::{UsageError, output::Sink, values};

/// How long `-p PID` is traced without `-d`.
const DEFAULT_PID_SECS: f64 = 10.0;

/// `memlock-trace advise [-p PID [-d SECS] | -- COMMAND...]`.
#[derive(Debug, Args, Clone, Default)]
pub struct AdviseArgs {
    /// Advise on this running process (its start-up is not seen: every fault counts as
    /// steady state unless --startup says otherwise).
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        conflicts_with = "command"
    )]
    pub pid: Option<u32>,
    /// With -p: trace this long (default 10 s).
    #[arg(short = 'd', long, value_name = "SECS", value_parser = values::secs)]
    pub duration: Option<f64>,
    /// The start-up window: faults in the first SECS seconds of the trace are start-up's
    /// (default, for a command: detected, until the last executable file was mapped).
    #[arg(long, value_name = "SECS", value_parser = values::secs)]
    pub startup: Option<f64>,
    /// Run the command a second time with the advice applied (the preload library, or the
    /// allocator's environment) and print both runs side by side.
    #[arg(long, conflicts_with = "pid")]
    pub apply: bool,
    /// Time one page fault in N (the tracer's --latency-sample): fault time is then scaled
    /// from the sample, and said so.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = values::int(1, u32::MAX))]
    pub latency_sample: u32,
    /// Keep the stacks of sampled faults (the tracer's --stacks) and show under each mapping
    /// advised on the code that faulted there most.
    #[arg(long)]
    pub stacks: bool,
    /// Write the report as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Write the report to FILE instead of stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The command to run, trace and advise on.
    #[arg(last = true, value_name = "COMMAND", value_parser = clap::value_parser!(std::ffi::OsString))]
    pub command: Vec<std::ffi::OsString>,
}

/// Runs `advise`; returns the exit code (the command's, of its first run; 0 for `-p`).
pub fn run(args: &AdviseArgs) -> Result<i32> {
    if args.pid.is_none() && args.command.is_empty() {
        return Err(UsageError(
            "advise needs a process: `memlock-trace advise -p PID [-d SECS]` or \
             `memlock-trace advise -- COMMAND...`"
                .into(),
        )
        .into());
    }
    if args.duration.is_some() && args.pid.is_none() {
        return Err(
            UsageError("-d is for -p PID: a command is traced until it exits".into()).into(),
        );
    }
    if let Some(pid) = args.pid
        && (pid == 0 || !std::path::Path::new(&format!("/proc/{pid}")).exists())
    {
        return Err(UsageError(format!("no process with pid {pid}")).into());
    }
    // Refused before anything runs when the file cannot be written.
    let mut sink = Sink::open(args.output.as_deref())?;
    let target = match args.pid {
        Some(pid) => observe::Target::Pid {
            pid,
            secs: args.duration.unwrap_or(DEFAULT_PID_SECS),
        },
        None => observe::Target::Command(args.command.clone()),
    };
    let watch = if args.apply {
        apply::watch()?
    } else {
        observe::Environment::default()
    };
    let first = observe::run(&target, &watch, args.latency_sample, args.stacks)?;
    let table = table::build(&first, args.startup)?;
    let advice = rules::advise(&table);
    let out = if args.apply {
        let plan = apply::plan(&advice)?;
        let second = match &plan {
            Some(plan) => Some(observe::run(
                &target,
                &plan.env,
                args.latency_sample,
                args.stacks,
            )?),
            None => None,
        };
        let after = match &second {
            Some(run) => Some(table::build(run, args.startup)?),
            None => None,
        };
        let comparison = apply::compare(&table, after.as_ref(), plan.as_ref(), &advice);
        if args.json {
            render::apply_json(&table, &advice, &comparison)
        } else {
            render::apply_text(&table, &advice, &comparison)
        }
    } else if args.json {
        render::json(&table, &advice)
    } else {
        render::text(&table, &advice)
    };
    sink.write_result(out.as_bytes())?;
    // A running process's trace ends well: advise's own status is 0.
    Ok(first.exit_code.unwrap_or(0))
}

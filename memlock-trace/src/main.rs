use std::process::ExitCode;

use clap::Parser as _;
use memlock_trace::{
    UsageError,
    cli::{Cli, Command, WorkloadName},
    session, workload,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        None => session::run(cli.trace),
        Some(Command::Workload { name, report }) => run_workload(name, report.as_deref()).map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(error) => {
            eprintln!("memlock-trace: error: {error:#}");
            if error.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn run_workload(name: WorkloadName, report: Option<&std::path::Path>) -> anyhow::Result<()> {
    let calls = match name {
        WorkloadName::Syscalls => workload::syscalls::run()?,
        WorkloadName::Faults => return workload::faults::serve(),
    };
    let json = serde_json::to_string_pretty(&calls)?;
    match report {
        Some(path) => std::fs::write(path, json)?,
        None => println!("{json}"),
    }
    Ok(())
}

//! Project tasks cargo cannot do by itself: toolchain set-up, the bundled run, the host and
//! VM test stages. `cargo xtask --help`.

mod bench;
mod run;
mod setup;
mod test;
mod util;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what the build needs (rust-src, bpf-linker) and mount tracefs; idempotent.
    Setup,
    /// Build everything and run the bundled workloads under the tracer.
    Run(run::Args),
    /// Run the tests on this kernel and inside a qemu VM booting a stock Debian kernel.
    Test(test::Args),
    /// Measure what tracing page faults costs (untraced vs memlock-trace vs bpftrace) and
    /// write BENCHMARKS.md.
    Bench(bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Setup => setup::ensure(),
        Task::Run(args) => setup::ensure().and_then(|()| run::run(&args)),
        Task::Test(args) => setup::ensure().and_then(|()| test::run(&args)),
        Task::Bench(args) => setup::ensure().and_then(|()| bench::run(&args)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

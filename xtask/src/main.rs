//! Project tasks cargo cannot do by itself: toolchain set-up, the bundled run, the lint
//! checks, the host and VM test stages, the benchmark. `cargo xtask --help`.

mod bench;
mod dist;
mod lint;
mod run;
mod setup;
mod test;
mod util;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// memlock-trace's project tasks: set-up, the bundled run, lint, the tests on four kernels and
/// the page-fault benchmark.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and linting need (rust-src, bpf-linker, rustfmt, clippy) and
    /// mount tracefs; idempotent.
    Setup,
    /// Build everything and run the bundled workloads under the tracer.
    Run(run::Args),
    /// Check formatting and run clippy on user space and the eBPF crate; `test` does this first.
    ///
    /// Runs `cargo fmt --all -- --check`, `cargo clippy --all-targets -- -D warnings` (the
    /// user-space crates) and clippy for memlock-trace-ebpf (nightly, bpfel-unknown-none,
    /// `-Z build-std=core`). Every check runs; a failure names each failing check and the
    /// command that reproduces it.
    Lint,
    /// Lint, then run the tests on this kernel and in qemu guests booting Debian's 5.10, 6.1
    /// and 6.12, and arm64's 6.1 (emulated, the binaries cross-built; 6.12 with `--kernel
    /// 6.12-arm64`).
    ///
    /// The lint checks of `cargo xtask lint` always run first: if one fails, no test runs.
    /// Then the test binaries are built once and run on this machine's kernel and inside the
    /// guests, side by side, with a table per kernel and `N passed, N failed` over all.
    Test(test::Args),
    /// Build the release binary with its man page, bash/zsh/fish completions and systemd unit
    /// under target/dist/ (a /usr/local-style tree: bin/, share/man/man1/,
    /// share/...completions, lib/systemd/system/); `--target aarch64-unknown-linux-gnu`
    /// cross-builds them under target/dist/aarch64-unknown-linux-gnu/.
    Dist(dist::Args),
    /// Measure what tracing page faults costs (untraced vs memlock-trace vs bpftrace) and
    /// write BENCHMARKS.md.
    Bench(bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Setup => setup::ensure(),
        Task::Run(args) => setup::ensure().and_then(|()| run::run(&args)),
        Task::Lint => setup::ensure().and_then(|()| lint::run()),
        Task::Test(args) => setup::ensure().and_then(|()| test::run(&args)),
        Task::Dist(args) => setup::ensure().and_then(|()| dist::run(&args)),
        // Inside a guest (`--in-guest`) there is no toolchain, only the programs to measure.
        Task::Bench(args) if args.in_guest() => bench::run(&args),
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

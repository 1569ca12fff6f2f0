//! The hidden flags of `cargo xtask bench`, built only with the `bench` feature: design
//! variants and floors to measure against, never a user's choice.

use clap::Args;

use crate::faults::{BenchFloor, FaultOptions};

#[derive(Debug, Args, Default, Clone)]
pub struct BenchArgs {
    /// Benchmark only: attach the fault-start tracepoints the classic way even where tp_btf
    /// works (as bpftrace does).
    #[arg(long, hide = true)]
    pub classic_tracepoints: bool,
    /// Benchmark only: time faults from the system-wide start tracepoints even with -p or a
    /// command, where the start is otherwise taken on the targets' threads only.
    #[arg(long, hide = true)]
    pub tracepoint_start: bool,
    /// Benchmark only: the tracepoint set's per-fault hooks with programs that do nothing
    /// (`empty`) or only read the clock (`clock`), or the per-thread events of `-p` with
    /// programs that do nothing (`per-thread`); nothing is counted.
    #[arg(long, hide = true, value_enum, value_name = "FLOOR")]
    pub bench_floor: Option<BenchFloor>,
}

impl BenchArgs {
    /// Sets the fault options these flags choose.
    pub fn apply(&self, options: &mut FaultOptions) {
        options.classic_tracepoints = self.classic_tracepoints;
        options.tracepoint_start = self.tracepoint_start;
        options.bench_floor = self.bench_floor;
    }
}

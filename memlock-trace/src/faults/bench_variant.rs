//! Design variants and floors that `cargo xtask bench` measures the fault hooks against,
//! never a user's choice: flags only in a build with the `bench` feature (hidden even
//! there); a product build holds the defaults, which change nothing.

/// The bench's choices of fault hooks; the default is the product's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "bench", derive(clap::Args))]
pub struct BenchVariant {
    /// Benchmark only: attach the fault-start tracepoints the classic way even where tp_btf
    /// works, as bpftrace 0.17 does, for a like-for-like comparison.
    #[cfg_attr(feature = "bench", arg(long, hide = true))]
    pub classic_tracepoints: bool,
    /// Benchmark only: time faults from the system-wide start tracepoints even with -p or a
    /// command, where the start is otherwise taken on the targets' threads only.
    #[cfg_attr(feature = "bench", arg(long, hide = true))]
    pub tracepoint_start: bool,
    /// Benchmark only: the tracepoint set's per-fault hooks with programs that do nothing
    /// (`empty`) or only read the clock (`clock`), or the per-thread events of -p with
    /// programs that do nothing (`per-thread`); nothing is counted.
    #[cfg_attr(
        feature = "bench",
        arg(long = "bench-floor", hide = true, value_enum, value_name = "FLOOR")
    )]
    pub floor: Option<BenchFloor>,
}

/// Programs that attach to the tracepoint set's per-fault hooks and do nothing or only read
/// the clock at each end: what the hooks alone cost, and what timing a fault on them cannot
/// go below, the floors under any tool doing this job. Nothing is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchFloor {
    /// The system-wide hooks (tp_btf start, perf completion on every CPU), programs that
    /// return at once.
    Empty,
    /// The same hooks, programs that only read the clock.
    Clock,
    /// The hooks used with `-p`: `PAGE_FAULTS` (start) and `PAGE_FAULTS_MIN/MAJ`
    /// (completion, at the `--latency-sample` period) on each target thread, programs that
    /// return at once.
    PerThread,
}

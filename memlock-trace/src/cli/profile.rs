//! `--folded`, `--flamegraph`, `--pprof`: the kept stacks as profilers' files.

use std::path::PathBuf;

use clap::Args;

use crate::profile::Weight;

#[derive(Debug, Args, Default, Clone)]
pub struct ProfileArgs {
    /// Write the kept stacks (implies --stacks) to FILE as folded lines, as stackcollapse-perf.pl
    /// writes them (process name, then frames root first, `;`-separated, the weight last),
    /// for flamegraph.pl, inferno and speedscope.
    #[arg(long, value_name = "FILE")]
    pub folded: Option<PathBuf>,
    /// Draw the kept stacks (implies --stacks) as a flame graph SVG (flamegraph.pl's `mem`
    /// palette, widths in pages, calls or bytes per --profile-weight).
    #[arg(long, value_name = "FILE")]
    pub flamegraph: Option<PathBuf>,
    /// Write the kept stacks (implies --stacks) as a pprof profile (gzipped profile.proto) for
    /// `go tool pprof`, Grafana Pyroscope and Parca: sample types faults and bytes (calls and
    /// locked bytes for the call sites).
    #[arg(long, value_name = "FILE")]
    pub pprof: Option<PathBuf>,
    /// What the profile files weigh: fault stacks by faults (pages) or by bytes faulted in,
    /// mlock-family call sites by calls or by bytes locked.
    #[arg(long, value_enum, value_name = "WEIGHT", default_value_t = Weight::Faults)]
    pub profile_weight: Weight,
}

impl ProfileArgs {
    /// Whether any profile file was asked for (each implies `--stacks`).
    pub fn any_file(&self) -> bool {
        self.folded.is_some() || self.flamegraph.is_some() || self.pprof.is_some()
    }

    /// The files asked for, created now (see [`crate::profile::ProfileFiles::open`]).
    pub fn open(&self) -> anyhow::Result<crate::profile::ProfileFiles> {
        crate::profile::ProfileFiles::open(
            self.folded.as_deref(),
            self.flamegraph.as_deref(),
            self.pprof.as_deref(),
            self.profile_weight,
        )
    }
}

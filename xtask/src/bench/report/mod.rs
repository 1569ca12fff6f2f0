//! The markdown section `cargo xtask bench` writes into BENCHMARKS.md: method, results,
//! the targets, the max-rate run and the per-program costs. [`method`] writes the heading
//! and the method, [`tables`] the tables, [`targets`] the verdicts; this file holds the
//! figures they share and the section's place in BENCHMARKS.md.

mod method;
mod tables;
mod targets;

use std::{path::Path, process::Command};

use super::{
    Args, Mode, load_average,
    measure::{Latency, ProgramCost, Sample},
};

/// The machine a benchmark ran on, as every report names it.
pub(super) struct Machine {
    /// The kernel's release (`uname -r`).
    pub(super) kernel: String,
    pub(super) cpus: usize,
    /// What `bpftrace --version` printed.
    pub(super) bpftrace_version: String,
    /// The load averages (1, 5, 15 minutes) before the first run and after the last.
    pub(super) load_before: String,
    pub(super) load_after: String,
}

impl Machine {
    /// This machine as the runs start; `load_after` is for the caller to fill in.
    pub(super) fn before_the_runs(bpftrace: &Path) -> Self {
        Self {
            kernel: kernel_release(),
            cpus: std::thread::available_parallelism().map_or(1, usize::from),
            bpftrace_version: bpftrace_version(bpftrace),
            load_before: load_average(),
            load_after: String::new(),
        }
    }
}

/// What the page-fault report says about the machine.
pub(super) struct Environment {
    pub(super) machine: Machine,
    pub(super) thp: String,
}

/// BENCHMARKS.md holds every benchmark's report: each owns the text between its two markers.
pub(super) type Markers = (&'static str, &'static str);

/// The page-fault benchmark's markers.
pub(super) const FAULTS_SECTION: Markers = (
    "<!-- cargo xtask bench: page faults (generated, do not edit) -->",
    "<!-- end of cargo xtask bench -->",
);

/// `existing` with the section between `markers` replaced by `report` (appended if absent).
pub(super) fn replace_section(existing: &str, markers: Markers, report: &str) -> String {
    let (section_begin, section_end) = markers;
    let section = format!("{section_begin}\n{}\n{section_end}\n", report.trim_end());
    match (existing.find(section_begin), existing.find(section_end)) {
        (Some(begin), Some(end)) if begin < end => {
            let after = &existing[end + section_end.len()..];
            format!(
                "{}{section}{}",
                &existing[..begin],
                after.strip_prefix('\n').unwrap_or(after)
            )
        }
        _ if existing.trim().is_empty() => format!("# Benchmarks\n\n{section}"),
        _ => format!("{}\n\n{section}", existing.trim_end()),
    }
}

pub(super) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The running kernel's release, as `uname -r` prints it.
pub(super) fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .into()
}

/// What `bpftrace --version` prints, or nothing.
fn bpftrace_version(bpftrace: &Path) -> String {
    crate::util::output_of(Command::new(bpftrace).arg("--version"))
        .unwrap_or_default()
        .trim()
        .into()
}

/// The page-fault benchmark's section, from the rounds' `samples`, the non-target runs
/// (`neighbours`: round, mode, sample), the max-rate runs and the programs' costs.
pub(super) fn report(
    args: &Args,
    pages: usize,
    env: &Environment,
    samples: &[(Mode, Sample)],
    neighbours: &[(usize, Mode, Sample)],
    max_rate: &[(Mode, Sample)],
    costs: &[ProgramCost],
) -> String {
    let figures = Figures::new(samples, neighbours);
    let mut out = String::new();
    method::heading_and_method(&mut out, args, pages, env);
    tables::results(&mut out, args.runs, &figures);
    tables::non_target(&mut out, &figures);
    tables::sampled_latency(&mut out, &figures);
    targets::against_the_targets(&mut out, &figures);
    targets::where_the_cost_goes(&mut out, &figures);
    tables::max_rate(&mut out, pages, env.machine.cpus, max_rate);
    tables::program_costs(&mut out, pages, costs);
    out
}

/// The rounds' runs, and the figures the report derives from them: medians over rounds.
struct Figures<'a> {
    /// Every mode once a round, rounds in order.
    samples: &'a [(Mode, Sample)],
    /// (round, mode, sample) while the tracer followed another process.
    neighbours: &'a [(usize, Mode, Sample)],
    /// An untraced fault's CPU ns: what "vs untraced" divides by.
    untraced: f64,
}

impl<'a> Figures<'a> {
    fn new(samples: &'a [(Mode, Sample)], neighbours: &'a [(usize, Mode, Sample)]) -> Self {
        let mut figures = Self {
            samples,
            neighbours,
            untraced: 0.0,
        };
        figures.untraced = median(figures.cpu_ns(Mode::Untraced));
        figures
    }

    /// `ns` as a share of an untraced fault, in %.
    fn percent_of_untraced(&self, ns: f64) -> f64 {
        ns / self.untraced * 100.0
    }

    /// `mode`'s CPU ns per fault, one a round.
    fn cpu_ns(&self, mode: Mode) -> Vec<f64> {
        self.per_round(mode, |s| s.ns_per_fault)
    }

    /// `mode`'s wall-clock ns per fault, one a round.
    fn wall_ns(&self, mode: Mode) -> Vec<f64> {
        self.per_round(mode, |s| s.wall_ns_per_fault)
    }

    fn per_round(&self, mode: Mode, figure: fn(&Sample) -> f64) -> Vec<f64> {
        self.samples
            .iter()
            .filter(|(m, _)| *m == mode)
            .map(|(_, s)| figure(s))
            .collect()
    }

    /// Faults the kernel counted and the tracer did not, over all rounds.
    fn faults_lost(&self, mode: Mode) -> i64 {
        self.samples
            .iter()
            .filter(|(m, _)| *m == mode)
            .filter_map(|(_, s)| s.traced_faults.map(|t| s.kernel_faults as i64 - t as i64))
            .sum()
    }

    /// Added cost: the median over rounds of (mode - untraced) within the same round, which
    /// cancels the drift of a shared machine better than a difference of medians.
    fn added(&self, mode: Mode) -> f64 {
        let paired: Vec<f64> = self
            .samples
            .chunks(Mode::ALL.len())
            .filter_map(|round| {
                let of = |m: Mode| {
                    round
                        .iter()
                        .find(|(x, _)| *x == m)
                        .map(|(_, s)| s.ns_per_fault)
                };
                Some(of(mode)? - of(Mode::Untraced)?)
            })
            .collect();
        median(paired)
    }

    /// A non-target's CPU ns per fault under `mode`, one a round.
    fn neighbour_cpu_ns(&self, mode: Mode) -> Vec<f64> {
        self.neighbours
            .iter()
            .filter(|(_, m, _)| *m == mode)
            .map(|(_, _, s)| s.ns_per_fault)
            .collect()
    }

    /// A non-target's added cost: against the untraced run of the same round.
    fn neighbour_added(&self, mode: Mode) -> f64 {
        let rounds: Vec<&[(Mode, Sample)]> = self.samples.chunks(Mode::ALL.len()).collect();
        median(
            self.neighbours
                .iter()
                .filter(|(_, m, _)| *m == mode)
                .filter_map(|(round, _, s)| {
                    let untraced = rounds
                        .get(round - 1)?
                        .iter()
                        .find(|(m, _)| *m == Mode::Untraced)?;
                    Some(s.ns_per_fault - untraced.1.ns_per_fault)
                })
                .collect(),
        )
    }

    /// The median over rounds of one latency figure of `mode`.
    fn latency(&self, mode: Mode, figure: fn(&Latency) -> u64) -> f64 {
        median(
            self.samples
                .iter()
                .filter(|(m, _)| *m == mode)
                .filter_map(|(_, s)| s.latency.as_ref().map(|l| figure(l) as f64))
                .collect(),
        )
    }

    /// `mode`'s p50, p90 and p99.
    fn percentiles(&self, mode: Mode) -> [f64; 3] {
        [
            self.latency(mode, |l| l.p50),
            self.latency(mode, |l| l.p90),
            self.latency(mode, |l| l.p99),
        ]
    }

    /// `mode`'s p50, p90 and p99 over the default (exact) mode's.
    fn against_exact(&self, mode: Mode) -> Vec<f64> {
        let exact = self.percentiles(Mode::Default);
        self.percentiles(mode)
            .iter()
            .zip(exact)
            .map(|(v, e)| v / e)
            .collect()
    }

    /// The largest deviation of a sampled mode's percentile from the exact one (0.1: 10%).
    fn worst_sampled_deviation(&self) -> f64 {
        Mode::latency_compared()
            .filter(|&mode| mode != Mode::Default)
            .flat_map(|mode| self.against_exact(mode))
            .fold(0.0, |w: f64, x| w.max((x - 1.0).abs()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_is_replaced_in_place_and_the_rest_kept() {
        let first = replace_section(
            "# Benchmarks\n\n## Other\ntext\n",
            FAULTS_SECTION,
            "## Faults\nv1\n",
        );
        assert!(
            first.starts_with("# Benchmarks\n\n## Other\ntext\n\n"),
            "{first}"
        );
        assert!(first.contains("## Faults\nv1"));
        let second = replace_section(
            &format!("{first}\n## Later\n"),
            FAULTS_SECTION,
            "## Faults\nv2\n",
        );
        assert!(
            second.contains("## Faults\nv2") && !second.contains("v1"),
            "{second}"
        );
        assert!(
            second.contains("## Other\ntext") && second.contains("## Later"),
            "{second}"
        );
        assert!(replace_section("", FAULTS_SECTION, "## F\n").starts_with("# Benchmarks\n\n"));
    }
}

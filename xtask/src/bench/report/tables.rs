//! The report's tables: each mode's cost per fault, what a process that is not traced pays,
//! sampled latency against exact, the max-rate run and the BPF programs' own run time.

use std::fmt::Write as _;

use super::{
    super::{
        Mode,
        measure::{ProgramCost, Sample},
    },
    Figures, median,
};

/// Every mode's CPU and wall time per fault, added cost and faults lost.
pub(super) fn results(out: &mut String, runs: usize, figures: &Figures) {
    let _ = writeln!(out, "### Results: first touch, {runs} runs per mode\n");
    table_header(
        out,
        "| mode | CPU ns/fault | min | max | added | vs untraced | wall ns/fault | faults lost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    );
    for mode in Mode::ALL {
        let cpu = figures.cpu_ns(mode);
        let lost = figures.faults_lost(mode);
        let min = cpu.iter().copied().fold(f64::INFINITY, f64::min);
        let max = cpu.iter().copied().fold(0.0, f64::max);
        let med = median(cpu);
        let added = figures.added(mode);
        let dash = |v: String| {
            if mode == Mode::Untraced {
                "-".to_string()
            } else {
                v
            }
        };
        let _ = writeln!(
            out,
            "| {} | {med:.0} | {min:.0} | {max:.0} | {} | {} | {:.0} | {} |",
            mode.label(),
            dash(format!("{added:+.0}")),
            dash(format!("{:+.1}%", added / figures.untraced * 100.0)),
            median(figures.wall_ns(mode)),
            dash(lost.to_string()),
        );
    }
}

/// What the same workload pays, untraced itself, while the tracer follows a `sleep`.
pub(super) fn non_target(out: &mut String, figures: &Figures) {
    let _ = writeln!(
        out,
        "\n### A process that is not traced, while the tracer follows another with `-p`\n"
    );
    table_header(
        out,
        "| mode (following a `sleep`) | CPU ns/fault | added | vs untraced |",
        "|---|---:|---:|---:|",
    );
    for mode in &Mode::ALL[1..] {
        let add = figures.neighbour_added(*mode);
        let _ = writeln!(
            out,
            "| {} | {:.0} | {add:+.0} | {:+.1}% |",
            mode.label(),
            median(figures.neighbour_cpu_ns(*mode)),
            add / figures.untraced * 100.0
        );
    }
}

/// The latency modes' percentiles, and each against the default (exact) mode's.
pub(super) fn sampled_latency(out: &mut String, figures: &Figures) {
    let _ = writeln!(
        out,
        "\n### Sampled latency against exact, same workload (medians over rounds)\n"
    );
    table_header(
        out,
        "| mode | faults timed | p50 ns | p90 ns | p99 ns | p50 / exact | p90 / exact | p99 / exact |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    );
    for mode in Mode::latency_compared() {
        let p = figures.percentiles(mode);
        let r = figures.against_exact(mode);
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} |",
            mode.label(),
            figures.latency(mode, |l| l.timed),
            p[0],
            p[1],
            p[2],
            r[0],
            r[1],
            r[2]
        );
    }
}

/// Every CPU faulting at once: the time per fault and the counts, which must agree.
pub(super) fn max_rate(out: &mut String, pages: usize, cpus: usize, runs: &[(Mode, Sample)]) {
    let _ = writeln!(
        out,
        "\n### Maximum fault rate: {cpus} threads faulting at once (`mtouch {pages} {cpus}`)\n"
    );
    table_header(
        out,
        "| mode | wall ns/fault | CPU ns/fault | faults (kernel) | faults (tracer) | lost |",
        "|---|---:|---:|---:|---:|---:|",
    );
    for (mode, s) in runs {
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {} | {} | {} |",
            mode.label(),
            s.wall_ns_per_fault,
            s.ns_per_fault,
            s.kernel_faults,
            s.traced_faults.map_or("-".into(), |t| t.to_string()),
            s.traced_faults
                .map_or("-".into(), |t| (s.kernel_faults as i64 - t as i64)
                    .to_string()),
        );
    }
}

/// Each BPF program's run time per call in the profiled runs.
pub(super) fn program_costs(out: &mut String, pages: usize, costs: &[ProgramCost]) {
    let _ = writeln!(
        out,
        "\n### Where the cost goes: BPF program run time per call (`kernel.bpf_stats_enabled`, one \
         extra run each)\n\nPrograms that ran during the {pages}-fault run (other processes' \
         faults included, which the target filter rejects early). The kernel's timing adds two \
         clock reads to each run. What the table does not show is the hooks' own cost (the perf \
         overflow path, tracepoint dispatch) and, for bpftrace, work deferred out of its \
         programs (map element allocation and freeing).\n"
    );
    table_header(
        out,
        "| tracer | program | runs | avg ns/run |",
        "|---|---|---:|---:|",
    );
    for c in costs {
        let _ = writeln!(
            out,
            "| {} | `{}` | {} | {:.0} |",
            c.mode.label(),
            c.name,
            c.runs,
            c.avg_ns
        );
    }
}

/// A markdown table's column names and their alignment row.
fn table_header(out: &mut String, columns: &str, alignment: &str) {
    let _ = writeln!(out, "{columns}\n{alignment}");
}

//! The node-cost section of BENCHMARKS.md: method, the ratio table, the goals, and a plot
//! of the ratios.

use std::{fmt::Write as _, path::Path};

use anyhow::Result;
use plotters::prelude::*;

use super::{Run, Setup, figures::Figures};
use crate::bench::report::{Machine, Markers};

pub(super) const PLOT: &str = "docs/node-cost.svg";
pub(super) const SECTION: Markers = (
    "<!-- cargo xtask bench --node-cost (generated, do not edit) -->",
    "<!-- end of cargo xtask bench --node-cost -->",
);

pub(super) const GUEST_SECTION: Markers = (
    "<!-- cargo xtask bench --node-cost --guest (generated, do not edit) -->",
    "<!-- end of cargo xtask bench --node-cost --guest -->",
);

/// One guest's runs (`--guest`).
pub(super) struct GuestRuns {
    pub(super) kernel: String,
    pub(super) hooks: String,
    pub(super) runs: Vec<Run>,
}

pub(super) struct Environment {
    pub(super) machine: Machine,
    pub(super) rounds: usize,
    /// `probe`'s line for the syscall family: which hooks the system calls pay for.
    pub(super) hooks: String,
}

/// One figure, as a cost relative to untraced (above 1: costlier), from a run's figures.
struct Metric {
    name: &'static str,
    /// The figure itself, and the unit it is shown in.
    value: fn(&Figures) -> Option<f64>,
    unit: &'static str,
    /// Rates are inverted, so every ratio reads "times the untraced cost".
    is_rate: bool,
}

const METRICS: [Metric; 4] = [
    Metric {
        name: "fork+exec `/bin/true` (shell loop, per CPU-s)",
        value: |f| Some(f.fork_exec_per_sec),
        unit: "/s",
        is_rate: true,
    },
    Metric {
        name: "`stress-ng --fork 1` bogo-ops per CPU-s",
        value: |f| f.stress_fork_per_sec,
        unit: "/s",
        is_rate: true,
    },
    Metric {
        name: "`getppid` via `syscall()`",
        value: |f| Some(f.getppid_ns),
        unit: " ns",
        is_rate: false,
    },
    Metric {
        name: "first touch, fresh process",
        value: |f| Some(f.first_touch_ns),
        unit: " ns/page",
        is_rate: false,
    },
];

fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// The median over rounds of `setup`'s figure.
fn median_value(runs: &[Run], setup: Setup, metric: &Metric) -> Option<f64> {
    median(
        runs.iter()
            .filter(|r| r.setup == setup)
            .filter_map(|r| (metric.value)(&r.figures))
            .collect(),
    )
}

/// A table's first two lines: a column per setup.
fn table_header(r: &mut String, setups: &[Setup]) {
    let _ = write!(r, "| |");
    for setup in setups {
        let _ = write!(r, " {} |", setup.label());
    }
    let _ = write!(r, "\n|---|");
    for _ in setups {
        let _ = write!(r, "---|");
    }
    r.push('\n');
}

/// The median over rounds of `setup`'s session map memory, in bytes.
fn median_map_bytes(runs: &[Run], setup: Setup) -> Option<f64> {
    median(
        runs.iter()
            .filter(|run| run.setup == setup)
            .filter_map(|run| run.figures.map_bytes.map(|b| b as f64))
            .collect(),
    )
}

/// A goal's verdict from the figure that decides it.
fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "not met",
        None => "not measured",
    }
}

/// The median over rounds of `setup`'s cost against the same round's untraced one.
fn median_ratio(runs: &[Run], setup: Setup, metric: &Metric) -> Option<f64> {
    let ratios = runs
        .iter()
        .filter(|r| r.setup == setup)
        .filter_map(|r| {
            let base = runs
                .iter()
                .find(|b| b.round == r.round && b.setup == Setup::Untraced)?;
            let (value, base) = ((metric.value)(&r.figures)?, (metric.value)(&base.figures)?);
            Some(if metric.is_rate {
                base / value
            } else {
                value / base
            })
        })
        .collect();
    median(ratios)
}

pub(super) fn section(env: &Environment, runs: &[Run]) -> String {
    let mut r = String::new();
    let _ = writeln!(
        r,
        "## Node cost: what a session costs the other processes (`cargo xtask bench --node-cost`)\n"
    );
    let _ = writeln!(
        r,
        "Method: {} rounds; in each, every setup in turn: started, waited for until attached, \
         then, beside it: a POSIX shell loop of 400 fork+exec `/bin/true` (runs per CPU-second \
         of the shell and its children), `stress-ng --fork 1 -t 3` (bogo-ops per CPU-second, \
         usr+sys), 300,000 `syscall(SYS_getppid)` (the fastest of 6 loops, thread CPU ns per \
         call), and a fresh `memlock-trace workload faults` process first-touching 64 MiB \
         (the fastest of 3, its CPU time per page): CPU time throughout, as the machine is \
         shared and wall time would count others' work; what a tracer adds runs in the \
         measured processes' kernel time and counts. Then the \
         session's BPF map memory (`memlock:` of its map fds' fdinfo) and stopped. Each figure \
         is divided by the same round's untraced one (rates inverted: every ratio is the cost \
         against untraced, above 1 costlier); the table gives the medians of those ratios and, \
         in brackets, the median figure. The two floors are the system-wide modes' own hooks \
         with fault programs that return at once (hidden `--bench-floor empty`; the other \
         families' programs run as they do): what any program there costs before it counts. \
         Kernel {}, {} CPUs, shared with other builds: load \
         average {} before, {} after. {}. Syscall hooks: {}.\n",
        env.rounds,
        env.machine.kernel,
        env.machine.cpus,
        env.machine.load_before,
        env.machine.load_after,
        env.machine.bpftrace_version,
        if env.hooks.is_empty() {
            "(probe printed none)"
        } else {
            &env.hooks
        },
    );
    table_header(&mut r, &Setup::ALL);
    for metric in &METRICS {
        let _ = write!(r, "| {} |", metric.name);
        for setup in Setup::ALL {
            let value = median_value(runs, setup, metric);
            let cell = match (setup, median_ratio(runs, setup, metric), value) {
                (_, _, None) => "-".to_string(),
                (Setup::Untraced, _, Some(v)) => format!("1 ({v:.1}{})", metric.unit),
                (_, Some(ratio), Some(v)) => format!("{ratio:.2} ({v:.1}{})", metric.unit),
                (_, None, Some(v)) => format!("({v:.1}{})", metric.unit),
            };
            let _ = write!(r, " {cell} |");
        }
        r.push('\n');
    }
    let _ = write!(r, "| BPF map memory of the session |");
    for setup in Setup::ALL {
        let bytes = median_map_bytes(runs, setup);
        let maps = runs
            .iter()
            .find(|run| run.setup == setup)
            .map_or(0, |run| run.figures.maps);
        let cell = bytes.map_or("-".into(), |b| {
            format!("{:.1} MiB, {maps} maps", b / (1024.0 * 1024.0))
        });
        let _ = write!(r, " {cell} |");
    }
    let _ = writeln!(
        r,
        "\n\n![node cost ratios]({})\n",
        PLOT.trim_start_matches("docs/")
    );
    goals(&mut r, runs);
    r
}

/// The guests' section: per guest, memlock-trace's setups as ratios to the guest's own
/// untraced figures (the figures themselves are an emulated CPU's), and the goals that
/// concern the fentry hooks.
pub(super) fn guest_section(guests: &[GuestRuns], rounds: usize) -> String {
    let mut r = String::new();
    let _ = writeln!(
        r,
        "## Node cost in guests: the fentry syscall hooks (`cargo xtask bench --node-cost \
         --guest KERNEL`)\n\n\
         Method: as the host's section above, inside a qemu guest (software emulation, one \
         CPU) booting the stock kernel, {rounds} rounds; memlock-trace's setups only \
         (bpftrace is not carried into the guest), `stress-ng` absent. Each cell is the median \
         of the per-round ratios to the same round's untraced figure: an emulated CPU's \
         figures themselves mean little.\n"
    );
    let setups = [
        Setup::SystemWide,
        Setup::SystemWideCountOnly,
        Setup::OtherProcess,
    ];
    for guest in guests {
        let _ = writeln!(
            r,
            "### {} (syscall hooks: {})\n",
            guest.kernel,
            if guest.hooks.is_empty() {
                "-"
            } else {
                &guest.hooks
            }
        );
        table_header(&mut r, &setups);
        for metric in METRICS.iter().filter(|m| !m.name.contains("stress-ng")) {
            let _ = write!(r, "| {} |", metric.name);
            for setup in setups {
                let cell = median_ratio(&guest.runs, setup, metric)
                    .map_or("-".into(), |ratio| format!("{ratio:.2}"));
                let _ = write!(r, " {cell} |");
            }
            r.push('\n');
        }
        let _ = write!(r, "| BPF map memory of the session |");
        for setup in setups {
            let bytes = median_map_bytes(&guest.runs, setup);
            let cell = bytes.map_or("-".into(), |b| format!("{:.1} MiB", b / (1024.0 * 1024.0)));
            let _ = write!(r, " {cell} |");
        }
        let getppid = median_ratio(&guest.runs, Setup::SystemWide, &METRICS[2]);
        let fork = median_ratio(&guest.runs, Setup::SystemWide, &METRICS[0]);
        let _ = writeln!(
            r,
            "\n\n- `getppid` beside a system-wide session within 5% of untraced: {} ({})\n\
             - fork+exec rate >= 0.95 of untraced, system-wide: {} ({})\n",
            getppid.map_or("-".into(), |c| format!("{c:.2}")),
            verdict(getppid.map(|c| c <= 1.05)),
            fork.map_or("-".into(), |c| format!("{:.2} of untraced", 1.0 / c)),
            verdict(fork.map(|c| 1.0 / c >= 0.95)),
        );
    }
    r
}

/// The goals, each with the figure that decides it.
fn goals(r: &mut String, runs: &[Run]) {
    let ratio = |setup, index: usize| median_ratio(runs, setup, &METRICS[index]);
    let _ = writeln!(r, "Goals (medians of the per-round ratios):\n");
    let of_untraced = |c: Option<f64>| c.map_or("-".into(), |c| format!("{:.2}", 1.0 / c));
    for (setup, label, floor) in [
        (
            Setup::SystemWide,
            "system-wide",
            Some(Setup::SystemWideFloor),
        ),
        (
            Setup::SystemWideCountOnly,
            "`--count-only`",
            Some(Setup::SystemWideCountOnlyFloor),
        ),
        (Setup::OtherProcess, "`-p`", None),
    ] {
        let fork = ratio(setup, 0);
        let floor = floor.map_or(String::new(), |floor| {
            format!("; its floor: {}", of_untraced(ratio(floor, 0)))
        });
        let _ = writeln!(
            r,
            "- fork+exec rate >= 0.95 of untraced, {label}: {} of untraced ({}{floor})",
            of_untraced(fork),
            verdict(fork.map(|c| 1.0 / c >= 0.95)),
        );
    }
    let (ours, peer) = (
        ratio(Setup::SystemWide, 2),
        ratio(Setup::BpftraceSyscalls, 2),
    );
    let _ = writeln!(
        r,
        "- `getppid` beside a system-wide session no slower than beside bpftrace's syscall \
         script: {} against {} ({}); within 5% of untraced (where fentry is used): {}",
        ours.map_or("-".into(), |c| format!("{c:.2}")),
        peer.map_or("-".into(), |c| format!("{c:.2}")),
        verdict(ours.zip(peer).map(|(o, p)| o <= p)),
        verdict(ours.map(|c| c <= 1.05)),
    );
    for (row, work) in [(0, "fork+exec"), (1, "`stress-ng --fork`")] {
        for (ours, peer, mode, script) in [
            (
                Setup::SystemWide,
                Setup::BpftraceFaults,
                "default mode",
                "faults + latency script",
            ),
            (
                Setup::SystemWideCountOnly,
                Setup::BpftraceFaultCount,
                "`--count-only`",
                "fault-count script",
            ),
        ] {
            let (ours, peer) = (ratio(ours, row), ratio(peer, row));
            let _ = writeln!(
                r,
                "- {work} beside a system-wide session, {mode} no costlier than bpftrace's \
                 {script}: {} against {} ({})",
                ours.map_or("-".into(), |c| format!("{c:.2}")),
                peer.map_or("-".into(), |c| format!("{c:.2}")),
                verdict(ours.zip(peer).map(|(o, p)| o <= p)),
            );
        }
    }
    let (ours, peer) = (ratio(Setup::SystemWide, 3), ratio(Setup::BpftraceFaults, 3));
    let _ = writeln!(
        r,
        "- first touch, default mode no costlier than bpftrace's fault script: {} against {} \
         ({})",
        ours.map_or("-".into(), |c| format!("{c:.2}")),
        peer.map_or("-".into(), |c| format!("{c:.2}")),
        verdict(ours.zip(peer).map(|(o, p)| o <= p)),
    );
    let count_only = ratio(Setup::SystemWideCountOnly, 3);
    let floor = ratio(Setup::SystemWideCountOnlyFloor, 3);
    let _ = writeln!(
        r,
        "- first touch, `--count-only` within 3% of untraced: {} ({}; its floor: {})",
        count_only.map_or("-".into(), |c| format!("{c:.2}")),
        verdict(count_only.map(|c| c <= 1.03)),
        floor.map_or("-".into(), |c| format!("{c:.2}")),
    );
}

const COLORS: [RGBColor; Setup::ALL.len()] = [
    RGBColor(128, 128, 128),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(174, 199, 232),
    RGBColor(152, 223, 138),
    RGBColor(23, 190, 207),
    RGBColor(214, 39, 40),
    RGBColor(255, 152, 150),
    RGBColor(255, 127, 14),
];

/// Grouped bars: per figure, each setup's median cost ratio against untraced.
pub(super) fn plot(path: &Path, runs: &[Run]) -> Result<()> {
    let root = SVGBackend::new(path, (960, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let ratios: Vec<Vec<f64>> = METRICS
        .iter()
        .map(|m| {
            Setup::ALL
                .iter()
                .map(|&s| median_ratio(runs, s, m).unwrap_or(0.0))
                .collect()
        })
        .collect();
    let top = ratios.iter().flatten().fold(1.0f64, |a, &b| a.max(b)) * 1.15;
    let groups = METRICS.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "cost against untraced (median ratio over rounds; 1 = untraced)",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..groups, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(METRICS.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let index = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 && index < METRICS.len() {
                ["fork+exec", "stress-ng --fork", "getppid", "first touch"][index].into()
            } else {
                String::new()
            }
        })
        .draw()?;
    let width = 0.8 / Setup::ALL.len() as f64;
    for (s, setup) in Setup::ALL.iter().enumerate() {
        let color = COLORS[s];
        chart
            .draw_series(ratios.iter().enumerate().map(|(g, row)| {
                let x0 = g as f64 + 0.1 + s as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width * 0.9, row[s])], color.filled())
            }))?
            .label(setup.label())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(0.0, 1.0), (groups, 1.0)],
        BLACK,
    )))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

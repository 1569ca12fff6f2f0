//! SVG charts for the report (plotters): which figures each scenario shows, and the bar and
//! line charts they are drawn as.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

use super::{ScenarioRun, f};
use crate::lab::workload::scenario::Scenario;

/// The scenario's own chart, `NAME.svg` in `dir`; `None` for a scenario without one.
pub(super) fn scenario_chart(dir: &Path, run: &ScenarioRun) -> Result<Option<String>> {
    let file = format!("{}.svg", run.scenario.name());
    let path = dir.join(&file);
    if run.scenario == Scenario::ThreadCreate {
        thread_create_lines(&path, run)?;
    } else if let Some((title, y_label)) = bar_axes(run.scenario) {
        bars(&path, title, y_label, &scenario_bars(run))?;
    } else {
        return Ok(None);
    }
    Ok(Some(file))
}

/// The creation rate at each process count, a line per mlock mode (the paper's figure 3).
fn thread_create_lines(path: &Path, run: &ScenarioRun) -> Result<()> {
    let results = run.own["results"].as_array().cloned().unwrap_or_default();
    let series: Vec<(String, Vec<(f64, f64)>)> = crate::lab::workload::thread_create::MODES
        .iter()
        .map(|mode| {
            (
                format!("mlock={mode}"),
                results
                    .iter()
                    .filter(|r| r["mode"] == *mode)
                    .map(|r| (f(&r["processes"]), f(&r["threads_per_sec"])))
                    .collect(),
            )
        })
        .collect();
    lines(
        path,
        "thread creation rate (paper figure 3)",
        "processes",
        "threads/s",
        &series,
    )
}

/// The bars of the scenarios drawn from their variants' figures: the scenario, the bar's
/// label, the variant, the path to the figure in it, and what to divide the figure by.
const VARIANT_BARS: &[(Scenario, &str, &str, &[&str], f64)] = &[
    (
        Scenario::FirstTouch,
        "lazy touch",
        "lazy",
        &["touch_ns_per_page"],
        1.0,
    ),
    (
        Scenario::FirstTouch,
        "mlock call",
        "mlock",
        &["call_ns_per_page"],
        1.0,
    ),
    (
        Scenario::FirstTouch,
        "touch, mlocked",
        "mlock",
        &["touch_ns_per_page"],
        1.0,
    ),
    (
        Scenario::FirstTouch,
        "populate mmap",
        "populate",
        &["call_ns_per_page"],
        1.0,
    ),
    (
        Scenario::FirstTouch,
        "touch, populated",
        "populate",
        &["touch_ns_per_page"],
        1.0,
    ),
    (
        Scenario::ThreadStack,
        "no mlock",
        "off",
        &["faults_per_thread"],
        1.0,
    ),
    (
        Scenario::ThreadStack,
        "MCL_FUTURE",
        "future",
        &["faults_per_thread"],
        1.0,
    ),
    (
        Scenario::DynamicAlloc,
        "mlock=off",
        "off",
        &["faults", "minflt"],
        1.0,
    ),
    (
        Scenario::DynamicAlloc,
        "MCL_FUTURE",
        "future",
        &["faults", "minflt"],
        1.0,
    ),
    (
        Scenario::MallocVsMmap,
        "malloc write",
        "malloc",
        &["write_us"],
        1.0,
    ),
    (
        Scenario::MallocVsMmap,
        "MAP_LOCKED write",
        "mmap-locked",
        &["write_us"],
        1.0,
    ),
    (
        Scenario::MallocVsMmap,
        "malloc read",
        "malloc",
        &["read_us"],
        1.0,
    ),
    (
        Scenario::MallocVsMmap,
        "MAP_LOCKED read",
        "mmap-locked",
        &["read_us"],
        1.0,
    ),
    (
        Scenario::VmMemory,
        "mem-lock=off",
        "mem-lock-off",
        &["rss_max_kib"],
        1024.0,
    ),
    (
        Scenario::VmMemory,
        "mem-lock=on",
        "mem-lock-on",
        &["rss_max_kib"],
        1024.0,
    ),
];

/// The title and y axis of a scenario drawn as bars.
fn bar_axes(scenario: Scenario) -> Option<(&'static str, &'static str)> {
    Some(match scenario {
        Scenario::FirstTouch => ("first touch: ns per 4 KiB page", "ns/page"),
        Scenario::ThreadStack => ("faults per thread", "faults"),
        Scenario::DynamicAlloc => ("page faults of one large malloc (paper figure 4)", "faults"),
        Scenario::MallocVsMmap => ("1M random accesses to 28-byte records", "us"),
        Scenario::VmMemory => ("qemu resident memory (MiB)", "MiB"),
        Scenario::MemoryPressure => ("touching each region again after the pressure (ms)", "ms"),
        Scenario::ThreadCreate
        | Scenario::VmaSplit
        | Scenario::ThpSplit
        | Scenario::ForkInherit
        | Scenario::MemlockLimit => return None,
    })
}

/// The bars of a scenario drawn as a bar chart.
fn scenario_bars(run: &ScenarioRun) -> Vec<(String, f64)> {
    if run.scenario == Scenario::MemoryPressure {
        let again = &run.own["touched_again"];
        return vec![
            ("lazy".into(), f(&again["lazy"]["ns"]) / 1e6),
            ("MAP_POPULATE".into(), f(&again["populate"]["ns"]) / 1e6),
            ("mlock".into(), f(&again["mlock"]["ns"]) / 1e6),
            (
                "mlock, after munlock".into(),
                f(&run.own["munlock"]["touched_again"]["ns"]) / 1e6,
            ),
        ];
    }
    VARIANT_BARS
        .iter()
        .filter(|bar| bar.0 == run.scenario)
        .map(|(_, label, variant, path, divisor)| {
            let figure = path.iter().fold(run.variant(variant), |v, key| &v[*key]);
            (label.to_string(), f(figure) / divisor)
        })
        .collect()
}

/// Minor-fault latency percentiles of the lazy first touch and the malloc run, as the fault
/// family measured them in the kernel.
pub(super) fn fault_latency_chart(dir: &Path, runs: &[ScenarioRun]) -> Result<Option<String>> {
    let mut values = Vec::new();
    for (scenario, variant) in [
        (Scenario::FirstTouch, "lazy"),
        (Scenario::MallocVsMmap, "malloc"),
    ] {
        let Some(run) = runs.iter().find(|r| r.scenario == scenario) else {
            continue;
        };
        let lat = &run.faults(run.pid_of(variant))["latency_ns"]["minor"];
        for q in ["p50", "p90", "p99", "p99_9"] {
            if let Some(ns) = lat[q].as_f64() {
                values.push((format!("{variant} {q}"), ns / 1000.0));
            }
        }
    }
    if values.is_empty() {
        return Ok(None);
    }
    bar_file(
        dir,
        "fault-latency.svg",
        "minor page fault latency (us)",
        "us",
        &values,
    )
}

/// Latency distribution of every traced mlock-family call in the suite, in log2 buckets.
pub(super) fn latency_chart(dir: &Path, runs: &[ScenarioRun]) -> Result<Option<String>> {
    let mut buckets = [0u64; 32];
    for e in runs.iter().flat_map(|r| &r.events) {
        let ns = e["latency_ns"].as_u64().unwrap_or(1).max(1);
        buckets[(63 - ns.leading_zeros() as usize).min(31)] += 1;
    }
    let (Some(lo), Some(hi)) = (
        buckets.iter().position(|&b| b > 0),
        buckets.iter().rposition(|&b| b > 0),
    ) else {
        return Ok(None);
    };
    let values: Vec<(String, f64)> = (lo..=hi)
        .map(|i| (crate::output::duration(1 << i), buckets[i] as f64))
        .collect();
    bar_file(
        dir,
        "syscall-latency.svg",
        "mlock-family call latency (calls per log2 bucket)",
        "calls",
        &values,
    )
}

/// Draws `values` as bars into `file` in `dir`; returns the file's name, for the report.
fn bar_file(
    dir: &Path,
    file: &str,
    title: &str,
    y_label: &str,
    values: &[(String, f64)],
) -> Result<Option<String>> {
    bars(&dir.join(file), title, y_label, values)?;
    Ok(Some(file.to_string()))
}

const SIZE: (u32, u32) = (720, 420);
const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
];

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing a chart: {e}")
}

/// One bar per `(label, value)`.
pub fn bars(path: &Path, title: &str, y_label: &str, bars: &[(String, f64)]) -> Result<()> {
    // Drawn in memory, then written as every file the tool writes: private, no symlink.
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let max = bars.iter().map(|b| b.1).fold(0.0, f64::max).max(1e-9) * 1.15;
        let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((0..bars.len().saturating_sub(1)).into_segmented(), 0.0..max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .y_desc(y_label)
            .x_label_formatter(&|x| match x {
                SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .draw()
            .map_err(err)?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
                let color = COLORS[i % COLORS.len()];
                let mut bar = Rectangle::new(
                    [
                        (SegmentValue::Exact(i), 0.0),
                        (SegmentValue::Exact(i + 1), *v),
                    ],
                    color.filled(),
                );
                bar.set_margin(0, 0, 12, 12);
                bar
            }))
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    crate::output::write_private(path, svg.as_bytes(), "suite -o")
}

/// One line per series of `(x, y)` points.
pub fn lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<()> {
    // Drawn in memory, then written as every file the tool writes: private, no symlink.
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let points = series.iter().flat_map(|s| s.1.iter());
        let (x_max, y_max) = points.fold((1.0f64, 1e-9f64), |(x, y), p| (x.max(p.0), y.max(p.1)));
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..x_max + 0.5, 0.0..y_max * 1.15)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .draw()
            .map_err(err)?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(err)?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    crate::output::write_private(path, svg.as_bytes(), "suite -o")
}

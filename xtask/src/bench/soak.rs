//! `cargo xtask bench --soak MINUTES`: memlock-trace system-wide with `--prometheus`, as a
//! fleet node runs it, while processes churn around it: a fork+exec loop of `/bin/true`,
//! short `python3` runs, and python children that each take a name never seen before and
//! make one `mlock` + `munlock`. Every few seconds the tracer's resident memory, CPU time and
//! `/metrics` series are sampled; the figures and a plot go into BENCHMARKS.md. Memory
//! bounded by the options, not by how many processes came and went, shows as flat lines
//! after the warm-up.

use std::{
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use plotters::prelude::*;

use super::report::{Markers, replace_section};
use crate::run::workspace_root;

const SECTION: Markers = (
    "<!-- cargo xtask bench --soak (generated, do not edit) -->",
    "<!-- end of cargo xtask bench --soak -->",
);
const PLOT: &str = "docs/soak.svg";
const PORT: u16 = 19477;
const SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// Children with names of their own, each locking one page: the names a fleet node never
/// sees twice (cron jobs, build steps), which per-name state must not keep forever.
const NAMED_CHURN: &str = r#"
import ctypes, mmap, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
buf = mmap.mmap(-1, 4096)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
n = 0
while True:
    n += 1
    pid = os.fork()
    if pid == 0:
        libc.prctl(15, f"soak-{n}".encode(), 0, 0, 0)  # PR_SET_NAME
        libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(4096))
        libc.munlock(ctypes.c_void_p(addr), ctypes.c_size_t(4096))
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.02)
"#;

struct Sample {
    secs: f64,
    rss_mib: f64,
    /// CPU the tracer used since the previous sample, in percent of one CPU.
    cpu_percent: f64,
    series: u64,
    scrape_ms: f64,
    processes_started: u64,
}

pub fn run(tracer: &Path, minutes: f64, out: &Path) -> Result<()> {
    if minutes <= 0.0 {
        bail!("--soak takes minutes > 0");
    }
    crate::util::install_missing_packages(&["python3"])
        .context("the churn runs python3 children")?;
    let hz = clock_ticks();
    // Files, not pipes: a pipe nobody reads for minutes fills and stops the tracer.
    let dir = std::env::temp_dir().join(format!("memlock-trace-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = Command::new(tracer)
        .args(["--prometheus", &format!("127.0.0.1:{PORT}"), "--json"])
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?)
        .spawn()
        .with_context(|| format!("starting {}", tracer.display()))?;
    let pid = child.id();
    wait_for_metrics(&mut child, &err_path)?;
    let churn = start_churn()?;
    let forks_before = forks();
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut last_ticks = cpu_ticks(pid)?;
    let mut last_at = Instant::now();
    while started.elapsed().as_secs_f64() < minutes * 60.0 {
        std::thread::sleep(SAMPLE_EVERY);
        let ticks = cpu_ticks(pid)?;
        let now = Instant::now();
        let scrape_started = Instant::now();
        let series = series_count()?;
        let sample = Sample {
            secs: started.elapsed().as_secs_f64(),
            rss_mib: rss_kib(pid)? as f64 / 1024.0,
            cpu_percent: (ticks - last_ticks) as f64 / hz * 100.0
                / now.duration_since(last_at).as_secs_f64(),
            series,
            scrape_ms: scrape_started.elapsed().as_secs_f64() * 1e3,
            processes_started: forks() - forks_before,
        };
        eprintln!(
            "xtask soak: {:6.0} s  rss {:6.1} MiB  cpu {:5.1} %  series {:6}  scrape {:5.0} ms  \
             processes {}",
            sample.secs,
            sample.rss_mib,
            sample.cpu_percent,
            sample.series,
            sample.scrape_ms,
            sample.processes_started
        );
        samples.push(sample);
        (last_ticks, last_at) = (ticks, now);
    }
    for mut c in churn {
        let _ = c.kill();
        let _ = c.wait();
    }
    let peak_kib = hwm_kib(pid)?;
    // The stop as a service manager does it: SIGTERM, then how long until the tool is gone.
    let stop = Instant::now();
    // SAFETY: kill takes integers; `pid` is our child, not yet waited for.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    child.wait()?;
    let stop_secs = stop.elapsed().as_secs_f64();
    let stdout = std::fs::read_to_string(&out_path)?;
    let stderr = std::fs::read_to_string(&err_path)?;
    eprintln!("xtask soak: the tracer's stderr:\n{stderr}");
    let summary = stdout
        .lines()
        .rev()
        .find(|l| l.contains("\"type\":\"summary\""))
        .context("the tracer wrote no summary after SIGTERM")?;
    let summary: serde_json::Value = serde_json::from_str(summary)?;
    let listed = summary["processes"].as_array().map_or(0, Vec::len);
    let folded = summary["folded"]["processes"].as_u64().unwrap_or(0);
    if samples.is_empty() {
        bail!("the soak ended before its first sample ({SAMPLE_EVERY:?})");
    }
    let root = workspace_root();
    plot(&root.join(PLOT), &samples)?;
    let report = report(&samples, minutes, peak_kib, stop_secs, listed, folded);
    let out = root.join(out);
    let existing = std::fs::read_to_string(&out).unwrap_or_default();
    std::fs::write(&out, replace_section(&existing, SECTION, &report))?;
    println!("{report}");
    println!(
        "xtask soak: wrote {} and {}",
        out.display(),
        root.join(PLOT).display()
    );
    Ok(())
}

fn start_churn() -> Result<Vec<Child>> {
    let spawn = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting the churn ({program})"))
    };
    Ok(vec![
        // fork+exec as fast as a shell goes, paced so the node is busy but not saturated.
        spawn(
            "bash",
            &[
                "-c",
                "while :; do for i in 1 2 3 4 5 6 7 8 9 10; do /bin/true; done; sleep 0.05; done",
            ],
        )?,
        // Short interpreter runs: thousands of page faults each.
        spawn(
            "bash",
            &["-c", "while :; do python3 -c pass; sleep 0.2; done"],
        )?,
        spawn("python3", &["-c", NAMED_CHURN])?,
    ])
}

fn wait_for_metrics(child: &mut Child, stderr: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            let err = std::fs::read_to_string(stderr).unwrap_or_default();
            bail!("the tracer exited ({status}) before serving /metrics:\n{err}");
        }
        if series_count().is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("the tracer did not serve /metrics on port {PORT} within 30 s")
}

/// Series in one scrape of /metrics: its sample lines.
fn series_count() -> Result<u64> {
    let mut stream = TcpStream::connect(("127.0.0.1", PORT))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "GET /metrics HTTP/1.0\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n"
    )?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    let body = body
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .context("no HTTP body")?;
    Ok(body
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count() as u64)
}

fn status_kib(pid: u32, key: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {key} in /proc/{pid}/status"))
}

fn rss_kib(pid: u32) -> Result<u64> {
    status_kib(pid, "VmRSS:")
}

fn hwm_kib(pid: u32) -> Result<u64> {
    status_kib(pid, "VmHWM:")
}

/// utime + stime of `pid`, clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("bad /proc/PID/stat")?
        .1
        .split_whitespace()
        .collect();
    // Fields 14 and 15 of stat, 12 and 13 after the comm.
    Ok(fields[11].parse::<u64>()? + fields[12].parse::<u64>()?)
}

/// Processes started on the machine since boot (`processes` of /proc/stat).
fn forks() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("processes "))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf takes an integer and touches no memory.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

/// One figure of a sample, for a panel of the plot.
type Figure = Box<dyn Fn(&Sample) -> f64>;

fn plot(path: &Path, samples: &[Sample]) -> Result<()> {
    let root = SVGBackend::new(path, (900, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((3, 1));
    let minutes = samples.last().map_or(1.0, |s| s.secs / 60.0).max(0.1);
    let series: [(&str, RGBColor, Figure); 3] = [
        ("tracer RSS (MiB)", BLUE, Box::new(|s| s.rss_mib)),
        (
            "tracer CPU (% of one CPU)",
            RED,
            Box::new(|s| s.cpu_percent),
        ),
        ("/metrics series", GREEN, Box::new(|s| s.series as f64)),
    ];
    for (panel, (label, color, value)) in panels.iter().zip(series) {
        let top = samples.iter().map(&value).fold(0.0, f64::max).max(1.0) * 1.15;
        let mut chart = ChartBuilder::on(panel)
            .caption(label, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..minutes, 0.0..top)?;
        chart
            .configure_mesh()
            .x_desc("minutes")
            .light_line_style(WHITE)
            .draw()?;
        chart.draw_series(LineSeries::new(
            samples.iter().map(|s| (s.secs / 60.0, value(s))),
            &color,
        ))?;
    }
    root.present()?;
    Ok(())
}

fn report(
    samples: &[Sample],
    minutes: f64,
    peak_kib: u64,
    stop_secs: f64,
    listed: usize,
    folded: u64,
) -> String {
    let mut r = String::new();
    let last = samples.last().expect("checked non-empty");
    // After the warm-up: the second half of the run against its first sample past the warm-up.
    let warm = samples.len() / 4;
    let after_warmup = &samples[warm..];
    let (lo, hi) = after_warmup.iter().fold((f64::MAX, 0.0f64), |(lo, hi), s| {
        (lo.min(s.rss_mib), hi.max(s.rss_mib))
    });
    let series_hi = after_warmup.iter().map(|s| s.series).max().unwrap_or(0);
    let series_lo = after_warmup.iter().map(|s| s.series).min().unwrap_or(0);
    let cpu_mean =
        after_warmup.iter().map(|s| s.cpu_percent).sum::<f64>() / after_warmup.len() as f64;
    let scrape_max = samples.iter().map(|s| s.scrape_ms).fold(0.0, f64::max);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let _ = writeln!(
        r,
        "## Soak: {minutes} minutes system-wide under process churn (`cargo xtask bench --soak {minutes}`)\n"
    );
    let _ = writeln!(
        r,
        "`memlock-trace --prometheus 127.0.0.1:{PORT} --json`, default options, on kernel {}, \
         {cpus} CPUs, {}, while a shell forks and execs `/bin/true` (10 per 50 ms), `python3 -c \
         pass` runs every 0.2 s, and python children each take a new name (`soak-N`) and make \
         one `mlock` + `munlock`. Sampled every {} s: the tracer's VmRSS, its CPU time, and the \
         sample lines of one `/metrics` scrape.\n",
        kernel.trim(),
        date(),
        SAMPLE_EVERY.as_secs()
    );
    let _ = writeln!(r, "![soak]({PLOT})\n");
    let _ = writeln!(r, "| figure | value |\n|---|---|");
    let _ = writeln!(
        r,
        "| processes started during the soak | {} |",
        last.processes_started
    );
    let _ = writeln!(
        r,
        "| RSS after the warm-up (first quarter), min .. max | {lo:.1} .. {hi:.1} MiB |"
    );
    let _ = writeln!(
        r,
        "| RSS at the end / peak (VmHWM) | {:.1} / {:.1} MiB |",
        last.rss_mib,
        peak_kib as f64 / 1024.0
    );
    let _ = writeln!(
        r,
        "| tracer CPU after the warm-up, mean | {cpu_mean:.1} % of one CPU |"
    );
    let _ = writeln!(
        r,
        "| /metrics series after the warm-up, min .. max | {series_lo} .. {series_hi} |"
    );
    let _ = writeln!(r, "| slowest scrape | {scrape_max:.0} ms |");
    let _ = writeln!(r, "| SIGTERM to exit, summary written | {stop_secs:.2} s |");
    let _ = writeln!(
        r,
        "| summary: processes listed / folded by name (`--max-processes`) | {listed} / {folded} |"
    );
    r
}

fn date() -> String {
    Command::new("date")
        .args(["-u", "+%F"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

//! One traced run: this binary run as the tracer (`--json -i`, its documented interval and
//! summary lines into a private file) with the target's `/proc` sampled alongside, read
//! back for the target process.

use std::{
    collections::BTreeMap,
    ffi::OsString,
    io::BufRead as _,
    os::unix::{ffi::OsStrExt as _, process::CommandExt as _},
    path::PathBuf,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, anyhow};
use serde::{Deserialize, Serialize};

use super::sample::{Pid, Sampler, Samples};
use crate::{
    CommandError, exit,
    output::{Outside, WallClock},
};

/// How often the tracer prints an interval: the resolution of the start-up split.
const INTERVAL_SECS: &str = "0.1";
/// Mappings per process in each interval line: all of them.
const ALL_MAPPINGS: &str = "1000000";

pub enum Target {
    Pid {
        pid: u32,
        secs: f64,
    },
    /// Its name and arguments as bytes (they need not be UTF-8).
    Command(Vec<OsString>),
}

/// What the second run of `--apply` changes: variables set for the command alone (so that
/// the tracer itself does not load the preload library), and the log the preload library
/// writes.
#[derive(Clone, Debug, Default)]
pub struct Environment {
    pub vars: Vec<(String, String)>,
    pub preload_log: Option<PathBuf>,
}

/// Latency of a class as the tracer's JSON gives it.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize)]
pub struct Latency {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub max: u64,
    #[serde(default)]
    pub total: u64,
}

#[derive(Clone, Debug, Deserialize)]
pub struct MappingRow {
    pub mapping: String,
    pub start: String,
    pub end: String,
    pub faults: u64,
    pub locked: Option<bool>,
    /// A faulting thread's stack pointer was inside it: a stack.
    #[serde(default)]
    pub stack: bool,
    /// `--stacks`: the stacks that faulted most in it.
    #[serde(default)]
    pub stacks: Vec<Site>,
}

/// One of a mapping's top stacks (`--stacks`): its sampled faults and functions, innermost
/// first, as the tracer's JSON gives them.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Site {
    /// Faults that kept this stack (one in the tracer's `--stack-sample`).
    pub faults: u64,
    pub frames: Vec<SiteFrame>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct SiteFrame {
    pub symbol: String,
}

/// A process's `"faults"` object, the parts advise reads.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Faults {
    pub minor: u64,
    pub major: u64,
    pub user: u64,
    pub populated: u64,
    #[serde(default)]
    pub latency_ns: BTreeMap<String, Latency>,
    #[serde(default)]
    pub by_mapping: Vec<MappingRow>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct Window {
    pub start_ns: u64,
    pub end_ns: u64,
}

/// The tracer's lines advise reads (`"type"`).
#[derive(Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum LineKind {
    Interval,
    Summary,
}

#[derive(Deserialize)]
struct Line {
    #[serde(rename = "type")]
    kind: LineKind,
    window: Window,
    processes: Vec<Process>,
    #[serde(default)]
    dropped_events: u64,
    #[serde(default)]
    fault_health: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Process {
    pid: u32,
    comm: String,
    faults: Option<Faults>,
    #[serde(default)]
    syscalls: BTreeMap<String, Calls>,
}

/// An mlock-family call's figures in the summary.
#[derive(Deserialize)]
struct Calls {
    #[serde(default)]
    pages_locked: u64,
}

/// The target's faults in one interval.
#[derive(Clone, Debug)]
pub struct Interval {
    pub window: Window,
    pub faults: Faults,
}

pub struct Run {
    /// `--stacks`: the tracer kept fault stacks; the command that draws them as a flame
    /// graph.
    pub flamegraph_command: Option<Outside>,
    pub pid: u32,
    pub comm: String,
    /// What was traced, for the report's first line.
    /// The target in words: `pid N`, or the command quoted (its bytes, escaped when shown).
    pub described: Outside,
    pub launched: bool,
    /// The launched command's exit status (None for `-p`: not ours, and it did not exit).
    pub exit_code: Option<i32>,
    /// `-p`: the process still ran when the trace ended.
    pub running_at_end: bool,
    pub intervals: Vec<Interval>,
    /// The whole session's figures for the target.
    pub session: Faults,
    pub session_window: Window,
    pub samples: Samples,
    /// Other processes of the trace (children): pid, comm, faults.
    pub others: Vec<(u32, String, u64)>,
    /// Fault records and maps the tracer lost (non-zero: the figures are short).
    pub lost: u64,
    /// The preload library's log lines.
    pub preload_log: Vec<String>,
    /// Bytes the kernel counted locked by the target's mlock-family calls.
    pub locked_by_calls: u64,
    /// From the process's start to the tracer seeing it exit (launched commands).
    pub wall_ns: Option<u64>,
    /// When the launched process started (CLOCK_REALTIME ns, to the clock tick).
    pub started_ns: Option<u64>,
}

/// `words` as one command line a POSIX shell splits back into them.
fn shell_words<'a>(words: impl IntoIterator<Item = &'a [u8]> + Clone) -> Vec<u8> {
    // Only a NUL byte cannot be quoted, and no argument or environment string holds one.
    shlex::bytes::try_join(words.clone())
        .unwrap_or_else(|_| words.into_iter().collect::<Vec<_>>().join(&b' '))
}

/// Runs the tracer on `target` and reads back its lines; `stacks`: with fault stacks.
pub fn run(target: &Target, env: &Environment, latency_sample: u32, stacks: bool) -> Result<Run> {
    let exe = std::env::current_exe().context("finding memlock-trace's own binary")?;
    // A running process's name before the trace: it may exit during it.
    let comm_before = match target {
        Target::Pid { pid, .. } => crate::procfs::read_comm(*pid),
        Target::Command(_) => None,
    };
    let lines = temp_path("lines")?;
    let mut tracer = tracer_command(&exe, &lines, target, env, latency_sample, stacks);
    let (described, traced) = describe(target, env);
    let flamegraph_command = stacks.then(|| {
        Outside::from(
            [
                &b"memlock-trace --stacks --flamegraph faults.svg "[..],
                &traced,
            ]
            .concat(),
        )
    });
    // Ctrl-C stops the tracer, which then writes its summary: advise waits for it and
    // advises on what was traced instead of dying with it. The tracer gets the default
    // disposition back (an ignored signal would stay ignored across exec).
    // SAFETY: signal(2) with a constant disposition; no memory is touched.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        tracer.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let spawned = tracer
        .stdin(Stdio::inherit())
        .spawn()
        .with_context(|| format!("running the tracer {}", exe.display()));
    let mut child = spawned?;
    let sampler = Sampler::start(match target {
        Target::Pid { pid, .. } => Pid::Known(*pid),
        Target::Command(_) => Pid::ChildOf(child.id()),
    });
    let status = child.wait().context("waiting for the tracer")?;
    let sampled_pid = sampler.pid();
    let samples = sampler.finish();
    let text = std::fs::read(&lines);
    let _ = std::fs::remove_file(&lines);
    let code = status.code().unwrap_or(i32::from(exit::FAILURE));
    let parsed = parse_lines(&text.unwrap_or_default())?;
    let Some(summary) = parsed.iter().find(|l| l.kind == LineKind::Summary) else {
        return Err(no_summary(code));
    };
    let pid = target_pid(target, sampled_pid, summary)?;
    let ours = summary.processes.iter().find(|p| p.pid == pid);
    let intervals = parsed
        .iter()
        .filter(|l| l.kind == LineKind::Interval)
        .map(|l| Interval {
            window: l.window,
            faults: l
                .processes
                .iter()
                .find(|p| p.pid == pid)
                .and_then(|p| p.faults.clone())
                .unwrap_or_default(),
        })
        .collect();
    let started_ns = started_ns(target, &samples);
    let running_at_end = matches!(target, Target::Pid { .. })
        && samples
            .start_boot_ns
            .is_some_and(|start| super::sample::still_running(pid, start));
    // The summary is made as soon as the command has exited: its end is the command's.
    let wall_ns = started_ns.and_then(|started| summary.window.end_ns.checked_sub(started));
    Ok(Run {
        flamegraph_command,
        pid,
        // A process that neither faulted nor called while traced is in no summary line: its
        // name from /proc, while it lives, or as it was before the trace.
        comm: ours.map_or_else(
            || {
                crate::procfs::read_comm(pid)
                    .or(comm_before)
                    .map_or_else(String::new, |c| c.to_string())
            },
            |p| p.comm.clone(),
        ),
        described,
        launched: matches!(target, Target::Command(_)),
        exit_code: matches!(target, Target::Command(_)).then_some(code),
        running_at_end,
        intervals,
        session: ours.and_then(|p| p.faults.clone()).unwrap_or_default(),
        session_window: summary.window,
        samples,
        others: summary
            .processes
            .iter()
            .filter(|p| p.pid != pid)
            .map(|p| {
                let faults = p.faults.as_ref().map_or(0, |f| f.minor + f.major);
                (p.pid, p.comm.clone(), faults)
            })
            .collect(),
        lost: lost(summary),
        preload_log: preload_log(env),
        wall_ns,
        started_ns,
        locked_by_calls: ours.map_or(0, |p| {
            p.syscalls.values().map(|c| c.pages_locked).sum::<u64>() * crate::procfs::PAGE_SIZE
        }),
    })
}

/// This binary as the tracer of `target`, its JSON lines into `lines`; a command runs with
/// the variables of `env` set in its environment alone (`--command-env`: not through
/// `env(1)`, whose own faults and mappings would be counted as the command's).
fn tracer_command(
    exe: &std::path::Path,
    lines: &std::path::Path,
    target: &Target,
    env: &Environment,
    latency_sample: u32,
    stacks: bool,
) -> Command {
    let mut tracer = Command::new(exe);
    tracer.args([
        "--json",
        "-q",
        "-i",
        INTERVAL_SECS,
        "--top-mappings",
        ALL_MAPPINGS,
    ]);
    tracer.args(["--latency-sample", &latency_sample.to_string()]);
    if stacks {
        tracer.arg("--stacks");
    }
    tracer.arg("-o").arg(lines);
    match target {
        Target::Pid { pid, secs } => {
            tracer.args(["-p", &pid.to_string(), "-d", &secs.to_string()]);
        }
        Target::Command(argv) => {
            for (k, v) in &env.vars {
                tracer.arg(format!("--command-env={k}={v}"));
            }
            tracer.arg("--").args(argv);
        }
    }
    tracer
}

/// The target in words for the report (`pid N`, or the command quoted), and the tracer's
/// arguments that trace it again (for the flame graph's command).
fn describe(target: &Target, env: &Environment) -> (Outside, Vec<u8>) {
    match target {
        Target::Pid { pid, secs } => {
            let traced = format!("-p {pid} -d {secs}").into_bytes();
            (Outside::from(format!("pid {pid}")), traced)
        }
        Target::Command(argv) => {
            let env_words: Vec<Vec<u8>> = (!env.vars.is_empty())
                .then(|| b"env".to_vec())
                .into_iter()
                .chain(
                    env.vars
                        .iter()
                        .map(|(k, v)| format!("{k}={v}").into_bytes()),
                )
                .collect();
            let argv_words = argv.iter().map(|a| a.as_bytes());
            let command = shell_words(argv_words.clone());
            let quoted = [&b"`"[..], &command, b"`"].concat();
            let traced = shell_words(env_words.iter().map(Vec::as_slice).chain(argv_words));
            (Outside::from(quoted), [&b"-- "[..], &traced].concat())
        }
    }
}

/// The tracer's interval and summary lines; the VMA family's own lines are not read here.
fn parse_lines(text: &[u8]) -> Result<Vec<Line>> {
    text.lines()
        .map_while(Result::ok)
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<serde_json::Value>(&l))
        .filter(|v| {
            v.as_ref().map_or(true, |v| {
                matches!(v["type"].as_str(), Some("interval" | "summary"))
            })
        })
        .map(|v| v.and_then(serde_json::from_value))
        .collect::<Result<_, _>>()
        .context("reading the tracer's JSON lines")
}

/// The error of a traced run without a summary: the command could not run (its exit code,
/// as the tracer's: 126, 127), or the tracer failed.
fn no_summary(code: i32) -> anyhow::Error {
    if let Ok(code) = u8::try_from(code)
        && [exit::NOT_EXECUTABLE, exit::NOT_FOUND].contains(&code)
    {
        return CommandError {
            code,
            message: "the command could not be run (see the error above)".into(),
        }
        .into();
    }
    anyhow!(
        "the traced run ended without a summary (tracer exit status {code}): see its error \
         above"
    )
}

/// The process advised on: the one given, or the launched command as the sampler found it.
fn target_pid(target: &Target, sampled_pid: Option<u32>, summary: &Line) -> Result<u32> {
    Ok(match (target, sampled_pid) {
        (Target::Pid { pid, .. }, _) => *pid,
        (Target::Command(_), Some(pid)) => pid,
        // Exited before the first sample: the process with the most faults.
        (Target::Command(_), None) => summary
            .processes
            .iter()
            .max_by_key(|p| p.faults.as_ref().map_or(0, |f| f.minor + f.major))
            .map(|p| p.pid)
            .ok_or_else(|| anyhow!("the traced run saw no process fault"))?,
    })
}

/// Fault records and maps the tracer lost.
fn lost(summary: &Line) -> u64 {
    summary.dropped_events
        + summary.fault_health.as_ref().map_or(0, |h| {
            ["stats_evicted", "regions_evicted", "update_failed"]
                .iter()
                .filter_map(|k| h[k].as_u64())
                .sum()
        })
}

/// The preload library's log lines (the log removed once read).
fn preload_log(env: &Environment) -> Vec<String> {
    match &env.preload_log {
        Some(path) => {
            let log = std::fs::read_to_string(path).unwrap_or_default();
            let _ = std::fs::remove_file(path);
            log.lines().map(str::to_string).collect()
        }
        None => Vec::new(),
    }
}

/// The launched process's start in CLOCK_REALTIME: now minus its age.
fn started_ns(target: &Target, samples: &Samples) -> Option<u64> {
    match (target, samples.start_boot_ns) {
        (Target::Command(_), Some(start)) => crate::procfs::boot_time_ns()
            .ok()
            .and_then(|now| now.checked_sub(start))
            .and_then(|age| WallClock::now_ns().checked_sub(age)),
        _ => None,
    }
}

/// A file only we can read, in the temporary directory.
pub fn temp_path(what: &str) -> Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = std::env::temp_dir().join(format!(
        "memlock-trace-advise-{}-{what}-{}",
        std::process::id(),
        WallClock::now_ns()
    ));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_command_is_quoted_as_a_shell_reads_it() {
        let words: [&[u8]; 4] = [b"python3", b"my table.py", b"$HOME", b"\xff"];
        let line = super::shell_words(words);
        assert_eq!(line, b"python3 'my table.py' '$HOME' '\xff'");
        let split = shlex::bytes::split(&line).unwrap();
        assert_eq!(split, words.map(<[u8]>::to_vec));
    }
}

//! `advise --apply`: the environment that carries the advice out (the preload library's
//! rules, glibc's tunables) and the two runs compared. Nothing in the program changes, and
//! no limit is raised: advice the limit refuses was already turned into populating.

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use super::units::{count, ms};
use super::{
    observe::{Environment, temp_path},
    rules::{Advice, ApplyStep, Verdict},
    table::{Phase, Table},
};
use crate::UsageError;

/// The preload library's file name, as cargo builds it.
pub const PRELOAD_FILE: &str = "libmemlock_preload.so";
/// Where to find it instead of next to the binary.
pub const PRELOAD_ENV: &str = "MEMLOCK_TRACE_PRELOAD";
/// Rows of the mapping comparison.
const MAPPING_ROWS: usize = 8;
/// The advice helped when the faults the program's code took after start-up fell below this
/// share of before. Counts, not their time: a fault count is the same from run to run, while
/// one run's fault time follows the machine's load (measured for issue 30: churn.py's
/// first-round heap touches under the tunables cost 110-181 ms traced on a loaded host
/// against 120-180 ms for each of the untuned rounds, but 224 ms against 179 ms for ten times
/// the faults in one unlucky run).
const HELPED_BELOW: f64 = 0.8;

pub struct Plan {
    pub env: Environment,
}

/// Blocks `malloc`/`calloc` return of at least this size are logged in the first run of
/// `--apply`: below it glibc serves them from its heaps, at it or above (its default mmap
/// threshold is 128 KiB, raised up to 32 MiB as blocks are freed) with a mapping of their
/// own.
const WATCH_BLOCKS_FROM: usize = 64 << 10;

/// The first run's environment under `--apply`: the preload library only watches, logging
/// the large blocks the allocator returns, so that advice on a mapping malloc made can
/// name the blocks to populate or lock (glibc maps them itself, out of the library's
/// `mmap` hook's sight). Without the library, the first run goes as plain `advise`.
pub fn watch() -> Result<Environment> {
    let Ok(library) = preload_library() else {
        return Ok(Environment::default());
    };
    let mut env = Environment::default();
    let log = preload_env(&mut env, &library)?;
    env.vars.push((
        "MEMLOCK_PRELOAD_WATCH".into(),
        WATCH_BLOCKS_FROM.to_string(),
    ));
    env.preload_log = Some(log);
    Ok(env)
}

/// `LD_PRELOAD` (ours first, the caller's after) and the log, in `env`; the log's path.
fn preload_env(env: &mut Environment, library: &std::path::Path) -> Result<PathBuf> {
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(existing) if !existing.is_empty() => format!("{}:{existing}", library.display()),
        _ => library.display().to_string(),
    };
    // Writable by the command whoever it runs as (it may drop privileges), readable by us
    // alone.
    let log = temp_path("preload-log")?;
    std::fs::set_permissions(&log, std::os::unix::fs::PermissionsExt::from_mode(0o622))?;
    env.vars.push(("LD_PRELOAD".into(), preload));
    env.vars
        .push(("MEMLOCK_PRELOAD_LOG".into(), log.display().to_string()));
    Ok(log)
}

/// The second run's environment, or None when no advice can be applied.
pub fn plan(advice: &[Advice]) -> Result<Option<Plan>> {
    let steps: Vec<ApplyStep> = advice
        .iter()
        .filter(|a| a.verdict == Verdict::Do)
        .filter_map(|a| a.apply.clone())
        .collect();
    if steps.is_empty() {
        return Ok(None);
    }
    let mut env = Environment::default();
    let rules = preload_rules(&steps);
    let tunables: Vec<&str> = steps
        .iter()
        .filter_map(|s| match s {
            ApplyStep::Tunable(t) => Some(t.as_str()),
            ApplyStep::Preload(_) => None,
        })
        .collect();
    if !rules.is_empty() {
        let library = preload_library()?;
        let log = preload_env(&mut env, &library)?;
        env.vars
            .push(("MEMLOCK_PRELOAD_RULES".into(), rules.join(";")));
        env.preload_log = Some(log);
    }
    if !tunables.is_empty() {
        // The program's own tunables stay; ours follow, so they win where both set one.
        let mut all: Vec<String> = std::env::var("GLIBC_TUNABLES")
            .ok()
            .filter(|t| !t.is_empty())
            .into_iter()
            .collect();
        all.extend(tunables.iter().map(|t| t.to_string()));
        env.vars.push(("GLIBC_TUNABLES".into(), all.join(":")));
    }
    Ok(Some(Plan { env }))
}

/// The preload library's rules for `steps`, one per kind and length
/// (`ACTION:KIND:LENGTH[:PATH]`): two mappings malloc made of blocks of one size give one
/// `alloc` rule, which acts on every block of that size; populating wins over locking then,
/// since the limit was weighed per mapping.
pub(super) fn preload_rules(steps: &[ApplyStep]) -> Vec<String> {
    let mut rules: Vec<(&str, &str)> = Vec::new();
    for step in steps {
        let ApplyStep::Preload(r) = step else {
            continue;
        };
        for (action, what) in r.split(';').filter_map(|rule| rule.split_once(':')) {
            match rules.iter_mut().find(|(_, w)| *w == what) {
                Some(known) if action == "populate" => known.0 = action,
                Some(_) => {}
                None => rules.push((action, what)),
            }
        }
    }
    rules.iter().map(|(a, w)| format!("{a}:{w}")).collect()
}

/// `$MEMLOCK_TRACE_PRELOAD`, or the library next to this binary (cargo builds both into
/// one directory), or in `../lib/memlock-trace/` (as `cargo xtask dist` lays it out).
fn preload_library() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(PRELOAD_ENV) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        return Err(UsageError(format!(
            "{PRELOAD_ENV}={} is not a file: point it at {PRELOAD_FILE}",
            path.display()
        ))
        .into());
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    // Next to the binary (cargo's target directory), or where `cargo xtask dist` installs it.
    let places = [
        dir.join(PRELOAD_FILE),
        dir.join("../lib/memlock-trace").join(PRELOAD_FILE),
    ];
    if let Some(found) = places.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    Err(UsageError(format!(
        "--apply needs the preload library {PRELOAD_FILE}, found neither next to {} nor in \
         ../lib/memlock-trace/: build it with `cargo build -p memlock-preload` (or `cargo \
         build`, which builds the whole workspace), or set {PRELOAD_ENV}=PATH",
        exe.display()
    ))
    .into())
}

/// One run's figures in the comparison.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    pub during_startup: Phase,
    pub after_startup: Phase,
    pub user_p50_ns: Option<u64>,
    pub user_p99_ns: Option<u64>,
    pub wall_ns: Option<u64>,
    pub locked_max_bytes: u64,
    pub locked_by_calls_bytes: u64,
    /// minflt + majflt the process counted itself (/proc/PID/stat) in its whole life.
    pub own_faults: Option<u64>,
    pub exit_code: Option<i32>,
    /// Whether the hook set timed the faults the kernel populated (fentry/kprobe do; the
    /// tracepoint set counts them only: their time is in the call that populated them).
    pub populated_timed: bool,
}

impl Side {
    fn of(t: &Table) -> Self {
        let user = t.latency_ns.get("user");
        Self {
            during_startup: t.during_startup.clone(),
            after_startup: t.after_startup.clone(),
            user_p50_ns: user.map(|l| l.p50),
            user_p99_ns: user.map(|l| l.p99),
            wall_ns: t.wall_ns,
            locked_max_bytes: t.limits.locked_max_bytes,
            locked_by_calls_bytes: t.locked_by_calls_bytes,
            own_faults: t.own_faults,
            exit_code: t.exit_code,
            populated_timed: t.latency_ns.contains_key("populated"),
        }
    }
}

/// A mapping's faults after start-up in both runs (matched by name and size: addresses
/// differ from run to run).
#[derive(Clone, Debug, Serialize)]
pub struct MappingPair {
    pub mapping: String,
    pub size_bytes: u64,
    pub before: Option<(u64, u64)>,
    pub after: Option<(u64, u64)>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// The environment of the second run (nothing when no advice could be applied).
    pub environment: Vec<(String, String)>,
    pub before: Side,
    pub after: Option<Side>,
    pub mappings: Vec<MappingPair>,
    /// What the preload library did in the second run, line by line.
    pub preload_log: Vec<String>,
    pub helped: Option<bool>,
    pub verdict: String,
}

/// The mean time of the faults the program's code took after start-up.
fn per_fault(p: &Phase) -> String {
    crate::output::duration(p.user_fault_ns / p.user.max(1))
}

/// The two runs compared; `after` and `plan`: the second run and what it changed (None
/// when no advice could be applied).
pub fn compare(
    before: &Table,
    after: Option<&Table>,
    plan: Option<&Plan>,
    advice: &[Advice],
) -> Comparison {
    let (Some(after), Some(plan)) = (after, plan) else {
        return nothing_applied(before, advice);
    };
    let (b, a) = (&before.after_startup, &after.after_startup);
    // A run that ended otherwise (the advice broke the program) did not take the same path.
    let helped =
        (a.user as f64) < HELPED_BELOW * b.user as f64 && before.exit_code == after.exit_code;
    Comparison {
        environment: plan.env.vars.clone(),
        before: Side::of(before),
        after: Some(Side::of(after)),
        mappings: pair_mappings(before, after),
        preload_log: after.preload_log.clone(),
        helped: Some(helped),
        verdict: verdict(before, after, plan, helped),
    }
}

/// The comparison when there was no second run: why not.
fn nothing_applied(before: &Table, advice: &[Advice]) -> Comparison {
    let reasons = advice.iter().filter(|a| a.verdict == Verdict::Do).count();
    Comparison {
        environment: Vec::new(),
        before: Side::of(before),
        after: None,
        mappings: Vec::new(),
        preload_log: Vec::new(),
        helped: None,
        verdict: if reasons == 0 {
            "nothing to apply: no advice to lock, populate or change the allocator".into()
        } else {
            "nothing to apply: none of the advice can be carried out from outside the \
             program (see each one's note)"
                .into()
        },
    }
}

/// The mappings either run listed first (by fault time after start-up), each with both runs'
/// figures.
fn pair_mappings(before: &Table, after: &Table) -> Vec<MappingPair> {
    let mut mappings: Vec<MappingPair> = Vec::new();
    for (t, is_before) in [(before, true), (after, false)] {
        for m in t.mappings.iter().take(MAPPING_ROWS) {
            let figures = Some((m.faults_after, m.fault_ns_after));
            match mappings
                .iter_mut()
                .find(|p| p.mapping == m.mapping && p.size_bytes == m.size_bytes)
            {
                Some(p) if is_before => p.before = p.before.or(figures),
                Some(p) => p.after = p.after.or(figures),
                None => mappings.push(MappingPair {
                    mapping: m.mapping.clone(),
                    size_bytes: m.size_bytes,
                    before: if is_before { figures } else { None },
                    after: if is_before { None } else { figures },
                }),
            }
        }
    }
    // Rows only one run listed: the other run's own figures for them, when it had them.
    for p in &mut mappings {
        let find = |t: &Table| {
            t.mappings
                .iter()
                .find(|m| m.mapping == p.mapping && m.size_bytes == p.size_bytes)
                .map(|m| (m.faults_after, m.fault_ns_after))
        };
        p.before = p.before.or_else(|| find(before));
        p.after = p.after.or_else(|| find(after));
    }
    mappings
}

/// The verdict in words: whether the advice helped (the faults the program's code took
/// after start-up), and what else changed between the runs.
fn verdict(before: &Table, after: &Table, plan: &Plan, helped: bool) -> String {
    let (b, a) = (&before.after_startup, &after.after_startup);
    let change = |x: u64, y: u64| {
        if x == 0 {
            String::new()
        } else {
            format!(" ({:+.0}%)", (y as f64 - x as f64) * 100.0 / x as f64)
        }
    };
    let failed: Vec<&String> = after
        .preload_log
        .iter()
        .filter(|l| l.contains("errno="))
        .collect();
    let mut verdict = format!(
        "{}: faults taken by the program's code after start-up {} -> {}{}, their time {} -> \
         {}{}",
        if helped {
            "the advice helped"
        } else {
            "the advice did not help"
        },
        count(b.user),
        count(a.user),
        change(b.user, a.user),
        ms(b.user_fault_ns),
        ms(a.user_fault_ns),
        change(b.user_fault_ns, a.user_fault_ns),
    );
    if helped && a.user_fault_ns > b.user_fault_ns {
        verdict.push_str(&format!(
            "; each fault cost more this run ({} against {} on average): one run's fault times \
             follow the machine's load, so repeat both runs before weighing time",
            per_fault(a),
            per_fault(b)
        ));
    }
    verdict.push_str(&moved(before, after));
    if let (Some(x), Some(y)) = (before.wall_ns, after.wall_ns) {
        verdict.push_str(&format!(
            "; the command's wall time {:.2} s -> {:.2} s (both runs traced)",
            x as f64 / 1e9,
            y as f64 / 1e9
        ));
    }
    if let (Some(x), Some(y)) = (before.exit_code, after.exit_code)
        && x != y
    {
        verdict.push_str(&format!(
            "; the command exited with status {y} this run, {x} before: a run that ended \
             otherwise is no measure of the advice (the advice may have broken it)"
        ));
    }
    if !failed.is_empty() {
        verdict.push_str(&format!(
            "; {} of the preload library's actions failed (see its log below)",
            failed.len()
        ));
    }
    if plan.env.preload_log.is_some() && after.preload_log.is_empty() {
        verdict.push_str(
            "; the preload library saw no advised mapping being made (made inside libc, or \
             before the library loaded)",
        );
    }
    verdict
}

/// The faults the advice moved into the calls that populate pages (locking and populating
/// take the faults up front, they do not make them go), and where they went: start-up, or
/// after it. Empty when the kernel populated no more pages than before.
fn moved(before: &Table, after: &Table) -> String {
    let populated = |t: &Table| t.during_startup.populated + t.after_startup.populated;
    let Some(more) = populated(after)
        .checked_sub(populated(before))
        .filter(|&n| n > 0)
    else {
        return String::new();
    };
    let all = |p: &Phase| p.minor + p.major;
    format!(
        "; {} more faults were taken up front, inside mmap, mlock2 or madvise (one per page, \
         or per huge page), {} of them during start-up: the cost moved there, it did not go \
         (faults during start-up {} -> {}; faults after start-up {} -> {})",
        count(more),
        count(
            after
                .during_startup
                .populated
                .saturating_sub(before.during_startup.populated)
        ),
        count(all(&before.during_startup)),
        count(all(&after.during_startup)),
        count(all(&before.after_startup)),
        count(all(&after.after_startup)),
    )
}

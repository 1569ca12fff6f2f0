use std::process::ExitCode;

use clap::{
    CommandFactory as _, Parser as _,
    error::{ContextKind, ContextValue, ErrorKind},
};
use memlock_trace::{
    CommandError, UsageError,
    cli::{Cli, Command},
    exit,
    output::{COLUMNS, JSON_SCHEMA, Sink, WriteError, wrap},
    probe,
    process::Targets,
    session,
    tracer::Tracer,
};
#[cfg(feature = "lab")]
use memlock_trace::{
    cli::{WorkloadName, WorkloadParams},
    lab::{suite, verify, workload},
};

fn main() -> ExitCode {
    let cli = match parse_cli() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let result = match cli.command {
        None => session::run(cli.trace),
        Some(Command::Probe { json }) => run_probe(json).map(|()| 0),
        Some(Command::Advise(args)) => memlock_trace::advise::run(&args),
        #[cfg(feature = "lab")]
        Some(Command::Suite(args)) => suite::run(args),
        #[cfg(feature = "lab")]
        Some(Command::Scenario { name, args, report }) => {
            run_scenario(name, &args, report.as_deref()).map(|()| 0)
        }
        #[cfg(feature = "lab")]
        Some(Command::Workload {
            name,
            report,
            params,
        }) => run_workload(name, report.as_deref(), &params).map(|()| 0),
        #[cfg(feature = "lab")]
        Some(Command::Verify { json, output }) => verify::run(json, output.as_deref()),
        Some(Command::Completions { shell }) => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "memlock-trace", &mut script);
            print_result(None, &script).map(|()| 0)
        }
        Some(Command::Man { dir: None }) => memlock_trace::cli::man::page()
            .map_err(anyhow::Error::from)
            .and_then(|page| print_result(None, &page))
            .map(|()| 0),
        Some(Command::Man { dir: Some(dir) }) => memlock_trace::cli::man::write_pages(&dir)
            .map(|()| 0)
            .map_err(|e| {
                UsageError(format!("cannot write man pages to {}: {e}", dir.display())).into()
            }),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(exit::FAILURE)),
        Err(error) => ExitCode::from(exit_code(&error)),
    }
}

/// Prints `error` (unless stdout was a pipe that closed) and picks the exit code, as
/// `timeout(1)` and `env(1)` do: the tool's own failure 125, the command's 126 or 127.
fn exit_code(error: &anyhow::Error) -> u8 {
    if WriteError::find(error).is_some_and(WriteError::is_closed_pipe) {
        return exit::CLOSED_PIPE;
    }
    eprintln!("memlock-trace: error: {error:#}");
    if let Some(e) = error.downcast_ref::<CommandError>() {
        e.code
    } else if error.downcast_ref::<UsageError>().is_some() {
        exit::USAGE
    } else {
        exit::FAILURE
    }
}

/// Parses the command line. clap renders help and version; every usage error is one line
/// `memlock-trace: error: ...`, exit 2, as the tool's own (clap's `error:` with its usage
/// block would be the one error not saying whose it is). A value out of range names the
/// flag and what is accepted; an unknown option gets no "use `-- -X`" tip, since `--`
/// starts the command to trace.
fn parse_cli() -> Result<Cli, ExitCode> {
    let error = match Cli::try_parse() {
        Ok(cli) => return Ok(cli),
        Err(error) => error,
    };
    let message = match error.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => error.exit(),
        ErrorKind::UnknownArgument => unknown_argument(&error),
        ErrorKind::ValueValidation => one_line(&error),
        _ => format!("{}: see `memlock-trace --help`", one_line(&error)),
    };
    eprintln!("memlock-trace: error: {message}");
    Err(ExitCode::from(exit::USAGE))
}

/// clap's message on one line: its first paragraph (a list of arguments folded in) and its
/// tips; the usage block is left out.
fn one_line(error: &clap::Error) -> String {
    let text = error.to_string();
    let mut paragraphs = text.split("\n\n").map(|p| {
        p.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    });
    let mut message = paragraphs
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_string();
    for tip in paragraphs.filter_map(|p| p.strip_prefix("tip: ").map(str::to_string)) {
        message.push_str(&format!(" ({tip})"));
    }
    message
}

fn unknown_argument(error: &clap::Error) -> String {
    let arg = match error.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => arg.clone(),
        _ => String::new(),
    };
    let mut message = format!("unknown option `{arg}`");
    if let Some(ContextValue::String(similar)) = error.get(ContextKind::SuggestedArg) {
        message.push_str(&format!(" (did you mean `{similar}`?)"));
    }
    message.push_str(&format!(
        ": see `memlock-trace --help`; an option of the command to trace goes after the \
         command, which follows `--` (`memlock-trace -- COMMAND {arg}`)"
    ));
    message
}

/// Writes a computed result to `path` (created beforehand by `Sink::open`) or stdout; see
/// [`Sink::write_result`] for what happens when that fails.
fn print_result(sink: Option<Sink>, result: &[u8]) -> anyhow::Result<()> {
    let mut sink = match sink {
        Some(sink) => sink,
        None => Sink::open(None)?,
    };
    sink.write_result(result)
}

#[cfg(feature = "lab")]
fn run_workload(
    name: WorkloadName,
    report: Option<&std::path::Path>,
    params: &WorkloadParams,
) -> anyhow::Result<()> {
    // Before the workload runs, so that a bad path costs nothing.
    let sink = Sink::open(report)?;
    let calls = match name {
        WorkloadName::Syscalls => serde_json::to_value(workload::syscalls::run()?)?,
        WorkloadName::Faults => return workload::faults::serve(),
        WorkloadName::Thp => serde_json::to_value(workload::huge_pages::thp()?)?,
        WorkloadName::Hugetlb => serde_json::to_value(workload::huge_pages::hugetlb()?)?,
        WorkloadName::Children => {
            serde_json::to_value(workload::children::run(params.count, params.calls)?)?
        }
        WorkloadName::Flood => serde_json::to_value(workload::flood::run(
            params.threads,
            u64::from(params.calls),
            params.wait_stdin,
            params.munlock,
        )?)?,
    };
    let json = serde_json::to_string_pretty(&calls)?;
    print_result(Some(sink), format!("{json}\n").as_bytes())
}

/// `memlock-trace probe`: what the kernel allows. Without the capabilities to load programs,
/// what can be seen (kernel, BTF, the capabilities missing) and every hook kind and family
/// marked as not checked, exit 0: a report, not a refusal.
fn run_probe(json: bool) -> anyhow::Result<()> {
    use memlock_trace::{
        faults::FaultHooks, object::HookFamily as _, process::ProcessHooks, syscalls::SyscallHooks,
        vma::VmaHooks,
    };
    let kernel = probe::kernel_release();
    let lacking = probe::missing_capabilities()?;
    let missing = (!lacking.is_empty()).then(|| probe::in_words(&lacking));
    let (capabilities, hooks) = match &missing {
        None => {
            let capabilities = probe::capabilities()?;
            // The hook sets a real session would pick, by loading the tracer with nothing
            // to trace.
            let mut hooks = Tracer::load(&Targets::Tgids(Vec::new()))?.hooks;
            // What the tracepoint set could not do here, though another set was picked:
            // a forced `--fault-hooks tracepoint` would meet it.
            let limits =
                memlock_trace::faults::attach::tracepoint_set_limits(&probe::KernelBtf::load()?);
            if let Some(faults) = hooks.get_mut(FaultHooks::NAME) {
                for limit in limits {
                    faults.note(&format!("; tracepoint set here: {limit}"));
                }
            }
            let hooks: std::collections::BTreeMap<_, _> = hooks
                .iter()
                .map(|(family, line)| (*family, line.full()))
                .collect();
            (capabilities, hooks)
        }
        Some(missing) => {
            let families = [
                ProcessHooks::NAME,
                SyscallHooks::NAME,
                VmaHooks::NAME,
                FaultHooks::NAME,
            ];
            let not_checked = format!("not checked: needs {missing}");
            (
                probe::unprivileged(missing),
                families.map(|f| (f, not_checked.clone())).into(),
            )
        }
    };
    if json {
        let report = serde_json::json!({
            "type": "probe",
            "schema": JSON_SCHEMA,
            "time_ns": memlock_trace::output::WallClock::now_ns(),
            "kernel": kernel,
            "missing_capabilities": missing,
            "capabilities": capabilities,
            "hooks": hooks,
        });
        return print_result(None, format!("{report}\n").as_bytes());
    }
    let mut lines = vec![format!("kernel {kernel}")];
    if let Some(missing) = &missing {
        lines.extend(wrap(
            "",
            &format!(
                "not privileged: missing {missing}, so no hook was tried: run as root, or \
                 grant them with `sudo setcap {}+ep $(which memlock-trace)`",
                lacking.join(",").to_lowercase()
            ),
            COLUMNS,
            4,
        ));
    }
    for c in &capabilities {
        let usable = match (c.checked, c.usable) {
            (false, _) => "?",
            (true, true) => "yes",
            (true, false) => "no",
        };
        lines.extend(wrap(
            &format!("{:<12} {usable:<4}", c.name),
            &c.detail,
            COLUMNS,
            18,
        ));
    }
    for (family, described) in &hooks {
        lines.extend(wrap(&format!("hooks {family}:"), described, COLUMNS, 4));
    }
    print_result(None, format!("{}\n", lines.join("\n")).as_bytes())
}

#[cfg(feature = "lab")]
fn run_scenario(
    name: workload::scenario::Scenario,
    args: &workload::scenario::ScenarioArgs,
    report: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    // Before the experiment runs, so that its measurements always have somewhere to go.
    let sink = Sink::open(report)?;
    let result = workload::scenario::run(name, args)?;
    let json = serde_json::to_string(&result)?;
    print_result(Some(sink), format!("{json}\n").as_bytes())
}

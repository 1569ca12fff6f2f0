//! Parsing tests for the whole command line.

use std::ffi::OsStr;

use super::*;

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("memlock-trace").chain(args.iter().copied()))
}

#[test]
fn system_wide_by_default() {
    let cli = parse(&[]).unwrap();
    assert!(cli.command.is_none());
    assert!(cli.trace.pids.is_empty() && cli.trace.command.is_empty());
}

#[test]
fn pids_repeat_and_options_parse() {
    let cli = parse(&[
        "-p",
        "1",
        "--pid",
        "2",
        "--interval",
        "0.5",
        "--duration",
        "3",
        "--events",
        "--json",
        "--all-vma-changes",
    ])
    .unwrap();
    assert!(cli.trace.all_vma_changes);
    assert_eq!(cli.trace.pids, [1, 2]);
    assert_eq!(cli.trace.interval, Some(0.5));
    assert_eq!(cli.trace.duration, Some(3.0));
    assert!(cli.trace.syscall_events() && cli.trace.fault_events() && cli.trace.json);
}

#[test]
fn command_after_double_dash_keeps_its_own_flags() {
    let cli = parse(&["--events", "--", "ls", "-l", "--json"]).unwrap();
    assert_eq!(cli.trace.command, ["ls", "-l", "--json"]);
    assert!(!cli.trace.json);
}

#[test]
fn command_user_and_arguments_are_bytes() {
    use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
    let bytes = |b: &[u8]| OsString::from_vec(b.to_vec());
    let argv = [
        bytes(b"memlock-trace"),
        bytes(b"--user"),
        bytes(b"n\xffbody"),
        bytes(b"--"),
        bytes(b"s\xff"),
        bytes(b"0.\xfe"),
    ];
    let cli = Cli::try_parse_from(argv.clone()).unwrap();
    assert_eq!(cli.trace.command, argv[4..]);
    assert_eq!(
        cli.trace.user.as_deref().map(OsStr::as_bytes),
        Some(&b"n\xffbody"[..])
    );
    let mut advise = vec![bytes(b"memlock-trace"), bytes(b"advise"), bytes(b"--")];
    advise.extend_from_slice(&argv[4..]);
    let Some(Command::Advise(args)) = Cli::try_parse_from(advise).unwrap().command else {
        panic!("not advise");
    };
    assert_eq!(args.command, argv[4..]);
}

#[test]
fn bad_values_are_rejected() {
    assert!(parse(&["--pid", "abc"]).is_err());
    assert!(parse(&["--duration", "-1"]).is_err());
    assert!(parse(&["--interval", "0"]).is_err());
}

#[cfg(feature = "lab")]
#[test]
fn verify_subcommand() {
    let cli = parse(&["verify", "--json", "-o", "/tmp/v.json"]).unwrap();
    let Some(Command::Verify { json, output }) = cli.command else {
        panic!("not verify: {:?}", cli.command);
    };
    assert!(json, "--json is a flag, as in every subcommand");
    assert_eq!(output.as_deref(), Some(std::path::Path::new("/tmp/v.json")));
    assert!(parse(&["verify", "--json", "/tmp/v.json"]).is_err());
}

#[test]
fn libbpf_tools_habits_parse() {
    let cli = parse(&["1", "5"]).unwrap();
    assert!(cli.command.is_none());
    assert_eq!(
        (cli.trace.interval_secs(), cli.trace.count),
        (Some(1.0), Some(5))
    );
    let t = parse(&[
        "-i", "0.5", "-d", "3", "-t", "42", "-T", "-m", "--hist", "-vv",
    ])
    .unwrap()
    .trace;
    assert_eq!(
        (t.interval_secs(), t.duration, t.tid),
        (Some(0.5), Some(3.0), Some(42))
    );
    assert!(t.timestamp && t.hist && t.fault_options().per_thread);
    assert_eq!((t.unit(), t.verbose), (crate::output::Unit::Ms, 2));
    assert_eq!(
        parse(&["-u"]).unwrap().trace.unit(),
        crate::output::Unit::Us
    );
    assert_eq!(parse(&[]).unwrap().trace.unit(), crate::output::Unit::Auto);
    // Positionals before `--` are the interval; after it, the command's own.
    let t = parse(&["2", "--", "sleep", "1"]).unwrap().trace;
    assert_eq!(
        (t.interval_secs(), t.command.as_slice()),
        (
            Some(2.0),
            &[OsString::from("sleep"), OsString::from("1")][..]
        )
    );
    let t = parse(&["-o", "/tmp/x", "-q", "--", "ls"]).unwrap().trace;
    assert!(t.quiet && t.output.is_some());
    // Subcommands still win over the interval positional.
    assert!(matches!(
        parse(&["probe"]).unwrap().command,
        Some(Command::Probe { .. })
    ));
    for bad in [
        &["-m", "-u"][..],
        &["-v", "-q"],
        &["1", "--interval", "2"],
        &["0"],
        &["1", "0"],
        &["-t", "5", "-p", "6"],
        &["-t", "5", "--", "ls"],
    ] {
        assert!(parse(bad).is_err(), "{bad:?} accepted");
    }
    let e = parse(&["prboe"]).unwrap_err().to_string();
    assert!(e.contains("neither a subcommand nor an interval"), "{e}");
}

#[test]
fn fault_options_parse() {
    let cli = parse(&[
        "--fault-hooks",
        "tracepoint",
        "--count-only",
        "--per-thread",
        "--events",
        "--sample",
        "100",
        "--top-mappings",
        "3",
        "--stacks",
        "--stacks-top",
        "4",
        "--stack-sample",
        "8",
    ])
    .unwrap();
    let o = cli.trace.fault_options();
    assert_eq!(o.hooks, HookChoice::Tracepoint);
    assert!(!o.latency && o.per_thread && o.events);
    assert!(o.stacks && o.top_stacks == 4 && o.stack_sample == 8);
    assert!(
        parse(&["--stacks-top", "4"]).is_err(),
        "--stacks-top needs --stacks"
    );
    assert!(
        parse(&["--stack-sample", "8"]).is_err(),
        "--stack-sample needs --stacks"
    );
    assert!(
        parse(&["--stacks", "--stack-sample", "0"]).is_err(),
        "one in 0"
    );
    assert_eq!((o.sample_every, o.top_mappings), (100, 3));
    let d = parse(&[]).unwrap().trace.fault_options();
    assert_eq!(
        d,
        FaultOptions {
            events: false,
            ..FaultOptions::default()
        }
    );
    let syscalls_only = parse(&["--events=syscalls", "--json"]).unwrap().trace;
    assert!(syscalls_only.syscall_events() && !syscalls_only.fault_events());
    assert!(!syscalls_only.fault_options().events);
    assert!(
        parse(&["--events=faults"])
            .unwrap()
            .trace
            .fault_options()
            .events
    );
    assert!(parse(&["--events=bogus"]).is_err());
    // A list of kinds: a call's VMA line only when `vma` (or nothing, or `all`) is named.
    let kinds = |arg: &str| {
        let t = parse(&[arg]).unwrap().trace;
        (t.syscall_events(), t.vma_events(), t.fault_events())
    };
    assert_eq!(kinds("--events"), (true, true, true));
    assert_eq!(kinds("--events=all"), (true, true, true));
    assert_eq!(kinds("--events=calls"), (true, false, false));
    assert_eq!(kinds("--events=syscalls"), (true, true, false));
    assert_eq!(kinds("--events=calls,vma"), (true, true, false));
    assert_eq!(kinds("--events=faults,calls"), (true, false, true));
    assert!(parse(&["--fault-hooks", "uprobe"]).is_err());
    assert!(parse(&["--sample", "0"]).is_err());
    assert_eq!(
        parse(&["--fault-hooks", "off"])
            .unwrap()
            .trace
            .fault_options()
            .hooks,
        HookChoice::Off
    );
}

#[cfg(feature = "lab")]
#[test]
fn workload_subcommand() {
    for out in ["--report", "--output", "-o"] {
        let cli = parse(&["workload", "syscalls", out, "/tmp/r.json"]).unwrap();
        let Some(Command::Workload { report, .. }) = cli.command else {
            panic!("not workload: {:?}", cli.command);
        };
        assert_eq!(report.as_deref(), Some(std::path::Path::new("/tmp/r.json")));
    }
    let cli = parse(&["workload", "syscalls", "--report", "/tmp/r.json"]).unwrap();
    assert!(matches!(
        cli.command,
        Some(Command::Workload {
            name: WorkloadName::Syscalls,
            ..
        })
    ));
}

#[test]
fn production_options_parse() {
    let cli = parse(&[
        "--comm",
        "postgres",
        "--cgroup",
        "system.slice",
        "--follow-children",
        "--prometheus",
        ":9464",
        "--prometheus-pid-label",
        "--prometheus-max-names",
        "7",
        "--max-processes",
        "10",
        "--max-targets",
        "5",
    ])
    .unwrap();
    let p = &cli.trace.production;
    assert_eq!(p.comm.as_deref(), Some("postgres"));
    assert_eq!(
        p.cgroup.as_deref(),
        Some(std::path::Path::new("system.slice"))
    );
    assert!(p.follow_children && p.prometheus_pid_label);
    assert_eq!(p.prometheus_max_names, 7);
    assert_eq!(p.prometheus, Some("0.0.0.0:9464".parse().unwrap()));
    assert_eq!((p.max_processes, p.max_targets), (10, Some(5)));
    let p = parse(&["--prometheus", "[::1]:0"])
        .unwrap()
        .trace
        .production;
    assert_eq!(p.prometheus, Some("[::1]:0".parse().unwrap()));
    assert_eq!(
        p.max_processes,
        crate::process::table::DEFAULT_MAX_PROCESSES
    );
    assert_eq!(p.prometheus_max_names, crate::metrics::DEFAULT_MAX_NAMES);
}

#[test]
fn bad_production_options_are_rejected() {
    let e = parse(&["--prometheus", "localhost"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("is not a listen address"), "{e}");
    assert!(parse(&["--prometheus", "1.2.3.4:99999"]).is_err());
    assert!(
        parse(&["--prometheus-pid-label"]).is_err(),
        "needs --prometheus"
    );
    assert!(parse(&["--max-processes", "0"]).is_err());
    assert!(parse(&["--prometheus", ":0", "--prometheus-max-names", "-1"]).is_err());
    assert!(parse(&["--max-targets", "-1"]).is_err());
}

#[test]
fn advise_subcommand() {
    let cli = parse(&["advise", "--apply", "--json", "--", "python3", "-c", "pass"]).unwrap();
    let Some(Command::Advise(args)) = cli.command else {
        panic!("not advise: {:?}", cli.command);
    };
    assert!(args.apply && args.json);
    assert_eq!(args.command, ["python3", "-c", "pass"]);
    let cli = parse(&["advise", "-p", "42", "-d", "3", "--startup", "0.5"]).unwrap();
    let Some(Command::Advise(args)) = cli.command else {
        panic!("not advise: {:?}", cli.command);
    };
    assert_eq!(
        (args.pid, args.duration, args.startup),
        (Some(42), Some(3.0), Some(0.5))
    );
    // --apply runs the command again: a running process cannot be.
    assert!(parse(&["advise", "--apply", "-p", "42"]).is_err());
    assert!(parse(&["advise", "-p", "42", "--", "true"]).is_err());
    assert!(parse(&["advise", "--startup", "0", "--", "true"]).is_err());
}

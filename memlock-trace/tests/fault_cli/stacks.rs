//! `--stacks` through the binary: each call site's faults and mlock calls counted on its own
//! stack, exactly, and named by function in JSON and text.

use serde_json::Value;

use super::{BIN, json_lines, traced_workload};

/// The workload's own `getrusage` minflt after each command, from its `ok MINFLT ...`
/// answers (they share the tracer's stdout), in command order.
fn answered_minflt(stdout: &[u8]) -> Vec<u64> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("ok "))
        .map(|rest| rest.split_whitespace().next().unwrap().parse().unwrap())
        .collect()
}

/// Whether a frame's `symbol` is `function`: its path as the ELF symbol table gives it, or
/// the bare name DWARF's line tables give an inlined function (the test builds keep no more
/// debug information).
fn names(symbol: &str, function: &str) -> bool {
    symbol == function || symbol.ends_with(&format!("::{function}"))
}

/// The stacks of the (one) traced process whose frames name `function`, most faults first.
fn stacks_naming<'a>(stacks: &'a [Value], function: &str) -> Vec<&'a Value> {
    stacks
        .iter()
        .filter(|s| {
            s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| names(f["symbol"].as_str().unwrap(), function))
        })
        .collect()
}

/// `--stacks`: the faults of two distinct call sites, and the pages an mlock populated, each
/// counted on its own stack exactly (equal to the kernel's own minflt delta of the command)
/// and named by function, symbolized after the workload exited.
#[test]
fn stacks_name_each_call_site_with_its_exact_count() {
    // Each site runs once with 0 pages first, so its code is faulted in before the measured
    // run, and `touch 1` maps, touches and unmaps a page first, so the measured commands
    // fault in nothing else (without it, 6 runs in 20 of the workload alone had a 1,001st
    // fault in `site_a 1000`); the sleeps leave the tracer time to read the mappings before
    // the exit.
    let commands = "noop\ntouch 1\nsite_a 0\nsite_b 0\nsite_mlock 0\nnoop\n\
                    site_a 1000\nsite_b 300\nsite_mlock 200\nsleep\nsleep\nexit";
    // Every fault keeps its stack, so the counts per stack are exact.
    let out = traced_workload(&["--json", "--stacks", "--stack-sample", "1"], commands);
    let minflt = answered_minflt(&out.stdout);
    assert_eq!(minflt.len(), 9, "{}", String::from_utf8_lossy(&out.stdout));
    // The kernel's count of each measured command (its own getrusage before and after).
    let (touched_a, touched_b, populated) = (
        minflt[6] - minflt[5],
        minflt[7] - minflt[6],
        minflt[8] - minflt[7],
    );
    assert_eq!((touched_a, touched_b, populated), (1000, 300, 200));

    let lines = json_lines(&out.stdout);
    let summary = lines.last().expect("a summary line");
    let f = &summary["processes"][0]["faults"];
    let stacks = f["stacks"]
        .as_array()
        .unwrap_or_else(|| panic!("faults.stacks with --stacks: {f}"));
    assert!(stacks.len() <= 10, "--stacks-top defaults to 10");
    let hook_set = summary["fault_hooks"]["hook_set"].as_str().unwrap();
    let shown: Vec<(u64, Vec<&str>)> = stacks
        .iter()
        .map(|s| {
            let frames = s["frames"].as_array().unwrap();
            (
                s["faults"].as_u64().unwrap(),
                frames
                    .iter()
                    .map(|f| f["symbol"].as_str().unwrap())
                    .collect(),
            )
        })
        .collect();
    eprintln!("{hook_set} hooks, top stacks: {shown:#?}");

    // The top stack: the 1000 first touches, in fault_site_alpha.
    assert!(
        stacks_naming(&stacks[..1], "fault_site_alpha").len() == 1,
        "the top stack is not fault_site_alpha's: {shown:#?}"
    );
    // Every fault keeps its stack: one lost to a full ring buffer would show here.
    let health = &summary["fault_health"];
    assert_eq!(health["stacks_dropped"], 0, "{health}");
    assert_eq!(stacks[0]["faults"], touched_a, "{shown:#?}");
    let beta = stacks_naming(stacks, "fault_site_beta");
    assert!(
        !beta.is_empty(),
        "no stack names fault_site_beta: {shown:#?}"
    );
    assert_eq!(beta[0]["faults"], touched_b, "{shown:#?}");
    // Pages mlock populated: on the stack of its call site.
    let gamma = stacks_naming(stacks, "mlock_site_gamma");
    assert!(
        !gamma.is_empty(),
        "no stack names mlock_site_gamma: {shown:#?}"
    );
    assert_eq!(gamma[0]["faults"], populated, "{shown:#?}");
    assert_eq!(f["populated_by"]["mlock"], populated, "{f}");

    // The mapping rows' stacks: each site's faults, in whichever rows they went to (its own
    // VMA's, or one span of mappings gone by the summary where the hooks found no VMA), add
    // up to the site's exact count, and no row's stacks hold more faults than the row.
    let rows = f["by_mapping"].as_array().unwrap();
    for (site, expected) in [
        ("fault_site_alpha", touched_a),
        ("fault_site_beta", touched_b),
        ("mlock_site_gamma", populated),
    ] {
        let mut in_rows = 0;
        for row in rows {
            let stacks = row["stacks"]
                .as_array()
                .unwrap_or_else(|| panic!("by_mapping stacks with --stacks: {row}"));
            assert!(stacks.len() <= 3, "{row}");
            let held: u64 = stacks.iter().map(|s| s["faults"].as_u64().unwrap()).sum();
            assert!(held <= row["faults"].as_u64().unwrap(), "{row}");
            in_rows += stacks_naming(stacks, site)
                .iter()
                .map(|s| s["faults"].as_u64().unwrap())
                .sum::<u64>();
        }
        assert_eq!(in_rows, expected, "{site} in the rows: {rows:#?}");
    }

    // The innermost frame of each named stack is in the workload's binary, resolved.
    for stack in [&stacks[0], beta[0], gamma[0]] {
        let frame = &stack["frames"][0];
        assert_eq!(frame["resolved"], true, "{frame}");
        assert_eq!(frame["module"], BIN, "{frame}");
        assert!(frame["addr"].as_str().unwrap().starts_with("0x"), "{frame}");
    }
    let health = &summary["fault_health"];
    assert_eq!(
        (
            health["stacks_dropped"].as_u64(),
            health["stacks_evicted"].as_u64()
        ),
        (Some(0), Some(0)),
        "{health}"
    );
}

#[test]
fn text_summary_lists_the_stacks() {
    let out = traced_workload(
        &["--stacks", "--stacks-top", "3"],
        "site_a 0\nsite_a 200\nsleep\nexit",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "user call stack (innermost first; faults sampled 1 in --stack-sample, each \
             counted as that many)"
        ),
        "{text}"
    );
    // Under its mapping's row, on one line.
    assert!(
        text.lines()
            .filter_map(|l| l.split_once(" faults at "))
            .any(|(_, stack)| stack.split(" <- ").any(|f| names(f, "fault_site_alpha"))),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "fault stacks: one fault in {} keeps its stack (--stack-sample); 0 sampled faults' \
             stacks lost",
            memlock_trace::faults::DEFAULT_STACK_SAMPLE
        )),
        "{text}"
    );
}

/// `--stacks` for mlock-family calls: every call counted on its user call site with the
/// pages it populated and locked, equal to the kernel's own counts (the workload's getrusage
/// and the summary's syscall table), and the call site named by function.
#[test]
fn stacks_name_the_call_sites_of_mlock_with_their_calls_and_pages() {
    // mlock_site_gamma makes the system call itself (no libc wrapper without a frame): 4
    // calls, the first of 0 bytes, then 100, 50 and 30 fresh pages; libc's mlock once.
    let commands = "noop\nsite_mlock 0\nnoop\nsite_mlock 100\nsite_mlock 50\nsite_mlock 30\n\
                    mlock 10\nsleep\nsleep\nexit";
    let out = traced_workload(&["--json", "--stacks"], commands);
    let minflt = answered_minflt(&out.stdout);
    assert_eq!(minflt.len(), 7, "{}", String::from_utf8_lossy(&out.stdout));
    let (gamma_pages, libc_pages) = (minflt[5] - minflt[2], minflt[6] - minflt[5]);
    assert_eq!((gamma_pages, libc_pages), (180, 10));

    let lines = json_lines(&out.stdout);
    let summary = lines.last().expect("a summary line");
    let process = &summary["processes"][0];
    let sites = process["call_sites"]
        .as_array()
        .unwrap_or_else(|| panic!("call_sites with --stacks: {process}"));
    let shown: Vec<(&str, u64, u64, u64, Vec<&str>)> = sites
        .iter()
        .map(|s| {
            (
                s["syscall"].as_str().unwrap(),
                s["calls"].as_u64().unwrap(),
                s["pages_populated"].as_u64().unwrap(),
                s["pages_locked"].as_u64().unwrap(),
                s["frames"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|f| f["symbol"].as_str().unwrap())
                    .collect(),
            )
        })
        .collect();
    eprintln!("call sites: {shown:#?}");
    let gamma = stacks_naming(sites, "mlock_site_gamma");
    assert_eq!(
        gamma.len(),
        1,
        "one call site names mlock_site_gamma: {shown:#?}"
    );
    let gamma = gamma[0];
    assert_eq!(gamma["syscall"], "mlock");
    assert_eq!(gamma["calls"], 4, "{gamma}");
    assert_eq!(gamma["errors"], 0, "{gamma}");
    assert_eq!(gamma["pages_populated"], gamma_pages, "{gamma}");
    assert_eq!(gamma["pages_locked"], gamma_pages, "{gamma}");
    assert_eq!(gamma["pages_unlocked"], 0, "{gamma}");
    let frame = &gamma["frames"][0];
    assert_eq!(frame["resolved"], true, "{frame}");
    assert_eq!(frame["module"], BIN, "{frame}");
    // Every call is on some call site: the sums are the syscall table's.
    let sum = |field: &str| -> u64 { sites.iter().map(|s| s[field].as_u64().unwrap()).sum() };
    let mlock = &process["syscalls"]["mlock"];
    assert_eq!(mlock["count"], 5, "{mlock}");
    assert_eq!(sum("calls"), 5, "{shown:#?}");
    assert_eq!(
        sum("pages_populated"),
        gamma_pages + libc_pages,
        "{shown:#?}"
    );
    assert_eq!(sum("pages_locked"), gamma_pages + libc_pages, "{shown:#?}");
    let health = &summary["call_site_health"];
    assert_eq!(
        (&health["dropped"], &health["evicted"]),
        (&0.into(), &0.into()),
        "{summary}"
    );
    // Every call's stack was unwound from its registers, none cut at a data word.
    let unwinding = &health["unwinding"];
    assert_eq!(unwinding["frame_pointer_walks"], 0, "{summary}");
    assert_eq!(unwinding["frames_dropped"], 0, "{summary}");
}

#[test]
fn text_summary_lists_the_call_sites() {
    let out = traced_workload(&["--stacks"], "site_mlock 0\nsite_mlock 20\nsleep\nexit");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("user call site (innermost first)"), "{text}");
    let line = text
        .lines()
        .find(|l| {
            l.trim_start().starts_with("mlock ") && l.contains("workload::faults::mlock_site_gamma")
        })
        .unwrap_or_else(|| panic!("no call site names mlock_site_gamma:\n{text}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&words[..4], ["mlock", "2", "20", "+20"], "{line}");
    assert!(
        text.contains("stacks: 0 mlock-family calls' stacks lost (ring buffer full)"),
        "{text}"
    );
}

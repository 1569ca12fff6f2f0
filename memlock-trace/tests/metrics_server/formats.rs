//! What test:metrics_server's two formats must satisfy: the linters' verdicts (promtool for
//! the text format 0.0.4, the Prometheus project's Python client for OpenMetrics) and the
//! families both carry.

use std::io::Write as _;

use crate::support::prometheus::PROMTOOL;

/// Runs `program args` with `input` on stdin: (success, stdout and stderr).
fn check_with(program: &str, args: &[&str], input: &str) -> (bool, String) {
    let mut child = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// promtool passes the 0.0.4 text; the Prometheus project's OpenMetrics parser passes
/// OpenMetrics.
pub fn assert_linters_pass(text: &str, openmetrics: &str) {
    let (ok, said) = check_with(PROMTOOL, &["check", "metrics"], text);
    assert!(ok, "promtool check metrics (0.0.4): {said}\n{text}");
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{text}"
    );
    // The Prometheus project's OpenMetrics parser: raises on anything out of the spec.
    let parse = "import sys\nfrom prometheus_client.openmetrics.parser import \
                 text_string_to_metric_families as parse\n\
                 families = list(parse(sys.stdin.read()))\n\
                 missing = [f.name for f in families if not f.documentation]\n\
                 assert not missing, missing\nprint(len(families))";
    let (ok, said) = check_with("/usr/bin/python3", &["-c", parse], openmetrics);
    assert!(ok, "OpenMetrics parser: {said}\n{openmetrics}");
    assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
    // promtool lints the 0.0.4 text only: on OpenMetrics its one complaint is that each
    // counter's `_total` samples have no HELP of their own, which they have in 0.0.4.
    let (_, said) = check_with(PROMTOOL, &["check", "metrics"], openmetrics);
    for complaint in said.lines() {
        assert!(
            complaint.ends_with("_total no help text"),
            "promtool on OpenMetrics: {said}"
        );
    }
}

/// What either format carries: the families of the build info, the tracer's own process and
/// the maps, bytes rather than pages, and the build info's labels.
pub fn assert_families(format: &str, body: &str) {
    for family in [
        "# TYPE memlock_trace_build_info gauge",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_open_fds gauge",
        "# TYPE memlock_trace_syscall_latency_seconds histogram",
        "# TYPE memlock_trace_map_entries gauge",
    ] {
        assert!(body.contains(family), "{format}: no {family}:\n{body}");
    }
    assert!(
        !body.contains("pages_populated") && !body.contains("pages_locked"),
        "{format}: pages, not bytes:\n{body}"
    );
    let Some(info) = body
        .lines()
        .find(|l| l.starts_with("memlock_trace_build_info{"))
    else {
        panic!("{format}: no build info:\n{body}");
    };
    assert!(
        info.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))
            && info.contains("faults=\"")
            && info.contains("syscalls=\"")
            // One word per hook set, not the whole description.
            && !info.rsplit_once(' ').unwrap().0.contains(' ')
            && info.ends_with(" 1"),
        "{info}"
    );
}

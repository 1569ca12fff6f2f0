//! Setting up test:prometheus's workload and scraping the tracer's /metrics as Prometheus
//! does (OpenMetrics), until what the workload did shows.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::support::{
    BIN, Tracer,
    exposition::{Sample, parse},
    poll_within,
};

/// An HTTP client for the tracer's /metrics. Its timeout only bounds a hung server: the guests
/// run these tests in software emulation beside the host stage, where a scrape after fifty
/// processes took over 5 s; how fast the server answers is test:metrics_server's, on the host.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// Starts `memlock-trace --json --prometheus 127.0.0.1:0 --follow-children EXTRA --
/// sh -c "memlock-trace workload syscalls --report R; read x"`: the workload runs at once,
/// then the command waits for stdin to close (and exits 0).
pub fn start(extra: &[&str], report: &Path) -> (Tracer, String) {
    let script = format!(
        "{BIN} workload syscalls --report {}; read x || true",
        report.display()
    );
    let mut cmd = Command::new(BIN);
    cmd.args(["--json", "--prometheus", "127.0.0.1:0", "--follow-children"])
        .args(extra)
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::piped());
    let mut tracer = Tracer::spawn_command(&mut cmd);
    let line = tracer.wait_for_stderr("serving Prometheus metrics on http://");
    let url = line.rsplit(' ').next().unwrap().to_string();
    (tracer, url)
}

/// The workload's own record, once it is complete.
///
/// A hang guard, not a target: in a software-emulated guest on a loaded 2-core machine the
/// workload's `mlockall` populating the whole (debug) binary under the fault and VMA hooks
/// took over 30 s on 6.12 (the first of the tests, once in three runs, twice in another).
pub fn workload_report(path: &Path) -> Vec<Value> {
    // The wait includes loading the programs (the command is held until then): minutes in
    // an emulated guest on a loaded machine.
    poll_within(Duration::from_secs(300), Duration::from_millis(20), || {
        match std::fs::read_to_string(path).map(|s| serde_json::from_str::<Vec<Value>>(&s)) {
            Ok(Ok(v)) => Ok(v),
            _ => Err(format!("the workload never wrote {}", path.display())),
        }
    })
}

/// Scrapes until `ready` holds (the tracer drains asynchronously), at most 120 s (guests in
/// software emulation, side by side on two CPUs, can be slow); `expected` is said if not.
pub fn scrape_until(
    url: &str,
    expected: &str,
    ready: impl Fn(&[Sample]) -> bool,
) -> (Vec<Sample>, String) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        // What Prometheus asks for (without it: the text format 0.0.4, test:metrics_server).
        let mut response = agent()
            .get(url)
            .header("Accept", "application/openmetrics-text;version=1.0.0")
            .call()
            .expect("GET /metrics");
        assert_eq!(response.status(), 200);
        let content_type = response
            .headers()
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let text = response.body_mut().read_to_string().unwrap();
        let samples = parse(&text);
        if ready(&samples) {
            assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
            assert!(
                content_type.starts_with("application/openmetrics-text"),
                "{content_type}"
            );
            return (samples, text);
        }
        assert!(
            Instant::now() < deadline,
            "metrics never showed the workload ({expected}):\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

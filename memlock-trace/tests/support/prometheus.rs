//! Debian's `prometheus` as a scraper under test: started with a configuration of the
//! test's, its own data directory, and its HTTP API read back (targets, PromQL).

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::poll_within;

pub const PROMETHEUS: &str = "/usr/bin/prometheus";
pub const PROMTOOL: &str = "/usr/bin/promtool";

/// A running Prometheus, killed (and its directory removed) when dropped.
pub struct Prometheus {
    child: Child,
    pub dir: PathBuf,
    pub url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child, which has not been reaped yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

/// The `scrape_configs` entry of one plain-HTTP job scraping `target` (`HOST:PORT`).
pub fn scrape_job(job: &str, target: &str) -> String {
    format!("  - job_name: {job}\n    static_configs:\n      - targets: [\"{target}\"]\n")
}

/// The `HOST:PORT` the tracer's `serving Prometheus metrics on http://HOST:PORT/metrics`
/// line names, as a scrape target.
pub fn served_target(serving: &str) -> String {
    serving
        .rsplit("http://")
        .next()
        .unwrap()
        .trim_end_matches("/metrics")
        .to_string()
}

pub fn require(program: &str) {
    assert!(
        Path::new(program).is_file(),
        "{program} is missing: `cargo xtask test` installs Debian's prometheus package \
         (or: apt-get install prometheus)"
    );
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into()
}

impl Prometheus {
    /// Starts Prometheus with `scrape_configs` (YAML, the list under that key, indented by
    /// two spaces) scraping every second, in `dir`; returns once it answers ready.
    pub fn start(dir: &Path, scrape_configs: &str) -> Self {
        require(PROMETHEUS);
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  \
                 evaluation_interval: 1s\nscrape_configs:\n{scrape_configs}"
            ),
        )
        .unwrap();
        let listen = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {PROMETHEUS}: {e}"));
        let server = Self {
            child,
            dir: dir.to_path_buf(),
            url: format!("http://{listen}"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while server
            .get("/-/ready", &[])
            .is_none_or(|(status, _)| status != 200)
        {
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within 60 s:\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    fn get(&self, path: &str, query: &[(&str, &str)]) -> Option<(u16, String)> {
        let mut request = agent().get(format!("{}{path}", self.url));
        for &(k, v) in query {
            request = request.query(k, v);
        }
        let mut response = request.call().ok()?;
        let status = response.status().as_u16();
        Some((status, response.body_mut().read_to_string().ok()?))
    }

    fn api(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let (_, body) = self
            .get(path, query)
            .unwrap_or_else(|| panic!("GET {path} {query:?} failed"));
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(v["status"], "success", "{path} {query:?}: {body}");
        v["data"].clone()
    }

    /// The series an instant PromQL query returns.
    pub fn query(&self, promql: &str) -> Vec<Value> {
        self.api("/api/v1/query", &[("query", promql)])["result"]
            .as_array()
            .expect("a vector")
            .clone()
    }

    /// The value of an instant PromQL query that returns at most one series (0 when none).
    pub fn one(&self, promql: &str) -> f64 {
        let result = self.query(promql);
        assert!(
            result.len() <= 1,
            "{promql} returned several series: {result:?}"
        );
        result
            .first()
            .map_or(0.0, |s| s["value"][1].as_str().unwrap().parse().unwrap())
    }

    /// The active targets, once every one has been scraped at least `scrapes` times (its
    /// health is known); at most 60 s.
    pub fn targets_after_scrapes(&self, scrapes: u32) -> Vec<Value> {
        let mut seen = 0;
        poll_within(Duration::from_secs(60), Duration::from_millis(1100), || {
            let targets = self.api("/api/v1/targets", &[])["activeTargets"]
                .as_array()
                .expect("a list")
                .clone();
            if !targets.is_empty() && targets.iter().all(|t| t["health"] != "unknown") {
                seen += 1;
                if seen >= scrapes {
                    return Ok(targets);
                }
            }
            Err(format!(
                "targets not scraped within 60 s: {targets:?}\n{}",
                self.log()
            ))
        })
    }
}

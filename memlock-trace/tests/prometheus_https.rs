//! Runs on: host only: runs Debian's prometheus and promtool against --web-config (TLS, basic
//! auth), user space on every kernel
//!
//! Packages: prometheus
//!
//! `--web-config FILE` (the exporter-toolkit format) with Debian's real `prometheus` as the
//! scraper: over HTTPS with basic auth the right password gets samples, a wrong one 401,
//! plain HTTP nothing; a client certificate from the configured CA is accepted, one from
//! another CA refused; `promtool check web-config` accepts the very file. Certificates are
//! made here (rcgen), the bcrypt hash too.
//!
//! Host stage only (`cargo xtask test` installs the prometheus package when missing).

mod common;
mod support;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use common::require_privileges;
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use serde_json::Value;
use support::{
    BIN, Tracer, assert_contains,
    prometheus::{PROMTOOL, Prometheus, require},
};

const USER: &str = "prometheus";
const PASSWORD: &str = "right horse battery staple";

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("memlock-trace-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CA: its certificate (PEM) and what signs with it.
fn make_ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), Issuer::new(params, key))
}

/// A leaf certificate and key (PEM) for `names`, signed by `issuer`, for `usage`.
fn leaf(
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
    issuer: &Issuer<'_, KeyPair>,
) -> (String, String) {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).unwrap();
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// The web config (relative paths: read from the file's directory), checked by promtool.
fn web_config(dir: &Scratch) -> PathBuf {
    let hash = bcrypt::hash(PASSWORD, 5).unwrap();
    let path = dir.write(
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  \
             client_ca_file: ca.pem\n  client_auth_type: VerifyClientCertIfGiven\n\
             basic_auth_users:\n  {USER}: {hash}\n"
        ),
    );
    require(PROMTOOL);
    let out = Command::new(PROMTOOL)
        .args(["check", "web-config"])
        .arg(&path)
        .output()
        .expect("run promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.contains("SUCCESS"),
        "promtool check web-config: {said}"
    );
    path
}

/// One scrape job against `target`; `extra` is indented YAML under the job.
fn job(name: &str, scheme: &str, target: &str, extra: &str) -> String {
    format!(
        "  - job_name: {name}\n    scheme: {scheme}\n{extra}    static_configs:\n      - \
         targets: [\"{target}\"]\n"
    )
}

fn auth(password: &str) -> String {
    format!("    basic_auth:\n      username: {USER}\n      password: \"{password}\"\n")
}

fn tls(dir: &Path, client: Option<&str>) -> String {
    let mut yaml = format!(
        "    tls_config:\n      ca_file: {}\n",
        dir.join("ca.pem").display()
    );
    if let Some(name) = client {
        yaml.push_str(&format!(
            "      cert_file: {0}.pem\n      key_file: {0}.key\n",
            dir.join(name).display()
        ));
    }
    yaml
}

fn target<'a>(targets: &'a [Value], job: &str) -> &'a Value {
    targets
        .iter()
        .find(|t| t["labels"]["job"] == job)
        .unwrap_or_else(|| panic!("no target of job {job}: {targets:?}"))
}

fn series_of(prometheus: &Prometheus, job: &str) -> usize {
    prometheus
        .query(&format!("{{job=\"{job}\",__name__=~\"memlock_trace_.*\"}}"))
        .len()
}

#[test]
fn prometheus_scrapes_over_https_with_basic_auth() {
    require_privileges();
    let dir = Scratch::new("https");
    let (ca_pem, ca) = make_ca("memlock-trace test CA");
    let (_, other_ca) = make_ca("some other CA");
    dir.write("ca.pem", &ca_pem);
    let (cert, key) = leaf(
        &["127.0.0.1", "localhost"],
        ExtendedKeyUsagePurpose::ServerAuth,
        &ca,
    );
    dir.write("server.pem", &cert);
    dir.write("server.key", &key);
    for (name, issuer) in [("client", &ca), ("stranger", &other_ca)] {
        let (cert, key) = leaf(&[name], ExtendedKeyUsagePurpose::ClientAuth, issuer);
        dir.write(&format!("{name}.pem"), &cert);
        dir.write(&format!("{name}.key"), &key);
    }
    let config = web_config(&dir);

    let mut tracer = Tracer::spawn(&[
        "--prometheus",
        "127.0.0.1:0",
        "--web-config",
        config.to_str().unwrap(),
        "--comm",
        "no-such-process",
    ]);
    let line = tracer.wait_for_stderr("serving Prometheus metrics on https://");
    let addr = line
        .rsplit("https://")
        .next()
        .and_then(|s| s.strip_suffix("/metrics"))
        .unwrap()
        .to_string();
    tracer.wait_for_stderr("tracing");
    assert!(
        !tracer.stderr().contains("warning: /metrics"),
        "{}",
        tracer.stderr()
    );

    let d = &dir.0;
    let jobs = [
        job("right", "https", &addr, &(tls(d, None) + &auth(PASSWORD))),
        job("wrong", "https", &addr, &(tls(d, None) + &auth("guess"))),
        job("anonymous", "https", &addr, &tls(d, None)),
        job("plain", "http", &addr, &auth(PASSWORD)),
        job(
            "client_cert",
            "https",
            &addr,
            &(tls(d, Some("client")) + &auth(PASSWORD)),
        ),
        job(
            "stranger_cert",
            "https",
            &addr,
            &(tls(d, Some("stranger")) + &auth(PASSWORD)),
        ),
    ];
    let prometheus = Prometheus::start(&d.join("prometheus"), &jobs.concat());
    let targets = prometheus.targets_after_scrapes(3);
    for t in &targets {
        eprintln!("{}: {} {}", t["labels"]["job"], t["health"], t["lastError"]);
    }
    for job in ["right", "client_cert"] {
        let t = target(&targets, job);
        assert_eq!(t["health"], "up", "{job}: {t}\n{}", prometheus.log());
        assert!(series_of(&prometheus, job) > 10, "{job}: samples scraped");
    }
    for job in ["wrong", "anonymous"] {
        let t = target(&targets, job);
        assert_eq!(t["health"], "down", "{job}: {t}");
        assert_contains(
            &t["lastError"],
            "401 Unauthorized",
            format_args!("{job}: {t}"),
        );
    }
    for job in ["plain", "stranger_cert"] {
        let t = target(&targets, job);
        assert_eq!(t["health"], "down", "{job}: {t}");
        assert!(!t["lastError"].as_str().unwrap().is_empty(), "{job}: {t}");
    }
    assert_contains(
        &target(&targets, "stranger_cert")["lastError"],
        "tls",
        format_args!("{targets:?}"),
    );
    for job in ["wrong", "anonymous", "plain", "stranger_cert"] {
        assert_eq!(series_of(&prometheus, job), 0, "{job}: no sample");
        let up = prometheus.query(&format!("up{{job=\"{job}\"}}"));
        assert_eq!(up.len(), 1, "{job}: {up:?}");
        assert_eq!(up[0]["value"][1], "0", "{job}: {up:?}");
    }
    drop(prometheus);
    tracer.signal(libc::SIGTERM);
    let finished = tracer.finish();
    assert!(finished.status.success(), "{}", finished.stderr);
}

/// A bad file is one clear error naming the key, before anything is loaded.
#[test]
fn a_bad_web_config_names_the_key() {
    let dir = Scratch::new("web-config-errors");
    for (text, expected) in [
        (
            "tls_server_config:\n  cert_file: s.pem\n  key_file: s.key\n  cipher_suites: [x]\n",
            "cipher_suites",
        ),
        (
            "tls_server_config:\n  cert_file: missing.pem\n  key_file: s.key\n",
            "cert_file",
        ),
        (
            "basic_auth_users:\n  alice: plaintext\n",
            "alice: not a bcrypt hash",
        ),
        (
            "tls_server_config:\n  cert_file: s.pem\n  key_file: s.key\n  client_auth_type: Sometimes\n",
            "client_auth_type",
        ),
    ] {
        let path = dir.write("web.yml", text);
        let out = Command::new(BIN)
            .args(["--prometheus", "127.0.0.1:0", "--web-config"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text}: {stderr}");
        assert!(
            stderr.contains(&format!("--web-config {}", path.display()))
                && stderr.contains(expected),
            "{text}: {stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    }
}

/// Plain HTTP on every interface says that anyone on the network can read it.
#[test]
fn plain_http_on_every_interface_is_warned_about() {
    require_privileges();
    let mut tracer = Tracer::spawn(&["--prometheus", ":0", "--comm", "no-such-process"]);
    tracer.wait_for_stderr("tracing");
    let err = tracer.stderr();
    assert!(
        err.contains("warning: /metrics on 0.0.0.0:")
            && err.contains("is plain HTTP without authentication")
            && !err.contains("0.0.0.0:0 "),
        "{err}"
    );
    tracer.signal(libc::SIGTERM);
    assert!(tracer.finish().status.success());
}

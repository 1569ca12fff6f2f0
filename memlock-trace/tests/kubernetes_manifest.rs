//! Runs on: host only: kubernetes-validate checks the manifest and the image recipe against
//! the unit, whatever the kernel (the capabilities they grant are exercised by
//! test:least_privilege, in the guests too)
//!
//! Packages: python3, python3-venv: kubernetes-validate is installed from PyPI into a venv
//! of its own
//!
//! The DaemonSet in dist/kubernetes/ and the image recipe in dist/container/: Kubernetes' own
//! schemas accept the manifest, strictly (`kubernetes-validate --strict`, installed from
//! PyPI into a venv under the target directory on first use), and the manifest and the image
//! run the tracer as dist/memlock-trace.service does: the same arguments, the same
//! capabilities, the same memory limit, this version's image.

mod support;

use std::{path::Path, process::Command, sync::Mutex};

use serde_json::Value;

const MANIFEST: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../dist/kubernetes/memlock-trace.yaml"
);
const CONTAINERFILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../dist/container/Containerfile"
);
/// The validator's venv, kept between runs (the build's scratch space).
const VENV: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/kubernetes-validate");
/// The release pinned: its schemas are Kubernetes 1.37's.
const VALIDATOR: &str = "kubernetes-validate==1.37.0";

/// `kubernetes-validate`, installed on first use.
fn validator() -> std::path::PathBuf {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _once = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let bin = Path::new(VENV).join("bin/kubernetes-validate");
    if bin.exists() {
        return bin;
    }
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("{what}: {e}; install python3 and python3-venv"));
        assert!(
            out.status.success(),
            "{what} failed (python3-venv installed? PyPI reachable?):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(
        Command::new(support::PYTHON).args(["-m", "venv", VENV]),
        "python3 -m venv",
    );
    run(
        Command::new(Path::new(VENV).join("bin/pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            VALIDATOR,
        ]),
        "pip install kubernetes-validate",
    );
    bin
}

/// The manifest's documents, as JSON values.
fn documents() -> Vec<Value> {
    let text = std::fs::read_to_string(MANIFEST).unwrap();
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{MANIFEST}: {e}"))
}

/// The DaemonSet's one container.
fn container() -> Value {
    let docs = documents();
    let set = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet in the manifest");
    let containers = set["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    assert_eq!(containers.len(), 1, "{containers:?}");
    containers[0].clone()
}

/// The unit's (first) `key=` value.
fn unit_value(key: &str) -> String {
    support::unit_values(key).remove(0)
}

/// The unit's ExecStart arguments, after the binary.
fn unit_arguments() -> Vec<String> {
    unit_value("ExecStart")
        .split_whitespace()
        .skip(1)
        .map(str::to_string)
        .collect()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|v| v.as_str().expect("a string").to_string())
        .collect()
}

#[test]
fn kubernetes_accepts_the_manifest_strictly() {
    let out = Command::new(validator())
        .args(["--strict", MANIFEST])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    for resource in ["namespace/memlock-trace", "daemonset/memlock-trace"] {
        assert!(
            stdout.contains(&format!("passed for resource {resource}")),
            "{resource} not validated: {stdout}{stderr}"
        );
    }
    // The validator refuses what it should: a field Kubernetes does not know.
    let wrong = std::env::temp_dir().join(format!(
        "memlock-trace-manifest-{}.yaml",
        std::process::id()
    ));
    let text = std::fs::read_to_string(MANIFEST).unwrap();
    std::fs::write(&wrong, text.replace("hostPID: true", "hostPid: true")).unwrap();
    let refused = Command::new(validator())
        .args(["--strict"])
        .arg(&wrong)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&wrong);
    assert!(
        !refused.status.success(),
        "a misspelt field passed: {}",
        String::from_utf8_lossy(&refused.stdout)
    );
}

/// The pod runs the unit's command line with the unit's capabilities and memory limit, on
/// the node's pids and tracefs, from this version's image, whose recipe runs the same.
#[test]
fn the_daemonset_and_the_image_run_the_tracer_as_the_unit_does() {
    let c = container();
    assert_eq!(strings(&c["args"]), unit_arguments(), "{c}");
    let port = unit_arguments()
        .iter()
        .find_map(|a| a.strip_prefix(':').map(str::to_string))
        .expect("the unit's --prometheus :PORT");
    assert_eq!(c["ports"][0]["containerPort"].to_string(), port, "{c}");
    let mut added = strings(&c["securityContext"]["capabilities"]["add"]);
    added.sort();
    let mut granted: Vec<String> = unit_value("AmbientCapabilities")
        .split_whitespace()
        .map(|cap| cap.trim_start_matches("CAP_").to_string())
        .collect();
    granted.sort();
    assert_eq!(added, granted, "{c}");
    assert_eq!(
        strings(&c["securityContext"]["capabilities"]["drop"]),
        ["ALL"]
    );
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    // MemoryMax=160M is MiB, as Kubernetes' 160Mi.
    let memory_max = unit_value("MemoryMax");
    assert_eq!(
        c["resources"]["limits"]["memory"].as_str(),
        Some(memory_max.replace('M', "Mi").as_str()),
        "{c}"
    );
    assert_eq!(
        c["image"].as_str(),
        Some(concat!("memlock-trace:", env!("CARGO_PKG_VERSION"))),
        "the image is this version's"
    );
    let docs = documents();
    let pod = &docs.iter().find(|d| d["kind"] == "DaemonSet").unwrap()["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true, "system-wide needs the node's pids");
    let tracefs = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["hostPath"]["path"] == "/sys/kernel/tracing");
    assert!(tracefs.is_some(), "tracefs mounted from the node: {pod}");

    let recipe = std::fs::read_to_string(CONTAINERFILE).unwrap();
    let cmd = format!("CMD {}", serde_json::to_string(&unit_arguments()).unwrap());
    assert!(
        recipe.lines().any(|l| l.replace("\", \"", "\",\"") == cmd),
        "the image's CMD is the unit's arguments ({cmd}):\n{recipe}"
    );
    assert!(
        recipe.contains(&format!("-t memlock-trace:{}", env!("CARGO_PKG_VERSION"))),
        "the recipe tags this version's image:\n{recipe}"
    );
    // `cargo xtask dist`'s tree holds what the recipe copies.
    for source in ["bin/memlock-trace", "share/man/man1/"] {
        assert!(
            recipe.contains(&format!("COPY {source} ")),
            "{source}:\n{recipe}"
        );
    }
}

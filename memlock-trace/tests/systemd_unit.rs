//! Runs on: host only: systemd-analyze checks the unit file, whatever the kernel (the capabilities
//! it grants are exercised by test:least_privilege, in the guests too)
//!
//! Packages: systemd
//!
//! The systemd unit in dist/: systemd itself checks it (`systemd-analyze verify`, with the
//! built binary and man page where the unit names them), it grants exactly the capabilities
//! `memlock-trace probe` asks an unprivileged user for, and its exposure score is the one
//! README.md states. `systemd-analyze` works without systemd running.

mod support;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use support::{BIN, UNIT};

const README: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
/// Where the unit expects the binary (`cargo xtask dist`'s tree copied to /usr/local).
const INSTALLED: &str = "/usr/local/bin/memlock-trace";

/// The unit with ExecStart pointing at the binary under test, in a directory of its own,
/// with the man pages the unit's `Documentation=` names under `dir/man`.
fn unit_under_test(name: &str) -> (PathBuf, PathBuf) {
    let dir =
        std::env::temp_dir().join(format!("memlock-trace-unit-{name}-{}", std::process::id()));
    let man = dir.join("man/man1");
    std::fs::create_dir_all(&man).unwrap();
    let text = UNIT;
    assert!(text.contains(INSTALLED), "the unit runs {INSTALLED}");
    let unit = dir.join("memlock-trace.service");
    std::fs::write(&unit, text.replace(INSTALLED, BIN)).unwrap();
    let out = Command::new(BIN).arg("man").arg(&man).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (unit, dir.join("man"))
}

fn systemd_analyze(args: &[&str], unit: &Path, manpath: &Path) -> std::process::Output {
    Command::new("systemd-analyze")
        .args(args)
        .arg(unit)
        .env("MANPATH", manpath)
        .output()
        .unwrap_or_else(|e| {
            panic!("systemd-analyze (Debian package systemd) cannot run: {e}; install systemd")
        })
}

/// Every capability named on the unit's `key=` lines.
fn unit_capabilities(key: &str) -> Vec<String> {
    let mut caps: Vec<String> = support::unit_values(key)
        .iter()
        .flat_map(|v| v.split_whitespace().map(str::to_string))
        .collect();
    caps.sort();
    caps
}

#[test]
fn systemd_verifies_the_unit_without_a_warning() {
    let (unit, man) = unit_under_test("verify");
    let out = systemd_analyze(&["verify"], &unit, &man);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {stderr}");
    assert!(
        stderr.trim().is_empty(),
        "systemd-analyze verify warned: {stderr}"
    );
}

/// An unprivileged `probe` names the capabilities a session needs in its `setcap` line;
/// the unit grants those (ambient, for its dynamic user) and bounds itself to them.
#[test]
fn the_unit_grants_the_capabilities_probe_names() {
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            BIN,
            "probe",
        ])
        .output()
        .expect("setpriv (util-linux) runs probe as nobody");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let flat = stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    let grant = flat
        .split("sudo setcap ")
        .nth(1)
        .and_then(|rest| rest.split("+ep").next())
        .unwrap_or_else(|| panic!("no setcap line in probe's output:\n{stdout}"));
    let mut named: Vec<String> = grant.split(',').map(str::to_uppercase).collect();
    named.sort();
    let tracefs_closed = std::fs::metadata("/sys/kernel/tracing")
        .is_ok_and(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o005 == 0);
    assert!(
        tracefs_closed,
        "tracefs is open to other users here, so probe names no CAP_DAC_READ_SEARCH and \
         this test cannot compare the unit's three capabilities with probe's"
    );
    assert_eq!(unit_capabilities("AmbientCapabilities"), named, "{stdout}");
    assert_eq!(
        unit_capabilities("CapabilityBoundingSet"),
        named,
        "{stdout}"
    );
}

#[test]
fn readme_states_the_units_exposure_score() {
    let (unit, man) = unit_under_test("security");
    let out = systemd_analyze(&["security", "--offline=true", "--no-pager"], &unit, &man);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "→ Overall exposure level for memlock-trace.service: 2.0 OK 🙂"
    let score = stdout
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for memlock-trace.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no overall exposure level in:\n{stdout}"));
    let readme = std::fs::read_to_string(README).unwrap();
    let stated = format!("exposure level {score}");
    assert!(
        readme.contains(&stated),
        "README.md should say `{stated}` (systemd-analyze security --offline=true):\n{stdout}"
    );
}

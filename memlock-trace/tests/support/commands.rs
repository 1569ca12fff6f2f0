//! memlock-trace run to completion (plain, `suite`, `advise`): it must succeed, and what it
//! printed or wrote is returned; what the advise tests need installed.

use std::{path::PathBuf, process::Command};

use serde_json::Value;

use super::{BIN, line_with};

/// Asserts that the finished command `what` succeeded, its status, stdout and stderr in the
/// message; returns its stdout.
pub fn succeeded(what: &str, out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `source` written to `dir/NAME.c` and compiled by gcc with `flags` into `dir/NAME`.
pub fn compile_c(dir: &std::path::Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).unwrap();
    let bin = dir.join(name);
    let out = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&bin)
        .arg(&c)
        .output()
        .unwrap_or_else(|e| {
            panic!("gcc: {e} (`cargo xtask test` installs Debian's gcc; or: apt-get install gcc)")
        });
    succeeded(&format!("gcc {name}.c"), &out);
    bin
}

/// Runs `memlock-trace ARGS` to completion; it must succeed (its stderr is in the message).
pub fn run(args: &[&str]) -> std::process::Output {
    let out = Command::new(BIN)
        .args(args)
        .output()
        .expect("memlock-trace");
    succeeded(&format!("memlock-trace {args:?}"), &out);
    out
}

/// Runs `cmd` (`memlock-trace suite ... --out OUT_DIR`) to completion; it must succeed.
/// Returns the report it wrote, `OUT_DIR/report.json`.
pub fn suite_report(cmd: &mut Command, out_dir: &std::path::Path) -> Value {
    let out = cmd.output().expect("run memlock-trace suite");
    succeeded("suite", &out);
    serde_json::from_str(&std::fs::read_to_string(out_dir.join("report.json")).unwrap()).unwrap()
}

/// Runs `advise --apply --json -- COMMAND` and returns its report.
pub fn advise_apply(command: &[&str]) -> Value {
    advise_json(&["--apply"], command)
}

/// Runs `advise OPTIONS --json -- COMMAND`, asserts it succeeded, and returns its report.
pub fn advise_json(options: &[&str], command: &[&str]) -> Value {
    let out = Command::new(BIN)
        .arg("advise")
        .args(options)
        .args(["--json", "--"])
        .args(command)
        .output()
        .unwrap();
    let stdout = succeeded("advise", &out);
    serde_json::from_str(line_with(&stdout, "\"type\":\"advise\"")).unwrap()
}

/// Debian's python3, which the advise tests run: missing, the test fails saying how to get it.
pub const PYTHON: &str = "/usr/bin/python3";

pub fn require_python() {
    assert!(
        std::path::Path::new(PYTHON).is_file(),
        "{PYTHON} is missing (`cargo xtask test` installs Debian's python3 package, or: \
         apt-get install python3)"
    );
}

/// advise --apply's preload library, beside the tracer: missing, the test fails naming it.
pub fn require_preload() {
    let preload = std::path::Path::new(BIN).with_file_name("libmemlock_preload.so");
    assert!(
        preload.is_file(),
        "{} is missing: `cargo xtask test` builds it (or: cargo build -p memlock-preload)",
        preload.display()
    );
}

//! What a stage reports: each test binary's outcome from libtest's summary lines, what
//! `memlock-trace probe --json` found on the kernel, and the table printed per kernel.

use anyhow::{Context as _, Result};

use super::Stage;

/// What one test binary did on one kernel.
pub(super) struct Outcome {
    pub(super) name: String,
    pub(super) passed: u64,
    pub(super) failed: u64,
    pub(super) exit_code: i32,
}

/// Sums libtest's `test result: ok. N passed; M failed; ...` lines.
pub(super) fn outcome(name: &str, output: &str, exit_code: i32) -> Outcome {
    let (mut passed, mut failed) = (0, 0);
    for line in output.lines().filter(|l| l.starts_with("test result:")) {
        for part in line.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(label), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let n: u64 = n.parse().unwrap_or(0);
            match label {
                "passed" => passed += n,
                "failed" => failed += n,
                _ => {}
            }
        }
    }
    // A crash before the summary line still counts as a failure.
    if exit_code != 0 && failed == 0 {
        failed = 1;
    }
    Outcome {
        name: name.to_string(),
        passed,
        failed,
        exit_code,
    }
}

/// What `memlock-trace probe --json` reports: each hook kind the kernel allows or not (and
/// why), and each family's hook set.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Probe {
    capabilities: Vec<Capability>,
    hooks: Vec<(String, String)>,
}

#[derive(Debug, PartialEq)]
struct Capability {
    name: String,
    /// `None`: not checked (no privileges to try).
    usable: Option<bool>,
    detail: String,
}

impl Probe {
    /// The report's JSON line, among whatever else the output holds (a guest's console).
    pub(super) fn parse(output: &str) -> Result<Self> {
        let line = output
            .lines()
            .find(|l| l.starts_with('{') && l.contains("\"type\":\"probe\""))
            .with_context(|| {
                format!("no JSON report in `memlock-trace probe --json`'s output:\n{output}")
            })?;
        let report: serde_json::Value = serde_json::from_str(line).context("probe --json")?;
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        let capabilities = report["capabilities"]
            .as_array()
            .context("probe --json: no capabilities")?
            .iter()
            .map(|c| Capability {
                name: text(&c["name"]),
                usable: c["checked"]
                    .as_bool()
                    .unwrap_or(false)
                    .then(|| c["usable"].as_bool().unwrap_or(false)),
                detail: text(&c["detail"]),
            })
            .collect();
        let hooks = report["hooks"]
            .as_object()
            .context("probe --json: no hooks")?
            .iter()
            .map(|(family, line)| (family.clone(), text(line)))
            .collect();
        Ok(Self {
            capabilities,
            hooks,
        })
    }

    pub(super) fn usable(&self, name: &str) -> bool {
        self.capabilities
            .iter()
            .any(|c| c.name == name && c.usable == Some(true))
    }
}

pub(super) fn print_table(stage: &Stage) {
    println!(
        "== {} — kernel {} ({:.0}s) ==",
        stage.title, stage.kernel, stage.secs
    );
    for c in &stage.probe.capabilities {
        let usable = match c.usable {
            Some(true) => "yes",
            Some(false) => "no",
            None => "?",
        };
        println!("  {:<12} {usable:<4} {}", c.name, c.detail);
    }
    for (family, hooks) in &stage.probe.hooks {
        println!("  {family:<12} {hooks}");
    }
    println!(
        "  {:<44} {:>7} {:>7} {:>5}",
        "test binary", "passed", "failed", "exit"
    );
    for o in &stage.outcomes {
        println!(
            "  {:<44} {:>7} {:>7} {:>5}",
            o.name, o.passed, o.failed, o.exit_code
        );
    }
    for (name, reason) in &stage.not_run {
        println!("  {name:<44} {reason}");
    }
    println!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_summaries_are_summed() {
        let out = "test a ... ok\ntest result: ok. 3 passed; 0 failed; 1 ignored\n\
                   test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured\n";
        let o = outcome("x", out, 101);
        assert_eq!((o.passed, o.failed), (5, 1));
        assert_eq!(
            outcome("y", "", 139).failed,
            1,
            "a crash counts as a failure"
        );
    }

    #[test]
    fn probe_reports_parse() {
        let probe = Probe::parse(
            "console noise\n{\"type\":\"probe\",\"capabilities\":[\
             {\"name\":\"fentry\",\"usable\":false,\"checked\":true,\"detail\":\"refused\"},\
             {\"name\":\"kprobe\",\"usable\":true,\"checked\":true,\"detail\":\"ok\"}],\
             \"hooks\":{\"faults\":\"kprobe (handle_mm_fault)\"}}\nmore",
        )
        .unwrap();
        assert!(probe.usable("kprobe") && !probe.usable("fentry") && !probe.usable("btf"));
        assert_eq!(
            probe.hooks,
            [("faults".to_string(), "kprobe (handle_mm_fault)".to_string())]
        );
        assert!(Probe::parse("kernel 6.1\nfentry no").is_err());
    }
}

//! The man page and the shell completions of `output_formats.rs`, both made from the clap
//! definition.

use std::process::Command;

use super::support::{BIN, run, scratch};

/// The man page names page faults in its NAME line and has the EXIT STATUS and EXAMPLES
/// sections of a tool's page (man-pages(7)), in that order after OPTIONS (issue 47 point 14).
#[test]
fn man_page_has_exit_status_examples_and_names_page_faults() {
    let man = String::from_utf8_lossy(&run(&["man"]).stdout).into_owned();
    let name = man
        .split(".SH NAME\n")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .unwrap_or_else(|| panic!("no NAME section:\n{man}"));
    assert!(name.contains("page faults"), "{name}");
    let at = |s: &str| man.find(s).unwrap_or_else(|| panic!("no {s:?} in:\n{man}"));
    assert!(at(".SH OPTIONS") < at(".SH \"EXIT STATUS\""));
    assert!(at(".SH \"EXIT STATUS\"") < at(".SH EXAMPLES"));
    for code in ["124", "125", "126", "127"] {
        assert!(man.contains(&format!("\\fB{code}\\fR")), "exit {code}");
    }
    // The page written to a directory is the same.
    let dir = scratch("output-formats-man-sections");
    run(&["man", dir.to_str().unwrap()]);
    let written = std::fs::read_to_string(dir.join("memlock-trace.1")).unwrap();
    assert!(written.contains(".SH EXAMPLES"), "{written}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn man_page_and_completions_come_from_the_clap_definition() {
    let man = run(&["man"]);
    let man = String::from_utf8_lossy(&man.stdout);
    assert!(
        man.starts_with(".ie") || man.contains(".TH memlock-trace"),
        "{man}"
    );
    for flag in ["\\-\\-hist", "\\-\\-interval", "\\-o", "\\-\\-timestamp"] {
        assert!(man.contains(flag), "{flag} missing from the man page");
    }
    // With a directory: the page and one per subcommand it names.
    let dir = scratch("output-formats-man");
    run(&["man", dir.to_str().unwrap()]);
    let mut pages: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    for page in [
        "memlock-trace.1",
        "memlock-trace-probe.1",
        "memlock-trace-verify.1",
    ] {
        assert!(pages.iter().any(|p| p == page), "{page} not in {pages:?}");
    }
    assert!(man.contains("memlock\\-trace\\-probe(1)") || man.contains("memlock-trace-probe(1)"));
    std::fs::remove_dir_all(&dir).ok();
    for shell in ["bash", "zsh", "fish"] {
        let script = run(&["completions", shell]);
        let script = String::from_utf8_lossy(&script.stdout);
        assert!(
            script.contains("memlock-trace") && script.contains("hist"),
            "{shell}: {script}"
        );
    }
    let out = Command::new(BIN)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

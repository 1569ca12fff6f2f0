//! Where each of memlock-trace's integration test binaries runs, and which Debian packages it
//! needs, read from the top of its own file (`memlock-trace/tests/NAME.rs`), so that renaming
//! or adding a test file takes its placement along. The declaration is one or two paragraphs
//! of the file's leading `//!` doc (a paragraph ends at an empty `//!` line; its lines are
//! joined with single spaces):
//!
//! - `Runs on: host only: WHY`: the host stage only. Each guest's table prints
//!   `host only: WHY`.
//! - `Runs on: host, 5.10, 6.12, arm64: WHY`: the host and these guests, x86_64's named as
//!   `--kernel` names them and `arm64` for every aarch64 guest (one cross-build runs on
//!   each). WHY says why the x86_64 guests left out can do without it, and their tables
//!   print `not on 6.1, run on 5.10, 6.12 and the host: WHY`; with none left out there is
//!   nothing to say, and no WHY.
//! - `Packages: python3, memcached: WHY`: the Debian packages of the programs it runs,
//!   installed when missing before any stage (the x86_64 guests' initramfs carries python3
//!   and memcached from the host: `vm::programs`). WHY is optional, for the reader.
//!
//! Without `Runs on:`, a binary runs on the host and every x86_64 guest; the aarch64 guests
//! run only the binaries that name `arm64`, and the lib's own tests.
//!
//! What goes where. `host only` is for kernel-independent behaviour (CLI parsing, output
//! shape, JSON schema, errors decided in user space) and for programs the guests do not
//! carry; its WHY names the binaries that check the figures behind it in the guests. Three
//! guests each running every binary do not fit CI's time on two cores (emulated beside the
//! host stage, each took 55 to over 60 minutes), so the x86_64 guests share the rest by what
//! differs between the kernels, the hooks: every guest checks each family's figures against
//! the kernel's own (syscalls: test:syscalls or test:exact_calls; faults: test:faults,
//! test:fault_cli or test:mappings; VMAs: test:vma_whole and test:verify, on all three with
//! the lib's BTF tests and test:probe), and what user space builds on top of the hooks runs
//! on one guest, chosen to balance the guests' times. 6.1 and 6.12 offer the same hooks
//! (fentry, kprobes, `bpf_find_vma`, the maple tree; only the VMA family's functions
//! differ); 5.10 has the rbtree, the raw syscall dispatchers and no `bpf_find_vma`. The
//! aarch64 guests are emulated too: `arm64` is for each family's exact figures only
//! (`arm64.rs`).

use std::{fs, path::Path};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{run::workspace_root, vm};

/// memlock-trace's integration tests, one binary per file, relative to the workspace.
const TESTS_DIR: &str = "memlock-trace/tests";

const RUNS_ON: &str = "Runs on:";
const PACKAGES: &str = "Packages:";
const HOST_ONLY: &str = "host only";
/// How a declaration names the aarch64 guests.
const ARM64: &str = "arm64";
/// Where a malformed declaration sends its author.
const SEE: &str = "see xtask/src/test/placement.rs or docs/reference.md, \"Where each test runs\"";

/// Where one test binary runs and what it needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Placement {
    pub(super) guests: Guests,
    /// Whether the aarch64 guests run it too.
    pub(super) arm64: bool,
    /// Debian packages of the programs it runs.
    pub(super) packages: Vec<String>,
}

/// Which x86_64 guests run a binary (the host stage runs every one).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) enum Guests {
    /// A file without `Runs on:`, or one naming them all.
    #[default]
    Every,
    /// These guests' versions, as declared, and why the others can do without it.
    Some { versions: Vec<String>, why: String },
    /// None, and why.
    HostOnly { why: String },
}

/// The lib's own tests (every program verified, the CO-RE offsets against each kernel's
/// BTF) run on every guest, the aarch64 ones too; they have no file of their own to say so.
const LIB: Placement = Placement {
    guests: Guests::Every,
    arm64: true,
    packages: Vec::new(),
};

impl Placement {
    /// Why a binary so placed does not run in the guest booting `kernel`, if it does not.
    pub(super) fn why_not_on(&self, kernel: vm::Kernel) -> Option<String> {
        if let Guests::HostOnly { why } = &self.guests {
            return Some(format!("{HOST_ONLY}: {why}"));
        }
        if kernel.arch.rust_target().is_some() {
            return (!self.arm64).then(|| super::arm64::NOT_ON_ARM64.to_string());
        }
        let Guests::Some { versions, why } = &self.guests else {
            return None;
        };
        (!versions.iter().any(|v| v == kernel.version)).then(|| {
            format!(
                "not on {}, run on {} and the host: {why}",
                kernel.version,
                versions.join(", ")
            )
        })
    }
}

/// The placement of a test binary cargo built from `src_path`: its file's declaration for one
/// of memlock-trace's integration tests, [`LIB`] for its lib, the default otherwise (its
/// binary's unit tests; the other packages' binaries never go into a guest).
pub(super) fn of_binary(package: &str, kind: &str, src_path: &Path) -> Result<Placement> {
    match (package, kind) {
        ("memlock-trace", "test") => read(src_path),
        ("memlock-trace", "lib") => Ok(LIB),
        _ => Ok(Placement::default()),
    }
}

/// Every file in [`TESTS_DIR`] with its test binary's name (the file's stem, as cargo names
/// it) and placement, in name order.
pub(super) fn test_files() -> Result<Vec<(String, Placement)>> {
    let dir = workspace_root().join(TESTS_DIR);
    let mut files = Vec::new();
    for entry in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        if path.is_file() && path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().unwrap_or_default().to_string_lossy();
            files.push((name.into_owned(), read(&path)?));
        }
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(files)
}

fn read(path: &Path) -> Result<Placement> {
    let source = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&source).with_context(|| format!("{}: where the test runs", path.display()))
}

/// The declaration in a test file's source.
fn parse(source: &str) -> Result<Placement> {
    let mut placement = Placement::default();
    let (mut runs_on, mut packages) = (false, false);
    for paragraph in leading_doc_paragraphs(source) {
        if let Some(rest) = paragraph.strip_prefix(RUNS_ON) {
            ensure!(!runs_on, "two `{RUNS_ON}` paragraphs: keep one; {SEE}");
            (placement.guests, placement.arm64) = parse_runs_on(rest.trim())?;
            runs_on = true;
        } else if let Some(rest) = paragraph.strip_prefix(PACKAGES) {
            ensure!(!packages, "two `{PACKAGES}` paragraphs: keep one; {SEE}");
            placement.packages = parse_packages(rest.trim())?;
            packages = true;
        }
    }
    // A declaration spelt otherwise, or not at the start of a paragraph of the top doc, would
    // be silently ignored and the binary run everywhere.
    let read = usize::from(runs_on) + usize::from(packages);
    if declaration_like_lines(source) != read {
        bail!(
            "a line starting like `{RUNS_ON}` or `{PACKAGES}` is not read: start a paragraph \
             of the `//!` doc at the top of the file with exactly `{RUNS_ON}` or \
             `{PACKAGES}`; {SEE}"
        );
    }
    Ok(placement)
}

/// A declaration's `LIST[: WHY]` after `label`: the list, and the reason if there is a colon
/// (which must have one after it).
fn list_and_why<'a>(label: &str, declared: &'a str) -> Result<(&'a str, Option<&'a str>)> {
    let (list, why) = match declared.split_once(':') {
        Some((list, why)) => (list, Some(why.trim())),
        None => (declared, None),
    };
    ensure!(
        why != Some(""),
        "`{label} {declared}`: nothing after the colon: say why, or drop it; {SEE}"
    );
    Ok((list, why))
}

/// `host only: WHY`, or `host, VERSION, ..., arm64[: WHY]`, after `Runs on:`.
fn parse_runs_on(declared: &str) -> Result<(Guests, bool)> {
    let (places, why) = list_and_why(RUNS_ON, declared)?;
    let places: Vec<&str> = places.split(',').map(str::trim).collect();
    if places == [HOST_ONLY] {
        let why = why.with_context(|| format!("`{RUNS_ON} {HOST_ONLY}` needs `: WHY`; {SEE}"))?;
        return Ok((Guests::HostOnly { why: why.into() }, false));
    }
    ensure!(
        !places.contains(&HOST_ONLY),
        "`{RUNS_ON} {declared}`: `{HOST_ONLY}` stands alone (no guest runs such a binary, \
         the aarch64 ones neither); {SEE}"
    );
    ensure!(
        places[0] == "host",
        "`{RUNS_ON} {declared}`: the host stage runs every binary: name `host` first; {SEE}"
    );
    let mut versions: Vec<String> = Vec::new();
    let mut arm64 = false;
    for &place in &places[1..] {
        let seen = match place {
            "host" => true,
            ARM64 => std::mem::replace(&mut arm64, true),
            version => {
                let seen = versions.iter().any(|v| v == version);
                versions.push(x86_64_guest(version)?.into());
                seen
            }
        };
        ensure!(!seen, "`{RUNS_ON} {declared}`: {place} named twice; {SEE}");
    }
    ensure!(
        !versions.is_empty(),
        "`{RUNS_ON} {declared}`: no x86_64 guest: name one, or write \
         `{RUNS_ON} {HOST_ONLY}: WHY`; {SEE}"
    );
    let every = x86_64_guests().all(|k| versions.iter().any(|v| v == k.version));
    let guests = match (every, why) {
        (true, None) => Guests::Every,
        (true, Some(_)) => bail!(
            "`{RUNS_ON} {declared}`: every x86_64 guest runs it, so no table prints the \
             reason: drop `: WHY`; {SEE}"
        ),
        (false, Some(why)) => Guests::Some {
            versions,
            why: why.into(),
        },
        (false, None) => bail!(
            "`{RUNS_ON} {declared}`: say why the x86_64 guests left out can do without it \
             (`{RUNS_ON} {}: WHY`); {SEE}",
            places.join(", ")
        ),
    };
    Ok((guests, arm64))
}

/// `version` as one of the x86_64 guests' kernels; the aarch64 guests go by [`ARM64`].
fn x86_64_guest(version: &str) -> Result<&'static str> {
    match vm::kernel(version) {
        Ok(kernel) if kernel.arch.rust_target().is_none() => Ok(kernel.version),
        Ok(_) => bail!(
            "`{RUNS_ON}` names the aarch64 guests together as `{ARM64}`, not {version}: \
             one cross-build runs on each; {SEE}"
        ),
        Err(_) => {
            let known: Vec<&str> = x86_64_guests().map(|k| k.version).collect();
            bail!(
                "`{RUNS_ON}` names an unknown kernel {version}: known are host, {} and \
                 {ARM64}; {SEE}",
                known.join(", ")
            )
        }
    }
}

fn x86_64_guests() -> impl Iterator<Item = vm::Kernel> {
    vm::KERNELS
        .into_iter()
        .filter(|k| k.arch.rust_target().is_none())
}

/// `PACKAGE, ...[: WHY]`, after `Packages:`.
fn parse_packages(declared: &str) -> Result<Vec<String>> {
    let (list, _why) = list_and_why(PACKAGES, declared)?;
    let mut packages: Vec<String> = Vec::new();
    for package in list.split(',').map(str::trim) {
        // Debian policy's package names: lower case letters, digits, `+`, `-` and `.`.
        let well_formed = package.len() >= 2
            && package.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && package
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c));
        ensure!(
            well_formed,
            "`{PACKAGES} {declared}`: {package:?} is not a Debian package name: list them \
             with commas, then `: WHY` if anything; {SEE}"
        );
        ensure!(
            !packages.contains(&package.to_string()),
            "`{PACKAGES} {declared}`: {package} named twice; {SEE}"
        );
        packages.push(package.into());
    }
    Ok(packages)
}

/// The paragraphs of the `//!` doc the source starts with, each one line of text.
fn leading_doc_paragraphs(source: &str) -> Vec<String> {
    let mut paragraphs = vec![String::new()];
    for line in source.lines().map_while(|l| l.strip_prefix("//!")) {
        let line = line.trim();
        let paragraph = paragraphs.last_mut().expect("never empty");
        if line.is_empty() {
            paragraphs.push(String::new());
        } else if paragraph.is_empty() {
            paragraph.push_str(line);
        } else {
            paragraph.push(' ');
            paragraph.push_str(line);
        }
    }
    paragraphs.retain(|p| !p.is_empty());
    paragraphs
}

/// Comment lines anywhere in the source whose text starts as a declaration does, in any case.
fn declaration_like_lines(source: &str) -> usize {
    source
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("//"))
        .map(|text| {
            text.trim_start_matches(['/', '!'])
                .trim()
                .to_ascii_lowercase()
        })
        .filter(|text| {
            [RUNS_ON, PACKAGES]
                .iter()
                .any(|key| text.starts_with(&key.to_ascii_lowercase()))
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the real files: a malformed declaration fails here, not halfway through a run.
    #[test]
    fn every_test_file_declares_a_placement_xtask_reads() {
        let files = test_files().unwrap_or_else(|e| panic!("{e:#}"));
        assert!(files.len() > 40, "{} test files", files.len());
        let named = |name: &str| &files.iter().find(|(n, _)| n == name).unwrap().1;
        // One of each shape, so a parser that read nothing would not pass.
        assert!(matches!(named("errors").guests, Guests::HostOnly { .. }));
        assert!(matches!(named("faults").guests, Guests::Some { .. }));
        assert!(named("faults").arm64 && named("probe").arm64 && !named("cli").arm64);
        assert_eq!(
            named("stacks").packages.first().map(String::as_str),
            Some("gcc")
        );
    }

    #[test]
    fn declarations_parse() {
        let source = "//! Runs on: host, 5.10,\n//!   6.12, arm64: the\n//! reason\n//!\n\
                      //! Packages: python3, linux-perf: perf stat\n//!\n//! What it tests.\n\
                      \nmod common;\n";
        let placement = parse(source).unwrap();
        assert_eq!(
            placement.guests,
            Guests::Some {
                versions: vec!["5.10".into(), "6.12".into()],
                why: "the reason".into()
            }
        );
        assert!(placement.arm64);
        assert_eq!(placement.packages, ["python3", "linux-perf"]);
        let why = |version| placement.why_not_on(vm::kernel(version).unwrap());
        assert_eq!(
            why("6.1").as_deref(),
            Some("not on 6.1, run on 5.10, 6.12 and the host: the reason")
        );
        assert_eq!((why("5.10"), why("6.1-arm64")), (None, None));

        let host_only = parse("//! Runs on: host only: user space (test:x: y)\n").unwrap();
        assert_eq!(
            host_only.why_not_on(vm::kernel("6.12-arm64").unwrap()),
            Some("host only: user space (test:x: y)".into())
        );
        let every = parse("//! Runs on: host, 5.10, 6.1, 6.12, arm64\n").unwrap();
        assert_eq!((every.guests, every.arm64), (Guests::Every, true));
        assert_eq!(
            parse("//! Just tests.\nfn f() {}\n").unwrap(),
            Placement::default()
        );
    }

    #[test]
    fn malformed_declarations_say_what_to_write() {
        for (source, says) in [
            ("//! Runs on: host, 6.13: why\n", "unknown kernel 6.13"),
            ("//! Runs on: host, 6.1-arm64\n", "together as `arm64`"),
            ("//! Runs on: 5.10: why\n", "name `host` first"),
            ("//! Runs on: host, arm64\n", "no x86_64 guest"),
            (
                "//! Runs on: host, 5.10\n",
                "say why the x86_64 guests left out",
            ),
            ("//! Runs on: host, 5.10, 6.1, 6.12: why\n", "drop `: WHY`"),
            ("//! Runs on: host only\n", "needs `: WHY`"),
            ("//! Runs on: host only, arm64: why\n", "stands alone"),
            ("//! Runs on: host, arm64, host: why\n", "host named twice"),
            ("//! Runs on: host, 5.10, 5.10: why\n", "5.10 named twice"),
            ("//! Runs on: host, 5.10:\n", "nothing after the colon"),
            ("//! Packages: Python3\n", "not a Debian package name"),
            ("//! Packages: gcc gdb\n", "not a Debian package name"),
            ("//! Packages: gcc,\n", "not a Debian package name"),
            ("//! runs on: host only: why\n", "is not read"),
            ("//! Tests.\n//! Runs on: host only: why\n", "is not read"),
            ("//! Tests.\n\n// Runs on: host only: why\n", "is not read"),
            (
                "//! Runs on: host only: a\n//!\n//! Runs on: host only: b\n",
                "two `Runs on:`",
            ),
        ] {
            let error = format!("{:#}", parse(source).unwrap_err());
            assert!(error.contains(says), "{source:?}: {error}");
            assert!(error.contains("docs/reference.md"), "{source:?}: {error}");
        }
    }
}

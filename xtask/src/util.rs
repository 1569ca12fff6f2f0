//! Running commands with errors that name them.

use std::process::Command;

use anyhow::{Context as _, Result, bail};

/// Runs `cmd` with inherited stdio; fails on a non-zero exit, naming the command.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout; errors name the command line (and, when it cannot
/// start, the program to install).
pub fn output_of(cmd: &mut Command) -> Result<String> {
    let line = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|arg| arg.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let out = cmd.output().with_context(|| {
        format!(
            "cannot run `{line}` (is `{}` installed?)",
            cmd.get_program().display()
        )
    })?;
    if !out.status.success() {
        bail!(
            "`{line}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

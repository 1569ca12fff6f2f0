//! The man page: clap_mangen's sections from the one clap definition, then the sections a
//! man page of a tool is expected to have and clap knows nothing of (man-pages(7): EXIT
//! STATUS after OPTIONS, then EXAMPLES), as strace(1) and perf-trace(1) have them.

use std::{io, path::Path};

use clap::CommandFactory;
use clap_mangen::Man;

use super::Cli;

/// `EXIT STATUS`: the table of docs/reference.md's "Exit codes", as roff.
const EXIT_STATUS: &[(&str, &str)] = &[
    (
        "the command's",
        "With \\-\\- COMMAND: its exit status (128 + N when signal N killed it).",
    ),
    (
        "0",
        "Done: no command, or one that exited 0; verify: every step agrees.",
    ),
    (
        "1",
        "verify: a step disagrees with the kernel; suite: a consistency check failed.",
    ),
    (
        "2",
        "Usage: a bad option or value, no such pid or cgroup, an output path that cannot be \
         created.",
    ),
    (
        "124",
        "With \\-\\- COMMAND: \\-\\-duration (or INTERVAL COUNT) ended while the command ran; \
         it was sent SIGTERM and waited for, as timeout(1) does.",
    ),
    (
        "125",
        "memlock\\-trace itself failed: privileges, loading or attaching, writing its output.",
    ),
    ("126", "The command was found but could not be executed."),
    ("127", "The command was not found."),
    (
        "141",
        "stdout is a pipe that closed (memlock\\-trace \\-\\-events | head).",
    ),
];

/// `EXAMPLES`: what each does, then the command line.
const EXAMPLES: &[(&str, &str)] = &[
    (
        "Trace a command as user nobody and print its calls, page faults and mappings when it \
         exits:",
        "sudo memlock\\-trace \\-\\-user nobody \\-\\- python3 app.py",
    ),
    (
        "Every mlock\\-family call of a running process as it happens, with wall\\-clock time, \
         for 10 seconds:",
        "sudo memlock\\-trace \\-T \\-\\-events=calls \\-p 1234 \\-d 10",
    ),
    (
        "The same with the VMAs each call split, merged or locked:",
        "sudo memlock\\-trace \\-\\-events=syscalls \\-p 1234",
    ),
    (
        "System\\-wide, five one\\-second intervals, latency histograms in milliseconds:",
        "sudo memlock\\-trace \\-\\-hist \\-m 1 5",
    ),
    (
        "The summary per cgroup (service, container or pod):",
        "sudo memlock\\-trace \\-\\-by cgroup \\-d 30",
    ),
    (
        "Prometheus metrics on port 9464:",
        "sudo memlock\\-trace \\-\\-prometheus :9464",
    ),
    (
        "What to lock or populate, then the advice applied and both runs compared:",
        "sudo memlock\\-trace advise \\-\\-apply \\-\\- ./server",
    ),
    (
        "What this kernel allows, and the tracer checked against /proc/PID/smaps:",
        "sudo memlock\\-trace probe; sudo memlock\\-trace verify",
    ),
];

/// The tracer's own page: clap_mangen's sections, then EXIT STATUS and EXAMPLES.
pub fn page() -> io::Result<Vec<u8>> {
    let man = Man::new(Cli::command());
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    man.render_options_section(&mut page)?;
    man.render_subcommands_section(&mut page)?;
    page.extend_from_slice(extra_sections().as_bytes());
    man.render_version_section(&mut page)?;
    Ok(page)
}

/// The page and one per subcommand, to `dir` (`cargo xtask dist`).
pub fn write_pages(dir: &Path) -> io::Result<()> {
    clap_mangen::generate_to(Cli::command(), dir)?;
    std::fs::write(dir.join("memlock-trace.1"), page()?)
}

fn extra_sections() -> String {
    let mut roff = String::from(".SH \"EXIT STATUS\"\n");
    for (code, meaning) in EXIT_STATUS {
        roff.push_str(&format!(".TP\n\\fB{code}\\fR\n{meaning}\n"));
    }
    roff.push_str(
        ".PP\nAs with timeout(1), a command that itself exits 125 to 127 cannot be told from \
         the tracer's codes; the tracer's own errors are always on stderr, prefixed \
         memlock\\-trace: error:.\n",
    );
    roff.push_str(".SH EXAMPLES\n");
    for (what, command) in EXAMPLES {
        roff.push_str(&format!(
            ".PP\n{what}\n.PP\n.RS 4\n.nf\n{command}\n.fi\n.RE\n"
        ));
    }
    roff
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_page_has_exit_status_and_examples_after_options() {
        let page = String::from_utf8(super::page().unwrap()).unwrap();
        let at = |s: &str| page.find(s).unwrap_or_else(|| panic!("no {s:?}"));
        assert!(at(".SH OPTIONS") < at(".SH \"EXIT STATUS\""));
        assert!(at(".SH \"EXIT STATUS\"") < at(".SH EXAMPLES"));
        assert!(page.contains("\\fB124\\fR"));
    }
}

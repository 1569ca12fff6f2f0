//! Why the kernel refused a hook, in words that name the program, the kernel's reason and
//! the fix; and, kept typed beside the words, whether its verifier gave up for complexity
//! (what `-v`'s diagnostics can cause, so a session with `-v` must not quietly lose a hook).

use std::fmt::Write as _;

use aya::programs::ProgramError;

/// A hook the kernel refused: the message for the user ([`hook_refused`]'s), and whether the
/// verifier gave up on the program for complexity.
#[derive(Debug)]
pub struct HookRefused {
    message: String,
    too_complex: bool,
}

impl std::fmt::Display for HookRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HookRefused {}

/// A refusal kept for a hook line: the kernel's reason in words, and whether the verifier
/// gave up for complexity. In JSON it is its words.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refused {
    pub reason: String,
    pub too_complex: bool,
}

impl serde::Serialize for Refused {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.reason)
    }
}

impl Refused {
    /// A refusal in words only: a helper or field the kernel lacks, not a verifier's.
    pub fn lacking(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            too_complex: false,
        }
    }
}

impl Refused {
    /// An error out of attaching, in full (`{:#}`), typed as [`too_complex`] reads it.
    pub fn of(error: &anyhow::Error) -> Self {
        Self {
            reason: format!("{error:#}"),
            too_complex: too_complex(error),
        }
    }

    /// aya's refusal of one program, in one line ([`refusal_reason`]).
    pub fn of_program(error: &ProgramError) -> Self {
        Self {
            reason: refusal_reason(error),
            too_complex: gave_up_for_complexity(error),
        }
    }
}

/// Whether the verifier gave up on a program for its complexity: E2BIG (a million
/// instructions processed, or too many states) or its "too complex" message; an EPERM or
/// ENOTSUPP is the hook set's business, with or without `-v`.
fn gave_up_for_complexity(error: &ProgramError) -> bool {
    match error {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            io_error.raw_os_error() == Some(libc::E2BIG)
                || verifier_log.to_string().contains("too complex")
        }
        _ => false,
    }
}

/// Whether anything in `error`'s chain is a verifier's refusal for complexity.
pub fn too_complex(error: &anyhow::Error) -> bool {
    error.chain().any(|e| {
        e.downcast_ref::<HookRefused>()
            .is_some_and(|r| r.too_complex)
            || e.downcast_ref::<ProgramError>()
                .is_some_and(gave_up_for_complexity)
    })
}

/// Turns a refused load or attach into a message naming the program, the kernel's reason
/// (the last lines of the verifier log) and what to do about it.
pub fn hook_refused(program: &str, kind: &str, error: ProgramError) -> anyhow::Error {
    let too_complex = gave_up_for_complexity(&error);
    let mut message = format!("the kernel refused {kind} program `{program}`: ");
    match &error {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            let tail: Vec<&str> = log.lines().rev().take(8).collect();
            let _ = write!(message, "{io_error}");
            if !tail.is_empty() {
                let _ = write!(message, "\nverifier log (last lines):");
                for line in tail.iter().rev() {
                    let _ = write!(message, "\n    {line}");
                }
            }
        }
        other => {
            let _ = write!(message, "{other}");
            if let Some(source) = std::error::Error::source(other) {
                let _ = write!(message, ": {source}");
            }
        }
    }
    let _ = write!(
        message,
        "\nrun `memlock-trace probe` to see which hooks this kernel allows{}",
        if kind == "tracepoint" {
            "; tracepoints need tracefs mounted at /sys/kernel/tracing"
        } else {
            ""
        }
    );
    message.push_str(&perf_paranoid_hint(&message));
    anyhow::Error::new(HookRefused {
        message,
        too_complex,
    })
}

/// Debian and Ubuntu patch the kernel so that `kernel.perf_event_paranoid` 3 (their default)
/// refuses `perf_event_open` to everyone without CAP_SYS_ADMIN, CAP_PERFMON included: a
/// least-privilege tracer then fails with EACCES attaching its first tracepoint. Says so.
pub fn perf_paranoid_hint(refusal: &str) -> String {
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok());
    match paranoid {
        Some(level)
            if level > 2
                && refusal.contains("perf_event_open")
                && refusal.contains("os error 13") =>
        {
            format!(
                "\nkernel.perf_event_paranoid is {level}: this kernel then lets only CAP_SYS_ADMIN \
             open perf events (a Debian/Ubuntu patch; CAP_PERFMON is not enough). Run as root, or \
             `sysctl kernel.perf_event_paranoid=2` to keep to CAP_BPF + CAP_PERFMON"
            )
        }
        _ => String::new(),
    }
}

/// The kernel-internal `ENOTSUPP` (include/linux/errno.h), which strerror does not know: the
/// trampoline cannot handle this function (e.g. `vma_merge`'s 11 arguments on 6.1).
const ENOTSUPP: i32 = 524;

/// Whether the kernel refuses fentry as such, rather than this one function (ENOTSUPP for
/// one function's arguments, EBUSY for one already patched).
pub fn is_permission_error(error: &ProgramError) -> bool {
    let errno = match error {
        ProgramError::LoadError { io_error, .. } => io_error.raw_os_error(),
        ProgramError::SyscallError(e) => e.io_error.raw_os_error(),
        _ => None,
    };
    matches!(errno, Some(libc::EPERM | libc::EACCES))
}

/// `io::Error`'s text, naming ENOTSUPP where strerror says "Unknown error 524".
fn errno_text(error: &std::io::Error) -> String {
    match error.raw_os_error() {
        Some(ENOTSUPP) => "ENOTSUPP (524): the trampoline cannot take this function".into(),
        _ => error.to_string(),
    }
}

/// The kernel's reason in one line: the errno, and the verifier's last words if any.
pub fn refusal_reason(error: &ProgramError) -> String {
    match error {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            match log.lines().rev().find(|l| !l.trim().is_empty()) {
                Some(last) => format!(
                    "BPF_PROG_LOAD: {}; verifier: {}",
                    errno_text(io_error),
                    last.trim()
                ),
                None => format!("BPF_PROG_LOAD: {}", errno_text(io_error)),
            }
        }
        ProgramError::SyscallError(e) => format!("{}: {}", e.call, errno_text(&e.io_error)),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use aya_obj::VerifierLog;

    use super::*;

    fn load_error(errno: i32, log: &str) -> ProgramError {
        ProgramError::LoadError {
            io_error: std::io::Error::from_raw_os_error(errno),
            verifier_log: VerifierLog::new(log.to_string()),
        }
    }

    /// Only a verifier's refusal for complexity is blamed on -v's diagnostics: an EPERM
    /// (no trampolines on this kernel) is the hook set's business, with or without -v.
    #[test]
    fn only_a_refusal_for_complexity_is_too_complex() {
        let e2big = hook_refused("sys_enter_mlock", "tp_btf", load_error(libc::E2BIG, ""));
        assert!(too_complex(&e2big.context("syscalls")));
        let log = "BPF program is too complex\nprocessed 1000001 insns";
        assert!(Refused::of_program(&load_error(libc::EINVAL, log)).too_complex);
        let eperm = hook_refused(
            "handle_mm_fault_fentry",
            "fentry",
            load_error(libc::EPERM, ""),
        );
        assert!(!too_complex(&eperm));
        assert!(!Refused::of(&eperm).too_complex);
        assert!(Refused::of(&eperm).reason.starts_with(
            "the kernel refused fentry program `handle_mm_fault_fentry`: Operation not permitted"
        ));
    }
}

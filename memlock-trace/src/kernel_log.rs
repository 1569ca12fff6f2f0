//! `-v`: the eBPF programs' own diagnostics (a kernel read that failed and which field, a
//! map that was full and which, a record dropped, a target that left the set), written by
//! aya-log in the kernel and printed here on stderr, each named by its program.
//!
//! The level is a load-time global (`AYA_LOG_LEVEL`): off unless `-v`, so that without it
//! the verifier removes the log code from every program (see `memlock-trace-ebpf/src/diag.rs`).

use aya::{Ebpf, EbpfLoader};
use aya_log::EbpfLogger;
use log::{Level, Log, Metadata, Record};
use memlock_trace_common::diag::{self, RECORD_PREFIX};

/// `-v` count -> the most detailed level the programs write: none, then warnings and
/// information (losses, targets leaving), then everything.
pub fn level(verbose: u8) -> u8 {
    match verbose {
        0 => 0,
        1 => Level::Info as u8,
        _ => Level::Trace as u8,
    }
}

/// Sets the programs' log level before load (0: nothing is logged, nor loaded).
pub fn prepare_loader(loader: &mut EbpfLoader<'_>, level: u8) {
    // The loader keeps a reference until it loads.
    const LEVELS: [u8; 6] = [0, 1, 2, 3, 4, 5];
    let level = &LEVELS[usize::from(level).min(LEVELS.len() - 1)];
    loader.override_global(aya_log::LEVEL, level, true);
    // Our own gate, tested before anything is computed for a record.
    loader.override_global(memlock_trace_common::names::DIAG, level, true);
}

/// Prints each record on stderr: `memlock-trace: kernel: PROGRAM: message`.
pub struct KernelLog;

impl Log for KernelLog {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &Record<'_>) {
        let level = match record.level() {
            Level::Error => "error: ",
            Level::Warn => "warning: ",
            _ => "",
        };
        let text = record.args().to_string();
        let text = reads_failed(&text).unwrap_or(text);
        eprintln!("memlock-trace: kernel: {}: {level}{text}", record.target());
    }

    fn flush(&self) {}
}

/// Reads the programs' log ring (taking it from `ebpf`).
pub fn start(ebpf: &mut Ebpf) -> anyhow::Result<EbpfLogger<KernelLog>> {
    EbpfLogger::init_with_logger(ebpf, KernelLog)
        .map_err(|e| anyhow::anyhow!("reading the eBPF programs' log: {e}"))
}

/// A program's failed-reads record (`diag::RECORD_PREFIX`, field masks in hex) with the
/// fields named; None for any other text, which is printed as it is.
fn reads_failed(text: &str) -> Option<String> {
    let rest = text.strip_prefix(RECORD_PREFIX)?;
    let (failed, rest) = rest.split_once(", NULL base ")?;
    let (null_base, rest) = rest.split_once(' ')?;
    let runs = rest
        .strip_prefix('(')?
        .strip_suffix(" runs with a failure on this CPU)")?;
    let failed = u64::from_str_radix(failed, 16).ok()?;
    let null_base = u64::from_str_radix(null_base, 16).ok()?;
    let runs: u64 = runs.parse().ok()?;
    let names = |mask| {
        diag::field_names(mask)
            .map(|name| name.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = String::from("kernel read failed, reported as 0 or unknown: ");
    if failed != 0 {
        out.push_str(&names(failed));
    }
    if null_base != 0 {
        if failed != 0 {
            out.push_str("; ");
        }
        out.push_str(&format!("NULL struct, not read: {}", names(null_base)));
    }
    let run = if runs == 1 { "run" } else { "runs" };
    out.push_str(&format!(" ({runs} {run} with a failed read on this CPU)"));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::reads_failed;

    #[test]
    fn a_failed_reads_record_names_its_fields() {
        // As aya-log formats the eBPF side's record (`{:x}` without a 0x).
        let text =
            "kernel reads failed: fields 18, NULL base 0 (1 runs with a failure on this CPU)";
        assert_eq!(
            reads_failed(text).unwrap(),
            "kernel read failed, reported as 0 or unknown: mm_struct.locked_vm, \
             mm_struct.map_count (1 run with a failed read on this CPU)"
        );
        let text =
            "kernel reads failed: fields 1, NULL base 218 (4 runs with a failure on this CPU)";
        assert_eq!(
            reads_failed(text).unwrap(),
            "kernel read failed, reported as 0 or unknown: task_struct.mm; NULL struct, not \
             read: mm_struct.locked_vm, mm_struct.map_count, mm_struct.total_vm (4 runs with \
             a failed read on this CPU)"
        );
        // Bits the table does not name are still shown.
        let text = "kernel reads failed: fields 8000000000000000, NULL base 0 (2 runs with a failure on this CPU)";
        assert!(reads_failed(text).unwrap().contains("bit 63"));
        assert_eq!(reads_failed("map INFLIGHT full"), None);
    }

    /// The eBPF side's format string starts with the prefix the decoder expects.
    #[test]
    fn the_kernel_side_writes_the_prefix() {
        let source = include_str!("../../memlock-trace-ebpf/src/diag.rs");
        let format = format!(
            "\"{}{{:x}}, NULL base {{:x}} ({{}} runs with a failure on this CPU)\"",
            memlock_trace_common::diag::RECORD_PREFIX
        );
        assert!(source.contains(&format), "{format}");
    }
}

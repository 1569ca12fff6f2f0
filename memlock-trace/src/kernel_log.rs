//! `-v`: the eBPF programs' own diagnostics (a kernel read that failed and which field, a
//! map that was full and which, a record dropped, a target that left the set), written by
//! aya-log in the kernel and printed here on stderr, each named by its program.
//!
//! The level is a load-time global (`AYA_LOG_LEVEL`): off unless `-v`, so that without it
//! the verifier removes the log code from every program (see `memlock-trace-ebpf/src/diag.rs`).

use aya::{Ebpf, EbpfLoader};
use aya_log::EbpfLogger;
use log::{Level, Log, Metadata, Record};

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
        eprintln!(
            "memlock-trace: kernel: {}: {level}{}",
            record.target(),
            record.args()
        );
    }

    fn flush(&self) {}
}

/// Reads the programs' log ring (taking it from `ebpf`).
pub fn start(ebpf: &mut Ebpf) -> anyhow::Result<EbpfLogger<KernelLog>> {
    EbpfLogger::init_with_logger(ebpf, KernelLog)
        .map_err(|e| anyhow::anyhow!("reading the eBPF programs' log: {e}"))
}

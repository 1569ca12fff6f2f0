//! The rules on hand-made tables: what each kind of advice needs to be drawn, and what
//! keeps it from being drawn; the table's own counting on hand-made runs.

use super::{
    sample::{LimitsSeen, MemlockLimit},
    table::{MappingFigures, Phase, Startup, StartupHow, Table},
};

mod render;
mod room;
mod rules;
mod table;

const MIB: u64 = 1 << 20;

fn mapping(name: &str, size: u64, startup: u64, after: u64) -> MappingFigures {
    MappingFigures {
        mapping: name.into(),
        start: 0x7f00_0000_0000,
        end: 0x7f00_0000_0000 + size,
        size_bytes: size,
        perms: Some("rw-p".into()),
        resident_bytes: Some(size),
        swap_bytes: Some(0),
        faults_startup: startup,
        faults_after: after,
        fault_ns_startup: startup * 1500,
        fault_ns_after: after * 1500,
        locked: false,
        lifetimes: 1,
        stack: false,
        first_seen_secs: Some(0.5),
        sites: Vec::new(),
    }
}

fn table(mappings: Vec<MappingFigures>, limit: u64, cap: bool) -> Table {
    Table {
        pid: 1,
        comm: "prog".into(),
        described: "`prog`".into(),
        launched: true,
        exit_code: Some(0),
        running_at_end: false,
        traced_secs: 2.0,
        wall_ns: None,
        startup: Startup {
            secs: 0.2,
            how: StartupHow::Detected,
        },
        during_startup: Phase::default(),
        after_startup: Phase::default(),
        latency_ns: Default::default(),
        time_basis: "each fault timed".into(),
        limits: LimitsSeen {
            memlock_limit: Some(MemlockLimit::Bytes(limit)),
            cap_ipc_lock: Some(cap),
            threads_max: 1,
            ..LimitsSeen::default()
        },
        mem_available_bytes: Some(8 << 30),
        locked_by_calls_bytes: 0,
        own_faults: None,
        own_faults_before_attach: None,
        glibc_malloc: true,
        mappings,
        others: Vec::new(),
        lost: 0,
        preload_log: Vec::new(),
        flamegraph_command: None,
    }
}

/// 64 MiB of anonymous memory faulting after start-up under an 8 MiB `RLIMIT_MEMLOCK`,
/// with `CAP_IPC_LOCK` or without.
fn sixty_four_mib_under_eight(cap_ipc_lock: bool) -> Table {
    table(
        vec![mapping("anonymous", 64 * MIB, 0, 16384)],
        8 * MIB,
        cap_ipc_lock,
    )
}

//! Runs on: host, 5.10, 6.12, arm64: the syscall family's hooks are 6.12's on 6.1, where
//! test:exact_calls counts them
//!
//! The tracer reports exactly the mlock-family calls this process makes, with the right
//! errnos, and populated-page counts equal to the thread's own getrusage deltas.
#![cfg(feature = "lab")]

mod common;
mod support;

use common::{drain_syscalls, gettid, require_privileges};
use memlock_trace::{event::Syscall, lab::workload::syscalls, process::Targets, tracer::Tracer};
use support::{fdinfo_field, fdinfos};

#[test]
fn every_call_is_traced_with_its_result_and_populated_pages() {
    require_privileges();
    let mut tracer = Tracer::load(&Targets::Tgids(vec![std::process::id()])).expect("load tracer");
    let mut ring = tracer.take_events().expect("ring buffer");

    let calls = syscalls::run().expect("workload");

    let tid = gettid();
    let traced: Vec<_> = drain_syscalls(&mut ring)
        .into_iter()
        .filter(|r| r.raw.tid == tid)
        .collect();
    let names: Vec<&str> = traced.iter().map(|r| r.syscall.name()).collect();
    let expected: Vec<&str> = calls.iter().map(|c| c.syscall).collect();
    assert_eq!(names, expected, "calls traced vs calls made");

    for (i, (rec, call)) in traced.iter().zip(&calls).enumerate() {
        let errno = memlock_trace::event::errno_name(rec.raw.ret).unwrap_or_else(|| "0".into());
        assert_eq!(errno, call.result, "call {i} {}: result", call.syscall);
        assert_eq!(
            (rec.raw.min_flt, rec.raw.maj_flt),
            (call.faults.minflt, call.faults.majflt),
            "call {i} {}: faults inside the call vs getrusage(RUSAGE_THREAD) delta",
            call.syscall
        );
        assert_eq!(rec.raw.tgid, std::process::id());
        assert!(rec.raw.duration_ns > 0);
    }

    // The workload's known shape (see workload/syscalls.rs), checked figure by figure.
    let mlocks: Vec<_> = traced
        .iter()
        .filter(|r| r.syscall == Syscall::Mlock)
        .collect();
    assert_eq!(mlocks.len(), 3);
    assert_eq!(
        (mlocks[0].pages_populated(), mlocks[0].pages_locked()),
        (16, 16),
        "whole region"
    );
    assert_eq!(
        (mlocks[1].pages_populated(), mlocks[1].pages_locked()),
        (8, 8),
        "middle 8 pages"
    );
    assert_eq!(
        mlocks[1].raw.map_count_after - mlocks[1].raw.map_count_before,
        2,
        "locking the middle of a VMA splits it in three"
    );
    assert_eq!(
        memlock_trace::event::errno_name(mlocks[2].raw.ret).as_deref(),
        Some("ENOMEM")
    );
    assert_eq!(mlocks[2].pages_locked(), 0);

    let mlock2 = traced
        .iter()
        .find(|r| r.syscall == Syscall::Mlock2)
        .unwrap();
    assert_eq!(mlock2.raw.args[2], memlock_trace::event::MLOCK_ONFAULT);
    assert_eq!(
        (mlock2.pages_populated(), mlock2.pages_locked()),
        (0, 16),
        "MLOCK_ONFAULT locks, populates nothing"
    );

    let mlockall = traced
        .iter()
        .find(|r| r.syscall == Syscall::Mlockall)
        .unwrap();
    let munlockall = traced
        .iter()
        .find(|r| r.syscall == Syscall::Munlockall)
        .unwrap();
    assert!(mlockall.pages_locked() > 0);
    assert_eq!(
        munlockall.raw.locked_vm_after, 0,
        "munlockall unlocks everything"
    );

    let health = tracer.health().expect("counters");
    assert_eq!(health.dropped_events, 0);
    assert_eq!(health.untracked_calls, 0);
}

#[test]
fn other_processes_are_filtered_out() {
    require_privileges();
    // Trace only a pid that is not us: our calls must not appear.
    let mut tracer = Tracer::load(&Targets::Tgids(vec![1])).expect("load tracer");
    let mut ring = tracer.take_events().expect("ring buffer");
    let page =
        memlock_trace::lab::workload::Region::anonymous(1, libc::PROT_READ | libc::PROT_WRITE, 0)
            .unwrap();
    assert_eq!(unsafe { libc::mlock(page.addr.cast(), page.len) }, 0);
    let ours = drain_syscalls(&mut ring)
        .into_iter()
        .filter(|r| r.raw.tgid == std::process::id())
        .count();
    assert_eq!(ours, 0);
}

/// A 32-bit system call (`int 0x80`, which a 64-bit process may make too) has the ia32
/// numbers: 150 is ia32 `mlock`, x86-64 `munlock`. The programs see every call on the raw
/// `sys_enter`/`sys_exit` tracepoints, so they must leave such calls alone, as the
/// `syscalls:*` events do, rather than report an ia32 `mlock` as a `munlock`. x86 only: an
/// arm64 process cannot make an AArch32 call.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_32_bit_call_is_not_taken_for_the_64_bit_call_of_its_number() {
    require_privileges();
    const IA32_MLOCK: i64 = 150;
    let mut tracer = Tracer::load(&Targets::Tgids(vec![std::process::id()])).expect("load tracer");
    let mut ring = tracer.take_events().expect("ring buffer");
    // Below 4 GiB, so the address fits the 32-bit call's register.
    // SAFETY: a fresh anonymous mapping, touched only through the calls below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_32BIT,
            -1,
            0,
        )
    };
    assert_ne!(page, libc::MAP_FAILED);
    let ret: i64;
    // SAFETY: ia32 mlock(page, 4096) through the 32-bit entry; rbx (reserved by LLVM) is
    // swapped in and out around the call.
    unsafe {
        std::arch::asm!(
            "xchg rbx, {addr}",
            "int 0x80",
            "xchg rbx, {addr}",
            addr = inout(reg) page as u64 => _,
            inlateout("rax") IA32_MLOCK => ret,
            in("rcx") 4096u64,
        );
    }
    let locked_kib = || memlock_trace::lab::workload::proc_status_kib("VmLck").unwrap();
    assert_eq!(
        (ret, locked_kib()),
        (0, 4),
        "the 32-bit mlock failed (a kernel without CONFIG_IA32_EMULATION cannot run this test)"
    );
    // SAFETY: the page mapped above.
    assert_eq!(unsafe { libc::munlock(page, 4096) }, 0);
    assert_eq!(locked_kib(), 0);

    let tid = gettid();
    let traced: Vec<&str> = drain_syscalls(&mut ring)
        .into_iter()
        .filter(|r| r.raw.tid == tid)
        .map(|r| r.syscall.name())
        .collect();
    assert_eq!(traced, ["munlock"], "only the 64-bit call is one of ours");
    // SAFETY: unmapping the page mapped above, no longer used.
    unsafe { libc::munmap(page, 4096) };
}

/// Where the kernel allows trampolines (the probe's fentry), every family's syscall handlers
/// run on fentry/fexit of the calls' own functions, so no other call pays; elsewhere on the
/// calls' own `syscalls:*` events where the kernel has `bpf_find_vma` (5.17; this host,
/// arm64's 6.1), else on the raw tracepoints, saying why fentry was refused. 5.10 allows
/// fentry but its verifier refuses the programs' first read of the calls' `regs` (EACCES
/// after 2 instructions): there the raw tracepoints, with the kernel's reason, are what is
/// expected.
#[test]
fn the_syscall_hooks_are_on_the_calls_functions_where_fentry_is_allowed() {
    require_privileges();
    let caps = memlock_trace::probe::capabilities().expect("probe");
    let fentry = caps.iter().find(|c| c.name == "fentry").expect("fentry");
    let tracer = Tracer::load(&Targets::Tgids(Vec::new())).expect("load tracer");
    let syscalls = tracer.hooks["syscalls"].full();
    let prefix = memlock_trace::arch::SYSCALL_FUNCTION_PREFIX;
    let release = memlock_trace::probe::kernel_release();
    let before_5_11 = memlock_trace::probe::kernel_version(&release).is_none_or(|v| v < (5, 11));
    if fentry.usable && !before_5_11 {
        assert!(
            syscalls.starts_with(&format!("fentry/fexit {prefix}{{mlock,")),
            "{syscalls}"
        );
        for (family, hooks) in &tracer.hooks {
            let hooks = hooks.full();
            assert!(!hooks.contains("raw_syscalls"), "{family}: {hooks}");
        }
    } else {
        let events = memlock_trace::probe::kernel_version(&release).is_some_and(|v| v >= (5, 17));
        let expected = if events {
            "tracepoint syscalls:sys_{enter,exit}_{mlock,"
        } else {
            "tp_btf raw_syscalls:sys_{enter,exit} for mlock"
        };
        assert!(
            syscalls.starts_with(expected)
                && syscalls.contains(&format!("fentry on {prefix}* refused")),
            "{syscalls}"
        );
        if events {
            for (family, hooks) in &tracer.hooks {
                let hooks = hooks.full();
                assert!(!hooks.contains("raw_syscalls"), "{family}: {hooks}");
            }
        }
    }
}

/// The runs of every BPF program this process holds, summed (fdinfo `run_cnt`, which only
/// programs' fds have, counted while `kernel.bpf_stats_enabled` is 1).
fn program_runs() -> u64 {
    fdinfos(std::process::id() as i32)
        .iter()
        .filter_map(|info| fdinfo_field(info, "run_cnt:"))
        .sum()
}

/// A call nobody hooks runs none of a system-wide session's programs where the syscall
/// hooks are the calls' own (fentry/fexit: the x86 guests from 5.11; their events: this
/// host, arm64), and both raw dispatchers where they fall back (5.10). Counted, not timed: the kernel's own run counts of the
/// session's programs while this thread makes a million `getppid` calls. (What the calls
/// cost is the bench's: `cargo xtask bench --node-cost`.)
#[test]
fn a_call_nobody_hooks_runs_no_program_beside_a_fentry_session() {
    const CALLS: u64 = 1_000_000;
    require_privileges();
    let stats = "/proc/sys/kernel/bpf_stats_enabled";
    let was = std::fs::read_to_string(stats).expect("kernel.bpf_stats_enabled (5.8+)");
    let tracer = Tracer::load(&Targets::All).expect("load tracer");
    let per_call = tracer.hooks["syscalls"].set() != "tp_btf";
    let described = tracer.hooks["syscalls"].full();
    std::fs::write(stats, "1").unwrap();
    let before = program_runs();
    for _ in 0..CALLS {
        // SAFETY: getppid takes no argument and touches no memory.
        unsafe { libc::syscall(libc::SYS_getppid) };
    }
    let runs = program_runs() - before;
    std::fs::write(stats, was.trim()).unwrap();
    drop(tracer);
    if per_call {
        // Only other processes' (and parallel tests') hooked calls and faults run the
        // programs meanwhile: far fewer than the fallback's two per call.
        assert!(
            runs < CALLS / 4,
            "{runs} program runs during {CALLS} getppid calls ({described})"
        );
    } else {
        assert!(
            runs >= 2 * CALLS,
            "{runs} program runs during {CALLS} getppid calls on the raw dispatchers \
             ({described}): each call runs sys_enter's and sys_exit's"
        );
    }
}

//! Runs on: host, 5.10: user space on top of the hooks, whose own figures every guest checks
//! (test:syscalls or test:exact_calls, test:faults or test:fault_cli, test:vma_whole, test:verify)
//!
//! Packages: memcached
//!
//! The case of issue 12 item 13 with the real server: `memcached -k -u nobody` under a
//! 64 KiB `RLIMIT_MEMLOCK` fails `mlockall` with ENOMEM, and the tracer names the limit,
//! what was locked, what was asked and the missing `CAP_IPC_LOCK`.
//!
//! `cargo xtask test` installs Debian's package when missing, and the guests' initramfs
//! carries it (with its libraries and a passwd entry for `nobody`), so this runs in a guest
//! too.
//!
//! The limit is set by the shell's `ulimit` builtin in the launched command, which then execs
//! memcached: `prlimit(1)` is not in the guest, and lowering the limit in the tracer for its
//! child to inherit would also cap the tracer's own BPF maps on kernels before 5.11.

mod common;
mod support;

use std::path::Path;

use common::require_privileges;
use support::{Tracer, json_lines};

const MEMCACHED: &str = "/usr/bin/memcached";

/// Terminates memcached (the launched command) when dropped, so a failed assertion does
/// not leave the server running.
struct Server(i32);

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the server this test launched; ESRCH if it is gone already.
        unsafe { libc::kill(self.0, libc::SIGTERM) };
    }
}

#[test]
fn memcached_k_under_a_low_limit_is_told_why_mlockall_failed() {
    require_privileges();
    assert!(
        Path::new(MEMCACHED).is_file(),
        "{MEMCACHED} is missing: `cargo xtask test` installs Debian's memcached package \
         (or: apt-get install memcached)"
    );
    let mut tracer = Tracer::spawn(&[
        "--json",
        "--events",
        "--",
        "sh",
        "-c",
        // KiB, soft and hard limit both; `$0 "$@"` is memcached and its arguments.
        "ulimit -l 64 && exec \"$0\" \"$@\"",
        MEMCACHED,
        "-k",
        "-u",
        "nobody",
        // No listening sockets: nothing but the start-up matters here.
        "-p",
        "0",
        "-U",
        "0",
        "-l",
        "127.0.0.1",
    ]);
    // The shell execs memcached in the same process: the launched pid is the server's.
    let line = tracer.wait_for_stderr("tracing `sh` (pid ");
    // `tracing `sh` (pid N) from its exec (...)`: the digits after "(pid ".
    let pid: i32 = line
        .split_once("(pid ")
        .and_then(|(_, rest)| rest.split(')').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"));
    let server = Server(pid);
    tracer.wait_for_stderr("mlockall() failed");
    drop(server);
    let done = tracer.finish();

    let lines = json_lines(&done.stdout);
    let mlockall = lines
        .iter()
        .find(|l| l["type"] == "syscall" && l["syscall"] == "mlockall")
        .unwrap_or_else(|| panic!("no mlockall event:\n{}\n{}", done.stdout, done.stderr));
    assert_eq!(mlockall["comm"], "memcached", "{mlockall}");
    assert_eq!(mlockall["errno"], "ENOMEM", "{mlockall}");
    assert_eq!(mlockall["rlimit_memlock_bytes"], 65_536, "{mlockall}");
    assert_eq!(mlockall["locked_bytes_before"], 0, "{mlockall}");
    assert_eq!(mlockall["cap_ipc_lock"], false, "{mlockall}");
    // MCL_CURRENT asks for the whole address space, well past 64 KiB.
    assert!(
        mlockall["asked_bytes"].as_u64().unwrap() > 65_536,
        "{mlockall}"
    );
    let summary = lines.iter().rev().find(|l| l["type"] == "summary").unwrap();
    let process = support::with_syscalls(summary)[0];
    let why = &process["syscalls"]["mlockall"]["last_failure"]["ENOMEM"];
    assert_eq!(why["rlimit_memlock_bytes"], 65_536, "{process}");
}

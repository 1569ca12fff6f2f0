//! Runs on: host only: compiles a C program with gcc and compares with perf and gdb, which the
//! guests do not carry (the kernel side of --stacks: test:fault_cli, in the guests too)
//!
//! Packages: gcc, linux-perf, gdb, memcached, memtester, python3
//!
//! `--stacks` on code built as distributions build it, without frame pointers: the call
//! site of an mlock is unwound from the copied user stack with the modules' unwind tables,
//! checked frame for frame against `perf record --call-graph dwarf` (the established
//! tool) on a C program compiled here with `-O2 -fomit-frame-pointer` whose `rbp` holds a
//! data word, down to python's main through ctypes, and Debian's memcached and memtester
//! (stripped) against gdb's backtrace. No frame outside an executable mapping is ever shown.
//!
//! `cargo xtask test` installs gcc, Debian's linux-perf, gdb, python3, memcached and
//! memtester when missing. The C program is compiled on the machine that runs the test, so
//! this binary runs on the host.

mod common;
mod support;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use common::require_privileges;
use serde_json::Value;
use support::stacks::{
    build_lock_chain, build_touch_pages, call_site, figure, frames, lock_chain_call_site,
    mlock_call_site, perf_record_faults, perf_script, run_perf, scratch, stack_tables, traced,
    traced_exiting, traced_text_and_folded,
};

const PYTHON: &str = "/usr/bin/python3";
const MEMCACHED: &str = "/usr/bin/memcached";
const MEMTESTER: &str = "/usr/sbin/memtester";

/// Fails, saying how to get it, when `program` (Debian's `package`) is missing.
fn require_program(program: &str, package: &str) {
    assert!(
        Path::new(program).is_file(),
        "{program} is missing (`cargo xtask test` installs Debian's {package})"
    );
}

/// `source` as the python script `name` in a new scratch directory `dir`: the directory
/// and the script.
fn python_script(dir: &str, name: &str, source: &str) -> (PathBuf, PathBuf) {
    require_program(PYTHON, "python3");
    let dir = scratch(dir);
    let script = dir.join(name);
    std::fs::write(&script, source).unwrap();
    (dir, script)
}

/// perf's DWARF call chain of the one mlock of `command`, user function names innermost
/// first (`perf script`'s `addr sym+off (module)` lines). On `raw_syscalls:sys_enter`
/// filtered to mlock's number rather than `syscalls:sys_enter_mlock`: while any BPF
/// program on that tracepoint returns 0 (every memlock-trace running on the machine), the
/// kernel gives perf none of its samples (`perf_syscall_enter()`).
fn perf_dwarf_chain(dir: &Path, command: &[&str]) -> Vec<String> {
    let data = dir.join("perf.data");
    let filter = format!("id == {}", libc::SYS_mlock);
    run_perf(
        "perf record",
        Command::new("perf")
            .args([
                "record",
                "-q",
                "-e",
                "raw_syscalls:sys_enter",
                "--filter",
                &filter,
            ])
            .args(["--call-graph", "dwarf", "-o"])
            .arg(&data)
            .args(command),
    );
    perf_script(&[], &data)
        .lines()
        .filter(|l| l.starts_with(char::is_whitespace) && !l.trim().is_empty())
        .filter(|l| !l.ends_with("([kernel.kallsyms])"))
        .map(|l| {
            let symbol = l.split_whitespace().nth(1).unwrap_or_default();
            symbol.split("+0x").next().unwrap().to_string()
        })
        .collect()
}

/// The C program's mlock call site reads mlock <- lock_b <- lock_a <- main, symbolized
/// with file:line, and equals perf's DWARF chain frame for frame; where the kernel's
/// frame-pointer walk (the tool's stacks before) showed `__GI_mlock` alone.
#[test]
fn c_program_without_frame_pointers_unwinds_to_main_as_perf() {
    require_privileges();
    let dir = scratch("stacks-c");
    let bin = build_lock_chain(&dir);
    let bin = bin.to_str().unwrap();
    let names = lock_chain_call_site(bin);
    let perf = perf_dwarf_chain(&dir, &[bin]);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(names, perf, "ours and perf --call-graph dwarf");
}

/// Issue 47 point 8: a C program, on one CPU, touching 40,960 pages from one function and
/// mlocking 1,000 from another, one fault in 32 keeping its stack (the default): the stack
/// table, the folded file and the mapping row each count 40,960 and 1,000 faults there.
/// The table said 1,280 (its samples) and 1,000; the folded file 40,960 and 32,000 (the
/// mlock's one sample of 1,000 pages scaled by 32 again).
#[test]
fn stack_table_counts_faults_as_the_folded_file_and_the_mapping_row() {
    require_privileges();
    let dir = scratch("stacks-table");
    let bin = build_touch_pages(&dir);
    let (text, folded, stdout) = traced_text_and_folded(&dir, &[bin.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).ok();
    let table = stack_tables(&text);
    let mut seen = Vec::new();
    // The ranges it printed, each mapping's row `FAULTS LOCKED anonymous 0xSTART-0xEND`.
    for (range, function) in stdout.lines().zip(["touch_pages", "lock_pages"]) {
        let range = range.replace('-', "-0x");
        let row = text.lines().find(|l| l.contains(&format!(" 0x{range}")));
        let row = row.and_then(|l| figure(l.split_whitespace().next()?));
        let named = |frames: &[String]| frames.iter().take(2).any(|f| f == function);
        let in_table: u64 = table.iter().filter(|s| named(&s.1)).map(|s| s.0).sum();
        let in_folded: u64 = folded
            .lines()
            .filter_map(|l| l.rsplit_once(' '))
            .filter(|(stack, _)| stack.contains(&format!(";{function}")))
            .filter_map(|(_, n)| figure(n))
            .sum();
        seen.push((function, in_table, in_folded, row));
    }
    assert_eq!(
        seen,
        [
            ("touch_pages", 40_960, 40_960, Some(40_960)),
            ("lock_pages", 1_000, 1_000, Some(1_000))
        ],
        "(function, table, folded, mapping row)\n{text}\n{folded}"
    );
}

/// A program that deletes its own file before it locks, and exits at once: its call site
/// is symbolized after it has exited, from the file it mapped, kept open since its exec.
#[test]
fn deleted_and_exited_program_is_still_symbolized() {
    require_privileges();
    let dir = scratch("stacks-deleted");
    let bin = build_lock_chain(&dir);
    let summary = traced(&[], &[bin.to_str().unwrap(), "unlink"]);
    assert!(!bin.exists(), "the program deleted itself");
    std::fs::remove_dir_all(&dir).ok();
    let ours = mlock_call_site(&summary);
    let names: Vec<&str> = ours.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(
        names.get(1..4),
        Some(&["lock_b", "lock_a", "main"][..]),
        "{ours:#?}"
    );
}

/// python3 calling libc's mlock through ctypes: the call site goes through libffi, the
/// _ctypes module and the interpreter loop down to python's main, every frame in an
/// executable mapping; so does every sampled fault's stack. The script lives on a little
/// after its call: libffi is known only from python's maps (no other process here maps it),
/// and a python that exits within milliseconds of its import can leave before a loaded
/// machine's tracer reads them (the C programs' exit is what the other tests cover).
#[test]
fn python_ctypes_call_site_reaches_the_interpreter_and_main() {
    require_privileges();
    let (dir, script) = python_script(
        "stacks-python",
        "lock.py",
        "import ctypes, mmap\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         buf = mmap.mmap(-1, 1 << 16)\n\
         addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))\n\
         def lock_here():\n    \
             if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(1 << 16)) != 0:\n        \
                 raise OSError(ctypes.get_errno(), 'mlock')\n\
         lock_here()\n\
         import time; time.sleep(0.3)\n",
    );
    let summary = traced(&[], &[PYTHON, script.to_str().unwrap()]);
    std::fs::remove_dir_all(&dir).ok();
    let ours = mlock_call_site(&summary);
    let names: Vec<&str> = ours.iter().map(|(s, _)| s.as_str()).collect();
    let at = |what: &str| {
        names
            .iter()
            .position(|n| n.contains(what))
            .unwrap_or_else(|| panic!("no frame names {what}: {ours:#?}"))
    };
    assert!(names[0].ends_with("mlock"), "{ours:#?}");
    assert!(
        ours[1].1.contains("libffi"),
        "mlock's caller is libffi: {ours:#?}"
    );
    assert!(at("ffi_call") < at("_PyEval_EvalFrameDefault"), "{ours:#?}");
    assert!(
        at("_PyEval_EvalFrameDefault") < at("Py_BytesMain"),
        "{ours:#?}"
    );
    assert!(
        at("Py_BytesMain") < at("__libc_start_call_main"),
        "{ours:#?}"
    );
    // Every sampled fault's stack too: `frames` panics on a frame in no mapping.
    let process = &summary["processes"][0];
    let stacks = process["faults"]["stacks"].as_array().unwrap();
    assert!(!stacks.is_empty(), "{process}");
    for stack in stacks {
        assert!(!frames(&stack["frames"]).is_empty(), "{stack}");
    }
    let unwinding = &summary["call_site_health"]["unwinding"];
    assert_eq!(unwinding["frame_pointer_walks"], 0, "{unwinding}");
}

/// A frame of gdb's backtrace: its symbol, or for `??` (a stripped binary) the module and
/// the offset in it, from the process's mappings.
#[derive(Debug, PartialEq)]
enum GdbFrame {
    Symbol(String),
    Offset(String, u64),
}

/// gdb's backtrace at the first entry to `syscall` of `command` (`catch syscall`).
fn gdb_backtrace(command: &[&str], syscall: &str) -> Vec<GdbFrame> {
    let out = Command::new("gdb")
        .args(["-q", "-batch", "-nx"])
        .args(["-ex", &format!("catch syscall {syscall}")])
        .args(["-ex", "run", "-ex", "bt", "-ex", "info proc mappings"])
        .arg("--args")
        .args(command)
        .output()
        .unwrap_or_else(|e| panic!("gdb: {e} (`cargo xtask test` installs Debian's gdb)"));
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    // start end size offset perms path
    let mappings: Vec<(u64, u64, u64, String)> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f[..] {
                [start, end, _, offset, _, path] if path.starts_with('/') => {
                    Some((hex(start)?, hex(end)?, hex(offset)?, path.to_string()))
                }
                _ => None,
            }
        })
        .collect();
    let frames: Vec<GdbFrame> = text
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            // `#1  0x000055555555c24e in ?? ()` or `#0  __GI_mlockall () at ...`
            let f: Vec<&str> = l.split_whitespace().collect();
            let (addr, symbol) = match f[..] {
                [_, addr, "in", symbol, ..] => (hex(addr), symbol),
                [_, symbol, ..] => (None, symbol),
                _ => panic!("gdb frame line: {l}"),
            };
            if symbol != "??" {
                return GdbFrame::Symbol(symbol.to_string());
            }
            let addr = addr.unwrap_or_else(|| panic!("no address: {l}"));
            let (start, _, offset, path) = mappings
                .iter()
                .find(|(start, end, ..)| (*start..*end).contains(&addr))
                .unwrap_or_else(|| panic!("{addr:#x} in no mapping of gdb's:\n{text}"));
            GdbFrame::Offset(path.clone(), addr - start + offset)
        })
        .collect();
    assert!(
        frames.len() >= 2,
        "gdb's backtrace:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    frames
}

/// A call site's frames as gdb names them: the symbol, or a stripped binary's module and
/// offset.
fn as_gdb_frames(site: &Value) -> Vec<GdbFrame> {
    frames(&site["frames"]); // every frame in an executable mapping
    site["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| match f["resolved"].as_bool() {
            Some(true) => GdbFrame::Symbol(f["symbol"].as_str().unwrap().to_string()),
            _ => GdbFrame::Offset(
                f["module"].as_str().unwrap().to_string(),
                u64::from_str_radix(f["offset"].as_str().unwrap().trim_start_matches("0x"), 16)
                    .unwrap(),
            ),
        })
        .collect()
}

/// The summary's call site of `syscall` equals gdb's backtrace at that syscall in `command`
/// frame for frame, and its caller is the code of the (stripped) program `command` runs.
fn assert_call_site_is_gdbs(summary: &Value, syscall: &str, command: &[&str]) {
    let ours = as_gdb_frames(call_site(summary, syscall));
    let gdb = gdb_backtrace(command, syscall);
    assert_eq!(ours, gdb, "ours and gdb's backtrace");
    let program = command[0];
    assert!(
        matches!(&ours[1], GdbFrame::Offset(module, _) if module == program),
        "{syscall}'s caller is {program}'s main: {ours:#?}"
    );
}

/// Debian's memcached (no frame pointers, stripped) locks its memory with one mlockall
/// from main (`-k`): the call site equals gdb's backtrace at that syscall frame for frame
/// down to `_start`, the stripped binary's frames by their offset in it (gdb prints `??`).
/// perf's DWARF mode is not the reference here: on this binary it stops at
/// `__GI_mlockall+0x7 (inlined)`.
#[test]
fn memcached_mlockall_call_site_equals_gdbs_backtrace() {
    require_privileges();
    require_program(MEMCACHED, "memcached");
    let server = [
        MEMCACHED, "-k", "-u", "root", "-p", "0", "-U", "0", "-m", "8",
    ];
    let mut command = vec!["timeout", "-s", "INT", "1"];
    command.extend(server);
    // timeout's own status: memcached was stopped by it.
    let summary = traced_exiting(&["--follow-children"], &command, 124);
    assert_call_site_is_gdbs(&summary, "mlockall", &server);
}

/// Debian's memtester (stripped, no frame pointers) locks its test buffer with one mlock
/// from main: the call site equals gdb's backtrace frame for frame down to `_start`. Read
/// by the frame-pointer walk, that site was `__GI_mlock <- 0x6c6c252820424d75` (the bytes
/// of a format string where `rbp` pointed).
#[test]
fn memtester_mlock_call_site_equals_gdbs_backtrace() {
    require_privileges();
    require_program(MEMTESTER, "memtester");
    let command = [MEMTESTER, "64K", "1"];
    let summary = traced(&[], &command);
    assert_call_site_is_gdbs(&summary, "mlock", &command);
}

/// A fault stack as names, innermost first; an unsymbolized frame is `None`.
type NamedStack = Vec<Option<String>>;

/// Whether two stacks are the same frame for frame: as deep, and each frame the same
/// function where both tools named it (perf cannot name some that blazesym can, and the
/// reverse: a stripped binary's local functions).
fn same_frames(a: &NamedStack, b: &NamedStack) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.is_none() || y.is_none() || x == y)
}

/// perf's DWARF call chains of `comm`'s samples in `perf script` output, user frames only
/// (inlined ones included, as blazesym reports them too).
fn perf_user_stacks(script: &str, comm: &str) -> Vec<NamedStack> {
    script
        .split("\n\n")
        .filter_map(|sample| {
            let mut lines = sample.lines().filter(|l| !l.trim().is_empty());
            let header = lines.next()?;
            if header.split_whitespace().next() != Some(comm) {
                return None;
            }
            let frames: NamedStack = lines
                .filter(|l| !l.ends_with("([kernel.kallsyms])"))
                .map(|l| {
                    // `addr sym+off (module)` or `addr [unknown] (module)`
                    let rest = l.split_whitespace().nth(1).unwrap_or("[unknown]");
                    let name = rest.split("+0x").next().unwrap();
                    (name != "[unknown]").then(|| name.to_string())
                })
                .collect();
            (!frames.is_empty()).then_some(frames)
        })
        .collect()
}

/// python3 (Debian's, no frame pointers) faulting in 4 MiB and compressing it, traced with
/// every fault's stack kept while `perf record -e page-faults -c 1 --call-graph dwarf`
/// samples every fault of the same run: nearly every one of perf's stacks is one of ours,
/// frame for frame to the end of both (the 8 KiB of stack both copy).
#[test]
fn python_fault_stacks_equal_perfs_dwarf_stacks_sample_for_sample() {
    require_privileges();
    let (dir, script) = python_script(
        "stacks-perf-faults",
        "faults.py",
        "import zlib\n\
         data = bytearray(4 << 20)\n\
         for i in range(0, len(data), 4096):\n    data[i] = 1\n\
         z = zlib.compress(bytes(data))\n",
    );
    let data = dir.join("perf.data");
    let (data_arg, script_arg) = (data.display().to_string(), script.display().to_string());
    let summary = traced(
        &[
            "--stack-sample",
            "1",
            "--stacks-top",
            "1000000",
            "--follow-children",
        ],
        &perf_record_faults(
            &["--call-graph", "dwarf"],
            &data_arg,
            &[PYTHON, &script_arg],
        ),
    );
    let health = &summary["fault_health"];
    assert_eq!(health["stacks_dropped"], 0, "{health}");
    let mut ours: Vec<(NamedStack, u64)> = summary["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["comm"] == "python3")
        .flat_map(|p| p["faults"]["stacks"].as_array().unwrap())
        .map(|s| {
            let frames = s["frames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| (f["resolved"] == true).then(|| f["symbol"].as_str().unwrap().to_string()))
                .collect();
            (frames, s["faults"].as_u64().unwrap())
        })
        .collect();
    let script = perf_script(&["-F", "comm,tid,ip,sym,dso"], &data);
    let perf = perf_user_stacks(&script, "python3");
    // Each of perf's samples takes one fault of an equal stack of ours.
    let matched = perf
        .iter()
        .filter(|theirs| {
            ours.iter_mut()
                .find(|(stack, left)| *left > 0 && same_frames(stack, theirs))
                .map(|(_, left)| *left -= 1)
                .is_some()
        })
        .count();
    let pages = (4 << 20) / 4096;
    assert!(perf.len() >= pages, "perf sampled {} faults", perf.len());
    assert!(
        matched * 100 >= perf.len() * 95,
        "{matched} of perf's {} fault stacks equal one of ours frame for frame",
        perf.len()
    );
    std::fs::remove_dir_all(&dir).ok();
}

//! The `LD_PRELOAD` library of `memlock-trace advise --apply`: applies the advice to a program
//! without changing it. At load it may call `mlockall`; afterwards every `mmap` the program
//! makes through libc's symbol is passed to the real one, and a mapping an advice rule names
//! (by kind and length, and path for a file) is locked (`mlock2`) or populated
//! (`MADV_POPULATE_READ`/`WRITE`) as soon as it exists. Each action and its result is appended
//! to the log file, which `advise` reads back.
//!
//! Environment (set by `advise --apply`, documented in docs/advise.md):
//! - `MEMLOCK_PRELOAD_RULES`: `ACTION:KIND:LENGTH[:PATH]` separated by `;`, where ACTION is
//!   `lock` or `populate`, KIND `anon`, `file` or `alloc`, LENGTH the mapping's bytes
//!   (compared after rounding up to pages); an anonymous rule also takes a call up to
//!   [`MERGE_SLACK`] shorter, since the mapping `advise` saw may be the call's merged with a
//!   small neighbour; an `alloc` rule names a block `malloc`/`calloc` return, of LENGTH bytes
//!   rounded up to pages (glibc makes large blocks with its internal `mmap`, which the `mmap`
//!   hook never sees);
//! - `MEMLOCK_PRELOAD_WATCH`: a size in bytes: every block `malloc`/`calloc` return of at
//!   least that size is logged as `alloc ADDR LEN`, every anonymous `mmap` call of at least
//!   that size as `mmap ADDR LEN` (the first run of `--apply`, which learns which calls made
//!   each mapping, the kernel having merged some);
//! - `MEMLOCK_PRELOAD_MLOCKALL`: `mlockall` flags, a number (`MCL_CURRENT` 1, `MCL_FUTURE` 2,
//!   `MCL_ONFAULT` 4);
//! - `MEMLOCK_PRELOAD_LOG`: the file the actions are appended to.
//!
//! The hooks allocate nothing and take no lock: they run inside the program's own allocator.
//! Mappings libc makes for itself (glibc's `malloc` calls its internal `__mmap`) are not
//! seen by the `mmap` hook; the blocks `malloc` and `calloc` return are, by the `alloc`
//! rules. Other allocation calls (`realloc`, `posix_memalign`, ...) pass untouched.

mod alloc;
mod line;
mod mmap;
mod rules;

use std::{
    ffi::{c_int, c_void},
    sync::{OnceLock, atomic::Ordering},
};

use line::{LineBuf, result};
use rules::{Action, Kind, Rule, parse_rules};

/// How much larger than the `mmap` call that made it an anonymous mapping may be: the kernel
/// merges a private anonymous mapping with an adjacent one of the same flags (a few pages
/// of libc's or the program's), and `advise` sees the merged one.
const MERGE_SLACK: usize = 16 * PAGE;
const PAGE: usize = 4096;
/// `MADV_POPULATE_READ` / `MADV_POPULATE_WRITE` (Linux 5.14, include/uapi/asm-generic/mman-common.h).
const MADV_POPULATE_READ: c_int = 22;
const MADV_POPULATE_WRITE: c_int = 23;

struct Config {
    rules: Vec<Rule>,
    /// Blocks at least this large are logged (`MEMLOCK_PRELOAD_WATCH`).
    watch: Option<usize>,
    /// The log's descriptor, or -1.
    log: c_int,
}

static CONFIG: OnceLock<Config> = OnceLock::new();

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;

/// Runs when the library is loaded, before the program's `main`.
extern "C" fn init() {
    let log = std::env::var_os("MEMLOCK_PRELOAD_LOG")
        .and_then(|p| {
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(p)
                .ok()
        })
        .map_or(-1, std::os::fd::IntoRawFd::into_raw_fd);
    let rules = std::env::var("MEMLOCK_PRELOAD_RULES")
        .map(|r| parse_rules(&r))
        .unwrap_or_default();
    let watch = std::env::var("MEMLOCK_PRELOAD_WATCH")
        .ok()
        .and_then(|w| w.parse::<usize>().ok());
    let config = CONFIG.get_or_init(|| Config { rules, watch, log });
    let smallest_rule = config
        .rules
        .iter()
        .filter(|r| r.kind == Kind::Alloc)
        // A block up to a page shorter than the rule rounds up to it.
        .map(|r| r.len.saturating_sub(PAGE - 1))
        .min();
    if let Some(min) = smallest_rule.into_iter().chain(watch).min() {
        alloc::ALLOC_MIN.store(min, Ordering::Release);
    }
    if let Some(flags) = std::env::var("MEMLOCK_PRELOAD_MLOCKALL")
        .ok()
        .and_then(|f| f.parse::<c_int>().ok())
    {
        // SAFETY: mlockall takes flags only.
        let ret = unsafe { libc::mlockall(flags) };
        let mut line = LineBuf::new();
        line.push(b"mlockall flags=");
        line.push_num(flags as u64);
        result(&mut line, ret == 0);
        line.write(config.log);
    }
}

impl Config {
    /// Logs `WHAT ADDR LEN` for a call at least the watched size made (the first run of
    /// `--apply`, learning which calls made each mapping).
    fn watched(&self, what: &[u8], addr: usize, len: usize) {
        if self.watch.is_some_and(|from| len >= from) {
            let mut line = LineBuf::new();
            line.push(what);
            line.push_hex(addr as u64);
            line.push(b" ");
            line.push_num(len as u64);
            line.push(b"\n");
            line.write(self.log);
        }
    }
}

/// Locks or populates `len` bytes at `addr` for a rule, and logs it.
fn carry_out(config: &Config, action: Action, what: &[u8], addr: usize, len: usize, write: bool) {
    let ok = match action {
        // SAFETY: the range is the program's own, just mapped or allocated; mlock2 only
        // pins it.
        Action::Lock => unsafe { libc::syscall(libc::SYS_mlock2, addr, len, 0) == 0 },
        Action::Populate => {
            let advice = if write {
                MADV_POPULATE_WRITE
            } else {
                MADV_POPULATE_READ
            };
            // SAFETY: as above; populating only faults the range in.
            unsafe { libc::madvise(addr as *mut c_void, len, advice) == 0 }
        }
    };
    let mut line = LineBuf::new();
    line.push(match action {
        Action::Lock => b"lock ",
        Action::Populate => b"populate ",
    });
    line.push(what);
    line.push_hex(addr as u64);
    line.push(b" ");
    line.push_num(len as u64);
    result(&mut line, ok);
    line.write(config.log);
}

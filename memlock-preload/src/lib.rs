//! The `LD_PRELOAD` library of `memlock-trace advise --apply`: applies the advice to a program
//! without changing it. At load it may call `mlockall`; afterwards every `mmap` the program
//! makes through libc's symbol is passed to the real one, and a mapping an advice rule names
//! (by kind and length, and path for a file) is locked (`mlock2`) or populated
//! (`MADV_POPULATE_READ`/`WRITE`) as soon as it exists. Each action and its result is appended
//! to the log file, which `advise` reads back.
//!
//! Environment (set by `advise --apply`, documented in docs/advise.md):
//! - `MEMLOCK_PRELOAD_RULES`: `ACTION:KIND:LENGTH[:PATH]` separated by `;`, where ACTION is
//!   `lock` or `populate`, KIND `anon` or `file`, LENGTH the mapping's bytes (compared after
//!   rounding up to pages); an anonymous rule also takes a call up to [`MERGE_SLACK`] shorter,
//!   since the mapping `advise` saw may be the call's merged with a small neighbour;
//! - `MEMLOCK_PRELOAD_MLOCKALL`: `mlockall` flags, a number (`MCL_CURRENT` 1, `MCL_FUTURE` 2,
//!   `MCL_ONFAULT` 4);
//! - `MEMLOCK_PRELOAD_LOG`: the file the actions are appended to.
//!
//! The `mmap` hook allocates nothing and takes no lock: it may run inside the program's own
//! allocator. Mappings libc makes for itself (glibc's `malloc` calls its internal `__mmap`)
//! are not seen; `advise` says so where that matters.

use std::{
    ffi::{CStr, c_int, c_void},
    sync::{
        OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
};

/// How much larger than the `mmap` call that made it an anonymous mapping may be: the kernel
/// merges a private anonymous mapping with an adjacent one of the same flags (a few pages
/// of libc's or the program's), and `advise` sees the merged one.
const MERGE_SLACK: usize = 16 * PAGE;
/// Rules a program can be given at once: more than `advise` ever writes.
const MAX_RULES: usize = 16;
/// Longest file path a rule can name (Linux's PATH_MAX).
const MAX_PATH: usize = 4096;
const PAGE: usize = 4096;
/// `MADV_POPULATE_READ` / `MADV_POPULATE_WRITE` (Linux 5.14, include/uapi/asm-generic/mman-common.h).
const MADV_POPULATE_READ: c_int = 22;
const MADV_POPULATE_WRITE: c_int = 23;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Action {
    Lock,
    Populate,
}

#[derive(Clone, Debug)]
struct Rule {
    action: Action,
    /// `None`: anonymous; `Some(path)`: a mapping of this file.
    file: Option<Vec<u8>>,
    len: usize,
}

struct Config {
    rules: Vec<Rule>,
    /// The log's descriptor, or -1.
    log: c_int,
}

static CONFIG: OnceLock<Config> = OnceLock::new();
/// libc's `mmap`, found with `dlsym(RTLD_NEXT)`.
static REAL_MMAP: AtomicUsize = AtomicUsize::new(0);

type MmapFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, i64) -> *mut c_void;

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
    let config = CONFIG.get_or_init(|| Config { rules, log });
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

/// `lock:anon:268435456;populate:file:4096:/data/table`; a malformed rule is left out and
/// logged.
fn parse_rules(text: &str) -> Vec<Rule> {
    let mut rules = Vec::new();
    for rule in text.split(';').filter(|r| !r.is_empty()).take(MAX_RULES) {
        let mut parts = rule.splitn(4, ':');
        let action = match parts.next() {
            Some("lock") => Action::Lock,
            Some("populate") => Action::Populate,
            _ => continue,
        };
        let kind = parts.next();
        let Some(len) = parts.next().and_then(|l| l.parse::<usize>().ok()) else {
            continue;
        };
        let file = match (kind, parts.next()) {
            (Some("anon"), None) => None,
            (Some("file"), Some(path)) if path.len() < MAX_PATH => Some(path.as_bytes().to_vec()),
            _ => continue,
        };
        rules.push(Rule {
            action,
            file,
            len: round_up(len),
        });
    }
    rules
}

fn round_up(len: usize) -> usize {
    len.div_ceil(PAGE) * PAGE
}

fn real_mmap() -> Option<MmapFn> {
    let mut f = REAL_MMAP.load(Ordering::Acquire);
    if f == 0 {
        // SAFETY: a NUL-terminated symbol name; RTLD_NEXT finds the next `mmap` after us.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"mmap".as_ptr()) } as usize;
        REAL_MMAP.store(f, Ordering::Release);
    }
    // SAFETY: `f` is libc's `mmap`, whose signature this is.
    (f != 0).then(|| unsafe { std::mem::transmute::<usize, MmapFn>(f) })
}

/// # Safety
/// As libc's `mmap(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: i64,
) -> *mut c_void {
    let mapped = match real_mmap() {
        // SAFETY: the caller's arguments, passed on unchanged.
        Some(real) => unsafe { real(addr, len, prot, flags, fd, offset) },
        None => {
            // SAFETY: the raw system call with the caller's arguments.
            (unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, offset) })
                as *mut c_void
        }
    };
    if mapped != libc::MAP_FAILED {
        apply(mapped, len, prot, flags, fd);
    }
    mapped
}

/// glibc's other name for the same call on 64-bit.
///
/// # Safety
/// As libc's `mmap(2)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: i64,
) -> *mut c_void {
    // SAFETY: as above.
    unsafe { mmap(addr, len, prot, flags, fd, offset) }
}

/// Locks or populates a new mapping a rule names. Allocates nothing.
fn apply(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int) {
    let Some(config) = CONFIG.get() else {
        return;
    };
    let anonymous = flags & libc::MAP_ANONYMOUS != 0;
    let mut path = [0u8; MAX_PATH];
    let mut path_len = None;
    for rule in &config.rules {
        let call = round_up(len);
        let merged =
            anonymous && rule.file.is_none() && call < rule.len && rule.len - call <= MERGE_SLACK;
        if rule.len != call && !merged {
            continue;
        }
        match &rule.file {
            None if !anonymous => continue,
            Some(_) if anonymous => continue,
            Some(want) => {
                let have = *path_len.get_or_insert_with(|| fd_path(fd, &mut path));
                if have != Some(want.len()) || &path[..want.len()] != want.as_slice() {
                    continue;
                }
            }
            None => {}
        }
        let ok = match rule.action {
            // SAFETY: the range was just mapped for the program; mlock2 only pins it.
            Action::Lock => unsafe { libc::syscall(libc::SYS_mlock2, addr, len, 0) == 0 },
            Action::Populate => {
                let advice = if prot & libc::PROT_WRITE != 0 {
                    MADV_POPULATE_WRITE
                } else {
                    MADV_POPULATE_READ
                };
                // SAFETY: as above; populating only faults the range in.
                unsafe { libc::madvise(addr, len, advice) == 0 }
            }
        };
        let mut line = LineBuf::new();
        line.push(match rule.action {
            Action::Lock => b"lock ",
            Action::Populate => b"populate ",
        });
        line.push(if anonymous { b"anon " } else { b"file " });
        line.push_hex(addr as u64);
        line.push(b" ");
        line.push_num(len as u64);
        result(&mut line, ok);
        line.write(config.log);
        return;
    }
}

/// The path `fd` refers to, into `buf`: its length, or None.
fn fd_path(fd: c_int, buf: &mut [u8; MAX_PATH]) -> Option<usize> {
    let mut link = LineBuf::new();
    link.push(b"/proc/self/fd/");
    link.push_num(u64::try_from(fd).ok()?);
    link.push(b"\0");
    let name = CStr::from_bytes_until_nul(link.bytes()).ok()?;
    // SAFETY: a NUL-terminated path and a buffer of the length given.
    let n = unsafe { libc::readlink(name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    usize::try_from(n).ok().filter(|&n| n < buf.len())
}

/// ` ok` or ` errno=N`, then the newline.
fn result(line: &mut LineBuf, ok: bool) {
    if ok {
        line.push(b" ok\n");
    } else {
        line.push(b" errno=");
        line.push_num(std::io::Error::last_os_error().raw_os_error().unwrap_or(0) as u64);
        line.push(b"\n");
    }
}

/// A log line built on the stack.
struct LineBuf {
    buf: [u8; 128],
    len: usize,
}

impl LineBuf {
    fn new() -> Self {
        Self {
            buf: [0; 128],
            len: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn push_num(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }

    fn push_hex(&mut self, mut n: u64) {
        let mut digits = [0u8; 16];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b"0123456789abcdef"[(n % 16) as usize];
            n /= 16;
            if n == 0 {
                break;
            }
        }
        self.push(b"0x");
        self.push(&digits[i..]);
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    fn write(&self, fd: c_int) {
        if fd >= 0 {
            // SAFETY: writes our own buffer; one write per line (O_APPEND keeps lines whole).
            unsafe { libc::write(fd, self.buf.as_ptr().cast(), self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_bad_ones_are_left_out() {
        let rules = parse_rules("lock:anon:268435456;populate:file:5000:/a:b;bogus;lock:anon:x");
        assert_eq!(rules.len(), 2, "{rules:?}");
        assert_eq!((rules[0].action, rules[0].len), (Action::Lock, 268_435_456));
        assert_eq!(rules[1].file.as_deref(), Some(&b"/a:b"[..]));
        assert_eq!(rules[1].len, 8192);
    }

    #[test]
    fn log_lines_are_built_without_allocating() {
        let mut line = LineBuf::new();
        line.push(b"lock anon ");
        line.push_hex(0x7f00_1000);
        line.push(b" ");
        line.push_num(4096);
        assert_eq!(line.bytes(), b"lock anon 0x7f001000 4096");
    }
}

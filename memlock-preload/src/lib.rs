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
//!   least that size is logged as `alloc ADDR LEN` (the first run of `--apply`, which learns
//!   which mappings the allocator made);
//! - `MEMLOCK_PRELOAD_MLOCKALL`: `mlockall` flags, a number (`MCL_CURRENT` 1, `MCL_FUTURE` 2,
//!   `MCL_ONFAULT` 4);
//! - `MEMLOCK_PRELOAD_LOG`: the file the actions are appended to.
//!
//! The hooks allocate nothing and take no lock: they run inside the program's own allocator.
//! Mappings libc makes for itself (glibc's `malloc` calls its internal `__mmap`) are not
//! seen by the `mmap` hook; the blocks `malloc` and `calloc` return are, by the `alloc`
//! rules. Other allocation calls (`realloc`, `posix_memalign`, ...) pass untouched.

use std::{
    ffi::{CStr, c_int, c_void},
    sync::{
        OnceLock,
        atomic::{AtomicI32, AtomicUsize, Ordering},
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

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Anon,
    /// A mapping of this file.
    File(Vec<u8>),
    /// A block `malloc` or `calloc` returned.
    Alloc,
}

#[derive(Clone, Debug)]
struct Rule {
    action: Action,
    kind: Kind,
    len: usize,
}

struct Config {
    rules: Vec<Rule>,
    /// Blocks at least this large are logged (`MEMLOCK_PRELOAD_WATCH`).
    watch: Option<usize>,
    /// The log's descriptor, or -1.
    log: c_int,
}

static CONFIG: OnceLock<Config> = OnceLock::new();
/// libc's `mmap`, found with `dlsym(RTLD_NEXT)`.
static REAL_MMAP: AtomicUsize = AtomicUsize::new(0);
/// libc's `malloc` and `calloc` (or the allocator preloaded after us).
static REAL_MALLOC: AtomicUsize = AtomicUsize::new(0);
static REAL_CALLOC: AtomicUsize = AtomicUsize::new(0);
/// The smallest block the allocation hooks look at (an `alloc` rule's length, or the
/// watch size); `usize::MAX` until `init` has read the environment: every smaller block
/// passes with one comparison.
static ALLOC_MIN: AtomicUsize = AtomicUsize::new(usize::MAX);

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
        ALLOC_MIN.store(min, Ordering::Release);
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
        let kind = match (kind, parts.next()) {
            (Some("anon"), None) => Kind::Anon,
            (Some("alloc"), None) => Kind::Alloc,
            (Some("file"), Some(path)) if path.len() < MAX_PATH => {
                Kind::File(path.as_bytes().to_vec())
            }
            _ => continue,
        };
        rules.push(Rule {
            action,
            kind,
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

type MallocFn = unsafe extern "C" fn(usize) -> *mut c_void;
type CallocFn = unsafe extern "C" fn(usize, usize) -> *mut c_void;

/// The thread looking an allocator up (0: none).
static RESOLVER: AtomicI32 = AtomicI32::new(0);

/// The function `name` after us (libc's, or an allocator preloaded after us), looked up once
/// into `slot`; 0 to an allocation `dlsym` itself makes while looking it up (glibc's copes
/// with null). Another thread waits for the lookup.
fn next_symbol(slot: &AtomicUsize, name: &CStr) -> usize {
    loop {
        let f = slot.load(Ordering::Acquire);
        if f != 0 {
            return f;
        }
        // SAFETY: gettid takes nothing.
        let me = unsafe { libc::gettid() };
        match RESOLVER.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                // SAFETY: a NUL-terminated symbol name.
                let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
                slot.store(f, Ordering::Release);
                RESOLVER.store(0, Ordering::Release);
                return f;
            }
            Err(holder) if holder == me => return 0,
            Err(_) => std::hint::spin_loop(),
        }
    }
}

/// # Safety
/// As libc's `malloc(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc(len: usize) -> *mut c_void {
    let f = next_symbol(&REAL_MALLOC, c"malloc");
    if f == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `f` is the next `malloc`, called with the caller's argument.
    let block = unsafe { std::mem::transmute::<usize, MallocFn>(f)(len) };
    if len >= ALLOC_MIN.load(Ordering::Relaxed) && !block.is_null() {
        allocated(block as usize, len);
    }
    block
}

/// # Safety
/// As libc's `calloc(3)`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    let f = next_symbol(&REAL_CALLOC, c"calloc");
    if f == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `f` is the next `calloc`, called with the caller's arguments.
    let block = unsafe { std::mem::transmute::<usize, CallocFn>(f)(count, size) };
    if let Some(len) = count.checked_mul(size)
        && len >= ALLOC_MIN.load(Ordering::Relaxed)
        && !block.is_null()
    {
        allocated(block as usize, len);
    }
    block
}

/// A block of `len` bytes at `addr` from `malloc`/`calloc`: logged when watched, locked or
/// populated (its pages) when a rule names its length. Allocates nothing.
fn allocated(addr: usize, len: usize) {
    let Some(config) = CONFIG.get() else {
        return;
    };
    if config.watch.is_some_and(|w| len >= w) {
        let mut line = LineBuf::new();
        line.push(b"alloc ");
        line.push_hex(addr as u64);
        line.push(b" ");
        line.push_num(len as u64);
        line.push(b"\n");
        line.write(config.log);
    }
    let rounded = round_up(len);
    if let Some(rule) = config
        .rules
        .iter()
        .find(|r| r.kind == Kind::Alloc && r.len == rounded)
    {
        let first = addr / PAGE * PAGE;
        let end = round_up(addr + len);
        carry_out(config, rule.action, b"alloc ", first, end - first, true);
    }
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
        let merged = anonymous
            && rule.kind == Kind::Anon
            && call < rule.len
            && rule.len - call <= MERGE_SLACK;
        if rule.len != call && !merged {
            continue;
        }
        match &rule.kind {
            Kind::Alloc => continue,
            Kind::Anon if !anonymous => continue,
            Kind::File(_) if anonymous => continue,
            Kind::File(want) => {
                let have = *path_len.get_or_insert_with(|| fd_path(fd, &mut path));
                if have != Some(want.len()) || &path[..want.len()] != want.as_slice() {
                    continue;
                }
            }
            Kind::Anon => {}
        }
        let what: &[u8] = if anonymous { b"anon " } else { b"file " };
        carry_out(
            config,
            rule.action,
            what,
            addr as usize,
            len,
            prot & libc::PROT_WRITE != 0,
        );
        return;
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
        let rules = parse_rules(
            "lock:anon:268435456;populate:file:5000:/a:b;bogus;lock:anon:x;populate:alloc:1048577",
        );
        assert_eq!(rules.len(), 3, "{rules:?}");
        assert_eq!((rules[0].action, rules[0].len), (Action::Lock, 268_435_456));
        assert_eq!(rules[1].kind, Kind::File(b"/a:b".to_vec()));
        assert_eq!(rules[1].len, 8192);
        assert_eq!(
            (rules[2].action, &rules[2].kind, rules[2].len),
            (Action::Populate, &Kind::Alloc, 1_052_672)
        );
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

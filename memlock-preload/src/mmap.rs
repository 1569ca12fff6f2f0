//! The `mmap` hook: every mapping the program makes through libc's symbol is made by the real
//! `mmap`, then locked or populated if a rule names it.

use std::{
    ffi::{CStr, c_int, c_void},
    sync::atomic::{AtomicUsize, Ordering},
};

use crate::{
    CONFIG, MERGE_SLACK, carry_out,
    line::LineBuf,
    rules::{Kind, MAX_PATH, round_up},
};

/// libc's `mmap`, found with `dlsym(RTLD_NEXT)`.
static REAL_MMAP: AtomicUsize = AtomicUsize::new(0);

type MmapFn = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, i64) -> *mut c_void;

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

/// The hook, under each name glibc gives the call: `mmap`, and `mmap64`, its other name for
/// the same call on 64-bit.
macro_rules! mmap_hook {
    ($($name:ident),*) => {$(
        /// # Safety
        /// As libc's `mmap(2)`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
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
    )*};
}

mmap_hook!(mmap, mmap64);

/// Locks or populates a new mapping a rule names. Allocates nothing.
fn apply(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int) {
    let Some(config) = CONFIG.get() else {
        return;
    };
    let anonymous = flags & libc::MAP_ANONYMOUS != 0;
    if anonymous {
        // The kernel may merge it with a neighbour (a malloc block, another call's
        // mapping): `advise` names the calls that made a mapping in its rules.
        config.watched(b"mmap ", addr as usize, len);
    }
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

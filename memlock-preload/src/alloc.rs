//! The `malloc` and `calloc` hooks: every block at least as large as a rule or the watch
//! asks for is logged, locked or populated (glibc makes large blocks with its internal
//! `mmap`, which the `mmap` hook never sees).

use std::{
    ffi::{CStr, c_void},
    sync::atomic::{AtomicI32, AtomicUsize, Ordering},
};

use crate::{
    CONFIG, PAGE, carry_out,
    rules::{Kind, round_up},
};

/// libc's `malloc` and `calloc` (or the allocator preloaded after us).
static REAL_MALLOC: AtomicUsize = AtomicUsize::new(0);
static REAL_CALLOC: AtomicUsize = AtomicUsize::new(0);
/// The smallest block the allocation hooks look at (an `alloc` rule's length, or the
/// watch size); `usize::MAX` until `init` has read the environment: every smaller block
/// passes with one comparison.
pub(crate) static ALLOC_MIN: AtomicUsize = AtomicUsize::new(usize::MAX);

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
    config.watched(b"alloc ", addr, len);
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

//! Which system calls each family's handlers run at: on fentry/fexit of each hooked call's
//! own kernel function where the kernel allows trampolines ([`calls`]); else on each hooked
//! call's own `syscalls:sys_{enter,exit}_*` events; else (before 5.15, or without
//! `bpf_find_vma`) on the raw `sys_enter`/`sys_exit` tracepoints.
//!
//! fentry/fexit on `__x64_sys_mlock` & co (the arch's wrapper names, in user space's `arch`)
//! cost the calls nobody hooks nothing at all: only the hooked calls go through a
//! trampoline. The calls' events cost every other call of the machine the kernel's syscall
//! tracing path and a test of one bit per edge (1.35 of an untraced `getppid` here, as
//! bpftrace's script on the same events), and run one program, on every hooked call's
//! event alike, only at the hooked calls. The raw tracepoints' two programs run at every
//! system call of the machine, ~75 ns each here whatever they do (1.7 of `getppid`). The
//! events' price is paid at the end: closing a perf-attached event waits for a kernel grace
//! period (~35 ms) under a global mutex, one after another, 1.5 s for a session's ~40; the
//! session hands that wait to a child that outlives it (`memlock-trace`'s `detach`), off
//! the user's path. The programs return unless the call has a handler's bit in the
//! `SYSCALL_HOOKS` map, filled by the loader as the families attach.

/// Entries of `SYSCALL_HOOKS`, indexed by system call number (x86-64's and arm64's stop
/// below 470); a larger number is no call any program handles.
pub const MAX_NR: u32 = 512;

/// One bit per handler (and per variant of one: the loader picks the variant the kernel
/// allows), set in `SYSCALL_HOOKS[nr]` for each call it handles.
pub mod hook {
    /// The mlock family's entry (syscalls family).
    pub const SYSCALLS_ENTER: u32 = 1 << 0;
    /// Its exit.
    pub const SYSCALLS_EXIT: u32 = 1 << 1;
    /// The ranged calls' range check at entry, with `bpf_find_vma`.
    pub const RANGE_CHECK: u32 = 1 << 2;
    /// The same by a walk of the VMA rbtree (before 5.17).
    pub const RANGE_CHECK_RB: u32 = 1 << 3;
    /// VMA snapshots at the mlock family's entry (VMA family), with `bpf_find_vma`.
    pub const VMA_ENTER: u32 = 1 << 4;
    /// Its exit.
    pub const VMA_EXIT: u32 = 1 << 5;
    /// The same by the rbtree walk (VMAs in an rbtree: before 6.1).
    pub const VMA_ENTER_RB: u32 = 1 << 6;
    pub const VMA_EXIT_RB: u32 = 1 << 7;
    /// The populating calls' entry (fault family).
    pub const POPULATE_ENTER: u32 = 1 << 8;
    /// The same, also looking up the pages that met a busy mmap lock (`bpf_find_vma`).
    pub const POPULATE_ENTER_RETRY: u32 = 1 << 9;
    /// Their exit with the fentry/kprobe sets: only names the call.
    pub const POPULATE_EXIT: u32 = 1 << 10;
    /// Their exit with the tracepoint set: counts the pages populated (`bpf_find_vma`).
    pub const POPULATE_EXIT_COUNTED: u32 = 1 << 11;
    /// The same by the rbtree walk.
    pub const POPULATE_EXIT_COUNTED_RB: u32 = 1 << 12;
    /// Exits of calls that change mappings without populating: VMA cache dropped.
    pub const MAPPINGS_CHANGED: u32 = 1 << 13;
    /// Entries of calls after which mappings are gone: VMA cache dropped.
    pub const MAPPINGS_GOING: u32 = 1 << 14;
    /// The same, also the last lookup of the waiting pages (`bpf_find_vma`, `bpf_loop`).
    pub const MAPPINGS_GOING_RETRY: u32 = 1 << 15;
    /// `mmap` of code, at entry (`--stacks`).
    pub const STACKS_MMAP_ENTER: u32 = 1 << 16;
    /// Its exit.
    pub const STACKS_MMAP_EXIT: u32 = 1 << 17;

    /// The handlers that run at a call's entry; the others run at its exit. Where the
    /// handlers run from the calls' own events, a call's event at an edge is attached when
    /// it gets its first handler there.
    pub const AT_ENTER: u32 = SYSCALLS_ENTER
        | RANGE_CHECK
        | RANGE_CHECK_RB
        | VMA_ENTER
        | VMA_ENTER_RB
        | POPULATE_ENTER
        | POPULATE_ENTER_RETRY
        | MAPPINGS_GOING
        | MAPPINGS_GOING_RETRY
        | STACKS_MMAP_ENTER;

    /// The handlers that walk the VMA rbtree: picked only on a kernel without
    /// `bpf_find_vma` (5.17) or without the maple tree (6.1).
    pub const RB_WALK: u32 = RANGE_CHECK_RB | VMA_ENTER_RB | VMA_EXIT_RB | POPULATE_EXIT_COUNTED_RB;

    /// The handlers that need `bpf_find_vma` or `bpf_loop` (5.17): a kernel without them
    /// cannot load a program that calls them, so it gets the dispatchers without them.
    pub const NEED_FIND_VMA: u32 = RANGE_CHECK
        | VMA_ENTER
        | VMA_EXIT
        | POPULATE_ENTER_RETRY
        | POPULATE_EXIT_COUNTED
        | MAPPINGS_GOING_RETRY;
}

/// The calls with fentry/fexit programs of their own (one per call and edge, see
/// `memlock-trace-ebpf`'s `syscall_dispatch`), each with the handlers' bits it can run: a
/// call's programs are built with those handlers only, so each verifies only what its call
/// can need. The loader refuses to mark a bit a call's programs lack.
pub mod calls {
    use super::hook::*;

    const MLOCK_FAMILY: u32 = SYSCALLS_ENTER
        | SYSCALLS_EXIT
        | RANGE_CHECK
        | RANGE_CHECK_RB
        | VMA_ENTER
        | VMA_EXIT
        | VMA_ENTER_RB
        | VMA_EXIT_RB;
    pub const POPULATE: u32 = POPULATE_ENTER
        | POPULATE_ENTER_RETRY
        | POPULATE_EXIT
        | POPULATE_EXIT_COUNTED
        | POPULATE_EXIT_COUNTED_RB;
    const GOING: u32 = MAPPINGS_GOING | MAPPINGS_GOING_RETRY;

    pub const MLOCK: u32 = MLOCK_FAMILY | POPULATE;
    pub const MUNLOCK: u32 = MLOCK_FAMILY | MAPPINGS_CHANGED;
    pub const MMAP: u32 = POPULATE | STACKS_MMAP_ENTER | STACKS_MMAP_EXIT;
    pub const MUNMAP: u32 = MAPPINGS_CHANGED | GOING;
    pub const EXIT_GROUP: u32 = GOING;

    /// Every call with programs, by name (the kernel function is the arch's prefix and
    /// this), with its handlers.
    pub const ALL: [(&str, u32); 16] = [
        ("mlock", MLOCK),
        ("mlock2", MLOCK),
        ("munlock", MUNLOCK),
        ("mlockall", MLOCK),
        ("munlockall", MUNLOCK),
        ("mmap", MMAP),
        ("mremap", POPULATE),
        ("brk", POPULATE),
        ("madvise", POPULATE),
        ("mprotect", POPULATE),
        ("pkey_mprotect", POPULATE),
        ("remap_file_pages", POPULATE),
        ("execve", POPULATE),
        ("execveat", POPULATE),
        ("munmap", MUNMAP),
        ("exit_group", EXIT_GROUP),
    ];
}
